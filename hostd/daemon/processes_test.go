package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenvm/warren/agentwire"
	hostclient "github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/wire"
)

// procSandbox starts a fake-launcher daemon with one running sandbox of
// tenant alice (env FOO=bar), and returns the raw test client, a
// hostd/client of alice and the sandbox's id.
func procSandbox(t *testing.T) (*testDaemon, *client, *hostclient.Client, string) {
	t.Helper()
	td, _, c := aliceDaemon(t)
	tpl := c.template(fakeKernel(t))
	sb := c.createWith(map[string]any{"template": tpl.ID, "env": []string{"FOO=bar"}})
	hc, err := hostclient.New(td.sock, "alice", "")
	if err != nil {
		t.Fatal(err)
	}
	return td, c, hc, sb.ID
}

// output collects a process's output stream as the client sees it.
type output struct {
	mu     sync.Mutex
	start  *wire.OutputStart
	stdout bytes.Buffer
	stderr bytes.Buffer
	// all is stdout and stderr as they came.
	all    bytes.Buffer
	exit   *wire.ExecFrame
	frames int
}

func (o *output) add(f wire.ExecFrame) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.frames++
	if f.Start != nil {
		if o.frames != 1 {
			return fmt.Errorf("start in frame %d", o.frames)
		}
		o.start = f.Start
	}
	o.stdout.Write(f.Stdout)
	o.stderr.Write(f.Stderr)
	o.all.Write(f.Stdout)
	o.all.Write(f.Stderr)
	if f.Exit != nil {
		o.exit = &f
	}
	return nil
}

func (o *output) text() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.stdout.String()
}

