//go:build linux

package guestinit

import (
	"fmt"
	"os"
	"syscall"
)

// shellPath is the debug shell (u-root's gosh in our initramfs).
const shellPath = "/bin/sh"

// startShell starts the debug shell on the console in a new session with
// the console as its controlling terminal. It is not waited for here: the
// Reaper collects it like any other child. It is not restarted.
func startShell() error {
	p, err := os.StartProcess(shellPath, []string{shellPath}, &os.ProcAttr{
		Dir:   "/",
		Env:   []string{"PATH=/bbin:/bin", "HOME=/", "TERM=linux"},
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
		Sys:   &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0},
	})
	if err != nil {
		return fmt.Errorf("start shell: %w", err)
	}
	return p.Release()
}
