package daemon

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/hostd/store"
)

// repoRoot walks up from the package directory to go.mod.
func repoRoot(t *testing.T) string {
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
	if _, err := os.Stat("/dev/kvm"); err != nil {
		t.Skip("skipped: /dev/kvm is absent on this host (run in the nested KVM host)")
	}
	root := repoRoot(t)
	warren := os.Getenv("WARREN_BIN")
	if warren == "" {
		warren = filepath.Join(root, "bin", "warren")
	}
	kernel, initrd := filepath.Join(root, "build", "vmlinux"), filepath.Join(root, "build", "initramfs.cpio")
	for _, p := range []string{warren, kernel, initrd} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("skipped: %v (make warren kernel initramfs)", err)
		}
	}
	state, err := os.MkdirTemp("", "hostd-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	start := time.Now()
	step := func(format string, a ...any) {
		t.Logf("[%5.1fs] %s", time.Since(start).Seconds(), strings.TrimSpace(sprintf(format, a...)))
	}
	launcher := &ExecLauncher{Warren: warren}
	mod := func(c *Config) {
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

	step("building the template (boots the guest)")
	var tp store.Template
	a.ok(201, "POST", "/v1/templates", map[string]any{"kernel": kernel, "initramfs": initrd, "mem_mib": 256, "cpus": 1,
		"cmdline": "warren.hostname=tpl"}, &tp)
	step("template %s ready in %.0f ms", tp.ID, tp.BuildMS)

	sb := a.create(tp.ID)
	all = append(all, sb)
	step("sandbox %s running (pid %d, cgroup %v)", sb.ID, sb.PID, sb.Cgroup)
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
	a.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/resume", nil, &rec)
	all = append(all, rec)
	if out, _, _ := a.exec(sb.ID, "cat", "/tmp/hello.txt"); out != "hello from the host" {
		t.Fatalf("after resume from disk: %q", out)
	}
	step("resumed from disk (pid %d)", rec.PID)

	// Rolling snapshots.
	a.ok(202, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", map[string]any{"every": "5s", "keep": 4}, nil)
	var snaps struct{ Snapshots []store.Snapshot }
	waitFor(t, 90*time.Second, "2 rolling snapshots", func() bool {
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
