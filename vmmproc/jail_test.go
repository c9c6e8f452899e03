package vmmproc

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warrenvm/warren/vmmproc/jail"
	"github.com/warrenvm/warren/vmmproc/jail/jailtest"
	"golang.org/x/sys/unix"
)

func TestParseJail(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string
		err  bool
	}{
		{"", "", false}, {"off", "", false}, {"strict", "strict", false}, {"vmm", "vmm", false},
		{"vmm,log", "vmm,log", false}, {"strict,kill", "strict,kill", false}, {"strict,errno", "strict", false},
		{"loose", "", true}, {"vmm,shout", "", true}, {",log", "", true},
	} {
		j, err := ParseJail(c.in)
		if (err != nil) != c.err || (err == nil && j.String() != c.want) {
			t.Errorf("ParseJail(%q) = %q, %v", c.in, j.String(), err)
		}
	}
	// A VMM with a tap keeps what its fork children need under vmm only.
	vmm, _ := ParseJail("vmm")
	strict, _ := ParseJail("strict")
	if cfg := jailConfig(vmm, &vmOptions{tap: "t0"}); len(cfg.KeepCaps) != 2 {
		t.Errorf("vmm with a tap keeps %v", cfg.KeepCaps)
	}
	if cfg := jailConfig(strict, &vmOptions{tap: "t0"}); len(cfg.KeepCaps) != 0 {
		t.Errorf("strict with a tap keeps %v", cfg.KeepCaps)
	}
}

const jailHelperEnv = "WARREN_JAIL_HELPER"

// TestJailRefusesForbiddenSyscall runs the setup `--jail` runs (enterJail)
// in a subprocess started the way the daemon starts a VMM (new mount, ipc
// and uts namespaces, its own session) and checks there that forbidden
// syscalls (mount, umount2, unshare, ptrace, and under strict fork+exec)
// fail with EPERM, that no capability and no_new_privs and the filter are
// in force, and that the Go runtime keeps working (threads, GC, timers,
// files, pipes).
func TestJailRefusesForbiddenSyscall(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (capabilities, namespaces and seccomp are set up for real)")
	}
	exe := jailtest.Exe(t)
	for _, prof := range []string{"strict", "vmm"} {
		t.Run(prof, func(t *testing.T) {
			cmd := exec.Command(exe, "-test.run=^TestJailHelper$", "-test.v")
			cmd.Env = append(os.Environ(), jailHelperEnv+"="+prof)
			attr := jail.SysProcAttr(jail.NSOptions{NoPidNS: true})
			attr.Pdeathsig = 0
			cmd.SysProcAttr = attr
			out, err := cmd.CombinedOutput()
			t.Logf("helper (%s):\n%s", prof, out)
			if err != nil {
				t.Fatalf("helper: %v", err)
			}
			if !strings.Contains(string(out), "JAIL-HELPER-OK "+prof) {
				t.Fatal("the helper did not finish its checks")
			}
		})
	}
}

