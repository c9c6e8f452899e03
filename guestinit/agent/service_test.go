//go:build linux

package agent

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warrenvm/warren/agentwire"
)

func TestBackoff(t *testing.T) {
	b := backoff{min: 250 * time.Millisecond, max: 2 * time.Second, reset: 10 * time.Second}
	for _, tc := range []struct {
		prev, ran, want time.Duration
	}{
		{0, 0, 250 * time.Millisecond},                              // the first restart
		{0, time.Hour, 250 * time.Millisecond},                      // after a long first run
		{250 * time.Millisecond, 0, 500 * time.Millisecond},         // crashing at once: doubling
		{500 * time.Millisecond, time.Second, time.Second},          // a short run
		{time.Second, 9 * time.Second, 2 * time.Second},             // up to max
		{2 * time.Second, 0, 2 * time.Second},                       // and no further
		{2 * time.Second, 10 * time.Second, 250 * time.Millisecond}, // a run of reset: from min again
	} {
		if got := b.next(tc.prev, tc.ran); got != tc.want {
			t.Errorf("next(%v, %v) = %v, want %v", tc.prev, tc.ran, got, tc.want)
		}
	}
}

// fakeWaiter starts nothing: each Start hands out a fakeChild whose exit
// the test decides.
type fakeWaiter struct {
	mu      sync.Mutex
	next    int
	started chan *fakeChild
}

func (w *fakeWaiter) Start(func() (int, error)) (Child, error) {
	w.mu.Lock()
	w.next++
	c := &fakeChild{pid: 1000 + w.next, exit: make(chan syscall.WaitStatus, 1), signals: make(chan syscall.Signal, 8)}
	w.mu.Unlock()
	w.started <- c
	return c, nil
}

type fakeChild struct {
	pid     int
	exit    chan syscall.WaitStatus
	signals chan syscall.Signal
}

func (c *fakeChild) Pid() int                           { return c.pid }
func (c *fakeChild) Wait() (syscall.WaitStatus, error)  { return <-c.exit, nil }
func (c *fakeChild) SignalGroup(s syscall.Signal) error { c.signals <- s; return nil }
func (c *fakeChild) exitWith(code int)                  { c.exit <- syscall.WaitStatus(code << 8) }
func (c *fakeChild) killedBy(sig syscall.Signal)        { c.exit <- syscall.WaitStatus(sig) }

// fakeClock is the supervisor's time: now moves only when the test says,
// and every wait is handed to the test, which fires it.
type fakeClock struct {
	mu    sync.Mutex
	t     time.Time
	waits chan fakeWait
}

