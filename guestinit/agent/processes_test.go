//go:build linux

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/agentwire"
)

// serveClients serves s on a unix socket and returns a maker of new
// clients of it, each with connections of its own (a client that
// "reconnects"); the test's end closes them and s.
func serveClients(t *testing.T, s *Server) func() *agentclient.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	var clients []*agentclient.Client
	t.Cleanup(func() {
		for _, c := range clients {
			c.Close()
		}
		s.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return func() *agentclient.Client {
		c := agentclient.NewDial(func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		})
		clients = append(clients, c)
		return c
	}
}

// newTestServer is a server of a ProcessWaiter with default options.
func newTestServer() *Server { return NewServer(ProcessWaiter{}, Options{}) }

// output is what one output stream brought.
type output struct {
	starts []agentwire.OutputStart
	stdout bytes.Buffer
	stderr bytes.Buffer
	// order is the frames' types, in order (FrameOutputStart excluded).
	order []byte
	exit  *agentwire.ExitStatus
}

// readOutput reads process id's output from offset.
func readOutput(ctx context.Context, t *testing.T, c *agentclient.Client, id string, offset int64, follow bool) (*output, error) {
	t.Helper()
	o := &output{}
	err := c.ProcessOutput(ctx, id, offset, follow, func(typ byte, p []byte) error {
		switch typ {
		case agentwire.FrameOutputStart:
			var st agentwire.OutputStart
			if err := json.Unmarshal(p, &st); err != nil {
				return err
			}
			o.starts = append(o.starts, st)
			return nil
		case agentwire.FrameStdout:
			o.stdout.Write(p)
		case agentwire.FrameStderr:
			o.stderr.Write(p)
		case agentwire.FrameExit:
			o.exit = &agentwire.ExitStatus{}
			if err := json.Unmarshal(p, o.exit); err != nil {
				return err
			}
		}
		o.order = append(o.order, typ)
		return nil
	})
	return o, err
}

// errFound ends an output stream that showed what was looked for.
var errFound = errors.New("found")

// waitOutput follows process id's output until its stdout contains want,
// and returns the stdout read.
func waitOutput(t *testing.T, c *agentclient.Client, id string, offset int64, want string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var out bytes.Buffer
	err := c.ProcessOutput(ctx, id, offset, true, func(typ byte, p []byte) error {
		if typ == agentwire.FrameStdout {
			out.Write(p)
			if strings.Contains(out.String(), want) {
				return errFound
			}
		}
		return nil
	})
	if !errors.Is(err, errFound) {
		t.Fatalf("process %s: waiting for %q: %v; output %q", id, want, err, out.String())
	}
	return out.String()
}

func startProc(t *testing.T, c *agentclient.Client, req agentwire.ProcessRequest) agentwire.ProcessInfo {
	t.Helper()
	pi, err := c.StartProcess(ctxT(t), req)
	if err != nil {
		t.Fatalf("start %.200q: %v", req.Argv, err)
	}
	if pi.ID == "" || pi.Pid <= 0 || pi.State != agentwire.ProcessRunning {
		t.Fatalf("start %.200q: %+v", req.Argv, pi)
	}
	return pi
}

func wantCode(t *testing.T, err *agentwire.Error, code string) {
	t.Helper()
	if err == nil || err.Code != code {
		t.Fatalf("error %v, want code %s", err, code)
	}
}

func asAgentError(err error) *agentwire.Error {
	var e *agentwire.Error
	if errors.As(err, &e) {
		return e
	}
	return nil
}

