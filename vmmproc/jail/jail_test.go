//go:build linux && amd64

package jail

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/vmmproc/jail/jailtest"
)

// The tests that install filters or drop privileges run in a subprocess: the
// test binary re-executes itself with JAIL_HELPER naming a helper below,
// which prints its checks and exits 0 only if all passed. A seccomp filter
// cannot be removed, and capabilities once dropped are gone.
const helperEnv = "JAIL_HELPER"

var helpers = map[string]func(h *helper){
	"strict":   helperStrict,
	"vmm":      helperVMM,
	"kill":     helperKill,
	"log":      helperLog,
	"caps":     helperCaps,
	"enter":    helperEnter,
	"userkeep": helperUserKeep,
	"long":     helperLong,
	"noop":     func(h *helper) {},
	// The Go runtime under a filter that kills on anything unlisted: any
	// syscall the table misses shows up as SIGSYS.
	"strictkill": func(h *helper) {
		if err := Install(ProfileStrict, Options{Mode: ModeKill}); err != nil {
			h.failf("install: %v", err)
			return
		}
		checkGoRuntime(h)
	},
	"vmmkill": func(h *helper) {
		if err := Install(ProfileVMM, Options{Mode: ModeKill}); err != nil {
			h.failf("install: %v", err)
			return
		}
		h.wantOK("fork+exec /bin/true", exec.Command("/bin/true").Run())
		checkGoChild(h)
		checkGoRuntime(h)
	},
	// A VMM whose jail-init starts its children: the runtime runs, no
	// process can be made.
	"spawned": func(h *helper) {
		if err := Install(ProfileVMM, Options{Mode: ModeErrno, Spawned: true}); err != nil {
			h.failf("install: %v", err)
			return
		}
		h.wantErrno("fork+exec /bin/true", exec.Command("/bin/true").Run(), syscall.EPERM)
		checkGoRuntime(h)
	},
}

func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case SpawnVerb: // Spawner's shim, run from this binary in TestSpawn
			os.Exit(RunSpawn(os.Args[2:], os.Stderr))
		case spawnedVerb:
			os.Exit(spawnedReport())
		}
	}
	if os.Getenv(initWrapEnv) != "" {
		os.Exit(initWrap())
	}
	if args := os.Getenv(initArgsEnv); args != "" {
		fd := -1
		if os.Getenv(initReportEnv) != "" {
			fd = 3
		}
		os.Exit(RunInit(strings.Split(args, "\x1f"), fd))
	}
	if name := os.Getenv(helperEnv); name != "" {
		fn, ok := helpers[name]
		if !ok {
			fmt.Printf("FAIL: unknown helper %q\n", name)
			os.Exit(2)
		}
		h := &helper{}
		fn(h)
		if h.failed {
			os.Exit(1)
		}
		fmt.Println("HELPER OK")
		os.Exit(0)
	}
	code := m.Run()
	jailtest.Remove()
	os.Exit(code)
}

// helper collects a subprocess's checks.
type helper struct{ failed bool }

func (h *helper) logf(format string, args ...any) { fmt.Printf(format+"\n", args...) }
func (h *helper) failf(format string, args ...any) {
	h.failed = true
	fmt.Printf("FAIL: "+format+"\n", args...)
}

// wantErrno checks that err is errno.
func (h *helper) wantErrno(what string, err error, errno syscall.Errno) {
	if errors.Is(err, errno) {
		h.logf("ok: %s: %v", what, err)
		return
	}
	h.failf("%s: got %v, want %v", what, err, errno)
}

func (h *helper) wantOK(what string, err error) {
	if err != nil {
		h.failf("%s: %v", what, err)
		return
	}
	h.logf("ok: %s", what)
}

func errnoErr(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (seccomp, capabilities and namespaces are tested for real); run as root")
	}
	var d unix.CapUserData
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	if err := unix.Capget(&hdr, &d); err != nil || d.Effective&(1<<unix.CAP_SYS_ADMIN) == 0 {
		t.Skip("needs CAP_SYS_ADMIN")
	}
}

// runHelper runs a helper and returns its output and wait status.
func runHelper(t *testing.T, name string, attr *syscall.SysProcAttr, env ...string) (string, syscall.WaitStatus) {
	t.Helper()
	cmd := exec.Command(jailtest.Exe(t), "-test.run=^$")
	cmd.Env = append(append(os.Environ(), helperEnv+"="+name, "JAIL_TMP="+t.TempDir()), env...)
	cmd.SysProcAttr = attr
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("helper %s: %v", name, err)
	}
	return out.String(), cmd.ProcessState.Sys().(syscall.WaitStatus)
}