// waitFor waits until the output holds want.
func (o *output) waitFor(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(o.text(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("output %q: no %q after 10 s", o.text(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readOutput reads process pid's output, without follow, from offset.
func readOutput(t *testing.T, hc *hostclient.Client, id, pid string, offset int64) *output {
	t.Helper()
	o := &output{}
	if err := hc.ProcessOutput(context.Background(), id, pid, offset, false, o.add); err != nil {
		t.Fatalf("output of %s: %v", pid, err)
	}
	return o
}

// The process API's routes, through hostd/client, against the real guest
// agent: start (with the sandbox's env), list, get, output (replay and
// offsets), wait, stdin, signal, resize, remove.
func TestProcessAPI(t *testing.T) {
	_, c, hc, id := procSandbox(t)
	ctx := context.Background()

	p, err := hc.StartProcess(ctx, id, wire.ProcessRequest{Argv: []string{"sh", "-c", "echo $FOO $BAZ; echo err >&2; exit 3"},
		Env: []string{"BAZ=qux"}, Tag: "t1"})
	if err != nil || p.ID == "" || p.Pid <= 0 || p.Tag != "t1" {
		t.Fatalf("start: %+v %v", p, err)
	}
	w, err := hc.WaitProcess(ctx, id, p.ID)
	if err != nil || w.State != agentwire.ProcessExited || w.Exit == nil || w.Exit.Code != 3 {
		t.Fatalf("wait: %+v %v", w, err)
	}
	o := readOutput(t, hc, id, p.ID, -1)
	if o.start == nil || o.start.Offset != 0 || o.stdout.String() != "bar qux\n" || o.stderr.String() != "err\n" || o.exit == nil || *o.exit.Exit != 3 {
		t.Fatalf("output: start %+v stdout %q stderr %q exit %+v", o.start, o.stdout.String(), o.stderr.String(), o.exit)
	}
	// From an offset: what comes after it.
	// (stdout and stderr come in the order the agent read them.)
	o4 := readOutput(t, hc, id, p.ID, 4)
	if o4.start == nil || o4.start.Offset != 4 || o4.all.String() != o.all.String()[4:] || o4.exit == nil {
		t.Fatalf("output from 4: start %+v %q, want %q", o4.start, o4.all.String(), o.all.String()[4:])
	}
	l, err := hc.Processes(ctx, id)
	if err != nil || len(l) != 1 || l[0].ID != p.ID {
		t.Fatalf("processes: %+v %v", l, err)
	}
	if g, err := hc.Process(ctx, id, p.ID); err != nil || g.State != agentwire.ProcessExited || g.OutputBytes != int64(len("bar qux\nerr\n")) {
		t.Fatalf("process: %+v %v", g, err)
	}

	// stdin: a chunk, then eof.
	cat, err := hc.StartProcess(ctx, id, wire.ProcessRequest{Argv: []string{"cat"}, Stdin: true})
	if err != nil || !cat.StdinOpen {
		t.Fatalf("start cat: %+v %v", cat, err)
	}
	if err := hc.SendStdin(ctx, id, cat.ID, strings.NewReader("hello\n"), false); err != nil {
		t.Fatal(err)
	}
	if err := hc.SendStdin(ctx, id, cat.ID, strings.NewReader("world\n"), true); err != nil {
		t.Fatal(err)
	}
	if w, err := hc.WaitProcess(ctx, id, cat.ID); err != nil || w.Exit == nil || w.Exit.Code != 0 {
		t.Fatalf("wait cat: %+v %v", w, err)
	}
	if o := readOutput(t, hc, id, cat.ID, 0); o.stdout.String() != "hello\nworld\n" {
		t.Fatalf("cat's output %q", o.stdout.String())
	}

	// signal
	sl, err := hc.StartProcess(ctx, id, wire.ProcessRequest{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hc.SignalProcess(ctx, id, sl.ID, "SIGTERM"); err != nil {
		t.Fatal(err)
	}
	if w, err := hc.WaitProcess(ctx, id, sl.ID); err != nil || w.Exit == nil || !strings.Contains(w.Exit.Signal, "TERM") {
		t.Fatalf("wait after SIGTERM: %+v %v", w, err)
	}

	// resize: the terminal's new size is what stty sees.
	tty, err := hc.StartProcess(ctx, id, wire.ProcessRequest{Argv: []string{"sh", "-c", "read x; stty size"}, PTY: &wire.TerminalSize{Rows: 24, Cols: 80}})
	if err != nil || tty.PTY == nil {
		t.Fatalf("start on a pty: %+v %v", tty, err)
	}
	if r, err := hc.ResizeProcess(ctx, id, tty.ID, wire.TerminalSize{Rows: 30, Cols: 100}); err != nil || r.PTY == nil || r.PTY.Rows != 30 {
		t.Fatalf("resize: %+v %v", r, err)
	}
	if err := hc.SendStdin(ctx, id, tty.ID, strings.NewReader("\n"), false); err != nil {
		t.Fatal(err)
	}
	if w, err := hc.WaitProcess(ctx, id, tty.ID); err != nil || w.Exit == nil || w.Exit.Code != 0 {
		t.Fatalf("wait tty: %+v %v", w, err)
	}
	if o := readOutput(t, hc, id, tty.ID, 0); !strings.Contains(o.stdout.String(), "30 100") {
		t.Fatalf("stty size on the resized pty: %q", o.stdout.String())
	}

	// remove: a running one is killed and forgotten.
	long, err := hc.StartProcess(ctx, id, wire.ProcessRequest{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	var del map[string]string
	c.ok(200, "DELETE", "/v1/sandboxes/"+id+"/processes/"+long.ID, nil, &del)
	if del["deleted"] != long.ID {
		t.Fatalf("delete answered %v", del)
	}
	if _, err := hc.Process(ctx, id, long.ID); !hostclient.IsNotFound(err) {
		t.Fatalf("a removed process: %v, want 404", err)
	}
}

// A follower sees output as it comes and the exit last; a client that
// reconnects with the offset it reached gets only what it missed.
func TestProcessFollow(t *testing.T) {
	_, _, hc, id := procSandbox(t)
	ctx := context.Background()
	p, err := hc.StartProcess(ctx, id, wire.ProcessRequest{Argv: []string{"sh", "-c", "echo one; read x; echo two $x"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	o := &output{}
	done := make(chan error, 1)
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { done <- hc.ProcessOutput(fctx, id, p.ID, -1, true, o.add) }()
	o.waitFor(t, "one\n")
	// A second client, gone before the end: the process goes on.
	short, stop := context.WithTimeout(ctx, 200*time.Millisecond)
	err = hc.ProcessOutput(short, id, p.ID, 0, true, func(wire.ExecFrame) error { return nil })
	stop()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a follower whose context ended: %v", err)
	}
	if err := hc.SendStdin(ctx, id, p.ID, strings.NewReader("three\n"), true); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("follow: %v", err)
	}
	if o.text() != "one\ntwo three\n" || o.exit == nil || *o.exit.Exit != 0 {
		t.Fatalf("followed %q exit %+v", o.text(), o.exit)
	}
	re := &output{}
	if err := hc.ProcessOutput(ctx, id, p.ID, 4, true, re.add); err != nil || re.text() != "two three\n" || re.exit == nil {
		t.Fatalf("reconnect from 4: %q %+v %v", re.text(), re.exit, err)
	}
}

// Processes live in the guest: a follower goes on across an in-memory
// pause and resume, a rollback ends it (with an error line: the agent's
// connections were rewound) and it reconnects from its offset, and a
// fork neither stops the parent's process nor its output.
func TestProcessesSurvive(t *testing.T) {
	_, c, hc, id := procSandbox(t)
	ctx := context.Background()
	p, err := hc.StartProcess(ctx, id, wire.ProcessRequest{Argv: []string{"sh", "-c", "while read l; do echo got $l; done"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	send := func(s string) {
		t.Helper()
		if err := hc.SendStdin(ctx, id, p.ID, strings.NewReader(s+"\n"), false); err != nil {
			t.Fatal(err)
		}
	}
	follow := func(pid string, offset int64) (*output, chan error) {
		o := &output{}
		done := make(chan error, 1)
		go func() { done <- hc.ProcessOutput(ctx, id, pid, offset, true, o.add) }()
		return o, done
	}
	o, done := follow(p.ID, -1)
	send("a")
	o.waitFor(t, "got a\n")

	c.ok(200, "POST", "/v1/sandboxes/"+id+"/pause", nil, nil)
	// While paused the agent is not asked (409); the follower waits.
	if _, err := hc.Processes(ctx, id); err == nil || !strings.Contains(err.Error(), "409") {
		t.Fatalf("processes of a paused sandbox: %v, want 409", err)
	}
	c.ok(200, "POST", "/v1/sandboxes/"+id+"/resume", nil, nil)
	send("b")
	o.waitFor(t, "got b\n")

	c.ok(201, "POST", "/v1/sandboxes/"+id+"/snapshots", map[string]any{"name": "s1"}, nil)
	c.ok(200, "POST", "/v1/sandboxes/"+id+"/rollback", map[string]any{"snapshot": "s1"}, nil)
	select {
	case err := <-done:
		var he *hostclient.Error
		if !errors.As(err, &he) || !strings.Contains(he.Message, "rolled back") {
			t.Fatalf("a follower across a rollback ended with %v, want the rollback's error line", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a follower across a rollback did not end")
	}
	// Reconnect from where it was.
	re, done := follow(p.ID, int64(len(o.text())))
	send("c")
	re.waitFor(t, "got c\n")
	if re.text() != "got c\n" || re.start == nil || re.start.Offset != int64(len(o.text())) {
		t.Fatalf("reconnected at %+v: %q", re.start, re.text())
	}

	fr := c.fork(id, 1)
	child := fr.Children[0].ID
	l, err := hc.Processes(ctx, child)
	if err != nil || l == nil {
		t.Fatalf("the fork child's processes: %v %v (want a list, never null)", l, err)
	}
	send("d")
	re.waitFor(t, "got d\n")
	if l, err := hc.Processes(ctx, id); err != nil || len(l) != 1 || l[0].State != agentwire.ProcessRunning {
		t.Fatalf("the parent's processes after a fork: %+v %v", l, err)
	}
	if err := hc.SendStdin(ctx, id, p.ID, nil, true); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || re.exit == nil {
		t.Fatalf("the follower at the exit: %v %+v", err, re.exit)
	}

	// A pause to disk stops the VMM: a follower and a waiter end (the
	// client comes back after the resume).
	sl, err := hc.StartProcess(ctx, id, wire.ProcessRequest{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	_, done = follow(sl.ID, -1)
	waited := make(chan error, 1)
	go func() { _, err := hc.WaitProcess(ctx, id, sl.ID); waited <- err }()
	time.Sleep(100 * time.Millisecond) // both are under way
	c.ok(200, "POST", "/v1/sandboxes/"+id+"/pause?to_disk=true", nil, nil)
	for what, ch := range map[string]chan error{"follower": done, "waiter": waited} {
		select {
		case err := <-ch:
			if err == nil {
				t.Errorf("the %s across a pause to disk ended without an error", what)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the %s across a pause to disk did not end", what)
		}
	}
}

// What a tenant may not do: another tenant's sandbox, an unknown process,
// a stdin chunk over the bound, bad parameters.
func TestProcessLimits(t *testing.T) {
	td, c, hc, id := procSandbox(t)
	ctx := context.Background()
	p, err := hc.StartProcess(ctx, id, wire.ProcessRequest{Argv: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	base := "/v1/sandboxes/" + id + "/processes"
	bob := td.client(t, "bob")
	for _, r := range []struct{ method, path string }{
		{"GET", base}, {"POST", base}, {"GET", base + "/" + p.ID}, {"GET", base + "/" + p.ID + "/output"},
		{"GET", base + "/" + p.ID + "/wait"}, {"POST", base + "/" + p.ID + "/stdin"}, {"DELETE", base + "/" + p.ID},
		{"POST", base + "/" + p.ID + "/signal"}, {"POST", base + "/" + p.ID + "/resize"},
	} {
		var body any
		switch {
		case strings.HasSuffix(r.path, "/signal"):
			body = map[string]string{"signal": "KILL"}
		case strings.HasSuffix(r.path, "/resize"):
			body = map[string]int{"rows": 1, "cols": 1}
		case r.method == "POST" && r.path == base:
			body = map[string]any{"argv": []string{"true"}}
		}
		if st, b := bob.do(r.method, r.path, body); st != 404 {
			t.Errorf("bob: %s %s: %d %s, want 404", r.method, r.path, st, b)
		}
	}
	for _, pid := range []string{"nope", "a%2Fb", "sb-0%3Fx=1"} {
		for _, r := range []struct{ method, path string }{
			{"GET", base + "/" + pid}, {"GET", base + "/" + pid + "/output"}, {"GET", base + "/" + pid + "/wait"},
			{"DELETE", base + "/" + pid},
		} {
			if st, b := c.do(r.method, r.path, nil); st != 404 {
				t.Errorf("%s %s: %d %s, want 404", r.method, r.path, st, b)
			}
		}
		if st, b := c.do("POST", base+"/"+pid+"/signal", map[string]string{"signal": "TERM"}); st != 404 {
			t.Errorf("signal %s: %d %s", pid, st, b)
		}
	}
	if st, b := c.do("POST", base+"/"+p.ID+"/stdin", make([]byte, agentwire.MaxStdinChunk+1)); st != http.StatusRequestEntityTooLarge {
		t.Errorf("stdin over the bound: %d %s", st, b)
	}
	if st, b := c.do("POST", base+"/"+p.ID+"/stdin", make([]byte, agentwire.MaxStdinChunk)); st != http.StatusNoContent {
		t.Errorf("stdin at the bound: %d %s", st, b)
	}
	for _, r := range []struct {
		method, path string
		body         any
	}{
		{"POST", base, map[string]any{"argv": []string{}}},
		{"POST", base, map[string]any{"argv": []string{"true"}, "bogus": 1}},
		{"GET", base + "/" + p.ID + "/output?offset=x", nil},
		{"GET", base + "/" + p.ID + "/output?follow=maybe", nil},
		{"POST", base + "/" + p.ID + "/stdin?eof=2", []byte("x")},
		{"POST", base + "/" + p.ID + "/signal", map[string]string{}},
		{"POST", base + "/" + p.ID + "/resize", map[string]int{"rows": 0, "cols": 80}},
	} {
		if st, b := c.do(r.method, r.path, r.body); st != 400 {
			t.Errorf("%s %s %v: %d %s, want 400", r.method, r.path, r.body, st, b)
		}
	}
	// A program the guest does not have: the agent's code comes along.
	_, err = hc.StartProcess(ctx, id, wire.ProcessRequest{Argv: []string{"/no/such/program"}})
	var he *hostclient.Error
	if !errors.As(err, &he) || he.Status/100 != 4 || he.Code == "" {
		t.Fatalf("a missing program: %v, want a 4xx with the agent's code", err)
	}
	// A list is never null.
	if st, b := c.do("GET", base, nil); st != 200 || bytes.HasPrefix(b, []byte("null")) {
		t.Fatalf("list: %d %s", st, b)
	}
	if err := hc.SendStdin(ctx, id, p.ID, nil, true); err != nil {
		t.Fatal(err)
	}
}