func TestProcessSurvivesDisconnect(t *testing.T) {
	newClient := serveClients(t, newTestServer())
	c1 := newClient()
	pi := startProc(t, c1, agentwire.ProcessRequest{Argv: []string{"sh", "-c", "echo started; sleep 1; echo done"}, Tag: "bg"})
	// A follower that goes away, and a client that closes its connections.
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() {
		_, err := readOutput(ctx, t, c1, pi.ID, 0, true)
		got <- err
	}()
	time.Sleep(200 * time.Millisecond)
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled follower: %v", err)
	}
	c1.Close()

	c2 := newClient()
	l, err := c2.Processes(ctxT(t))
	if err != nil || len(l) != 1 || l[0].ID != pi.ID || l[0].Tag != "bg" || l[0].State != agentwire.ProcessRunning {
		t.Fatalf("Processes after reconnect: %+v, %v", l, err)
	}
	o, err := readOutput(ctxT(t), t, c2, pi.ID, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	if o.stdout.String() != "started\ndone\n" || o.exit == nil || o.exit.Code != 0 {
		t.Fatalf("stdout %q exit %+v", o.stdout.String(), o.exit)
	}
	info, err := c2.Process(ctxT(t), pi.ID)
	if err != nil || info.State != agentwire.ProcessExited || info.Exit == nil || info.Exit.Code != 0 || info.OutputBytes != int64(len("started\ndone\n")) {
		t.Fatalf("Process: %+v, %v", info, err)
	}
}

func TestProcessOutputReplay(t *testing.T) {
	c := serveClients(t, newTestServer())()
	pi := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"sh", "-c", "printf aaaa; sleep 0.1; printf bbbb >&2; sleep 0.1; printf cccc; exit 3"}})
	if w, err := c.WaitProcess(ctxT(t), pi.ID); err != nil || w.Exit == nil || w.Exit.Code != 3 {
		t.Fatalf("WaitProcess: %+v, %v", w, err)
	}
	for _, tc := range []struct {
		name           string
		offset         int64
		follow         bool
		start          agentwire.OutputStart
		stdout, stderr string
		order          []byte
	}{
		{"from 0", 0, true, agentwire.OutputStart{}, "aaaacccc", "bbbb", []byte{1, 2, 1, 3}},
		{"oldest kept", -1, false, agentwire.OutputStart{}, "aaaacccc", "bbbb", []byte{1, 2, 1, 3}},
		{"middle of stderr", 6, true, agentwire.OutputStart{Offset: 6}, "cccc", "bb", []byte{2, 1, 3}},
		{"at the end", 12, false, agentwire.OutputStart{Offset: 12}, "", "", []byte{3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := readOutput(ctxT(t), t, c, pi.ID, tc.offset, tc.follow)
			if err != nil {
				t.Fatal(err)
			}
			if len(o.starts) != 1 || o.starts[0] != tc.start {
				t.Errorf("starts %+v, want %+v", o.starts, tc.start)
			}
			if o.stdout.String() != tc.stdout || o.stderr.String() != tc.stderr || !bytes.Equal(o.order, tc.order) {
				t.Errorf("stdout %q stderr %q order %v", o.stdout.String(), o.stderr.String(), o.order)
			}
			if o.exit == nil || o.exit.Code != 3 {
				t.Errorf("exit %+v", o.exit)
			}
		})
	}
}

func TestProcessOutputSnapshot(t *testing.T) {
	c := serveClients(t, newTestServer())()
	pi := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"sh", "-c", "echo first; exec sleep 60"}})
	waitOutput(t, c, pi.ID, 0, "first\n")
	t0 := time.Now()
	o, err := readOutput(ctxT(t), t, c, pi.ID, -1, false)
	if err != nil {
		t.Fatal(err)
	}
	if o.stdout.String() != "first\n" || o.exit != nil || time.Since(t0) > 5*time.Second {
		t.Fatalf("snapshot: stdout %q exit %+v after %v", o.stdout.String(), o.exit, time.Since(t0))
	}
	// An offset past the end waits for output from there.
	ctx, cancel := context.WithTimeout(ctxT(t), 300*time.Millisecond)
	defer cancel()
	o, err = readOutput(ctx, t, c, pi.ID, 100, true)
	if !errors.Is(err, context.DeadlineExceeded) || len(o.starts) != 1 || o.starts[0].Offset != 100 || o.stdout.Len() != 0 {
		t.Fatalf("past the end: %+v, %v", o, err)
	}
}