func expectHelperOK(t *testing.T, name string, attr *syscall.SysProcAttr) string {
	t.Helper()
	out, ws := runHelper(t, name, attr)
	if !ws.Exited() || ws.ExitStatus() != 0 || !strings.Contains(out, "HELPER OK") {
		t.Fatalf("helper %s: %v\n%s", name, ws, out)
	}
	if testing.Verbose() {
		t.Logf("helper %s:\n%s", name, out)
	}
	return out
}

// TestHelpersOK runs the helpers that check their case themselves: strict
// refuses and the Go runtime still works, vmm's fork+exec, log mode
// allows, capabilities dropped, a long program loads.
func TestHelpersOK(t *testing.T) {
	needRoot(t)
	for _, name := range []string{"strict", "vmm", "log", "caps", "long"} {
		t.Run(name, func(t *testing.T) {
			if _, err := os.Stat("/bin/true"); err != nil && name == "vmm" {
				t.Skip("no /bin/true")
			}
			expectHelperOK(t, name, nil)
		})
	}
}

func TestGoRuntimeUnderKillMode(t *testing.T) {
	needRoot(t)
	for _, name := range []string{"strictkill", "vmmkill", "spawned"} {
		out, ws := runHelper(t, name, nil)
		if ws.Signaled() && ws.Signal() == syscall.SIGSYS {
			t.Errorf("%s: a syscall the table lacks killed the helper (see dmesg / audit log)\n%s", name, out)
			continue
		}
		if !ws.Exited() || ws.ExitStatus() != 0 || !strings.Contains(out, "HELPER OK") {
			t.Errorf("%s: %v\n%s", name, ws, out)
		}
	}
}

func TestKillMode(t *testing.T) {
	needRoot(t)
	out, ws := runHelper(t, "kill", nil)
	if !ws.Signaled() || ws.Signal() != syscall.SIGSYS {
		t.Fatalf("want death by SIGSYS, got %v\n%s", ws, out)
	}
	if !strings.Contains(out, "installed") || strings.Contains(out, "survived") {
		t.Fatalf("unexpected output:\n%s", out)
	}
}

func TestSysProcAttrNamespaces(t *testing.T) {
	needRoot(t)
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	cmd := exec.Command("/bin/sh", "-c", "echo $$; readlink /proc/self/ns/net; readlink /proc/self/ns/mnt; readlink /proc/self/ns/uts")
	cmd.SysProcAttr = SysProcAttr(NSOptions{NetNS: true})
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	lines := strings.Fields(string(out))
	if len(lines) != 4 {
		t.Fatalf("output %q", out)
	}
	if lines[0] != "1" {
		t.Errorf("pid in the new namespace is %s, want 1", lines[0])
	}
	for i, ns := range []string{"net", "mnt", "uts"} {
		mine, err := os.Readlink("/proc/self/ns/" + ns)
		if err != nil {
			t.Fatal(err)
		}
		if lines[i+1] == mine {
			t.Errorf("%s namespace not new: %s", ns, mine)
		}
	}
	// Without NetNS the network namespace is the daemon's.
	cmd = exec.Command("/bin/sh", "-c", "readlink /proc/self/ns/net")
	cmd.SysProcAttr = SysProcAttr(NSOptions{})
	out, err = cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if mine, _ := os.Readlink("/proc/self/ns/net"); strings.TrimSpace(string(out)) != mine {
		t.Errorf("net namespace changed without NetNS: %s vs %s", out, mine)
	}
	if a := SysProcAttr(NSOptions{}); a.Pdeathsig != syscall.SIGKILL {
		t.Errorf("Pdeathsig %v", a.Pdeathsig)
	}
}

// TestUserKeepsCaps: leaving root with KeepCaps (a network VMM's CAP_BPF
// where BPFNeedsCap) keeps exactly those, on every thread, and they
// survive the execve of a fork child.
func TestUserKeepsCaps(t *testing.T) {
	needRoot(t)
	expectHelperOK(t, "userkeep", nil)
}

