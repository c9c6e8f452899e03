//go:build linux

package guestinit

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/guestinit/agent"
)

// startCmd returns a start function for Reaper.Start that runs sh -c
// script in a process group of its own; hold, if positive, is how long it
// waits after the fork before returning the pid, so that the child can
// exit, and SIGCHLD arrive, before registration would finish if
// registration were not under the reaper's lock.
func startCmd(script string, hold time.Duration) func() (int, error) {
	return func() (int, error) {
		p, err := os.StartProcess("/bin/sh", []string{"sh", "-c", script}, &os.ProcAttr{
			Sys: &syscall.SysProcAttr{Setpgid: true},
		})
		if err != nil {
			return 0, err
		}
		pid := p.Pid
		p.Release()
		time.Sleep(hold)
		return pid, nil
	}
}

func waitChild(t *testing.T, c agent.Child) syscall.WaitStatus {
	t.Helper()
	done := make(chan syscall.WaitStatus, 1)
	go func() {
		ws, err := c.Wait()
		if err != nil {
			t.Errorf("Wait: %v", err)
		}
		done <- ws
	}()
	select {
	case ws := <-done:
		return ws
	case <-time.After(20 * time.Second):
		t.Fatalf("pid %d: Wait did not return", c.Pid())
		return 0
	}
}

// TestReaperWaiter: children registered through Start get their own exit
// status while the reaper runs, also those that exit before Start returns
// (the reaper is blocked on the lock meanwhile) and among orphans whose
// statuses are dropped.
func TestReaperWaiter(t *testing.T) {
	if !isolated(t) {
		return
	}
	r := subreaper(t)
	go r.Run()

	// Exits during registration: SIGCHLD comes while Start holds the lock.
	for i := range 5 {
		c, err := r.Start(startCmd("exit "+strconv.Itoa(i+1), 100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if ws := waitChild(t, c); !ws.Exited() || ws.ExitStatus() != i+1 {
			t.Fatalf("child %d: status %v", i, ws)
		}
		if err := c.SignalGroup(syscall.SIGKILL); !errors.Is(err, agent.ErrReaped) {
			t.Fatalf("SignalGroup after reap: %v", err)
		}
	}

	// Many at once, each making an orphan too (dropped by the reaper),
	// while unregistered children come and go.
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			c, err := r.Start(startCmd("sleep 0.0$((RANDOM % 10)) & exit "+strconv.Itoa(i), 0))
			if err != nil {
				t.Error(err)
				return
			}
			if ws := waitChild(t, c); !ws.Exited() || ws.ExitStatus() != i {
				t.Errorf("child %d: status %v", i, ws)
			}
		})
		startOrphaner(t)
	}
	wg.Wait()

	checkWaiter(t, r)

	// Nothing is left registered, the failed start included.
	r.mu.Lock()
	n := len(r.children)
	r.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d children still registered", n)
	}
}

// TestProcessWaiter runs the Waiter contract on agent.ProcessWaiter, the
// agent's Waiter outside PID 1.
func TestProcessWaiter(t *testing.T) {
	checkWaiter(t, agent.ProcessWaiter{})
}

// checkWaiter runs the contract every agent.Waiter keeps on w: a child's
// own exit status, agent.ErrReaped from SignalGroup once it is reaped,
// SignalGroup reaching a running child's group, and a failed start.
func checkWaiter(t *testing.T, w agent.Waiter) {
	t.Helper()
	c, err := w.Start(startCmd("exit 5", 0))
	if err != nil {
		t.Fatal(err)
	}
	if ws := waitChild(t, c); !ws.Exited() || ws.ExitStatus() != 5 {
		t.Fatalf("status %v", ws)
	}
	if err := c.SignalGroup(syscall.SIGKILL); !errors.Is(err, agent.ErrReaped) {
		t.Fatalf("SignalGroup after reap: %v, want ErrReaped", err)
	}

	c, err = w.Start(startCmd("exec sleep 60", 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SignalGroup(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if ws := waitChild(t, c); !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Fatalf("status %v", ws)
	}

	if _, err := w.Start(func() (int, error) { return 0, os.ErrNotExist }); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("failed start: %v", err)
	}
}

// TestAgentWithReaper serves the agent with the reaper as its Waiter, as
// PID 1 does, and runs execs and kills through a client.
func TestAgentWithReaper(t *testing.T) {
	if !isolated(t) {
		return
	}
	r := subreaper(t)
	go r.Run()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := agent.NewServer(r, agent.Options{Env: append([]string{"PATH=" + os.Getenv("PATH")}, agentEnv[1:]...)})
	go srv.Serve(l)
	defer srv.Close()
	c := agentclient.NewDial(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			var out bytes.Buffer
			code, err := c.Exec(ctx, agentwire.ExecRequest{Argv: []string{"sh", "-c", "echo $HOME $TERM; (sleep 0.01 &); exit " + strconv.Itoa(i)}}, &out, nil)
			if err != nil || code != i || out.String() != "/ linux\n" {
				t.Errorf("exec %d: code %d out %q err %v", i, code, out.String(), err)
			}
		})
	}
	wg.Wait()

	pids := make(chan int, 1)
	res := make(chan error, 1)
	go func() {
		code, err := c.Exec(ctx, agentwire.ExecRequest{Argv: []string{"sleep", "60"}, OnStart: func(pid int) { pids <- pid }}, nil, nil)
		if err == nil && code != 128+int(syscall.SIGTERM) {
			err = errors.New("exit code " + strconv.Itoa(code))
		}
		res <- err
	}()
	pid := <-pids
	if err := c.Kill(ctx, pid, "TERM"); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err != nil {
		t.Fatal(err)
	}
	var e *agentwire.Error
	if err := c.Kill(ctx, pid, "TERM"); !errors.As(err, &e) || e.Status != http.StatusNotFound {
		t.Fatalf("kill after exit: %v", err)
	}
	if !strings.HasPrefix(agentEnv[0], "PATH=/bbin:") {
		t.Errorf("agentEnv %q", agentEnv)
	}
}

func TestRepeatFilter(t *testing.T) {
	var got []string
	f := newRepeatFilter(func(err error) { got = append(got, err.Error()) })
	for _, s := range []string{"a", "a", "b", "b", "a"} {
		f.report(errors.New(s))
	}
	if strings.Join(got, ",") != "a,b,a" {
		t.Errorf("got %q", got)
	}
}

func TestIsGuestCID(t *testing.T) {
	for cid, want := range map[uint32]bool{0: false, 1: false, 2: false, 3: true, 1 << 20: true, 0xfffffffe: true, 0xffffffff: false} {
		if got := isGuestCID(cid); got != want {
			t.Errorf("isGuestCID(%#x) = %v, want %v", cid, got, want)
		}
	}
}