func TestProcessOutputBound(t *testing.T) {
	c := serveClients(t, newTestServer())()
	dir := t.TempDir()
	const total = 3 << 20
	file := filepath.Join(dir, "data")
	pi := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"sh", "-c", "head -c 3145728 /dev/urandom > data; cat data"}, Cwd: dir})
	info, err := c.WaitProcess(ctxT(t), pi.ID)
	if err != nil || info.Exit == nil || info.Exit.Code != 0 {
		t.Fatalf("WaitProcess: %+v, %v", info, err)
	}
	if info.OutputBytes != total || info.OutputFrom != total-agentwire.MaxProcessOutput {
		t.Fatalf("output bytes %d from %d", info.OutputBytes, info.OutputFrom)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	o, err := readOutput(ctxT(t), t, c, pi.ID, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	want := agentwire.OutputStart{Offset: total - agentwire.MaxProcessOutput, Dropped: total - agentwire.MaxProcessOutput}
	if len(o.starts) != 1 || o.starts[0] != want {
		t.Fatalf("starts %+v, want %+v", o.starts, want)
	}
	if !bytes.Equal(o.stdout.Bytes(), data[total-agentwire.MaxProcessOutput:]) {
		t.Fatalf("kept %d bytes, not the last MiB", o.stdout.Len())
	}
}

func TestProcessStdin(t *testing.T) {
	c := serveClients(t, newTestServer())()
	pi := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"cat"}, Stdin: true})
	if !pi.StdinOpen {
		t.Fatal("stdin not open")
	}
	if err := c.SendStdin(ctxT(t), pi.ID, strings.NewReader("hello\n"), false); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, c, pi.ID, 0, "hello\n")
	if err := c.SendStdin(ctxT(t), pi.ID, strings.NewReader("world"), true); err != nil {
		t.Fatal(err)
	}
	info, err := c.WaitProcess(ctxT(t), pi.ID)
	if err != nil || info.Exit.Code != 0 || info.StdinOpen {
		t.Fatalf("WaitProcess: %+v, %v", info, err)
	}
	o, err := readOutput(ctxT(t), t, c, pi.ID, 0, false)
	if err != nil || o.stdout.String() != "hello\nworld" {
		t.Fatalf("output %q, %v", o.stdout.String(), err)
	}
	// No stdin after the exit, nor for a process started without it.
	wantCode(t, asAgentError(c.SendStdin(ctxT(t), pi.ID, strings.NewReader("x"), false)), agentwire.CodeBadRequest)
	pi = startProc(t, c, agentwire.ProcessRequest{Argv: []string{"sleep", "60"}})
	wantCode(t, asAgentError(c.SendStdin(ctxT(t), pi.ID, strings.NewReader("x"), false)), agentwire.CodeBadRequest)
}

func TestProcessStdinNotRead(t *testing.T) {
	c := serveClients(t, newTestServer())()
	pi := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"sleep", "60"}, Stdin: true})
	// More than a pipe holds, to a process that never reads: the write
	// ends with the request's context, and the process lives on.
	ctx, cancel := context.WithTimeout(ctxT(t), 500*time.Millisecond)
	defer cancel()
	err := c.SendStdin(ctx, pi.ID, bytes.NewReader(make([]byte, agentwire.MaxStdinChunk)), false)
	if err == nil {
		t.Fatal("stdin write to a process that does not read succeeded")
	}
	// The next write waits for no earlier one.
	ctx2, cancel2 := context.WithTimeout(ctxT(t), 300*time.Millisecond)
	defer cancel2()
	_ = c.SendStdin(ctx2, pi.ID, bytes.NewReader(make([]byte, 1<<20)), false)
	info, err := c.Process(ctxT(t), pi.ID)
	if err != nil || info.State != agentwire.ProcessRunning {
		t.Fatalf("Process: %+v, %v", info, err)
	}
	// Too large a chunk is refused.
	err = c.SendStdin(ctxT(t), pi.ID, bytes.NewReader(make([]byte, agentwire.MaxStdinChunk+1)), false)
	wantCode(t, asAgentError(err), agentwire.CodeBadRequest)
}