func TestKernelVersion(t *testing.T) {
	for rel, want := range map[string][2]int{"6.1.0-27-amd64": {6, 1}, "6.18.44-fc-v1045": {6, 18}, "5.15.0": {5, 15}, "6.5rc1": {6, 5}} {
		maj, min, ok := kernelVersion(rel)
		if !ok || maj != want[0] || min != want[1] {
			t.Errorf("%s: %d.%d %v", rel, maj, min, ok)
		}
	}
	if _, _, ok := kernelVersion("garbage"); ok {
		t.Error("garbage parsed")
	}
}

func TestEnterInNamespaces(t *testing.T) {
	needRoot(t)
	expectHelperOK(t, "enter", SysProcAttr(NSOptions{NetNS: true}))
}

// --- helpers (run in the subprocess) ---

func mountTmpfs() error {
	return unix.Mount("none", os.Getenv("JAIL_TMP"), "tmpfs", 0, "")
}

func helperStrict(h *helper) {
	if err := Install(ProfileStrict, Options{}); err != nil {
		h.failf("install: %v", err)
		return
	}
	h.logf("installed strict filter")
	checkForbidden(h)
	checkIoctls(h)

	// Process creation is refused.
	r, _, e := syscall.RawSyscall(unix.SYS_CLONE, uintptr(unix.SIGCHLD), 0, 0)
	if e == 0 && r == 0 {
		syscall.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0) // the child, if any
	}
	h.wantErrno("clone(SIGCHLD) (fork)", errnoErr(e), unix.EPERM)
	_, _, e = syscall.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)
	h.wantErrno("clone3", errnoErr(e), unix.ENOSYS)
	h.wantErrno("execve", syscall.Exec("/bin/true", []string{"true"}, nil), unix.EPERM)
	h.wantErrno("os/exec", exec.Command("/bin/true").Run(), unix.EPERM)
	h.wantErrno("kill(1, 0)", syscall.Kill(1, 0), unix.EPERM)
	h.wantOK("kill(self, 0)", syscall.Kill(os.Getpid(), 0))
	h.wantErrno("setresuid", syscall.Setresuid(0, 0, 0), unix.EPERM)
	h.wantErrno("socket(AF_NETLINK)", sockErr(unix.AF_NETLINK, unix.SOCK_RAW), unix.EPERM)
	h.wantErrno("bpf(BPF_MAP_LOOKUP_ELEM)", bpfErr(unix.BPF_MAP_LOOKUP_ELEM), unix.EPERM)

	checkGoRuntime(h)
}

func sockErr(domain, typ int) error {
	fd, err := unix.Socket(domain, typ, 0)
	if err == nil {
		unix.Close(fd)
	}
	return err
}

func bpfErr(cmd uintptr) error {
	_, _, e := syscall.Syscall(unix.SYS_BPF, cmd, 0, 0)
	return errnoErr(e)
}

// checkForbidden: calls root could make without the filter (so EPERM can
// only come from it) or whose unfiltered error differs from EPERM.
func checkForbidden(h *helper) {
	h.wantErrno("mount", mountTmpfs(), unix.EPERM)
	_, _, e := syscall.Syscall(unix.SYS_PTRACE, unix.PTRACE_TRACEME, 0, 0)
	h.wantErrno("ptrace(PTRACE_TRACEME)", errnoErr(e), unix.EPERM)
	h.wantErrno("socket(AF_PACKET)", sockErr(unix.AF_PACKET, unix.SOCK_RAW), unix.EPERM)
	h.wantErrno("socket(AF_VSOCK)", sockErr(unix.AF_VSOCK, unix.SOCK_STREAM), unix.EPERM)
	runtime.LockOSThread() // if unshare worked, keep the damage on one thread
	h.wantErrno("unshare(CLONE_NEWNS)", unix.Unshare(unix.CLONE_NEWNS), unix.EPERM)
	h.wantErrno("unshare(CLONE_NEWUSER)", unix.Unshare(unix.CLONE_NEWUSER), unix.EPERM)
	runtime.UnlockOSThread()
	h.wantErrno("bpf(BPF_PROG_LOAD)", bpfErr(unix.BPF_PROG_LOAD), unix.EPERM)
	_, _, e = syscall.Syscall6(unix.SYS_KEXEC_LOAD, 0, 0, 0, 0, 0, 0)
	h.wantErrno("kexec_load", errnoErr(e), unix.EPERM)
	_, _, e = syscall.Syscall(unix.SYS_INIT_MODULE, 0, 0, 0)
	h.wantErrno("init_module", errnoErr(e), unix.EPERM)
	_, _, e = syscall.Syscall(unix.SYS_SETNS, 0, 0, 0)
	h.wantErrno("setns", errnoErr(e), unix.EPERM)
	_, _, e = syscall.Syscall(unix.SYS_USERFAULTFD, 0, 0, 0)
	h.wantErrno("userfaultfd", errnoErr(e), unix.EPERM)
	_, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE|unix.PROT_EXEC, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	h.wantErrno("mmap(PROT_WRITE|PROT_EXEC)", err, unix.EPERM)
}

