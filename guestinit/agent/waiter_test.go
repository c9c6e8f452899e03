//go:build linux

package agent

import (
	"errors"
	"os"
	"syscall"
	"testing"
)

func startSh(script string) func() (int, error) {
	return func() (int, error) {
		p, err := os.StartProcess("/bin/sh", []string{"sh", "-c", script}, &os.ProcAttr{
			Sys: &syscall.SysProcAttr{Setpgid: true},
		})
		if err != nil {
			return 0, err
		}
		pid := p.Pid
		p.Release()
		return pid, nil
	}
}

func TestProcessWaiter(t *testing.T) {
	var w ProcessWaiter
	c, err := w.Start(startSh("exit 5"))
	if err != nil {
		t.Fatal(err)
	}
	ws, err := c.Wait()
	if err != nil || !ws.Exited() || ws.ExitStatus() != 5 {
		t.Fatalf("Wait = %v, %v", ws, err)
	}
	if err := c.SignalGroup(syscall.SIGKILL); !errors.Is(err, ErrReaped) {
		t.Fatalf("SignalGroup after reap: %v, want ErrReaped", err)
	}

	c, err = w.Start(startSh("exec sleep 60"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SignalGroup(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ws, err = c.Wait()
	if err != nil || !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Fatalf("Wait = %v, %v", ws, err)
	}

	if _, err := w.Start(func() (int, error) { return 0, os.ErrNotExist }); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("failed start: %v", err)
	}
}
