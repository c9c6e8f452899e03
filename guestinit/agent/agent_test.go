//go:build linux

package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/agentwire"
)

// start serves an agent on a unix socket in a temporary directory.
func start(t *testing.T) *agentclient.Client { return startWith(t, nil) }

// startWith is start with a Syncer for /health.
func startWith(t *testing.T, syncer *Syncer) *agentclient.Client {
	return startOpts(t, ProcessWaiter{}, Options{Sync: syncer})
}

// startOpts serves an agent with w and opts on a unix socket in a
// temporary directory.
func startOpts(t *testing.T, w Waiter, opts Options) *agentclient.Client {
	return serve(t, NewServer(w, opts), nil)
}

// serve serves s on a unix socket in a temporary directory and returns a
// client of it; dialed, when not nil, is called at each of the client's
// dials. The test's end closes both and checks that Serve ended as
// closed.
func serve(t *testing.T, s *Server, dialed func()) *agentclient.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	c := agentclient.NewDial(func(ctx context.Context) (net.Conn, error) {
		if dialed != nil {
			dialed()
		}
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	t.Cleanup(func() {
		c.Close()
		s.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return c
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestExecExitCode(t *testing.T) {
	c := start(t)
	var out, errb bytes.Buffer
	code, err := c.Exec(ctxT(t), agentwire.ExecRequest{Argv: []string{"sh", "-c", "echo hi; echo oops >&2; exit 3"}}, &out, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if code != 3 || out.String() != "hi\n" || errb.String() != "oops\n" {
		t.Fatalf("code %d stdout %q stderr %q", code, out.String(), errb.String())
	}
}

func TestExecEnvCwd(t *testing.T) {
	c := start(t)
	dir := t.TempDir()
	var out bytes.Buffer
	code, err := c.Exec(ctxT(t), agentwire.ExecRequest{
		Argv: []string{"sh", "-c", `echo "$FOO $(pwd)"`},
		Env:  []string{"FOO=bar"},
		Cwd:  dir,
	}, &out, nil)
	if err != nil || code != 0 {
		t.Fatal(code, err)
	}
	if got, want := out.String(), "bar "+dir+"\n"; got != want {
		t.Fatalf("got %q want %q", got, want)
	}
}

func TestExecNotFound(t *testing.T) {
	c := start(t)
	_, err := c.Exec(ctxT(t), agentwire.ExecRequest{Argv: []string{"no-such-program-warren"}}, nil, nil)
	var e *agentwire.Error
	if !errors.As(err, &e) || e.Code != agentwire.CodeNotFound || e.Status != http.StatusNotFound {
		t.Fatalf("err %v", err)
	}
	_, err = c.Exec(ctxT(t), agentwire.ExecRequest{}, nil, nil)
	if !errors.As(err, &e) || e.Code != agentwire.CodeBadRequest {
		t.Fatalf("empty argv: err %v", err)
	}
}

func TestExecLargeOutput(t *testing.T) {
	c := start(t)
	const n = 10 << 20
	h := sha256.New()
	var size countWriter
	code, err := c.Exec(ctxT(t), agentwire.ExecRequest{Argv: []string{"sh", "-c", "head -c " + strconv.Itoa(n) + " /dev/urandom | tee /dev/stderr"}},
		io.MultiWriter(h, &size), nil)
	if err != nil || code != 0 {
		t.Fatal(code, err)
	}
	if size != n {
		t.Fatalf("got %d bytes", size)
	}
	// Same run, checking stdout against stderr (tee) byte for byte.
	ho, he := sha256.New(), sha256.New()
	if code, err := c.Exec(ctxT(t), agentwire.ExecRequest{Argv: []string{"sh", "-c", "head -c " + strconv.Itoa(n) + " /dev/urandom | tee /dev/stderr"}}, ho, he); err != nil || code != 0 {
		t.Fatal(code, err)
	}
	if !bytes.Equal(ho.Sum(nil), he.Sum(nil)) {
		t.Fatal("stdout and stderr checksums differ")
	}
}

type countWriter int

func (c *countWriter) Write(p []byte) (int, error) { *c += countWriter(len(p)); return len(p), nil }

func TestExecStdinChecksum(t *testing.T) {
	c := start(t)
	data := make([]byte, 5<<20)
	rand.Read(data)
	var out bytes.Buffer
	code, err := c.Exec(ctxT(t), agentwire.ExecRequest{Argv: []string{"cat"}, Input: bytes.NewReader(data)}, &out, nil)
	if err != nil || code != 0 {
		t.Fatal(code, err)
	}
	if !bytes.Equal(out.Bytes(), data) {
		t.Fatalf("cat returned %d bytes, not the %d sent", out.Len(), len(data))
	}
}

func TestExecConcurrent(t *testing.T) {
	c := start(t)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			var out bytes.Buffer
			code, err := c.Exec(ctxT(t), agentwire.ExecRequest{Argv: []string{"sh", "-c", "sleep 0.2; echo " + strconv.Itoa(i) + "; exit " + strconv.Itoa(i)}}, &out, nil)
			if err != nil || code != i || out.String() != strconv.Itoa(i)+"\n" {
				t.Errorf("exec %d: code %d out %q err %v", i, code, out.String(), err)
			}
		})
	}
	wg.Wait()
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func waitGone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); alive(pid); {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still alive", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestExecTimeoutKillsGroup(t *testing.T) {
	c := start(t)
	var out bytes.Buffer
	startT := time.Now()
	// The background sleep is in the same process group and holds stdout.
	code, err := c.Exec(ctxT(t), agentwire.ExecRequest{Argv: []string{"sh", "-c", "sleep 60 & echo $!; wait"}, TimeoutMS: 300}, &out, nil)
	if !errors.Is(err, agentclient.ErrTimedOut) || code != 128+int(syscall.SIGKILL) {
		t.Fatalf("code %d err %v", code, err)
	}
	if d := time.Since(startT); d > 10*time.Second {
		t.Fatalf("took %v", d)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid) // orphan of the killed shell; only gone if the group was killed
}

// lineWriter signals the first write.
type lineWriter struct {
	once sync.Once
	ch   chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { w.ch <- string(p) })
	return len(p), nil
}

func TestExecDisconnectKills(t *testing.T) {
	c := start(t)
	for _, stdin := range []bool{false, true} {
		ctx, cancel := context.WithCancel(ctxT(t))
		w := &lineWriter{ch: make(chan string, 1)}
		req := agentwire.ExecRequest{Argv: []string{"sh", "-c", "echo $$; exec sleep 60"}}
		if stdin {
			pr, pw := io.Pipe()
			defer pw.Close()
			req.Input = pr
		}
		errc := make(chan error, 1)
		go func() { _, err := c.Exec(ctx, req, w, nil); errc <- err }()
		var line string
		select {
		case line = <-w.ch:
		case <-time.After(10 * time.Second):
			t.Fatal("no output")
		}
		pid, err := strconv.Atoi(strings.TrimSpace(line))
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("stdin=%v: Exec err %v", stdin, err)
		}
		waitGone(t, pid)
	}
}