func checkIoctls(h *helper) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		h.failf("pipe2: %v", err)
		return
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	h.wantOK("ioctl(FIONBIO) on a pipe", unix.IoctlSetPointerInt(p[0], fionbio, 1))
	// Allowed numbers reach the driver, which knows nothing of them.
	_, _, e := syscall.Syscall(unix.SYS_IOCTL, uintptr(p[0]), 0xae80, 0)
	h.wantErrno("ioctl(KVM_RUN) on a pipe reaches the pipe", errnoErr(e), unix.ENOTTY)
	var c byte = 'x'
	_, _, e = syscall.Syscall(unix.SYS_IOCTL, uintptr(p[0]), unix.TIOCSTI, uintptr(unsafe.Pointer(&c)))
	h.wantErrno("ioctl(TIOCSTI)", errnoErr(e), unix.EPERM)
	_, _, e = syscall.Syscall(unix.SYS_IOCTL, uintptr(p[0]), 0xdeadbeef, 0)
	h.wantErrno("ioctl(0xdeadbeef)", errnoErr(e), unix.EPERM)
	_, _, e = syscall.Syscall(unix.SYS_IOCTL, uintptr(p[0]), 0xae01, 0)
	h.wantErrno("ioctl(KVM_CREATE_VM) in strict", errnoErr(e), unix.EPERM)
}

// checkGoRuntime exercises what a Go VMM does all day.
func checkGoRuntime(h *helper) {
	// Threads: locked goroutines force new Ms (clone with CLONE_THREAD).
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			time.Sleep(20 * time.Millisecond)
		})
	}
	wg.Wait()
	h.logf("ok: 32 locked goroutines")

	// Memory: enough garbage for many GCs, then return it to the OS.
	var keep [][]byte
	for i := range 400 {
		b := make([]byte, 1<<20)
		b[i%len(b)] = 1
		if i%50 == 0 {
			keep = append(keep, b)
		}
	}
	runtime.GC()
	debug.FreeOSMemory()
	h.logf("ok: 400 MiB allocated, GC, FreeOSMemory (%d kept)", len(keep))

	// Timers and tickers.
	tk := time.NewTicker(time.Millisecond)
	for range 5 {
		<-tk.C
	}
	tk.Stop()
	fired := make(chan struct{})
	time.AfterFunc(5*time.Millisecond, func() { close(fired) })
	select {
	case <-fired:
		h.logf("ok: timers")
	case <-time.After(5 * time.Second):
		h.failf("timer did not fire")
	}

	// Signals to itself (os/signal, rt_sigaction, kill).
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	syscall.Kill(os.Getpid(), syscall.SIGUSR1)
	select {
	case <-sig:
		h.logf("ok: SIGUSR1 to self")
	case <-time.After(5 * time.Second):
		h.failf("SIGUSR1 not delivered")
	}
	signal.Stop(sig)

	h.wantOK("tcp loopback round trip", roundTrip("tcp", "127.0.0.1:0"))
	dir := os.Getenv("JAIL_TMP")
	h.wantOK("unix socket round trip", roundTrip("unix", filepath.Join(dir, "s.sock")))
	h.wantOK("udp loopback round trip", udpRoundTrip())
	h.wantOK("files", files(dir))
	h.wantOK("memfd_create + mmap", memfd())
}

func roundTrip(network, addr string) error {
	ln, err := net.Listen(network, addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c)
	}()
	c, err := net.DialTimeout(network, ln.Addr().String(), 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	msg := bytes.Repeat([]byte("warren"), 10000)
	go c.Write(msg)
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if !bytes.Equal(got, msg) {
		return errors.New("echo differs")
	}
	return nil
}

