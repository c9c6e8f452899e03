//go:build linux && amd64

package jail

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// initArgsEnv has the test binary run RunInit with these arguments
// (separated by \x1f, the unit separator) instead of the tests.
const initArgsEnv = "JAIL_INIT_ARGS"

// initReportEnv has it report on fd 3.
const initReportEnv = "JAIL_INIT_REPORT"

// TestRunInit: RunInit, pid 1 of a new pid namespace, reports its
// command's PID (in the caller's namespace, through SCM_CREDENTIALS), runs
// it with the namespace's own /proc, keeps the command's orphans alive
// (they are its children once the command ends) and reaps them, exits
// only once the namespace is empty, with the command's exit status;
// HostPID maps a PID of the namespace to the caller's.
func TestRunInit(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	pidFile, orphanFile := filepath.Join(dir, "pid"), filepath.Join(dir, "orphan")
	script := `echo "$$ $(ls /proc | grep -c '^[0-9]') $` + InitEnv + `" > ` + pidFile + `.tmp && mv ` + pidFile + `.tmp ` + pidFile + `
(sleep 1.5; echo done > ` + orphanFile + `) &
sleep 1
exit 3`
	parent, child, err := InitReport()
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	mnt, err := ParentMountNS()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), initArgsEnv+"="+strings.Join([]string{"/bin/sh", "-c", script}, "\x1f"), initReportEnv+"=1", mnt)
	cmd.ExtraFiles = []*os.File{child}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = SysProcAttr(NSOptions{})
	cmd.SysProcAttr.Pdeathsig = 0
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	child.Close()
	reported, err := ReceivePID(parent, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var nsPID, procs int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if b, err := os.ReadFile(pidFile); err == nil {
			f := strings.Fields(string(b))
			nsPID, _ = strconv.Atoi(f[0])
			procs, _ = strconv.Atoi(f[1])
			if len(f) < 3 || f[2] != "1" {
				t.Errorf("the command's $%s: %q, want 1", InitEnv, f[2:])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command did not start: %s", out.String())
		}
	}
	// (The command has run a while now: its command line is readable.)
	if b, _ := os.ReadFile("/proc/" + strconv.Itoa(reported) + "/cmdline"); !bytes.HasPrefix(b, []byte("/bin/sh\x00-c")) {
		t.Errorf("the reported pid %d runs %q, want the command", reported, b)
	}
	host, err := HostPID(cmd.Process.Pid, nsPID)
	if err != nil {
		t.Fatal(err)
	}
	if host == nsPID || host == cmd.Process.Pid || host != reported {
		t.Errorf("HostPID(%d, %d) = %d: want the shell's PID here", cmd.Process.Pid, nsPID, host)
	}
	if b, _ := os.ReadFile("/proc/" + strconv.Itoa(host) + "/cmdline"); !bytes.HasPrefix(b, []byte("/bin/sh\x00-c")) {
		t.Errorf("HostPID gave %d, running %q", host, b)
	}
	if same, _ := HostPID(os.Getpid(), 1); same != 1 {
		t.Errorf("HostPID in the caller's own namespace: %d, want 1", same)
	}
	if _, err := HostPID(cmd.Process.Pid, 99999); err == nil {
		t.Error("HostPID of no process: no error")
	}
	// The namespace's /proc shows only its own processes (the init's
	// threads, the shell, ls, grep), not the host's.
	if procs < 3 || procs > 40 {
		t.Errorf("the command's /proc lists %d processes", procs)
	}
	err = cmd.Wait()
	took := time.Since(start)
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 3 {
		t.Fatalf("RunInit ended with %v, want exit 3: %s", err, out.String())
	}
	if _, err := os.Stat(orphanFile); err != nil || took < 1500*time.Millisecond {
		t.Fatalf("RunInit ended after %s, before the command's orphan (%v)", took, err)
	}
}

// TestRunInitOwnMountNS: RunInit refuses to run (and so to make mounts
// private) in the mount namespace of the process that started it, or
// when it is not told which that is.
func TestRunInitOwnMountNS(t *testing.T) {
	needRoot(t)
	mnt, err := ParentMountNS()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		env  []string
	}{
		// (In a throwaway mount namespace of initWrapEnv's process,
		// which RunInit shares: were the check broken, its mounts are
		// the ones changed, not the host's.)
		{"the starter's namespace", []string{initWrapEnv + "=1"}},
		{"not told", nil},
		{"told another", []string{mnt}},
	} {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(append(os.Environ(), initArgsEnv+"=/bin/true"), c.env...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.SysProcAttr = SysProcAttr(NSOptions{})
		cmd.SysProcAttr.Pdeathsig = 0
		err := cmd.Run()
		if c.name == "told another" {
			if err != nil {
				t.Errorf("%s: %v (%s), want it run", c.name, err, out.String())
			}
			continue
		}
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(out.String(), "not in a mount namespace of its own") {
			t.Errorf("%s: RunInit ended with %v (%s), want it refused", c.name, err, out.String())
		}
	}
}

// initWrapEnv has the test binary (in a new mount namespace) start itself
// again in a new pid namespace only, to run RunInit in its own mount
// namespace, which it names as the starter's.
const initWrapEnv = "JAIL_INIT_WRAP"

// initWrap is the test binary under initWrapEnv; it returns the exit code.
func initWrap() int {
	mnt, err := ParentMountNS()
	if err != nil {
		fmt.Println(err)
		return 1
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, initWrapEnv+"=") {
			env = append(env, kv)
		}
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(env, mnt)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	err = cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		fmt.Println(err)
		return 1
	}
	return 0
}

// TestReceivePIDNoReport: an init that ends (its end of the socket
// closed) without a report, or that takes too long, is an error.
func TestReceivePIDNoReport(t *testing.T) {
	parent, child, err := InitReport()
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	child.Close()
	if _, err := ReceivePID(parent, 5*time.Second); err == nil || !strings.Contains(err.Error(), "without reporting") {
		t.Errorf("closed without a report: %v", err)
	}
	p2, c2, err := InitReport()
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	defer c2.Close()
	start := time.Now()
	if _, err := ReceivePID(p2, 100*time.Millisecond); err == nil || time.Since(start) > 5*time.Second {
		t.Errorf("no report within the limit: %v after %s", err, time.Since(start))
	}
}
