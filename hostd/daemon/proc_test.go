package daemon

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/hostd/cgroup"
	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/vmmctl"
	"github.com/warrenvm/warren/vmmproc/jail"
)

// testRestore is a restore the stand-in warren (TestMain's role
// "warren") is started with.
var testRestore = vmmctl.Launch{Restore: &vmmctl.Restore{Snapshot: "/snap"}}

// TestExecLauncher: the VMM runs in a session of its own (a kill of the
// daemon's process group or session leaves it), started with its spec's
// arguments, with its output in the log, the Prepare hook applied, and
// stopProc ends it; a spec that does not encode starts nothing.
func TestExecLauncher(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "vmm.log")
	prepared := false
	t.Setenv(roleEnv, "warren")
	var cmd *exec.Cmd
	l := &ExecLauncher{Warren: os.Args[0], Prepare: func(c *exec.Cmd, spec LaunchSpec) (*vmmctl.JailInit, error) {
		prepared, cmd = spec.ID == "sb-000000000001", c
		return nil, nil
	}}
	p, err := l.Start(LaunchSpec{ID: "sb-000000000001", Launch: testRestore, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer stopProc(p.PID, p.StartTime, time.Second)
	if !prepared {
		t.Error("Prepare hook not called")
	}
	if want := []string{os.Args[0], "restore", "/snap"}; !slices.Equal(cmd.Args, want) {
		t.Errorf("args %q, want %q", cmd.Args, want)
	}
	sid, err := unix.Getsid(p.PID)
	if err != nil || sid != p.PID {
		t.Fatalf("session %d (%v), want its own (%d)", sid, err, p.PID)
	}
	if !alive(p.PID, p.StartTime) || alive(p.PID, p.StartTime+1) {
		t.Fatal("alive: start time not checked")
	}
	stopProc(p.PID, p.StartTime, 2*time.Second)
	if alive(p.PID, p.StartTime) {
		t.Fatal("still alive after stopProc")
	}
	if _, err := l.Start(LaunchSpec{Launch: vmmctl.Launch{Restore: &vmmctl.Restore{Snapshot: "relative"}}, Log: log}); err == nil {
		t.Error("a restore of a relative snapshot path started")
	}
	// A failing VMM's message ends up in the log.
	failing := filepath.Join(dir, "warren")
	os.WriteFile(failing, []byte("#!/bin/sh\necho \"warren: bogus $*\" >&2\nexit 1\n"), 0o755)
	l.Warren = failing
	p, err = l.Start(LaunchSpec{Launch: testRestore, Log: log})
	if err == nil {
		waitDead(p.PID, p.StartTime, 5*time.Second)
	}
	time.Sleep(100 * time.Millisecond)
	if b, _ := os.ReadFile(log); !strings.Contains(string(b), "bogus") {
		t.Errorf("log: %q", b)
	}
}

// TestJailPrepareNetNS: a jailed VMM runs under `warren jail-init` in new
// mount, pid, ipc and uts namespaces; without a network it also gets a new
// network namespace, and a network VMM (which makes its own for its tap
// and needs the host's for its upstream) does not.
func TestJailPrepareNetNS(t *testing.T) {
	prep, err := JailPrepare("vmm")
	if err != nil {
		t.Fatal(err)
	}
	for _, network := range []bool{false, true} {
		cmd := newCmd("/bin/warren")
		init, err := prep(cmd, LaunchSpec{Kind: "sandbox", Launch: testRestore, Network: network})
		if err != nil {
			t.Fatal(err)
		}
		init.ReportFD, init.Program = 3, "/bin/warren"
		args, err := init.Args()
		if err != nil {
			t.Fatal(err)
		}
		fl := cmd.SysProcAttr.Cloneflags
		if got := fl&unix.CLONE_NEWNET != 0; got == network {
			t.Errorf("network %v: CLONE_NEWNET %v", network, got)
		}
		if fl&unix.CLONE_NEWNS == 0 || fl&unix.CLONE_NEWPID == 0 {
			t.Errorf("network %v: clone flags %#x", network, fl)
		}
		if want := []string{jail.InitVerb, "--report-fd", "3", "--", "/bin/warren", "restore", "--jail", "vmm", "/snap"}; !slices.Equal(args, want) {
			t.Errorf("args %q", args)
		}
	}
}

// TestExecLauncherJailed: with the jail, the launcher returns the VMM's
// PID in the daemon's namespace (the child of the pid namespace's init),
// the VMM is in a pid namespace of its own, and the init ends with it.
func TestExecLauncherJailed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (new namespaces)")
	}
	prep, err := JailPrepare("vmm")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(roleEnv, "warren")
	l := &ExecLauncher{Warren: os.Args[0], Prepare: prep}
	p, err := l.Start(LaunchSpec{ID: "sb-000000000001", Launch: testRestore, Log: filepath.Join(t.TempDir(), "vmm.log")})
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Kill(p.PID, unix.SIGKILL)
	// The init reports the VMM as soon as its exec succeeded: its
	// command line can read empty for a moment after that.
	var argv []string
	kvmtest.WaitFor(t, 5*time.Second, "the VMM's command line", func() bool {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.PID))
		argv = strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		return len(argv) > 1
	})
	if len(argv) < 2 || argv[1] != "restore" {
		t.Fatalf("the launcher's PID %d runs %q, want the VMM", p.PID, argv)
	}
	self, _ := os.Readlink("/proc/self/ns/pid")
	vmm, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", p.PID))
	if self == vmm {
		t.Fatalf("the VMM is in the daemon's pid namespace (%s)", vmm)
	}
	stb, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID))
	var nsPID int
	for _, l := range strings.Split(string(stb), "\n") {
		if v, ok := strings.CutPrefix(l, "NSpid:"); ok {
			f := strings.Fields(v)
			nsPID, _ = strconv.Atoi(f[len(f)-1])
		}
	}
	if got, err := jail.HostPID(p.PID, nsPID); err != nil || got != p.PID || nsPID == p.PID {
		t.Errorf("HostPID(%d, %d) = %d, %v; want %d", p.PID, nsPID, got, err, p.PID)
	}
	st, _, _ := procStat(p.PID)
	ppid := ppidOf(t, p.PID)
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", ppid))
	if !strings.Contains(string(b), jail.InitVerb) {
		t.Errorf("the VMM's parent %d runs %q (state %c)", ppid, b, st)
	}
	unix.Kill(p.PID, unix.SIGKILL)
	kvmtest.WaitFor(t, 5*time.Second, "the init to end with its VMM", func() bool {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", ppid))
		return os.IsNotExist(err)
	})
}

