//go:build linux

package agent

import (
	"bytes"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenvm/warren/agentwire"
)

func TestParseSignal(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want syscall.Signal
		ok   bool
	}{
		{"TERM", syscall.SIGTERM, true},
		{"SIGKILL", syscall.SIGKILL, true},
		{"int", syscall.SIGINT, true},
		{"Hup", syscall.SIGHUP, true},
		{"USR1", syscall.SIGUSR1, true},
		{"9", syscall.SIGKILL, true},
		{"0", 0, false},
		{"65", 0, false},
		{"-1", 0, false},
		{"NOPE", 0, false},
		{"SIG", 0, false},
	} {
		got, ok := parseSignal(tt.in)
		if ok != tt.ok || (ok && got != tt.want) {
			t.Errorf("parseSignal(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

// TestKill starts a process that traps nothing, learns its pid through
// OnStart and the pid header, and kills it with each signal; the exit
// status names the signal, and the background child in its group is gone
// too.
func TestKill(t *testing.T) {
	c := start(t)
	for _, tt := range []struct {
		sig  string
		want syscall.Signal
	}{
		{"TERM", syscall.SIGTERM},
		{"KILL", syscall.SIGKILL},
		{"INT", syscall.SIGINT},
		{"SIGHUP", syscall.SIGHUP},
	} {
		t.Run(tt.sig, func(t *testing.T) {
			pids := make(chan int, 1)
			w := &lineWriter{ch: make(chan string, 1)}
			type result struct {
				code int
				err  error
			}
			done := make(chan result, 1)
			go func() {
				// exec keeps the pid: the group leader is the sleep
				// itself; the backgrounded sleep is another group member.
				code, err := c.Exec(ctxT(t), agentwire.ExecRequest{
					Argv:    []string{"sh", "-c", "sleep 60 & echo $!; exec sleep 60"},
					OnStart: func(pid int) { pids <- pid },
				}, w, nil)
				done <- result{code, err}
			}()
			var pid int
			select {
			case pid = <-pids:
			case <-time.After(10 * time.Second):
				t.Fatal("OnStart not called")
			}
			var line string
			select {
			case line = <-w.ch:
			case <-time.After(10 * time.Second):
				t.Fatal("no output")
			}
			bg := atoi(t, line)
			if err := c.Kill(ctxT(t), pid, tt.sig); err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil || r.code != 128+int(tt.want) {
				t.Fatalf("code %d err %v, want %d", r.code, r.err, 128+int(tt.want))
			}
			if tt.want == syscall.SIGINT {
				// sh starts background jobs with SIGINT ignored.
				syscall.Kill(bg, syscall.SIGKILL)
			}
			waitGone(t, bg)
			// Reaped: the pid is no longer the agent's.
			var e *agentwire.Error
			if err := c.Kill(ctxT(t), pid, "KILL"); !errors.As(err, &e) || e.Code != agentwire.CodeNotFound || e.Status != http.StatusNotFound {
				t.Fatalf("Kill after exit: %v", err)
			}
		})
	}
}

func TestKillErrors(t *testing.T) {
	c := start(t)
	ctx := ctxT(t)
	check := func(what string, err error, code string) {
		t.Helper()
		var e *agentwire.Error
		if !errors.As(err, &e) || e.Code != code {
			t.Errorf("%s: err %v, want %s", what, err, code)
		}
	}
	// A pid this agent never started (our own) is not found, never signalled.
	check("foreign pid", c.Kill(ctx, syscall.Getpid(), "TERM"), agentwire.CodeNotFound)
	check("pid 1", c.Kill(ctx, 1, "KILL"), agentwire.CodeNotFound)
	check("bad pid", c.Kill(ctx, 0, "TERM"), agentwire.CodeBadRequest)
	check("bad signal", c.Kill(ctx, 1, "BOGUS"), agentwire.CodeBadRequest)

	// The pid header comes with every exec, also without OnStart.
	var out bytes.Buffer
	var got int
	code, err := c.Exec(ctx, agentwire.ExecRequest{Argv: []string{"sh", "-c", "echo $$"}, OnStart: func(pid int) { got = pid }}, &out, nil)
	if err != nil || code != 0 {
		t.Fatal(code, err)
	}
	if want := atoi(t, out.String()); got != want {
		t.Errorf("OnStart pid %d, shell says %d", got, want)
	}
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		t.Fatal(err)
	}
	return n
}
