package daemon

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/warrenvm/warren/vmmctl"
)

// TestConfinementSpecs checks what the daemon asks of each VMM it starts
// under --vmm-uid-range: a template build and two sandboxes each with a
// uid of the range of their own, owning their directory while they run,
// in a jail of their own with only their files; the template's directory
// back to root once its build is over; a network template and sandbox
// the same, with the network's files and their network from jail-init's
// helper (no /dev/net/tun).
func TestConfinementSpecs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root (chown)")
	}
	state := t.TempDir()
	f := newFakeLauncher(t)
	r := &UIDRange{First: 1000000, Count: 8}
	td := startDaemon(t, state, f, func(c *Config) { c.VMMUIDs = r })
	c := td.client(t, "alice")
	warren := td.cfg.Warren

	tp := c.template(fakeKernel(t))
	tdir := td.store.TemplateDir("alice", tp.ID)
	build := f.confined[tp.ID]
	if build.c == nil || !r.has(build.c.UID) || build.c.GID != build.c.UID || build.dirOwner != build.c.UID {
		t.Fatalf("template build: %+v, its directory owned by %d: want a uid of the range owning it", build.c, build.dirOwner)
	}
	if build.c.Root != filepath.Join(state, "jail", tp.ID) || build.c.NetHelper {
		t.Errorf("template build's jail: %+v", build.c)
	}
	if !slices.Contains(build.c.Binds, vmmctl.Bind{Path: tdir, Writable: true}) {
		t.Errorf("template build's binds %+v lack its directory", build.c.Binds)
	}
	if o := dirOwner(tdir); o != 0 {
		t.Errorf("the template's directory is owned by %d after the build, want root", o)
	}

	sb1, sb2 := c.create(tp.ID), c.create(tp.ID)
	c1, c2 := f.confined[sb1.ID], f.confined[sb2.ID]
	for i, fc := range []fakeConfine{c1, c2} {
		if fc.c == nil || !r.has(fc.c.UID) || fc.dirOwner != fc.c.UID || fc.c.NetHelper {
			t.Fatalf("sandbox %d: %+v, its directory owned by %d", i+1, fc.c, fc.dirOwner)
		}
	}
	if c1.c.UID == c2.c.UID {
		t.Errorf("two sandboxes share uid %d", c1.c.UID)
	}
	sbs := filepath.Join(state, "tenants", "alice", "sandboxes")
	for _, b := range c1.c.Binds {
		switch {
		case b.Path == sbs && b.Writable, b.Path == filepath.Join(state, "tenants", "alice", "templates") && !b.Writable,
			strings.HasPrefix(b.Path, td.store.RunDir()) && b.Writable, b.Path == "/sys/module" && !b.Writable,
			b.Path == warren && b.Exec && !b.Writable:
		default:
			t.Errorf("sandbox bind %+v: not one a sandbox VMM needs", b)
		}
	}
	for _, p := range []string{state, filepath.Join(state, "keys"), "/etc", filepath.Dir(sbs)} {
		if slices.ContainsFunc(c1.c.Binds, func(b vmmctl.Bind) bool { return b.Path == p }) {
			t.Errorf("sandbox binds %s", p)
		}
	}
	args, err := jailValue(c1.c)
	if err != nil || !strings.Contains(args, "user=") || strings.Contains(args, "dev=tun") {
		t.Errorf("jailArgs %q %v", args, err)
	}

	ntp := c.networkTemplate(fakeKernel(t))
	nb := f.confined[ntp.ID]
	if nb.c == nil || !r.has(nb.c.UID) || !nb.c.NetHelper || nb.c.Root != filepath.Join(state, "jail", ntp.ID) {
		t.Fatalf("network template build: %+v", nb.c)
	}
	nsb := c.create(ntp.ID)
	ns := f.confined[nsb.ID]
	if ns.c == nil || !r.has(ns.c.UID) || !ns.c.NetHelper || ns.dirOwner != ns.c.UID {
		t.Fatalf("network sandbox: %+v, its directory owned by %d", ns.c, ns.dirOwner)
	}
	if args, err := jailValue(ns.c); err != nil || !strings.Contains(args, "user=") || strings.Contains(args, "dev=tun") {
		t.Errorf("network jailArgs %q %v", args, err)
	}
	if _, err := os.Stat("/etc/resolv.conf"); err == nil && !slices.Contains(ns.c.Binds, vmmctl.Bind{Path: "/etc/resolv.conf"}) {
		t.Errorf("network sandbox binds %+v lack /etc/resolv.conf", ns.c.Binds)
	}
}

// TestUIDRangeCheckUnused refuses a range that holds a user or a group of
// the host.
func TestUIDRangeCheckUnused(t *testing.T) {
	dir := t.TempDir()
	passwd, group := filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	os.WriteFile(passwd, []byte("root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n"), 0o644)
	os.WriteFile(group, []byte("root:x:0:\nbig:x:1000005:\n"), 0o644)
	r := &UIDRange{First: 1000000, Count: 65536}
	if err := r.CheckUnused(passwd, filepath.Join(dir, "absent")); err != nil {
		t.Errorf("no user in the range: %v", err)
	}
	if err := r.CheckUnused(passwd, group); err == nil || !strings.Contains(err.Error(), "big's id 1000005") {
		t.Errorf("a group in the range: %v", err)
	}
	if err := (&UIDRange{First: 1000, Count: 1}).CheckUnused(passwd); err == nil || !strings.Contains(err.Error(), "alice") {
		t.Errorf("a user in the range: %v", err)
	}
}

// TestMainUIDRangeNeedsJail: an explicit --vmm-uid-range with --jail off
// is refused (it would silently leave VMMs root).
func TestMainUIDRangeNeedsJail(t *testing.T) {
	dir := t.TempDir()
	var stderr bytes.Buffer
	code := Main([]string{"--state", filepath.Join(dir, "state"), "--socket", filepath.Join(dir, "s.sock"), "--warren", "/bin/true",
		"--cgroup-root", "none", "--jail", "off", "--vmm-uid-range", "2000000:16"}, &stderr)
	if code == 0 || !strings.Contains(stderr.String(), "--vmm-uid-range needs a jail") {
		t.Fatalf("Main = %d: %s", code, stderr.String())
	}
}

// jailValue is the --jail value of a "vmm" jail confined by c.
func jailValue(c *Confinement) (string, error) {
	j := vmmctl.Jail{Profile: "vmm"}
	c.confine(&j)
	return j.Encode()
}