func TestProcessSignalWaitDelete(t *testing.T) {
	c := serveClients(t, newTestServer())()
	for _, tc := range []struct {
		signal string
		code   int
		name   string
	}{
		{"TERM", 128 + int(syscall.SIGTERM), "SIGTERM"},
		{"SIGINT", 128 + int(syscall.SIGINT), "SIGINT"},
		{"9", 128 + int(syscall.SIGKILL), "SIGKILL"},
	} {
		pi := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"sleep", "60"}})
		if _, err := c.SignalProcess(ctxT(t), pi.ID, tc.signal); err != nil {
			t.Fatalf("signal %s: %v", tc.signal, err)
		}
		info, err := c.WaitProcess(ctxT(t), pi.ID)
		if err != nil || info.State != agentwire.ProcessExited || info.Exit.Code != tc.code || info.Exit.Signal != tc.name {
			t.Fatalf("signal %s: %+v %+v, %v", tc.signal, info, info.Exit, err)
		}
		// Signalling an exited process is no error.
		if info, err := c.SignalProcess(ctxT(t), pi.ID, "TERM"); err != nil || info.State != agentwire.ProcessExited {
			t.Fatalf("signal after exit: %+v, %v", info, err)
		}
	}
	pi := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"sleep", "60"}})
	_, err := c.SignalProcess(ctxT(t), pi.ID, "NOSUCH")
	wantCode(t, asAgentError(err), agentwire.CodeBadRequest)

	// A wait that the client gives up leaves the process running.
	ctx, cancel := context.WithTimeout(ctxT(t), 200*time.Millisecond)
	defer cancel()
	if _, err := c.WaitProcess(ctx, pi.ID); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitProcess: %v", err)
	}
	// Delete kills it, reaps it and forgets it.
	if err := c.RemoveProcess(ctxT(t), pi.ID); err != nil {
		t.Fatal(err)
	}
	if alive(pi.Pid) {
		t.Fatalf("pid %d alive after RemoveProcess", pi.Pid)
	}
	_, err = c.Process(ctxT(t), pi.ID)
	wantCode(t, asAgentError(err), agentwire.CodeNotFound)
	wantCode(t, asAgentError(c.RemoveProcess(ctxT(t), pi.ID)), agentwire.CodeNotFound)
}

func TestProcessGroupKilled(t *testing.T) {
	c := serveClients(t, newTestServer())()
	pi := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"sh", "-c", "sleep 60 & echo $!; wait"}})
	out := waitOutput(t, c, pi.ID, 0, "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.RemoveProcess(ctxT(t), pi.ID); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid) // the orphaned sleep: gone only if the group was killed
}

func TestProcessTimeout(t *testing.T) {
	c := serveClients(t, newTestServer())()
	never := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"sleep", "60"}, TimeoutMS: 0})
	timed := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"sh", "-c", "sleep 60 & wait"}, TimeoutMS: 300})
	info, err := c.WaitProcess(ctxT(t), timed.ID)
	if err != nil || !info.Exit.TimedOut || info.Exit.Code != 128+int(syscall.SIGKILL) {
		t.Fatalf("timed: %+v %+v, %v", info, info.Exit, err)
	}
	time.Sleep(2 * time.Second)
	info, err = c.Process(ctxT(t), never.ID)
	if err != nil || info.State != agentwire.ProcessRunning || !alive(never.Pid) {
		t.Fatalf("timeout 0: %+v, %v", info, err)
	}
}

func TestProcessStartErrors(t *testing.T) {
	c := serveClients(t, newTestServer())()
	for _, tc := range []struct {
		name string
		req  agentwire.ProcessRequest
		code string
	}{
		{"empty argv", agentwire.ProcessRequest{}, agentwire.CodeBadRequest},
		{"not found", agentwire.ProcessRequest{Argv: []string{"no-such-program-warren"}}, agentwire.CodeNotFound},
		{"bad cwd", agentwire.ProcessRequest{Argv: []string{"true"}, Cwd: "/no/such/dir"}, agentwire.CodeNotFound},
		{"long tag", agentwire.ProcessRequest{Argv: []string{"true"}, Tag: strings.Repeat("x", 257)}, agentwire.CodeBadRequest},
		{"zero terminal", agentwire.ProcessRequest{Argv: []string{"true"}, PTY: &agentwire.TerminalSize{}}, agentwire.CodeBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.StartProcess(ctxT(t), tc.req)
			wantCode(t, asAgentError(err), tc.code)
		})
	}
	if l, err := c.Processes(ctxT(t)); err != nil || len(l) != 0 {
		t.Fatalf("Processes after failed starts: %+v, %v", l, err)
	}
	_, err := c.Process(ctxT(t), "nope")
	wantCode(t, asAgentError(err), agentwire.CodeNotFound)
}

