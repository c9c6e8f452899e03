package daemon

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/hostd/crypt"
	"github.com/warrenvm/warren/hostd/store"
)

// TestE2EDisks drives sandboxes of a template with a writable disk
// through the daemon with real VMs: each sandbox writes its own bytes to
// /dev/vda and sees only its own; the template's frozen base keeps the
// original bytes; a sandbox's writes survive a pause to disk and resume;
// a fork child starts from its parent's disk and writes apart from it;
// the parent cannot be deleted while the child stands on its layers.
// It runs for a tenant without a key and for one with a key, whose disk
// files must besides be sealed (hostd/crypt) whenever no VMM needs them:
// the template's base after the build and once its last sandbox is gone,
// a sandbox's overlay once it is paused to disk, with none of its bytes
// in plaintext in its directory. WARREN_TESTDISK names the image (make
// testdisk).
func TestE2EDisks(t *testing.T) {
	warren, kernel, initrd := e2ePaths(t)
	img := os.Getenv("WARREN_TESTDISK")
	if img == "" {
		t.Skip("skipped: WARREN_TESTDISK is unset (make testdisk)")
	}
	orig, err := readHead(img, 16)
	if err != nil {
		t.Fatal(err)
	}
	state, step := e2eState(t, "hostd-disks-")
	keys := &crypt.LocalProvider{Dir: filepath.Join(state, "keys")}
	if err := os.Mkdir(keys.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	td := startE2EDaemon(t, state, warren, func(c *Config) { c.Keys = keys })
	for _, keyed := range []bool{false, true} {
		name := map[bool]string{false: "plain", true: "sealed"}[keyed]
		t.Run(name, func(t *testing.T) {
			tenant := "tenant-d-" + name
			c := td.client(t, tenant)
			if keyed {
				c.ok(201, "POST", "/v1/keys", nil, nil)
			}
			diskScenario(t, c, state, tenant, kernel, initrd, img, orig, keyed, step)
		})
	}
}

// diskScenario is TestE2EDisks for one tenant.
func diskScenario(t *testing.T, c *client, state, tenant, kernel, initrd, img string, orig []byte, keyed bool, step func(string, ...any)) {
	var all []store.Sandbox
	defer func() {
		for _, sb := range all { // leave no VMM behind, whatever happened
			stopProc(sb.PID, sb.StartTime, time.Second)
		}
	}()
	// sealed checks, for a tenant with a key, that each path is sealed
	// (want) or plaintext (!want).
	sealed := func(want bool, what string, paths ...string) {
		t.Helper()
		if !keyed {
			return
		}
		for _, p := range paths {
			if ok, err := isSealed(p); err != nil || ok != want {
				t.Fatalf("%s: %s sealed %v (%v), want %v", what, filepath.Base(p), ok, err, want)
			}
		}
	}
	sbDir := func(id string) string { return filepath.Join(state, "tenants", tenant, "sandboxes", id) }
	var tp store.Template
	c.ok(201, "POST", "/v1/templates", map[string]any{"kernel": kernel, "initramfs": initrd, "mem_mib": 256, "cpus": 1, "disks": []string{img}}, &tp)
	step("template %s with a writable disk ready in %.0f ms (base %s)", tp.ID, tp.BuildMS, tp.DiskBases[0])
	base := tp.DiskBases[0]
	sealed(true, "after the build", base)

	// head reads the first 16 bytes of the sandbox's /dev/vda.
	head := func(id string) string {
		t.Helper()
		out, errOut, code, err := c.tryExec(id, "dd", "if=/dev/vda", "bs=16", "count=1")
		if err != nil || code != 0 {
			t.Fatalf("dd in %s: %v exit %d %q", id, err, code, errOut)
		}
		return out
	}
	write := func(id, s string) {
		t.Helper()
		cmd := fmt.Sprintf("echo -n %s > /tmp/w && dd if=/tmp/w of=/dev/vda && sync", s)
		if out, errOut, code, err := c.tryExec(id, "sh", "-c", cmd); err != nil || code != 0 {
			t.Fatalf("write in %s: %v exit %d %q %q", id, err, code, out, errOut)
		}
	}
	a, b := c.create(tp.ID), c.create(tp.ID)
	all = append(all, a, b)
	write(a.ID, "AAAA-sandbox-one")
	write(b.ID, "BBBB-sandbox-two")
	if got := head(a.ID); got != "AAAA-sandbox-one" {
		t.Fatalf("%s reads %q", a.ID, got)
	}
	if got := head(b.ID); got != "BBBB-sandbox-two" {
		t.Fatalf("%s reads %q", b.ID, got)
	}
	sealed(false, "while sandboxes run", base, filepath.Join(sbDir(a.ID), "disk0.overlay"))
	if got, err := readImageHead(base, 16); err != nil || !bytes.Equal(got, orig) {
		t.Fatalf("the template's base changed: %q %v", got, err)
	}
	step("%s and %s each read their own bytes; the template's base is unchanged", a.ID, b.ID)

	c.ok(200, "POST", "/v1/sandboxes/"+a.ID+"/pause?to_disk=true", nil, nil)
	sealed(true, "paused to disk", filepath.Join(sbDir(a.ID), "disk0.overlay"))
	sealed(false, "another sandbox runs on it", base)
	if keyed {
		noNeedle(t, sbDir(a.ID), []byte("AAAA-sandbox-one"))
		step("%s paused to disk: its overlay is sealed and none of its files holds its bytes; the base stays plaintext for %s", a.ID, b.ID)
	}
	var ra store.Sandbox
	c.ok(200, "POST", "/v1/sandboxes/"+a.ID+"/resume", nil, &ra)
	all = append(all, ra)
	if got := head(a.ID); got != "AAAA-sandbox-one" {
		t.Fatalf("after pause to disk and resume %s reads %q", a.ID, got)
	}
	step("%s keeps its bytes across pause to disk and resume", a.ID)

	var fr struct{ Children []store.Sandbox }
	c.ok(201, "POST", "/v1/sandboxes/"+a.ID+"/fork", map[string]any{"n": 1}, &fr)
	if len(fr.Children) != 1 {
		t.Fatalf("fork: %+v", fr)
	}
	kid := fr.Children[0]
	all = append(all, kid)
	if got := head(kid.ID); got != "AAAA-sandbox-one" {
		t.Fatalf("the fork child reads %q", got)
	}
	write(kid.ID, "CCCC-fork-child!")
	if got := head(a.ID); got != "AAAA-sandbox-one" {
		t.Fatalf("after the child's write the parent reads %q", got)
	}
	if st, body := c.do("DELETE", "/v1/sandboxes/"+a.ID, nil); st != 409 || !strings.Contains(string(body), kid.ID) {
		t.Fatalf("delete of the parent with a child: %d %s", st, body)
	}
	step("fork child %s starts from the parent's disk and writes apart; the parent's delete waits for it", kid.ID)
	c.ok(200, "DELETE", "/v1/sandboxes/"+kid.ID, nil, nil)
	c.ok(200, "DELETE", "/v1/sandboxes/"+b.ID, nil, nil)
	c.ok(200, "POST", "/v1/sandboxes/"+a.ID+"/pause?to_disk=true", nil, nil)
	if keyed {
		layers, _ := filepath.Glob(filepath.Join(sbDir(a.ID), "disk*"))
		if len(layers) < 2 {
			t.Fatalf("after a fork, %s's directory holds disk files %q", a.ID, layers)
		}
		sealed(true, "no VMM left", append(layers, base)...)
		noNeedle(t, filepath.Join(state, "tenants", tenant), []byte("AAAA-sandbox-one"))
		noNeedle(t, filepath.Join(state, "tenants", tenant), []byte("CCCC-fork-child!"))
		step("no VMM of %s left: its base and %d disk layers are sealed", tenant, len(layers))
	}
	c.ok(200, "POST", "/v1/sandboxes/"+a.ID+"/resume", nil, &ra)
	all = append(all, ra)
	if got := head(a.ID); got != "AAAA-sandbox-one" {
		t.Fatalf("after a second pause to disk and resume %s reads %q", a.ID, got)
	}
	c.ok(200, "DELETE", "/v1/sandboxes/"+a.ID, nil, nil)
	sealed(true, "all sandboxes deleted", base)
	c.ok(200, "DELETE", "/v1/templates/"+tp.ID, nil, nil)
	step("deleted")
}

// readHead returns the first n bytes of the file at path.
func readHead(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, n)
	_, err = f.ReadAt(b, 0)
	return b, err
}

// readImageHead returns the first n bytes of the disk image at path: a
// raw image, or a cow/disk overlay read through its chain (the template's
// base is one where the file system cannot reflink).
func readImageHead(path string, n int) ([]byte, error) {
	ov, err := disk.IsOverlay(path)
	if err != nil || !ov {
		return readHead(path, n)
	}
	o, err := disk.OpenChain(path, true)
	if err != nil {
		return nil, err
	}
	defer o.Close()
	b := make([]byte, n)
	_, err = o.ReadAt(b, 0)
	return b, err
}
