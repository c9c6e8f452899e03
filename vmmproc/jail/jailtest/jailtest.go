// Package jailtest gives the tests that harden a process for real (in
// vmmproc/jail and vmmproc) a test binary that can drop privileges on all
// of its threads.
package jailtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
)

var (
	once  sync.Once
	exe   string
	err   error
	built string // the directory of a rebuilt binary, for Remove
)

// Exe returns the running test binary, or, when it links cgo, the calling
// test package rebuilt once with CGO_ENABLED=0 into a temporary directory
// (Remove removes it). The privilege calls need a binary without cgo:
// syscall.AllThreadsSyscall refuses cgo, and a test binary importing net
// links cgo when CGO_ENABLED=1; warren itself is built with
// CGO_ENABLED=0. Exe skips t when neither binary can be had.
func Exe(t testing.TB) string {
	t.Helper()
	once.Do(func() {
		if _, _, e := syscall.AllThreadsSyscall(syscall.SYS_GETPID, 0, 0, 0); e != syscall.ENOTSUP {
			exe, err = os.Executable()
			return
		}
		goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, serr := os.Stat(goBin); serr != nil {
			goBin = "go"
		}
		built, err = os.MkdirTemp("", "warren-jailtest")
		if err != nil {
			return
		}
		exe = filepath.Join(built, "cgofree.test")
		cmd := exec.Command(goBin, "test", "-c", "-o", exe, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, cerr := cmd.CombinedOutput(); cerr != nil {
			err = fmt.Errorf("rebuilding the test binary with CGO_ENABLED=0: %v\n%s", cerr, out)
		}
	})
	if err != nil {
		t.Skipf("no cgo-free test binary: %v", err)
	}
	return exe
}

// Remove removes the binary Exe rebuilt, if it did; TestMain calls it
// after the tests.
func Remove() {
	if built != "" {
		os.RemoveAll(built)
	}
}