// TestJailHelper is the subprocess of TestJailRefusesForbiddenSyscall.
func TestJailHelper(t *testing.T) {
	prof := os.Getenv(jailHelperEnv)
	if prof == "" {
		t.Skip("only run as TestJailRefusesForbiddenSyscall's subprocess")
	}
	child := strings.HasSuffix(prof, "-child")
	// A "-child" is a fork child of a jailed VMM: born under its filter.
	p := &process{forkChild: child}
	prof = strings.TrimSuffix(prof, "-child")
	js, err := ParseJail(prof)
	if err != nil {
		t.Fatal(err)
	}
	if !child && !ownMountNS(p) {
		t.Fatal("the helper should be in a mount namespace of its own")
	}
	// Threads exist before the jail (the filter reaches them all: TSYNC).
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			for {
				select {
				case <-stop:
					return
				default:
					_ = make([]byte, 1<<16)
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	if err := enterJail(js, &vmOptions{proc: p}, nil); err != nil {
		t.Fatal(err)
	}
	if p.currentJail() != prof {
		t.Fatalf("currentJail %q", p.currentJail())
	}
	eperm := func(what string, err error) {
		t.Helper()
		if err != unix.EPERM && err != syscall.EPERM {
			t.Errorf("%s: %v, want EPERM", what, err)
		} else {
			t.Logf("%s refused: %v", what, err)
		}
	}
	dir := t.TempDir()
	eperm("mount", unix.Mount("none", dir, "tmpfs", 0, ""))
	eperm("umount2", unix.Unmount("/proc", unix.MNT_DETACH))
	eperm("unshare", unix.Unshare(unix.CLONE_NEWNS))
	eperm("ptrace", unix.PtraceAttach(os.Getppid()))
	_, _, e := unix.Syscall(unix.SYS_SETNS, 0, 0, 0)
	eperm("setns", e)
	_, _, e = unix.Syscall(unix.SYS_KEXEC_LOAD, 0, 0, 0)
	eperm("kexec_load", e)
	// personality(0xffffffff) only reads the persona and needs no
	// privilege: only the filter refuses it.
	_, _, e = unix.Syscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0)
	eperm("personality (query)", e)
	if prof == "strict" {
		eperm("fork+exec", errnoOf(exec.Command("/bin/true").Run()))
	} else if _, err := os.Stat("/bin/true"); err == nil {
		if err := exec.Command("/bin/true").Run(); err != nil {
			t.Errorf("vmm: fork+exec: %v", err)
		}
	}
	if prof == "vmm" && !child {
		// What `warren fork-child` does under the inherited jail.
		exe, _ := os.Executable()
		cmd := exec.Command(exe, "-test.run=^TestJailHelper$", "-test.v")
		cmd.Env = append(os.Environ(), jailHelperEnv+"=vmm-child")
		out, err := cmd.CombinedOutput()
		t.Logf("fork child:\n%s", out)
		if err != nil || !strings.Contains(string(out), "JAIL-HELPER-OK vmm") {
			t.Errorf("fork child: %v", err)
		}
	}
	// No capabilities, no_new_privs, a filter.
	st, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(st), "Seccomp_filters:\t1\n"); n != 1 && strings.Contains(string(st), "Seccomp_filters:") {
		t.Errorf("more than one seccomp filter stacked")
	}
	for _, want := range []string{"CapEff:\t0000000000000000", "CapPrm:\t0000000000000000", "CapBnd:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2"} {
		if !strings.Contains(string(st), want) {
			t.Errorf("/proc/self/status lacks %q", want)
		}
	}
	// The Go runtime keeps working.
	runtime.GC()
	f := filepath.Join(dir, "f")
	if err := os.WriteFile(f, []byte("still works"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(f); err != nil || string(b) != "still works" {
		t.Fatalf("file: %q %v", b, err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	go func() { w.Write([]byte("x")); w.Close() }()
	if b := make([]byte, 1); func() error { _, err := r.Read(b); return err }() != nil {
		t.Fatal("pipe")
	}
	timer := time.After(20 * time.Millisecond)
	<-timer
	close(stop)
	wg.Wait()
	if t.Failed() {
		return
	}
	fmt.Println("JAIL-HELPER-OK " + prof)
}

func errnoOf(err error) error {
	for err != nil {
		if e, ok := err.(syscall.Errno); ok {
			return e
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return err
		}
		err = u.Unwrap()
	}
	return nil
}

// TestParseJailConfinement: the daemon's confinement options, and the
// ways a command line could widen them (root as the user, relative or
// unclean binds, binds without a root, unknown devices) refused; a fork
// child's spec carries the profile and mode only.
func TestParseJailConfinement(t *testing.T) {
	j, err := ParseJail("vmm,log,root=/s/jail,user=200001:200001,bind=/s/sb:rw,bind=/bin/warren:exec,dev=kvm,dev=null")
	if err != nil {
		t.Fatal(err)
	}
	if j.String() != "vmm,log" || j.user == nil || j.user.UID != 200001 || j.root == nil || j.root.Dir != "/s/jail" ||
		len(j.root.Binds) != 2 || !j.root.Binds[0].Writable || j.root.Binds[0].Exec || !j.root.Binds[1].Exec || j.root.Binds[1].Writable ||
		len(j.root.Devices) != 2 || j.root.Owner != j.user {
		t.Fatalf("parsed %+v root %+v", j, j.root)
	}
	if _, err := ParseJail("vmm,user=200001:200001"); err != nil {
		t.Errorf("user without root: %v", err)
	}
	if g, err := ParseJail("vmm,user=200002:200002,groups=200001:200000"); err != nil || !slices.Equal(g.user.Groups, []int{200001, 200000}) {
		t.Errorf("a fork child's groups: %+v, %v", g.user, err)
	}
	for _, bad := range []string{
		"vmm,user=0:0", "vmm,user=0:5", "vmm,user=5", "vmm,user=-1:-1", "vmm,user=1:1,user=2:2",
		"vmm,root=rel", "vmm,root=/a,root=/b", "vmm,root=/a:b",
		"vmm,root=/j,bind=rel", "vmm,root=/j,bind=/a/../etc", "vmm,root=/j,bind=/", "vmm,root=/j,bind=/a:suid",
		"vmm,bind=/a", "vmm,dev=kvm", "vmm,root=/j,dev=sda", "vmm,root=/j,shell=/bin/sh",
		"off,root=/j", "vmm,root=/j,log",
		"vmm,groups=5", "vmm,user=5:5,groups=0", "vmm,user=5:5,groups=a", "vmm,user=5:5,groups=6,groups=7",
	} {
		if j, err := ParseJail(bad); err == nil {
			t.Errorf("ParseJail(%q) accepted: %+v", bad, j)
		}
	}
	// With a user, a tap's fork capabilities are not kept (they could not
	// survive leaving root anyway).
	if cfg := jailConfig(j, &vmOptions{tap: "t0"}); len(cfg.KeepCaps) != 0 || cfg.User == nil {
		t.Errorf("confined VMM with a tap: keeps %v, user %v", cfg.KeepCaps, cfg.User)
	}
}

// TestJailSpawned: a VMM whose jail-init starts its fork children (a
// helper socket and jail.SpawnEnv) gets the filter without process
// making (jail.Options.Spawned); one without either keeps ProfileVMM's.
func TestJailSpawned(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	j := JailSpec{profile: jail.ProfileVMM, mode: jail.ModeErrno}
	for _, c := range []struct {
		helper *os.File
		env    string
		want   bool
	}{{r, "1", true}, {r, "", false}, {nil, "1", false}} {
		t.Setenv(jail.SpawnEnv, c.env)
		if got := jailConfig(j, &vmOptions{proc: newProcessWith(c.helper, false)}).Seccomp.Spawned; got != c.want {
			t.Errorf("helper %v, $%s=%q: Spawned %v, want %v", c.helper != nil, jail.SpawnEnv, c.env, got, c.want)
		}
	}
}