func TestProcessMax(t *testing.T) {
	s := newTestServer()
	s.table.max = 2
	c := serveClients(t, s)()
	a := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"true"}})
	if _, err := c.WaitProcess(ctxT(t), a.ID); err != nil {
		t.Fatal(err)
	}
	b := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"sleep", "60"}})
	// Full: the exited one is forgotten for the new one.
	d := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"sleep", "60"}})
	if _, err := c.Process(ctxT(t), a.ID); asAgentError(err) == nil || asAgentError(err).Code != agentwire.CodeNotFound {
		t.Fatalf("exited process kept: %v", err)
	}
	// All running: refused.
	_, err := c.StartProcess(ctxT(t), agentwire.ProcessRequest{Argv: []string{"true"}})
	wantCode(t, asAgentError(err), agentwire.CodeBadRequest)
	l, err := c.Processes(ctxT(t))
	if err != nil || len(l) != 2 || l[0].ID != b.ID || l[1].ID != d.ID {
		t.Fatalf("Processes: %+v, %v", l, err)
	}
}

func TestProcessIDPrefix(t *testing.T) {
	syncer := NewSyncer(nil)
	applied := 0
	syncer.SetIdentity = func(*agentwire.Identity) error { applied++; return nil }
	s := NewServer(ProcessWaiter{}, Options{Sync: syncer})
	c := serveClients(t, s)()
	a := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"true"}})
	b := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"true"}})
	prefix := func(id string) string { p, _, _ := strings.Cut(id, "-"); return p }
	if a.ID == b.ID || prefix(a.ID) != prefix(b.ID) {
		t.Fatalf("ids %s %s", a.ID, b.ID)
	}
	// A fork child's new identity: a new namespace for new processes.
	if err := syncer.SetIdentity(&agentwire.Identity{}); err != nil || applied != 1 {
		t.Fatalf("SetIdentity: %v, applied %d", err, applied)
	}
	d := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"true"}})
	if prefix(d.ID) == prefix(a.ID) || d.ID == a.ID || d.ID == b.ID {
		t.Fatalf("id after the identity change %s, before %s", d.ID, a.ID)
	}
	l, err := c.Processes(ctxT(t))
	if err != nil || len(l) != 3 || l[0].ID != a.ID || l[1].ID != b.ID || l[2].ID != d.ID {
		t.Fatalf("Processes: %+v, %v", l, err)
	}
}

// TestProcessIDPrefixPerRestore: every re-sync (one follows each restore)
// renews the namespace with the host's entropy, so sandboxes restored from
// one template (the same memory, the same random state) name their new
// processes apart, and the same sandbox's later processes too.
func TestProcessIDPrefixPerRestore(t *testing.T) {
	prefix := func(id string) string { p, _, _ := strings.Cut(id, "-"); return p }
	var firsts []string
	for _, entropy := range []string{"host entropy of sandbox 1", "host entropy of sandbox 2"} {
		syncer := NewSyncer(nil)
		syncer.AddEntropy = func([]byte) error { return nil }
		s := NewServer(ProcessWaiter{}, Options{Sync: syncer})
		s.table.renewPrefix("the template's state") // as restored: both alike
		c := serveClients(t, s)()
		before := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"true"}})
		if err := syncer.AddEntropy([]byte(entropy)); err != nil {
			t.Fatal(err)
		}
		after := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"true"}})
		if prefix(after.ID) == prefix(before.ID) {
			t.Fatalf("ids %s then %s: a re-sync did not renew the namespace", before.ID, after.ID)
		}
		firsts = append(firsts, after.ID)
	}
	if firsts[0] == firsts[1] {
		t.Fatalf("two sandboxes from one template both named a process %s", firsts[0])
	}
}