func udpRoundTrip() error {
	a, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer a.Close()
	b, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer b.Close()
	if _, err := b.WriteTo([]byte("ping"), a.LocalAddr()); err != nil {
		return err
	}
	a.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 16)
	n, _, err := a.ReadFrom(buf)
	if err != nil {
		return err
	}
	if string(buf[:n]) != "ping" {
		return fmt.Errorf("got %q", buf[:n])
	}
	return nil
}

func files(dir string) error {
	d, err := os.MkdirTemp(dir, "f")
	if err != nil {
		return err
	}
	p := filepath.Join(d, "a")
	if err := os.WriteFile(p, []byte("snapshot"), 0o600); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteAt([]byte("S"), 0); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Truncate(4096); err != nil {
		return err
	}
	f.Close()
	if err := os.Rename(p, p+".new"); err != nil {
		return err
	}
	b, err := os.ReadFile(p + ".new")
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(b, []byte("Snapshot")) {
		return fmt.Errorf("read back %q", b[:8])
	}
	ents, err := os.ReadDir(d)
	if err != nil || len(ents) != 1 {
		return fmt.Errorf("readdir: %v %v", ents, err)
	}
	if _, err := os.Stat(p + ".new"); err != nil {
		return err
	}
	return os.RemoveAll(d)
}

func memfd() error {
	fd, err := unix.MemfdCreate("jail", unix.MFD_CLOEXEC)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 1<<20); err != nil {
		return err
	}
	m, err := unix.Mmap(fd, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	m[4096] = 42
	if err := unix.Munmap(m); err != nil {
		return err
	}
	var b [1]byte
	if _, err := unix.Pread(fd, b[:], 4096); err != nil {
		return err
	}
	if b[0] != 42 {
		return fmt.Errorf("read back %d", b[0])
	}
	return nil
}

func helperVMM(h *helper) {
	if err := Install(ProfileVMM, Options{}); err != nil {
		h.failf("install: %v", err)
		return
	}
	h.logf("installed vmm filter")
	h.wantOK("fork+exec /bin/true", exec.Command("/bin/true").Run())
	checkGoChild(h)
	// Setsid and Pdeathsig, as the fork API uses them.
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	h.wantOK("exec with Setsid+Pdeathsig", cmd.Run())
	cmd = exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER}
	h.wantErrno("exec in a new user namespace", cmd.Run(), unix.EPERM)
	h.wantErrno("mount", mountTmpfs(), unix.EPERM)
	h.wantErrno("socket(AF_PACKET)", sockErr(unix.AF_PACKET, unix.SOCK_RAW), unix.EPERM)
	h.wantOK("socket(AF_NETLINK)", sockErr(unix.AF_NETLINK, unix.SOCK_RAW))
	_, _, e := syscall.Syscall(unix.SYS_PTRACE, unix.PTRACE_TRACEME, 0, 0)
	h.wantErrno("ptrace", errnoErr(e), unix.EPERM)
	h.wantErrno("bpf(BPF_PROG_LOAD)", bpfErr(unix.BPF_PROG_LOAD), unix.EPERM)
	// A map op on a bad fd reaches the kernel.
	if err := bpfErr(unix.BPF_MAP_LOOKUP_ELEM); errors.Is(err, unix.EPERM) {
		h.failf("bpf(BPF_MAP_LOOKUP_ELEM) refused: %v", err)
	} else {
		h.logf("ok: bpf(BPF_MAP_LOOKUP_ELEM) reaches the kernel: %v", err)
	}
	// A child can stack a stricter filter of its own (the fork child).
	checkGoRuntime(h)
}

// checkGoChild: a Go child (like `warren fork-child`) starts and runs under
// the inherited filter.
func checkGoChild(h *helper) {
	self, err := os.Executable()
	if err != nil {
		h.failf("executable: %v", err)
		return
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=noop")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "HELPER OK") {
		h.failf("go child: %v: %s", err, out)
		return
	}
	h.logf("ok: go child ran under the inherited filter")
}

func helperKill(h *helper) {
	if err := Install(ProfileStrict, Options{Mode: ModeKill}); err != nil {
		h.failf("install: %v", err)
		return
	}
	h.logf("installed kill filter")
	os.Stdout.Sync()
	mountTmpfs()
	h.logf("survived mount")
}

