//go:build linux && amd64

package jail

import (
	"errors"
	"fmt"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Install builds the profile's filter and installs it on every thread of the
// process: Install(p, opts) is NewFilter(p, opts) then (*Filter).Install.
func Install(p Profile, opts Options) error {
	f, err := NewFilter(p, opts)
	if err != nil {
		return err
	}
	return f.Install()
}

// Install sets PR_SET_NO_NEW_PRIVS and loads the program with
// seccomp(SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC): the kernel
// applies it to all threads of the process at once (a Go process has many,
// and any of them may run any goroutine) and gives them no_new_privs too.
// A filter cannot be removed; later filters only add restrictions.
func (f *Filter) Install() error {
	return installProgram(f.Program, f.Options.Mode == ModeLog)
}

func installProgram(prog []unix.SockFilter, log bool) error {
	if len(prog) == 0 {
		return errors.New("jail: empty seccomp program")
	}
	// The calling thread must carry no_new_privs when it calls seccomp;
	// keep the goroutine on it between the two calls.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := SetNoNewPrivs(); err != nil {
		if !errors.Is(err, syscall.ENOTSUP) {
			return err
		}
		// cgo: this thread only; TSYNC gives it to the others.
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("jail: prctl(PR_SET_NO_NEW_PRIVS): %w", err)
		}
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	flags := uintptr(unix.SECCOMP_FILTER_FLAG_TSYNC)
	if log {
		flags |= unix.SECCOMP_FILTER_FLAG_LOG
	}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		switch errno {
		case unix.EINVAL:
			return fmt.Errorf("jail: seccomp: %w (TSYNC or the program refused by the kernel)", errno)
		case unix.EACCES:
			return fmt.Errorf("jail: seccomp: %w (no_new_privs not set and no CAP_SYS_ADMIN)", errno)
		}
		return fmt.Errorf("jail: seccomp: %w", errno)
	}
	if r != 0 {
		// TSYNC failed: thread r could not be synchronized (it has
		// another, diverging filter). Nothing was installed.
		return fmt.Errorf("jail: seccomp TSYNC: thread %d cannot be synchronized; no filter installed", r)
	}
	return nil
}

// SetNoNewPrivs sets PR_SET_NO_NEW_PRIVS on every thread (execve can then
// never grant privileges: setuid bits and file capabilities are ignored).
func SetNoNewPrivs() error {
	if err := allThreads(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); err != nil {
		return fmt.Errorf("jail: prctl(PR_SET_NO_NEW_PRIVS): %w", err)
	}
	return nil
}

// allThreads runs a syscall on every thread of the process with
// syscall.AllThreadsSyscall. That is impossible in a cgo binary (the C
// threads are not the runtime's): there it returns ENOTSUP, and this
// package's privilege calls fail instead of half-applying. Build the VMM
// with CGO_ENABLED=0 (the Makefile does).
func allThreads(trap, a1, a2, a3 uintptr) error {
	_, _, errno := syscall.AllThreadsSyscall(trap, a1, a2, a3)
	if errno == syscall.ENOTSUP {
		return fmt.Errorf("%w (a cgo binary: per-thread state cannot be changed on all threads; build with CGO_ENABLED=0)", errno)
	}
	if errno != 0 {
		return errno
	}
	return nil
}