// ppidOf returns pid's parent.
func ppidOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	n, _ := strconv.Atoi(f[1])
	return n
}

// TestExecLauncherPassesFiles: a LaunchSpec's ExtraFiles reach the VMM
// as descriptors FirstExtraFD, FirstExtraFD+1, ..., jailed (through
// jail-init) or not, and nothing else above stderr does (jail-init's
// report socket is not the VMM's).
func TestExecLauncherPassesFiles(t *testing.T) {
	dir := t.TempDir()
	k, i := filepath.Join(dir, "vmlinux"), filepath.Join(dir, "initramfs.cpio")
	os.WriteFile(k, []byte("k"), 0o600)
	os.WriteFile(i, []byte("i"), 0o600)
	t.Setenv(roleEnv, "warren")
	for _, jailed := range []bool{false, true} {
		if jailed && os.Geteuid() != 0 {
			t.Log("jailed: skipped, needs root (new namespaces)")
			continue
		}
		l := &ExecLauncher{Warren: os.Args[0]}
		if jailed {
			prep, err := JailPrepare("vmm")
			if err != nil {
				t.Fatal(err)
			}
			l.Prepare = prep
		}
		kf, _ := os.Open(k)
		rf, _ := os.Open(i)
		log := filepath.Join(dir, fmt.Sprintf("vmm-%v.log", jailed))
		run := vmmctl.Launch{Run: &vmmctl.Run{KernelFD: FirstExtraFD, InitramfsFD: FirstExtraFD + 1, MemMiB: 128, CPUs: 1}}
		p, err := l.Start(LaunchSpec{ID: "tp-000000000001", Launch: run, Log: log, ExtraFiles: []*os.File{kf, rf}})
		kf.Close()
		rf.Close()
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("fd %d: %s\nfd %d: %s\n", FirstExtraFD, k, FirstExtraFD+1, i)
		var got string
		kvmtest.WaitFor(t, 10*time.Second, "the VMM's descriptors", func() bool {
			b, _ := os.ReadFile(log)
			got = string(b)
			return strings.Contains(got, want)
		})
		// (the Go runtime's own files, opened after exec, may take the
		// free numbers: a socket there is jail-init's report leaking)
		if strings.Contains(got, "socket:") {
			t.Errorf("jailed %v: the VMM inherited a socket:\n%s", jailed, got)
		}
		unix.Kill(p.PID, unix.SIGKILL)
	}
}