type fakeWait struct {
	d  time.Duration
	ch chan time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func (c *fakeClock) after(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.waits <- fakeWait{d, ch}
	return ch
}

// TestSupervisorRestarts drives the supervisor's loop with a fake waiter
// and clock: restarts after every exit with the backoff policy, counters
// and last exit in the status, a stop during a backoff, and a stop of a
// running process that ignores SIGTERM (SIGKILL after the grace).
func TestSupervisorRestarts(t *testing.T) {
	w := &fakeWaiter{started: make(chan *fakeChild, 4)}
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0), waits: make(chan fakeWait, 16)}
	resolve := func(argv, env []string, cwd, user string) (launch, error) {
		return launch{prog: "/bin/true", argv: argv}, nil
	}
	sv := newSupervisor(w, t.TempDir(), resolve)
	sv.now, sv.after = clk.now, clk.after
	sv.policy = backoff{min: time.Second, max: 4 * time.Second, reset: time.Minute}

	st, err := sv.add(agentwire.ServiceSpec{Name: "web", Argv: []string{"server", "--port", "8080"}})
	if err != nil {
		t.Fatal(err)
	}
	first := <-w.started
	if st.State != agentwire.ServiceRunning || st.Pid != first.pid || st.Starts != 1 || st.Restarts != 0 {
		t.Fatalf("after add: %+v", st)
	}
	if _, err := sv.add(agentwire.ServiceSpec{Name: "web", Argv: []string{"x"}}); !errors.Is(err, os.ErrExist) {
		t.Errorf("a second service named web: %v", err)
	}

	// It crashes at once, three times: waits of 1 s, 2 s, 4 s (max).
	c := first
	for i, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		clk.advance(100 * time.Millisecond)
		c.exitWith(3)
		wt := <-clk.waits
		if wt.d != want {
			t.Errorf("restart %d waits %v, want %v", i+1, wt.d, want)
		}
		st, _ := sv.get("web")
		if st.State != agentwire.ServiceBackoff || st.Pid != 0 || st.LastExit == nil || st.LastExit.Code != 3 || st.LastExit.RanMS != 100 {
			t.Errorf("in backoff: %+v (last exit %+v)", st, st.LastExit)
		}
		wt.ch <- clk.now()
		c = <-w.started
		waitRunning(t, sv, "web", c.pid)
	}
	// A long run: the next wait is back at the minimum.
	clk.advance(2 * time.Minute)
	c.killedBy(syscall.SIGSEGV)
	wt := <-clk.waits
	if wt.d != time.Second {
		t.Errorf("after a long run the restart waits %v", wt.d)
	}
	st, _ = sv.get("web")
	if st.LastExit.Code != 128+int(syscall.SIGSEGV) || st.LastExit.Signal != "SIGSEGV" || st.Restarts != 3 || st.Starts != 4 {
		t.Errorf("after SIGSEGV: %+v (last exit %+v)", st, st.LastExit)
	}

	// Stopped while backing off: nothing more starts.
	st, err = sv.stop("web", time.Second)
	if err != nil || st.State != agentwire.ServiceStopped {
		t.Fatalf("stop in backoff: %+v, %v", st, err)
	}
	if grace := <-clk.waits; grace.d != time.Second { // the stop's grace timer, never fired
		t.Errorf("stop's grace %v", grace.d)
	}
	select {
	case c := <-w.started:
		t.Fatalf("started %d after the stop", c.pid)
	default:
	}
	if _, ok := sv.get("web"); ok {
		t.Error("a stopped service is still listed")
	}
	if _, err := sv.stop("web", time.Second); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("second stop: %v", err)
	}

	// Stopped while running, ignoring SIGTERM: SIGKILL after the grace.
	if _, err := sv.add(agentwire.ServiceSpec{Name: "stubborn", Argv: []string{"x"}}); err != nil {
		t.Fatal(err)
	}
	c = <-w.started
	stopped := make(chan agentwire.ServiceStatus, 1)
	go func() {
		st, _ := sv.stop("stubborn", 10*time.Second)
		stopped <- st
	}()
	if sig := <-c.signals; sig != syscall.SIGTERM {
		t.Errorf("first signal %v", sig)
	}
	grace := <-clk.waits
	if grace.d != 10*time.Second {
		t.Errorf("grace %v", grace.d)
	}
	grace.ch <- clk.now()
	if sig := <-c.signals; sig != syscall.SIGKILL {
		t.Errorf("second signal %v", sig)
	}
	c.killedBy(syscall.SIGKILL)
	if st := <-stopped; st.State != agentwire.ServiceStopped || st.LastExit == nil || st.LastExit.Signal != "SIGKILL" {
		t.Errorf("after the stop: %+v", st)
	}
}

