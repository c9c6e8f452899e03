package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/hostd/crypt"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/vmmproc/jail"
)

// repoRoot walks up from the package directory to go.mod.
func repoRoot(t testing.TB) string {
	dir, _ := os.Getwd()
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		p := filepath.Dir(dir)
		if p == dir {
			t.Fatal("no go.mod above the test")
		}
		dir = p
	}
}

// TestE2E drives real VMs through the daemon's API: template build,
// create, exec, files, fork, pause/resume, a daemon restart with the VMMs
// running on, pause to disk, tenant isolation, rolling snapshots, delete.
// It needs /dev/kvm and bin/warren, build/vmlinux, build/initramfs.cpio
// (make warren kernel initramfs); `make test-kvm`-style, it runs in the
// nested KVM host on machines without /dev/kvm.
func TestE2E(t *testing.T) {
	warren, kernel, initrd := e2ePaths(t)
	state, err := os.MkdirTemp("", "hostd-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	start := time.Now()
	step := func(format string, a ...any) {
		t.Logf("[%5.1fs] %s", time.Since(start).Seconds(), strings.TrimSpace(sprintf(format, a...)))
	}
	// Every VMM jailed (WARREN_E2E_JAIL: vmm by default, "off", or say
	// "vmm,log" to find missing syscalls), every snapshot of tenant-a
	// encrypted at rest once it has a key.
	launcher := &ExecLauncher{Warren: warren}
	jailProfile := os.Getenv("WARREN_E2E_JAIL")
	if jailProfile == "" {
		jailProfile = "vmm"
	}
	if jailProfile != "off" {
		if launcher.Prepare, err = JailPrepare(jailProfile); err != nil {
			t.Fatal(err)
		}
	}
	keys := &crypt.LocalProvider{Dir: filepath.Join(state, "keys")}
	if err := os.Mkdir(keys.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// Confined as warren-hostd's default --vmm-uid-range does.
	uids, err := ParseUIDRange(DefaultUIDRange)
	if err != nil {
		t.Fatal(err)
	}
	mod := func(c *Config) {
		if jailProfile != "off" {
			c.VMMUIDs = uids
		}
		c.Keys = keys
		c.CgroupRoot = "" // the host's, or none (a warning) where there is none
		c.MonitorInterval = 500 * time.Millisecond
		c.BootTimeout, c.RestoreTimeout = 4*time.Minute, 2*time.Minute
		c.Log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	td := startDaemon(t, state, launcher, mod)
	a := td.client(t, "tenant-a")
	var all []store.Sandbox
	defer func() {
		// Leave no VMM behind, whatever happened.
		_, sbs, _ := td.store.Load()
		for _, sb := range sbs {
			stopProc(sb.PID, sb.StartTime, time.Second)
		}
		for _, sb := range all {
			stopProc(sb.PID, sb.StartTime, time.Second)
		}
	}()

	var ki KeyInfo
	a.ok(201, "POST", "/v1/keys", nil, &ki)
	step("tenant-a's key %s created; VMMs jailed: %s", ki.KeyID, jailProfile)

	step("building the template (boots the guest)")
	var tp store.Template
	a.ok(201, "POST", "/v1/templates", map[string]any{"kernel": kernel, "initramfs": initrd, "mem_mib": 256, "cpus": 1,
		"cmdline": "warren.hostname=tpl"}, &tp)
	step("template %s ready in %.0f ms", tp.ID, tp.BuildMS)
	sealedAll(t, filepath.Dir(tp.Snapshot))
	step("the template's snapshot is sealed on disk (%s header)", crypt.Magic)

	sb := a.create(tp.ID)
	all = append(all, sb)
	step("sandbox %s running (pid %d, cgroup %v)", sb.ID, sb.PID, sb.Cgroup)
	if jailProfile != "off" {
		// A jailed VMM without a network has a network namespace of its own.
		self, err1 := os.Readlink("/proc/self/ns/net")
		vmm, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", sb.PID))
		if err1 != nil || err2 != nil || self == vmm {
			t.Fatalf("the VMM's network namespace %q (%v), the daemon's %q (%v): want its own", vmm, err2, self, err1)
		}
		step("the VMM runs in a network namespace of its own (%s; the daemon's %s)", vmm, self)
		step("the VMM is confined: %s", checkConfined(t, uids, sb.PID, td.store.SandboxDir(sb.Tenant, sb.ID), keys.Dir))
		if owner := dirOwner(td.store.TemplateDir(tp.Tenant, tp.ID)); owner != 0 {
			t.Errorf("the template's directory is still owned by uid %d after its build VMM ended", owner)
		}
	}
	if out, _, code := a.exec(sb.ID, "sh", "-c", "echo hi"); out != "hi\n" || code != 0 {
		t.Fatalf("exec: %q %d", out, code)
	}
	a.ok(200, "PUT", "/v1/sandboxes/"+sb.ID+"/files?path=/tmp/hello.txt", []byte("hello from the host"), nil)
	if st, b := a.do("GET", "/v1/sandboxes/"+sb.ID+"/files?path=/tmp/hello.txt", nil); st != 200 || string(b) != "hello from the host" {
		t.Fatalf("file: %d %q", st, b)
	}
	if out, _, _ := a.exec(sb.ID, "cat", "/tmp/hello.txt"); out != "hello from the host" {
		t.Fatalf("cat: %q", out)
	}
	// The agent's refusal keeps its code through the daemon (warren exec
	// exits 127 on it, as a shell does).
	var refused wire.Error
	if st, b := a.do("POST", "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"argv": []string{"no-such-program"}}); st != 404 ||
		json.Unmarshal(b, &refused) != nil || refused.Code != agentwire.CodeNotFound {
		t.Fatalf("exec of a missing program: %d %s", st, b)
	}
	step("exec and files ok")

	var fr struct{ Children []store.Sandbox }
	a.ok(201, "POST", "/v1/sandboxes/"+sb.ID+"/fork", map[string]any{"n": 2}, &fr)
	all = append(all, fr.Children...)
	if len(fr.Children) != 2 {
		t.Fatalf("fork: %+v", fr)
	}
	for _, k := range fr.Children {
		if k.Status != store.Running {
			t.Fatalf("child %+v", k)
		}
		out, _, _ := a.exec(k.ID, "cat", "/tmp/hello.txt")
		host, _, _ := a.exec(k.ID, "cat", "/proc/sys/kernel/hostname")
		if out != "hello from the host" {
			t.Fatalf("child %s: %q", k.ID, out)
		}
		step("child %s (pid %d) has the parent's file; hostname %s", k.ID, k.PID, strings.TrimSpace(host))
		if jailProfile != "off" {
			step("child %s is confined: %s", k.ID, checkConfined(t, uids, k.PID, td.store.SandboxDir(k.Tenant, k.ID), keys.Dir))
			step("child %s was started by its family's jail-init: %s", k.ID, checkSpawned(t, sb, k))
		}
	}

	a.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/pause", nil, nil)
	a.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/resume", nil, nil)
	if out, _, _ := a.exec(sb.ID, "sh", "-c", "echo resumed"); out != "resumed\n" {
		t.Fatalf("after resume: %q", out)
	}
	step("pause/resume ok")

	// The daemon goes away (no VMM is stopped) and a new one adopts them.
	td.Close()
	<-td.done
	td = startDaemon(t, state, launcher, mod)
	a = td.client(t, "tenant-a")
	if got := a.get(sb.ID); got.Status != store.Running || got.PID != sb.PID {
		t.Fatalf("after a daemon restart: %+v", got)
	}
	if out, _, _ := a.exec(sb.ID, "cat", "/tmp/hello.txt"); out != "hello from the host" {
		t.Fatalf("exec after a daemon restart: %q", out)
	}
	if got := a.get(fr.Children[0].ID); got.Status != store.Running {
		t.Fatalf("child after a daemon restart: %+v", got)
	}
	step("daemon restarted: sandbox and children re-adopted, exec ok")

	// Tenant isolation.
	b := td.client(t, "tenant-b")
	var bl []store.Sandbox
	b.ok(200, "GET", "/v1/sandboxes", nil, &bl)
	if len(bl) != 0 {
		t.Fatalf("tenant-b sees %v", bl)
	}
	for _, p := range []string{"GET /v1/sandboxes/" + sb.ID, "POST /v1/sandboxes/" + sb.ID + "/pause", "DELETE /v1/sandboxes/" + sb.ID} {
		m, path, _ := strings.Cut(p, " ")
		if st, _ := b.do(m, path, nil); st != 404 {
			t.Fatalf("tenant-b %s: %d", p, st)
		}
	}
	if st, _ := b.do("POST", "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"argv": []string{"true"}}); st != 404 {
		t.Fatalf("tenant-b exec: %d", st)
	}
	step("tenant-b sees and touches nothing of tenant-a")

	// Pause to disk and resume from it: the guest's memory comes back.
	var rec store.Sandbox
	a.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/pause?to_disk=true", nil, &rec)
	if rec.Status != store.Suspended || alive(sb.PID, sb.StartTime) {
		t.Fatalf("suspended: %+v", rec)
	}
	step("paused to disk (%s)", rec.Latest().Name)
	sealedAll(t, filepath.Dir(rec.Latest().Path))
	suspended := *rec.Latest()
	step("its snapshot is sealed on disk")
	a.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/resume", nil, &rec)
	all = append(all, rec)
	if out, _, _ := a.exec(sb.ID, "cat", "/tmp/hello.txt"); out != "hello from the host" {
		t.Fatalf("after resume from disk: %q", out)
	}
	step("resumed from disk (pid %d)", rec.PID)

	// Rolling snapshots.
	a.ok(202, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", map[string]any{"every": "5s", "keep": 4}, nil)
	var snaps struct{ Snapshots []store.Snapshot }
	kvmtest.WaitFor(t, 90*time.Second, "2 rolling snapshots", func() bool {
		a.ok(200, "GET", "/v1/sandboxes/"+sb.ID+"/snapshots", nil, &snaps)
		n := 0
		for _, s := range snaps.Snapshots {
			if s.Rolling {
				n++
			}
		}
		return n >= 2
	})
	a.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", map[string]any{"every": "0"}, nil)
	for _, s := range snaps.Snapshots {
		step("snapshot %s %s %d bytes", s.Name, s.Kind, s.Bytes)
	}
	// Roll back to the latest rolling snapshot in place.
	last := snaps.Snapshots[len(snaps.Snapshots)-1]
	a.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/rollback", map[string]any{"snapshot": last.Name}, nil)
	if out, _, _ := a.exec(sb.ID, "sh", "-c", "echo after rollback"); out != "after rollback\n" {
		t.Fatalf("after rollback: %q", out)
	}
	step("rollback to %s ok", last.Name)

	// tenant-b has no key: its snapshots stay plaintext, and incremental
	// ones (on a layer the jailed VMM reopens) and a rollback onto a chain
	// work under the jail.
	var tpb store.Template
	b.ok(201, "POST", "/v1/templates", map[string]any{"kernel": kernel, "initramfs": initrd, "mem_mib": 256, "cpus": 1}, &tpb)
	sbb := b.create(tpb.ID)
	all = append(all, sbb)
	var s1, s2 store.Snapshot
	b.ok(201, "POST", "/v1/sandboxes/"+sbb.ID+"/snapshots", map[string]any{"name": "b1"}, &s1)
	b.ok(201, "POST", "/v1/sandboxes/"+sbb.ID+"/snapshots", map[string]any{"name": "b2", "incremental": true}, &s2)
	if s2.Kind != "incremental" {
		t.Fatalf("tenant-b's second snapshot is %s", s2.Kind)
	}
	if sealed, err := isSealed(s2.Path + ".wstate"); err != nil || sealed {
		t.Fatalf("tenant-b (no key) has its snapshot sealed: %v %v", sealed, err)
	}
	b.ok(200, "POST", "/v1/sandboxes/"+sbb.ID+"/rollback", map[string]any{"snapshot": "b2"}, nil)
	if out, _, _ := b.exec(sbb.ID, "sh", "-c", "echo b ok"); out != "b ok\n" {
		t.Fatalf("tenant-b after rollback: %q", out)
	}
	b.ok(200, "DELETE", "/v1/sandboxes/"+sbb.ID, nil, nil)
	b.ok(200, "DELETE", "/v1/templates/"+tpb.ID, nil, nil)
	step("tenant-b (no key): plaintext snapshots, full + incremental, rollback onto the chain ok")

	// Revoking the key stops the tenant's sandboxes; nothing of it can be
	// restored any more, and its files stay sealed.
	a.ok(200, "DELETE", "/v1/keys", nil, &ki)
	step("key revoked; stopped %v", ki.Stopped)
	if len(ki.Stopped) != 3 {
		t.Fatalf("revoke stopped %v, want the sandbox and its 2 children", ki.Stopped)
	}
	for _, s := range append([]store.Sandbox{rec}, fr.Children...) {
		if got := a.get(s.ID); got.Status != store.Stopped || alive(s.PID, s.StartTime) {
			t.Fatalf("%s after revoke: %+v", s.ID, got)
		}
	}
	for _, c := range []struct{ path, body string }{
		{"/v1/sandboxes/" + sb.ID + "/resume", ""},
		{"/v1/sandboxes", tp.ID},
	} {
		var body any
		if c.body != "" {
			body = map[string]any{"template": c.body}
		}
		st, out := a.do("POST", c.path, body)
		if st != 403 || !strings.Contains(string(out), "tenant-a: key revoked at") {
			t.Fatalf("POST %s after revoke: %d %s", c.path, st, out)
		}
		step("POST %s after revoke: %d %s", c.path, st, strings.TrimSpace(string(out)))
	}
	sealedAll(t, filepath.Dir(suspended.Path))
	if _, err := crypt.Open(context.Background(), suspended.Path+".wstate", keys, "tenant-a"); !errors.Is(err, crypt.ErrRevoked) {
		t.Fatalf("open after revoke: %v", err)
	}

	// Delete stops the VMMs.
	for _, s := range append([]store.Sandbox{rec}, fr.Children...) {
		a.ok(200, "DELETE", "/v1/sandboxes/"+s.ID, nil, nil)
		if alive(s.PID, s.StartTime) {
			t.Fatalf("%s: VMM still runs after delete", s.ID)
		}
	}
	a.ok(200, "DELETE", "/v1/templates/"+tp.ID, nil, nil)
	step("deleted; done")
}

// checkConfined checks what an attacker who took over the VMM with pid
// would have: a uid and gid of the range (not root), no capability, no
// way to gain privileges, the seccomp filter, and a root file system
// where its own directory own is and the host's secret (another tenant's
// key directory) and the test binary are not. It returns a summary.
func checkConfined(t *testing.T, r *UIDRange, pid int, own, secret string) string {
	t.Helper()
	status := procStatus(t, pid)
	for _, k := range []string{"Uid", "Gid"} {
		ids := strings.Fields(status[k])
		if len(ids) != 4 {
			t.Fatalf("VMM %d: %s %q", pid, k, status[k])
		}
		for _, v := range ids {
			if id, err := strconv.Atoi(v); err != nil || !r.has(id) {
				t.Errorf("VMM %d: %s %q: want every id in the range %d:%d", pid, k, status[k], r.First, r.Count)
			}
		}
	}
	for k, want := range map[string]string{"CapEff": "0000000000000000", "CapPrm": "0000000000000000",
		"CapBnd": "0000000000000000", "NoNewPrivs": "1", "Seccomp": "2"} {
		if status[k] != want {
			t.Errorf("VMM %d: %s %q, want %q", pid, k, status[k], want)
		}
	}
	checkJailRoot(t, pid, own, secret)
	return fmt.Sprintf("pid %d: uid %s, CapEff %s, NoNewPrivs %s, Seccomp %s; its root has %s, not %s", pid,
		strings.Fields(status["Uid"])[0], status["CapEff"], status["NoNewPrivs"], status["Seccomp"], own, secret)
}

// checkSpawned checks that fork child k of parent was started by the
// family's jail-init, not by the parent's VMM (which may start no
// process: jail.SpawnEnv), as a uid of its own (not the parent's, in the
// parent's group, for its disk layers), and, with cgroups, that it is in
// a cgroup of its own, the one its record names (it was born there:
// vmmproc/jail's TestSpawn).
func checkSpawned(t *testing.T, parent, k store.Sandbox) string {
	t.Helper()
	ppid := func(pid int) string { return procStatus(t, pid)["PPid"] }
	if !k.Spawner || ppid(k.PID) != ppid(parent.PID) || ppid(k.PID) == strconv.Itoa(parent.PID) {
		t.Errorf("child %s (pid %d, spawner %v): its parent is %s, want jail-init (%s, the parent VMM's parent)", k.ID, k.PID, k.Spawner, ppid(k.PID), ppid(parent.PID))
	}
	ps, ks := procStatus(t, parent.PID), procStatus(t, k.PID)
	puid, kuid := strings.Fields(ps["Uid"])[0], strings.Fields(ks["Uid"])[0]
	if puid == kuid || !slices.Contains(strings.Fields(ks["Groups"]), strings.Fields(ps["Gid"])[0]) {
		t.Errorf("child %s: uid %s, groups %q; parent's uid %s, gid %s: want a uid of its own in the parent's group", k.ID, kuid, ks["Groups"], puid, ps["Gid"])
	}
	if len(k.Cgroup) == 0 || k.Cgroup[0] == "none" {
		return fmt.Sprintf("parent pid %s (jail-init), uid %s (the parent's %s), groups %s; no cgroups here", ppid(k.PID), kuid, puid, ks["Groups"])
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", k.PID))
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range k.Cgroup {
		if filepath.Base(dir) != k.ID || !strings.Contains(string(b), "/"+k.ID+"\n") {
			t.Errorf("child %s: cgroup %s; /proc/%d/cgroup:\n%s", k.ID, dir, k.PID, b)
		}
	}
	return fmt.Sprintf("parent pid %s (jail-init), uid %s (the parent's %s), groups %s, cgroup %s", ppid(k.PID), kuid, puid, ks["Groups"], k.Cgroup[0])
}

// checkNetConfined checks a network VMM (pid) the way checkConfined
// checks the others: a uid of the range, no capability (but CAP_BPF where
// vmmproc/jail.BPFNeedsCap: its filter's maps need it there), no_new_privs,
// the filter, its jail root; and no /dev/net/tun there (its jail-init
// made its network).
func checkNetConfined(t *testing.T, r *UIDRange, pid int, own, secret string) string {
	t.Helper()
	status := procStatus(t, pid)
	for _, k := range []string{"Uid", "Gid"} {
		for _, v := range strings.Fields(status[k]) {
			if id, err := strconv.Atoi(v); err != nil || !r.has(id) {
				t.Errorf("network VMM %d: %s %q: want every id in the range %d:%d", pid, k, status[k], r.First, r.Count)
			}
		}
	}
	want := "0000000000000000"
	if jail.BPFNeedsCap() {
		want = fmt.Sprintf("%016x", uint64(1)<<unix.CAP_BPF)
	}
	for k, want := range map[string]string{"CapEff": want, "CapPrm": want, "CapBnd": want, "NoNewPrivs": "1", "Seccomp": "2"} {
		if status[k] != want {
			t.Errorf("network VMM %d: %s %q, want %q", pid, k, status[k], want)
		}
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d/root/dev/net/tun", pid)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("network VMM %d: /dev/net/tun in its root (%v)", pid, err)
	}
	checkJailRoot(t, pid, own, secret)
	return fmt.Sprintf("pid %d: uid %s, CapEff %s, NoNewPrivs %s, Seccomp %s; its root has %s, not %s nor /dev/net/tun", pid,
		strings.Fields(status["Uid"])[0], status["CapEff"], status["NoNewPrivs"], status["Seccomp"], own, secret)
}

// procStatus is /proc/PID/status as a map.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			status[k] = strings.TrimSpace(v)
		}
	}
	return status
}

// checkJailRoot checks that VMM pid's root (its jail) holds its own
// directory own, but neither secret nor this test binary (host files it
// has no business with).
func checkJailRoot(t *testing.T, pid int, own, secret string) {
	t.Helper()
	root := fmt.Sprintf("/proc/%d/root", pid)
	if _, err := os.Stat(root + own); err != nil {
		t.Errorf("VMM %d: its own directory %s is not in its root: %v", pid, own, err)
	}
	self, _ := os.Executable()
	for _, p := range []string{secret, self} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s: %v (on the host)", p, err)
		}
		if _, err := os.Stat(root + p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("VMM %d: the host's %s is in its root (%v)", pid, p, err)
		}
	}
}