// TestExecLauncherBornInCgroup: a jailed VMM whose LaunchSpec names a
// cgroup is born in it (jail-init joins it before it starts the VMM; the
// launcher never moves a running process), and so is its init.
func TestExecLauncherBornInCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (new namespaces, cgroups)")
	}
	m, err := cgroup.Detect("/sys/fs/cgroup", fmt.Sprintf("warren-test-%d", os.Getpid()))
	if err != nil {
		t.Skipf("skipped: no usable cgroup hierarchy here: %v", err)
	}
	g, err := m.Create("sb-000000000001", cgroup.Limits{MemoryBytes: 256 << 20, CPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	prep, err := JailPrepare("vmm")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(roleEnv, "warren")
	l := &ExecLauncher{Warren: os.Args[0], Prepare: prep}
	p, err := l.Start(LaunchSpec{ID: "sb-000000000001", Launch: testRestore, Log: filepath.Join(t.TempDir(), "vmm.log"), Cgroup: g.Dirs})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		stopProc(p.PID, p.StartTime, time.Second)
		kvmtest.WaitFor(t, 5*time.Second, "the group empty", func() bool { pids, _ := g.Procs(); return len(pids) == 0 })
		g.Remove()
		for _, d := range g.Dirs {
			os.Remove(filepath.Dir(d))
		}
	}()
	pids, err := g.Procs()
	if err != nil {
		t.Fatal(err)
	}
	init := ppidOf(t, p.PID)
	if !slices.Contains(pids, p.PID) || !slices.Contains(pids, init) {
		t.Fatalf("the group holds %v, want the VMM %d and its init %d", pids, p.PID, init)
	}
}

// TestTailRefusesLinks: tail reads a VMM's log or console from a
// directory the VMM owns: a link there (to a host file) or a FIFO reads
// as nothing, a regular file as its last bytes.
func TestTailRefusesLinks(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(t.TempDir(), "host-secret")
	os.WriteFile(secret, []byte("a host file's bytes"), 0o600)
	link := filepath.Join(dir, "console.log")
	if err := os.Symlink(secret, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "vmm.log")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := tail(link, 600); got != "" {
		t.Errorf("tail through a link: %q", got)
	}
	if got := tail(fifo, 600); got != "" {
		t.Errorf("tail of a FIFO: %q", got)
	}
	plain := filepath.Join(dir, "plain.log")
	os.WriteFile(plain, []byte("early line\nthe last line\n"), 0o600)
	if got := tail(plain, 14); got != "the last line" {
		t.Errorf("tail of a file: %q", got)
	}
	if got := tail("", 10); got != "" {
		t.Errorf("tail of no path: %q", got)
	}
}