func helperLog(h *helper) {
	if err := Install(ProfileStrict, Options{Mode: ModeLog}); err != nil {
		h.failf("install: %v", err)
		return
	}
	// getpriority is not listed: logged, and allowed.
	_, _, e := syscall.Syscall(unix.SYS_GETPRIORITY, unix.PRIO_PROCESS, 0, 0)
	h.wantOK("getpriority in log mode", errnoErr(e))
	_, _, e = syscall.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)
	h.wantErrno("clone3 in log mode", errnoErr(e), unix.ENOSYS)
}

// capLines reads the capability sets of every thread.
func capLines() (map[string][]string, error) {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, err
	}
	got := map[string][]string{}
	for _, tk := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + tk.Name() + "/status")
		if err != nil {
			continue // thread exited
		}
		for l := range strings.Lines(string(b)) {
			k, v, ok := strings.Cut(l, ":")
			if ok && strings.HasPrefix(k, "Cap") {
				got[k] = append(got[k], strings.TrimSpace(v))
			}
		}
	}
	return got, nil
}

func helperCaps(h *helper) {
	// Threads that exist before the drop must lose their capabilities
	// too: park some on locked OS threads.
	defer parkThreads(8)()

	keep := []uintptr{unix.CAP_NET_ADMIN}
	if err := DropCapabilities(keep); err != nil {
		h.failf("drop: %v", err)
		return
	}
	want := fmt.Sprintf("%016x", CapMask(keep))
	caps, ok := capsAre(h, want, "CapEff", "CapPrm", "CapInh", "CapBnd")
	if !ok {
		return
	}
	threads := len(caps["CapEff"])
	if threads < 9 {
		h.failf("only %d threads seen", threads)
	}
	for _, v := range caps["CapAmb"] {
		if v != "0000000000000000" {
			h.failf("CapAmb = %s", v)
		}
	}
	h.logf("ok: %d threads have CapEff=CapPrm=CapInh=CapBnd=%s", threads, want)

	// No seccomp here: the kernel refuses for lack of CAP_SYS_ADMIN, on
	// whatever thread the goroutine runs.
	for range 4 {
		runtime.LockOSThread()
		h.wantErrno("unshare(CLONE_NEWNS)", unix.Unshare(unix.CLONE_NEWNS), unix.EPERM)
		runtime.UnlockOSThread()
	}
	h.wantErrno("mount", mountTmpfs(), unix.EPERM)
	h.wantErrno("chroot", unix.Chroot("/"), unix.EPERM)
	// CAP_NET_ADMIN is still there.
	if strings.Contains(readStatus("Seccomp"), "2") {
		h.failf("a filter is installed")
	}
}

// parkThreads parks n goroutines on locked OS threads (threads that exist
// before a change of per-thread state, which must reach them too) and
// returns the function that lets them go.
func parkThreads(n int) func() {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			runtime.LockOSThread()
			<-stop
		})
	}
	time.Sleep(10 * time.Millisecond)
	return func() { close(stop); wg.Wait() }
}

// capsAre checks that every thread's capability sets named keys are want;
// it returns every thread's sets, and false if they could not be read.
func capsAre(h *helper, want string, keys ...string) (map[string][]string, bool) {
	caps, err := capLines()
	if err != nil {
		h.failf("%v", err)
		return nil, false
	}
	for _, k := range keys {
		for _, v := range caps[k] {
			if v != want {
				h.failf("%s = %s on some thread, want %s (all: %v)", k, v, want, caps[k])
				break
			}
		}
	}
	return caps, true
}

