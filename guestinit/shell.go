//go:build linux

package guestinit

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// shellPath is the debug shell (u-root's gosh in our initramfs; the
// image's own in an image root).
const shellPath = "/bin/sh"

// startShell starts the debug shell on the console in a new session with
// the console as its controlling terminal: on the initramfs u-root's gosh,
// in an image root the image's /bin/sh (with the agent's environment for
// that image), or an error when the image has none. It is not waited for
// here: the Reaper collects it like any other child. It is not restarted.
func startShell(img *imageRoot) error {
	env := []string{"PATH=/bbin:/bin", "HOME=/", "TERM=linux"}
	if img != nil {
		if _, err := os.Stat(shellPath); err != nil {
			return fmt.Errorf("start shell: the image has no %s: %w", shellPath, err)
		}
		base, _, _, _ := img.agentOptions()
		env = []string{"HOME=/root", "TERM=linux"}
		for _, kv := range base {
			if k, _, _ := strings.Cut(kv, "="); k != "HOME" && k != "TERM" {
				env = append(env, kv)
			}
		}
	}
	p, err := os.StartProcess(shellPath, []string{shellPath}, &os.ProcAttr{
		Dir:   "/",
		Env:   env,
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
		Sys:   &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0},
	})
	if err != nil {
		return fmt.Errorf("start shell: %w", err)
	}
	return p.Release()
}