// waitRunning waits until the supervisor has recorded pid as running (the
// fake waiter hands the child out before the loop records it).
func waitRunning(t *testing.T, sv *supervisor, name string, pid int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if st, _ := sv.get(name); st.Pid == pid {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("service %s never recorded pid %d", name, pid)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestServiceSpecChecks(t *testing.T) {
	sv := newSupervisor(&fakeWaiter{started: make(chan *fakeChild, 1)}, t.TempDir(), nil)
	for _, spec := range []agentwire.ServiceSpec{
		{Name: "", Argv: []string{"x"}},
		{Name: "../etc", Argv: []string{"x"}},
		{Name: "a/b", Argv: []string{"x"}},
		{Name: ".hidden", Argv: []string{"x"}},
		{Name: strings.Repeat("n", 65), Argv: []string{"x"}},
		{Name: "ok"},
		{Name: "ok", Argv: []string{""}},
		{Name: "ok", Argv: []string{"x"}, Env: []string{"NOEQUALS"}},
		{Name: "ok", Argv: []string{"x"}, Env: []string{"=v"}},
	} {
		if _, err := sv.add(spec); err == nil {
			t.Errorf("%+v accepted", spec)
		}
	}
	for _, n := range []string{"web", "a.b-c_d", "0", strings.Repeat("n", 64)} {
		if !validServiceName(n) {
			t.Errorf("name %q refused", n)
		}
	}
}

func TestRotatingLog(t *testing.T) {
	p := filepath.Join(t.TempDir(), "svc.log")
	l, err := openLog(p, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"aaaa", "bbbb", "cc", "dddddd", "eeeeeeeeeeee"} {
		if _, err := l.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	cur, _ := os.ReadFile(p)
	prev, _ := os.ReadFile(p + ".1")
	// aaaabbbbcc fills 10; dddddd rotates; eeee... (larger than max on its
	// own) rotates again and is kept whole.
	if string(cur) != "eeeeeeeeeeee" || string(prev) != "dddddd" {
		t.Errorf("log %q, previous %q", cur, prev)
	}
	if _, err := l.Write([]byte("x")); err == nil {
		t.Error("write after Close")
	}
	// Reopened, it appends.
	l, err = openLog(p, 100)
	if err != nil {
		t.Fatal(err)
	}
	l.Write([]byte("f"))
	l.Close()
	if cur, _ := os.ReadFile(p); string(cur) != "eeeeeeeeeeeef" {
		t.Errorf("reopened log %q", cur)
	}
}

// TestServices runs a real service through the agent's HTTP API: its
// status, its log, a restart after it is killed from outside, /health's
// report, and the stop.
func TestServices(t *testing.T) {
	logDir := filepath.Join(t.TempDir(), "log", "warren")
	c := startOpts(t, ProcessWaiter{}, Options{LogDir: logDir})
	ctx := ctxT(t)
	st, err := c.StartService(ctx, agentwire.ServiceSpec{Name: "echo", Argv: []string{"sh", "-c", `echo "up $SVC_VAR $$"; exec sleep 1000`}, Env: []string{"SVC_VAR=v1"}})
	if err != nil {
		t.Fatal(err)
	}
	if st.State != agentwire.ServiceRunning || st.Pid == 0 || st.Log != filepath.Join(logDir, "echo.log") {
		t.Fatalf("started: %+v", st)
	}
	waitFor := func(what string, ok func(agentwire.ServiceStatus) bool) agentwire.ServiceStatus {
		t.Helper()
		for {
			st, err := c.Service(ctx, "echo")
			if err != nil {
				t.Fatal(err)
			}
			if ok(st) {
				return st
			}
			if ctx.Err() != nil {
				t.Fatalf("%s: last status %+v", what, st)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	logHas := func(s string) bool {
		b, _ := os.ReadFile(st.Log)
		return bytes.Count(b, []byte(s)) > 0
	}
	first := st.Pid
	waitFor("the first line in the log", func(agentwire.ServiceStatus) bool { return logHas("up v1 ") })
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	st = waitFor("a restart", func(st agentwire.ServiceStatus) bool { return st.State == agentwire.ServiceRunning && st.Starts == 2 })
	if st.Pid == first || st.Restarts != 1 || st.LastExit == nil || st.LastExit.Signal != "SIGKILL" {
		t.Errorf("after the restart: %+v (last exit %+v)", st, st.LastExit)
	}
	waitFor("the second line in the log", func(agentwire.ServiceStatus) bool {
		b, _ := os.ReadFile(st.Log)
		return bytes.Count(b, []byte("up v1 ")) == 2
	})
	h, err := c.Health(ctx)
	if err != nil || len(h.Services) != 1 || h.Services[0].Name != "echo" || h.Services[0].Pid != st.Pid {
		t.Errorf("health services %+v, %v", h.Services, err)
	}
	if l, err := c.Services(ctx); err != nil || len(l) != 1 {
		t.Errorf("services %+v, %v", l, err)
	}
	if _, err := c.StartService(ctx, agentwire.ServiceSpec{Name: "nope", Argv: []string{"/no/such/program"}}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing program: %v", err)
	}
	if _, err := c.Service(ctx, "nope"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed first start left a service: %v", err)
	}
	pid := st.Pid
	st, err = c.StopService(ctx, "echo")
	if err != nil || st.State != agentwire.ServiceStopped || st.Pid != 0 {
		t.Fatalf("stop: %+v, %v", st, err)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("process %d still there after the stop", pid)
	}
	if _, err := c.Service(ctx, "echo"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after the stop: %v", err)
	}
}

// TestPollExec: the ready check is retried until it exits 0.
func TestPollExec(t *testing.T) {
	c := start(t)
	flag := filepath.Join(t.TempDir(), "ready")
	// The check passes on its third run.
	script := `n=$(cat ` + flag + ` 2>/dev/null || echo 0); n=$((n+1)); echo $n > ` + flag + `; [ $n -ge 3 ]`
	n, err := c.PollExec(ctxT(t), agentwire.ExecRequest{Argv: []string{"sh", "-c", script}}, 10*time.Millisecond)
	if err != nil || n != 3 {
		t.Errorf("PollExec: %d attempts, %v", n, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = c.PollExec(ctx, agentwire.ExecRequest{Argv: []string{"sh", "-c", "echo not yet; exit 7"}}, 10*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "exit code 7") || !strings.Contains(err.Error(), "not yet") {
		t.Errorf("PollExec that never passes: %v", err)
	}
}