func TestProcessEnvUser(t *testing.T) {
	c := serveClients(t, newTestServer())()
	dir := t.TempDir()
	pi := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"sh", "-c", `echo "$FOO $(pwd) $TERM"`}, Env: []string{"FOO=bar", "TERM=dumb"}, Cwd: dir})
	if _, err := c.WaitProcess(ctxT(t), pi.ID); err != nil {
		t.Fatal(err)
	}
	o, err := readOutput(ctxT(t), t, c, pi.ID, 0, false)
	if err != nil || o.stdout.String() != "bar "+dir+" dumb\n" {
		t.Fatalf("output %q, %v", o.stdout.String(), err)
	}
	if pi.Cwd != dir {
		t.Fatalf("cwd %q", pi.Cwd)
	}
}

func TestProcessServerCloseKills(t *testing.T) {
	s := newTestServer()
	c := serveClients(t, s)()
	pi := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"sleep", "60"}})
	s.Close()
	if alive(pi.Pid) {
		t.Fatalf("pid %d alive after Close", pi.Pid)
	}
}

func TestAbbreviate(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		max  int
		want []string
		cut  bool
	}{
		{[]string{"sh", "-c", "echo"}, 100, []string{"sh", "-c", "echo"}, false},
		{[]string{"sh", "-c", "echo"}, 7, []string{"sh", "-c", "ech"}, true},
		{[]string{"sh", "-c", "echo", "x"}, 8, []string{"sh", "-c", "echo", ""}, true},
		{[]string{"ab", "é"}, 3, []string{"ab", ""}, true}, // not half a rune
	} {
		got, cut := abbreviate(tc.argv, tc.max)
		if !slices.Equal(got, tc.want) || cut != tc.cut {
			t.Errorf("abbreviate(%q, %d) = %q, %v", tc.argv, tc.max, got, cut)
		}
	}
}

func TestProcessLongArgv(t *testing.T) {
	c := serveClients(t, newTestServer())()
	script := "echo ok #" + strings.Repeat("x", 100<<10)
	pi := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"sh", "-c", script}})
	if !pi.ArgvTruncated || len(strings.Join(pi.Argv, "")) > agentwire.MaxInfoArgv || pi.Argv[0] != "sh" {
		t.Fatalf("argv of %d bytes reported, truncated %v", len(strings.Join(pi.Argv, "")), pi.ArgvTruncated)
	}
	if info, err := c.WaitProcess(ctxT(t), pi.ID); err != nil || info.Exit.Code != 0 {
		t.Fatalf("WaitProcess: %+v, %v", info, err)
	}
}

func TestProcessRoutes(t *testing.T) {
	s := newTestServer()
	c := serveClients(t, s)()
	pi := startProc(t, c, agentwire.ProcessRequest{Argv: []string{"sleep", "60"}})
	for _, tc := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"PUT", "/processes", http.StatusMethodNotAllowed, agentwire.CodeMethodNotAllowed},
		{"POST", "/processes/" + pi.ID, http.StatusMethodNotAllowed, agentwire.CodeMethodNotAllowed},
		{"POST", "/processes/" + pi.ID + "/output", http.StatusMethodNotAllowed, agentwire.CodeMethodNotAllowed},
		{"GET", "/processes/" + pi.ID + "/stdin", http.StatusMethodNotAllowed, agentwire.CodeMethodNotAllowed},
		{"GET", "/processes/" + pi.ID + "/nope", http.StatusNotFound, agentwire.CodeNotFound},
		{"GET", "/processes/nope/output", http.StatusNotFound, agentwire.CodeNotFound},
		{"GET", "/processes/" + pi.ID + "/output?offset=x", http.StatusBadRequest, agentwire.CodeBadRequest},
		{"GET", "/processes/" + pi.ID + "/output?follow=maybe", http.StatusBadRequest, agentwire.CodeBadRequest},
		{"POST", "/processes", http.StatusBadRequest, agentwire.CodeBadRequest}, // no body
	} {
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, httptest.NewRequest(tc.method, tc.path, nil))
		var e agentwire.Error
		if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || w.Code != tc.status || e.Code != tc.code {
			t.Errorf("%s %s: %d %q", tc.method, tc.path, w.Code, w.Body.String())
		}
	}
}