func readStatus(key string) string {
	b, _ := os.ReadFile("/proc/self/status")
	for l := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(l, ":"); ok && k == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func helperEnter(h *helper) {
	if os.Getpid() != 1 {
		h.failf("not pid 1 of a new pid namespace: %d", os.Getpid())
	}
	// The temp dir must stay usable after leaving root.
	dir := os.Getenv("JAIL_TMP")
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chown(d, 65534, 65534); err != nil {
			h.failf("chown: %v", err)
		}
	}
	// Setup a VMM would do: loopback up in its new network namespace.
	if err := loopbackUp(); err != nil {
		h.failf("lo up: %v", err)
	}
	err := Enter(Config{
		Mounts:  &MountOptions{Proc: true},
		User:    &User{UID: 65534, GID: 65534},
		Profile: ProfileStrict,
	})
	if err != nil {
		h.failf("enter: %v", err)
		return
	}
	h.logf("entered")
	// The new /proc shows the new pid namespace: only this process.
	ents, err := os.ReadDir("/proc")
	if err != nil {
		h.failf("readdir /proc: %v", err)
	}
	var pids []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, e.Name())
		}
	}
	if !slices.Equal(pids, []string{"1"}) {
		h.failf("/proc shows pids %v, want [1]", pids)
	} else {
		h.logf("ok: /proc shows only pid 1")
	}
	for _, k := range []string{"Uid", "Gid"} {
		if f := strings.Fields(readStatus(k)); len(f) != 4 || slices.ContainsFunc(f, func(s string) bool { return s != "65534" }) {
			h.failf("%s: %v", k, f)
		}
	}
	caps, _ := capLines()
	for _, k := range []string{"CapEff", "CapPrm", "CapBnd"} {
		for _, v := range caps[k] {
			if v != "0000000000000000" {
				h.failf("%s = %s", k, v)
			}
		}
	}
	if readStatus("NoNewPrivs") != "1" || readStatus("Seccomp") != "2" {
		h.failf("NoNewPrivs %s, Seccomp %s", readStatus("NoNewPrivs"), readStatus("Seccomp"))
	} else {
		h.logf("ok: uid/gid 65534, no capabilities, no_new_privs, seccomp filter")
	}
	h.wantErrno("mount", unix.Mount("none", "/tmp", "tmpfs", 0, ""), unix.EPERM)
	checkGoRuntime(h)
}

func helperUserKeep(h *helper) {
	defer parkThreads(4)()
	keep := []uintptr{unix.CAP_BPF}
	if err := Enter(Config{User: &User{UID: 65534, GID: 65534}, KeepCaps: keep, Profile: ProfileVMM}); err != nil {
		h.failf("enter: %v", err)
		return
	}
	want := fmt.Sprintf("%016x", CapMask(keep))
	if _, ok := capsAre(h, want, "CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb"); !ok {
		return
	}
	if f := strings.Fields(readStatus("Uid")); len(f) != 4 || f[0] != "65534" || f[3] != "65534" {
		h.failf("Uid: %v", f)
	}
	out, err := exec.Command("/bin/cat", "/proc/self/status").Output()
	if err != nil {
		h.failf("exec a child: %v", err)
		return
	}
	for l := range strings.Lines(string(out)) {
		if k, v, ok := strings.Cut(l, ":"); ok && (k == "CapEff" || k == "CapAmb") && strings.TrimSpace(v) != want {
			h.failf("the exec'd child's %s = %s, want %s", k, strings.TrimSpace(v), want)
		}
	}
	h.logf("ok: uid 65534 with only CAP_BPF, ambient, and so in an exec'd child")
}

func helperLong(h *helper) {
	rules := longRules(rulesFor(ProfileStrict, Options{}, os.Getpid()))
	f, err := assembleFilter(ProfileStrict, Options{}, rules)
	if err != nil {
		h.failf("assemble: %v", err)
		return
	}
	if err := f.Install(); err != nil {
		h.failf("kernel refused a %d-instruction program: %v", len(f.Program), err)
		return
	}
	h.logf("ok: kernel loaded a %d-instruction program", len(f.Program))
	// Fake numbers above the kernel's table pass the filter and get ENOSYS.
	_, _, e := syscall.Syscall(1500, 0, 0, 0)
	h.wantErrno("syscall 1500 (allowed, unknown to the kernel)", errnoErr(e), unix.ENOSYS)
	_, _, e = syscall.Syscall(1900, 0, 7003, 0)
	h.wantErrno("syscall 1900 with a listed argument", errnoErr(e), unix.ENOSYS)
	_, _, e = syscall.Syscall(1900, 0, 7004, 0)
	h.wantErrno("syscall 1900 with another argument", errnoErr(e), unix.EPERM)
	_, _, e = syscall.Syscall(1600, 0, 0, 0)
	h.wantErrno("syscall 1600 (not listed)", errnoErr(e), unix.EPERM)
	h.wantErrno("mount", mountTmpfs(), unix.EPERM)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { runtime.LockOSThread(); time.Sleep(time.Millisecond) })
	}
	wg.Wait()
	h.logf("ok: threads still start")
}

func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}