func TestExecStdinNeverRead(t *testing.T) {
	c := start(t)
	// More stdin than a pipe holds, to a process that never reads it but
	// writes 1 MiB of output: the output must still arrive.
	input := bytes.NewReader(make([]byte, 8<<20))
	var n countWriter
	code, err := c.Exec(ctxT(t), agentwire.ExecRequest{Argv: []string{"sh", "-c", "head -c 1048576 /dev/zero; exit 7"}, Input: input}, &n, nil)
	if err != nil || code != 7 || n != 1<<20 {
		t.Fatalf("code %d err %v bytes %d", code, err, n)
	}
}

func TestHealth(t *testing.T) {
	c := start(t)
	h, err := c.Health(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if h.Version != agentwire.Version || h.UptimeSeconds <= 0 || h.MemTotalBytes == 0 || h.MemAvailableBytes == 0 || h.AgentUptimeSeconds < 0 {
		t.Fatalf("health %+v", h)
	}
}

func TestFileRoundTrip(t *testing.T) {
	c := start(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "blob")
	data := make([]byte, 5<<20)
	rand.Read(data)
	fi, err := c.WriteFile(ctxT(t), p, bytes.NewReader(data), 0o640)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size != int64(len(data)) || fi.Mode != 0o640 || fi.Name != "blob" {
		t.Fatalf("WriteFile info %+v", fi)
	}
	var got bytes.Buffer
	mode, err := c.ReadFile(ctxT(t), p, &got)
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(got.Bytes()) != sha256.Sum256(data) || mode != 0o640 {
		t.Fatalf("read back %d bytes mode %o", got.Len(), mode)
	}
	st, err := c.Stat(ctxT(t), p)
	if err != nil || st.Size != int64(len(data)) || st.Mode.Perm() != 0o640 || st.IsDir {
		t.Fatalf("Stat %+v %v", st, err)
	}
	if _, err := c.WriteFile(ctxT(t), filepath.Join(dir, "a"), strings.NewReader("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := c.List(ctxT(t), dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(l) != 2 || l[0].Name != "a" || l[1].Name != "blob" || l[0].Mode.Perm() != 0o755 {
		t.Fatalf("List %+v", l)
	}
}

func TestFileErrors(t *testing.T) {
	c := start(t)
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	ctx := ctxT(t)
	check := func(what string, err error, code string, status int) {
		t.Helper()
		var e *agentwire.Error
		if !errors.As(err, &e) || e.Code != code || e.Status != status {
			t.Errorf("%s: err %v, want %s/%d", what, err, code, status)
		}
	}
	_, err := c.ReadFile(ctx, missing, io.Discard)
	check("ReadFile missing", err, agentwire.CodeNotFound, 404)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadFile missing: %v is not fs.ErrNotExist", err)
	}
	_, err = c.Stat(ctx, missing)
	check("Stat missing", err, agentwire.CodeNotFound, 404)
	_, err = c.List(ctx, missing)
	check("List missing", err, agentwire.CodeNotFound, 404)
	_, err = c.WriteFile(ctx, filepath.Join(missing, "x"), strings.NewReader("x"), 0o644)
	check("WriteFile in missing dir", err, agentwire.CodeNotFound, 404)
	_, err = c.ReadFile(ctx, dir, io.Discard)
	check("ReadFile dir", err, agentwire.CodeIsDirectory, 400)
	_, err = c.ReadFile(ctx, "relative", io.Discard)
	check("ReadFile relative", err, agentwire.CodeBadRequest, 400)
}

func TestExecArgv(t *testing.T) {
	if got := execArgv([]string{"sh", "-c", "x"}, "/bin/sh"); !slices.Equal(got, []string{"/bin/sh", "-c", "x"}) {
		t.Errorf("bare name: %q", got)
	}
	if got := execArgv([]string{"./run", "a"}, "./run"); !slices.Equal(got, []string{"./run", "a"}) {
		t.Errorf("path: %q", got)
	}
}

func TestAgentTimes(t *testing.T) {
	c := start(t)
	for _, tc := range []struct {
		argv []string
		min  time.Duration
	}{
		{[]string{"true"}, 0},
		{[]string{"sh", "-c", "sleep 0.2"}, 200 * time.Millisecond},
	} {
		t0 := time.Now()
		st, err := c.ExecStatus(ctxT(t), agentwire.ExecRequest{Argv: tc.argv}, nil, nil)
		wall := time.Since(t0)
		if err != nil || st.Code != 0 {
			t.Fatalf("%q: %+v %v", tc.argv, st, err)
		}
		if d := time.Duration(st.AgentNs); d <= tc.min || d > wall {
			t.Errorf("%q: agent time %s, want in (%s, %s]", tc.argv, d, tc.min, wall)
		}
	}
	t0 := time.Now()
	h, d, err := c.HealthTimed(ctxT(t))
	wall := time.Since(t0)
	if err != nil || h.Version != agentwire.Version {
		t.Fatalf("HealthTimed: %+v %v", h, err)
	}
	if d <= 0 || d > wall {
		t.Errorf("health agent time %s, want in (0, %s]", d, wall)
	}
}

// TestExecStatusFailure checks that a failure before the exit frame gives
// code -1 and no agent time.
func TestExecStatusFailure(t *testing.T) {
	c := start(t)
	st, err := c.ExecStatus(ctxT(t), agentwire.ExecRequest{Argv: []string{"no-such-program-warren"}}, nil, nil)
	if err == nil || st.Code != -1 || st.AgentNs != 0 {
		t.Fatalf("%+v %v", st, err)
	}
}

// TestExecReusesConnection checks that the client reads each exec stream
// to its end, so that back-to-back calls share one connection (benchmarks
// of the round trip would otherwise time a connect now and then).
func TestExecReusesConnection(t *testing.T) {
	var dials atomic.Int32
	c := serve(t, NewServer(ProcessWaiter{}, Options{}), func() { dials.Add(1) })
	for i := range 10 {
		var out bytes.Buffer
		if code, err := c.Exec(ctxT(t), agentwire.ExecRequest{Argv: []string{"sh", "-c", "echo " + strconv.Itoa(i)}}, &out, nil); err != nil || code != 0 || out.String() != strconv.Itoa(i)+"\n" {
			t.Fatalf("exec %d: code %d out %q err %v", i, code, out.String(), err)
		}
		if _, err := c.Health(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("%d connections for 20 sequential calls, want 1", n)
	}
}

// WaitHealth retries until the agent listens, and gives up at its deadline.
func TestWaitHealth(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "late.sock")
	c := agentclient.NewDial(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	defer c.Close()
	if _, err := c.WaitHealth(context.Background(), time.Now(), time.Second); err == nil {
		t.Fatal("WaitHealth answered with no agent listening")
	}
	s := NewServer(ProcessWaiter{}, Options{})
	defer s.Close()
	go func() {
		time.Sleep(500 * time.Millisecond) // the agent starts late
		l, err := net.Listen("unix", sock)
		if err == nil {
			s.Serve(l)
		}
	}()
	h, err := c.WaitHealth(context.Background(), time.Now().Add(time.Minute), time.Second)
	if err != nil || h.Version != agentwire.Version {
		t.Fatalf("WaitHealth: %+v, %v", h, err)
	}
}
