//go:build linux

package agent

import (
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenvm/warren/agentwire"
)

func needStty(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("stty"); err != nil {
		t.Skip("no stty")
	}
}

func TestPTYSize(t *testing.T) {
	needStty(t)
	c := serveClients(t, newTestServer())()
	pi := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"sh", "-c", `stty size; echo "term=$TERM"; test -t 0 && test -t 1 && test -t 2 && echo tty`},
		PTY: &agentwire.TerminalSize{Rows: 33, Cols: 101}})
	if pi.PTY == nil || *pi.PTY != (agentwire.TerminalSize{Rows: 33, Cols: 101}) || !pi.StdinOpen {
		t.Fatalf("info %+v", pi)
	}
	info, err := c.WaitProcess(ctxT(t), pi.ID)
	if err != nil || info.Exit.Code != 0 {
		t.Fatalf("WaitProcess: %+v, %v", info, err)
	}
	o, err := readOutput(ctxT(t), t, c, pi.ID, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	// The terminal turns "\n" into "\r\n"; all its output is stdout.
	if got := o.stdout.String(); got != "33 101\r\nterm=xterm-256color\r\ntty\r\n" || o.stderr.Len() != 0 {
		t.Fatalf("stdout %q stderr %q", got, o.stderr.String())
	}
}

func TestPTYResize(t *testing.T) {
	needStty(t)
	c := serveClients(t, newTestServer())()
	pi := startProc(t, c, agentwire.ProcessRequest{
		// A SIGWINCH may interrupt the first read: it reads until a line.
		Argv: []string{"sh", "-c", `trap 'echo winch' WINCH; stty size; until read x; do :; done; stty size; read x`},
		PTY:  &agentwire.TerminalSize{Rows: 24, Cols: 80},
	})
	waitOutput(t, c, pi.ID, 0, "24 80\r\n")
	info, err := c.ResizeProcess(ctxT(t), pi.ID, agentwire.TerminalSize{Rows: 40, Cols: 120})
	if err != nil || info.PTY == nil || *info.PTY != (agentwire.TerminalSize{Rows: 40, Cols: 120}) {
		t.Fatalf("ResizeProcess: %+v, %v", info, err)
	}
	if err := c.SendStdin(ctxT(t), pi.ID, strings.NewReader("\n"), false); err != nil {
		t.Fatal(err)
	}
	out := waitOutput(t, c, pi.ID, 0, "40 120\r\n")
	if !strings.Contains(out, "winch") {
		t.Errorf("no SIGWINCH seen: %q", out)
	}
	// ^D at a line's start ends the input: read fails and sh exits 1.
	if err := c.SendStdin(ctxT(t), pi.ID, nil, true); err != nil {
		t.Fatal(err)
	}
	if info, err := c.WaitProcess(ctxT(t), pi.ID); err != nil || info.Exit.Code != 1 {
		t.Fatalf("WaitProcess: %+v, %v", info, err)
	}
	// Resizing an exited process is a no-op; one without a terminal an error.
	if _, err := c.ResizeProcess(ctxT(t), pi.ID, agentwire.TerminalSize{Rows: 1, Cols: 1}); err != nil {
		t.Fatal(err)
	}
	p := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"sleep", "60"}})
	_, err = c.ResizeProcess(ctxT(t), p.ID, agentwire.TerminalSize{Rows: 1, Cols: 1})
	wantCode(t, asAgentError(err), agentwire.CodeBadRequest)
}

func TestPTYInterrupt(t *testing.T) {
	c := serveClients(t, newTestServer())()
	pi := startProc(t, c, agentwire.ProcessRequest{
		Argv: []string{"sh", "-c", `trap 'echo got-int; exit 7' INT; echo ready; while :; do sleep 0.1; done`},
		PTY:  &agentwire.TerminalSize{Rows: 24, Cols: 80},
	})
	waitOutput(t, c, pi.ID, 0, "ready\r\n")
	if err := c.SendStdin(ctxT(t), pi.ID, strings.NewReader("\x03"), false); err != nil {
		t.Fatal(err)
	}
	info, err := c.WaitProcess(ctxT(t), pi.ID)
	if err != nil || info.Exit.Code != 7 {
		t.Fatalf("WaitProcess: %+v %+v, %v", info, info.Exit, err)
	}
	o, err := readOutput(ctxT(t), t, c, pi.ID, 0, true)
	if err != nil || !strings.Contains(o.stdout.String(), "got-int") || o.exit == nil || o.exit.Code != 7 {
		t.Fatalf("output %q exit %+v, %v", o.stdout.String(), o.exit, err)
	}
}

func TestPTYDescendantHoldsTerminal(t *testing.T) {
	c := serveClients(t, newTestServer())()
	// The shell exits; its background sleep ignores the hangup and keeps
	// the terminal open. The exit is reported all the same, at most
	// drainGrace later, and stdin writes fail instead of hanging.
	pi := startProc(t, c, agentwire.ProcessRequest{
		Argv: []string{"sh", "-c", `trap "" HUP; sleep 30 & echo $!; exit 3`},
		PTY:  &agentwire.TerminalSize{Rows: 24, Cols: 80},
	})
	t0 := time.Now()
	info, err := c.WaitProcess(ctxT(t), pi.ID)
	if err != nil || info.Exit.Code != 3 {
		t.Fatalf("WaitProcess: %+v, %v", info, err)
	}
	o, err := readOutput(ctxT(t), t, c, pi.ID, 0, false)
	if pid, perr := strconv.Atoi(strings.TrimSpace(o.stdout.String())); err != nil || perr != nil {
		t.Errorf("output %q: %v", o.stdout.String(), err)
	} else {
		defer syscall.Kill(pid, syscall.SIGKILL)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("exit reported after %v", d)
	}
	err = c.SendStdin(ctxT(t), pi.ID, strings.NewReader("x"), false)
	wantCode(t, asAgentError(err), agentwire.CodeBadRequest)
}

func TestTerminalNonblocking(t *testing.T) {
	master, tty, err := openTerminal(agentwire.TerminalSize{Rows: 2, Cols: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	defer master.Close()
	// A read of a terminal nobody writes ends at its deadline.
	if err := master.SetReadDeadline(time.Now().Add(100 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := master.Read(make([]byte, 10)); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read: %v", err)
		}
	case <-time.After(5 * time.Second):
		tty.Write([]byte("unblock\n"))
		t.Fatal("the master's read deadline does not work: it is in blocking mode")
	}
}
