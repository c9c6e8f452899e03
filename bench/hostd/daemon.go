package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// hostd is the warren-hostd subprocess.
type hostd struct {
	cmd    *exec.Cmd
	sock   string
	log    string
	exited chan struct{}
}

// startHostd starts warren-hostd (VMMs stopped when it exits) on a state
// directory in data, its VMMs' sockets (STATE/run, a link) and its own in
// work, and waits for it to answer.
func startHostd(ctx context.Context, c config, work, data string) (*hostd, error) {
	d := &hostd{sock: filepath.Join(work, "hostd.sock"), log: filepath.Join(work, "hostd.log"), exited: make(chan struct{})}
	state := filepath.Join(data, "state")
	if data != work {
		if err := os.MkdirAll(filepath.Join(work, "run"), 0o700); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(state, 0o700); err != nil {
			return nil, err
		}
		if err := os.Symlink(filepath.Join(work, "run"), filepath.Join(state, "run")); err != nil {
			return nil, err
		}
	}
	logf, err := os.Create(d.log)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	// The template names its kernel and initramfs in the daemon's guest
	// directory: theirs (run checks they share one).
	args := []string{"--state", state, "--socket", d.sock, "--warren", c.warren,
		"--cgroup-root", c.cgroupRoot, "--stop-on-exit", "--guest-dir", filepath.Dir(c.kernel)}
	if c.encrypted {
		keys := filepath.Join(work, "keys")
		if err := os.Mkdir(keys, 0o700); err != nil {
			return nil, err
		}
		// Decrypted copies on work's file system (a tmpfs in the nested host).
		args = append(args, "--keys", keys, "--decrypt-dir", filepath.Join(work, "decrypted"))
	}
	d.cmd = exec.Command(c.hostd, append(args, strings.Fields(c.hostdFlags)...)...)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	// Its own process group: a terminal's ^C reaches us, and we stop it.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", c.hostd, err)
	}
	go func() { d.cmd.Wait(); close(d.exited) }()
	a := newAPI(d.sock, "bench")
	defer a.close()
	if err := a.health(ctx, 30*time.Second); err != nil {
		d.stop()
		return nil, d.withLog(err)
	}
	return d, nil
}

// stop stops the daemon with SIGTERM (it stops its VMMs: --stop-on-exit),
// SIGKILL after 60 s.
func (d *hostd) stop() {
	select {
	case <-d.exited:
		return
	default:
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		return
	case <-time.After(60 * time.Second):
	}
	fmt.Println("warning: warren-hostd not gone 60s after SIGTERM: SIGKILL")
	d.cmd.Process.Kill()
	<-d.exited
}

// withLog adds the end of the daemon's log to err.
func (d *hostd) withLog(err error) error {
	b, _ := os.ReadFile(d.log)
	if len(b) == 0 {
		return err
	}
	return fmt.Errorf("%w\nwarren-hostd log (end):\n%s", err, tail(string(b)))
}
