package mcpserver

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
)

// fakeDaemon is a recording Daemon for the tests of the tools' arguments
// and answers' format: it records every call and answers with just enough
// state (sandboxes, files, snapshots of the files) for the scenario of
// drive to read back what it did. Commands are not run: exec and the
// processes answer from script. The same scenario runs against a real
// warren-hostd in the E2E tests, where the behaviour is checked.
type fakeDaemon struct {
	mu    sync.Mutex
	calls []call
	next  int
	// templates are the templates listed.
	templates []client.Template
	sandboxes map[string]*client.Sandbox
	// files are the sandboxes' files, by sandbox and path; snaps the
	// files at each snapshot, by sandbox and snapshot name.
	files map[string]map[string][]byte
	snaps map[string]map[string]map[string][]byte
	// script answers exec and start_process: by the argv joined with
	// spaces.
	script map[string]scripted
	procs  map[string][]wire.ProcessInfo
}

// call is one recorded Daemon call: its method and arguments.
type call struct {
	method string
	args   []any
}

// scripted is what the fake's exec of a command prints and exits with.
type scripted struct {
	stdout, stderr string
	exit           int
}

func newFakeDaemon(templates ...string) *fakeDaemon {
	f := &fakeDaemon{sandboxes: map[string]*client.Sandbox{}, files: map[string]map[string][]byte{},
		snaps: map[string]map[string]map[string][]byte{}, procs: map[string][]wire.ProcessInfo{}, script: scriptFor()}
	for _, t := range templates {
		f.templates = append(f.templates, client.Template{ID: t, Status: "ready", MemMiB: 512, CPUs: 1, Created: time.Now()})
	}
	return f
}

func (f *fakeDaemon) record(method string, args ...any) {
	f.calls = append(f.calls, call{method, args})
}

// callsOf returns the recorded calls of method.
func (f *fakeDaemon) callsOf(method string) []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	var l []call
	for _, c := range f.calls {
		if c.method == method {
			l = append(l, c)
		}
	}
	return l
}

// ncalls is how many calls were made.
func (f *fakeDaemon) ncalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func notFound(what string) error {
	return &client.Error{Status: http.StatusNotFound, Message: what + " not found"}
}

// sandbox returns sandbox id, with f.mu held.
func (f *fakeDaemon) sandbox(id string) (*client.Sandbox, error) {
	s := f.sandboxes[id]
	if s == nil {
		return nil, notFound("sandbox " + id)
	}
	return s, nil
}

func (f *fakeDaemon) Templates(ctx context.Context) ([]client.Template, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("Templates")
	return f.templates, nil
}

func (f *fakeDaemon) ReadyTemplates(ctx context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("ReadyTemplates")
	var l []string
	for _, t := range f.templates {
		l = append(l, t.ID)
	}
	return l, nil
}

func (f *fakeDaemon) Create(ctx context.Context, req wire.SandboxRequest, fn client.ProgressFunc) (*client.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("Create", req)
	if fn != nil {
		fn(wire.Progress{Step: "restore", Pct: 50})
	}
	return f.newSandbox(req.Template, req.Labels, req.Env, ""), nil
}

// newSandbox makes a running sandbox, with f.mu held.
func (f *fakeDaemon) newSandbox(tpl string, labels map[string]string, env []string, parent string) *client.Sandbox {
	f.next++
	s := &client.Sandbox{ID: fmt.Sprintf("sb-%012x", f.next), Template: tpl, Status: "running", Labels: labels, Env: env, Parent: parent, Created: time.Now()}
	f.sandboxes[s.ID] = s
	f.files[s.ID] = map[string][]byte{"/tmp/big": bytes.Repeat([]byte{'x'}, 300<<10)}
	return s
}

func (f *fakeDaemon) Sandboxes(ctx context.Context) ([]client.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("Sandboxes")
	var l []client.Sandbox
	for _, s := range f.sandboxes {
		l = append(l, *s)
	}
	return l, nil
}

func (f *fakeDaemon) Resolve(ctx context.Context, ref string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if store.ValidID(ref) {
		return ref, nil
	}
	for _, s := range f.sandboxes {
		if s.Labels["name"] == ref {
			return s.ID, nil
		}
	}
	return "", notFound(fmt.Sprintf("sandbox %q", ref))
}

func (f *fakeDaemon) Delete(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("Delete", id)
	if _, err := f.sandbox(id); err != nil {
		return err
	}
	delete(f.sandboxes, id)
	return nil
}

// setStatus sets sandbox id's status.
func (f *fakeDaemon) setStatus(method, id, status string, args ...any) (*client.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record(method, append([]any{id}, args...)...)
	s, err := f.sandbox(id)
	if err != nil {
		return nil, err
	}
	s.Status = status
	c := *s
	return &c, nil
}

func (f *fakeDaemon) Pause(ctx context.Context, id string, toDisk bool, fn client.ProgressFunc) (*client.Sandbox, error) {
	return f.setStatus("Pause", id, "paused", toDisk)
}

func (f *fakeDaemon) Resume(ctx context.Context, id string, fn client.ProgressFunc) (*client.Sandbox, error) {
	return f.setStatus("Resume", id, "running")
}

func (f *fakeDaemon) Fork(ctx context.Context, id string, n int, fn client.ProgressFunc) (*wire.ForkResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("Fork", id, n)
	p, err := f.sandbox(id)
	if err != nil {
		return nil, err
	}
	r := &wire.ForkResult{Parent: id}
	for range n {
		c := f.newSandbox(p.Template, nil, p.Env, id)
		f.files[c.ID] = maps.Clone(f.files[id])
		f.procs[c.ID] = slices.Clone(f.procs[id])
		r.Children = append(r.Children, *c)
	}
	return r, nil
}

func (f *fakeDaemon) Snapshot(ctx context.Context, id string, req wire.SnapshotRequest) (*client.Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("Snapshot", id, req)
	s, err := f.sandbox(id)
	if err != nil {
		return nil, err
	}
	if f.snaps[id] == nil {
		f.snaps[id] = map[string]map[string][]byte{}
	}
	f.snaps[id][req.Name] = maps.Clone(f.files[id])
	snap := client.Snapshot{Name: req.Name, Kind: "full", Time: time.Now(), Path: "/state/" + req.Name}
	s.Snapshots = append(s.Snapshots, snap)
	return &snap, nil
}

func (f *fakeDaemon) Snapshots(ctx context.Context, id string) ([]client.Snapshot, *client.Rolling, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("Snapshots", id)
	s, err := f.sandbox(id)
	if err != nil {
		return nil, nil, err
	}
	return s.Snapshots, nil, nil
}

func (f *fakeDaemon) Rollback(ctx context.Context, id, snapshot string) (*wire.RollbackReply, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("Rollback", id, snapshot)
	files, ok := f.snaps[id][snapshot]
	if !ok {
		return nil, notFound("snapshot " + snapshot)
	}
	f.files[id] = maps.Clone(files)
	return &wire.RollbackReply{Snapshot: snapshot, PauseMS: 1.5}, nil
}

// scriptFor is the fake's answers to drive's commands.
func scriptFor() map[string]scripted {
	return map[string]scripted{
		"/bin/sh -c " + scenarioExec: {stdout: "hi\n", stderr: "err\n", exit: 3},
		"/bin/sh -c echo $GREETING":  {stdout: "hello\n"},
		"/bin/sh -c " + scenarioBg:   {stdout: "started\ndone\n"},
		"/bin/sh -c " + scenarioBig:  {},
		"sleep 600":                  {},
		"/bin/sh -c " + scenarioUTF8: {stdout: "é" + strings.Repeat("x", 70<<10) + "end\n"},
	}
}

func (f *fakeDaemon) Exec(ctx context.Context, id string, req wire.ExecRequest, stdout, stderr io.Writer) (*client.ExecStatus, error) {
	f.mu.Lock()
	f.record("Exec", id, req)
	_, err := f.sandbox(id)
	s, ok := f.script[strings.Join(req.Argv, " ")]
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("fake: no script for %q", req.Argv)
	}
	// In two writes, as the daemon's frames come.
	for _, o := range []struct {
		w io.Writer
		s string
	}{{stdout, s.stdout}, {stderr, s.stderr}} {
		h := len(o.s) / 2
		o.w.Write([]byte(o.s[:h]))
		o.w.Write([]byte(o.s[h:]))
	}
	return &client.ExecStatus{Exit: s.exit}, nil
}

func (f *fakeDaemon) StartProcess(ctx context.Context, id string, req wire.ProcessRequest) (*wire.ProcessInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("StartProcess", id, req)
	if _, err := f.sandbox(id); err != nil {
		return nil, err
	}
	p := wire.ProcessInfo{ID: fmt.Sprintf("p%d", len(f.procs[id])+1), Pid: 100, Argv: req.Argv, Tag: req.Tag, State: "running", StartedAt: time.Now()}
	f.procs[id] = append(f.procs[id], p)
	return &p, nil
}

func (f *fakeDaemon) Processes(ctx context.Context, id string) ([]wire.ProcessInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("Processes", id)
	if _, err := f.sandbox(id); err != nil {
		return nil, err
	}
	return f.procs[id], nil
}

// process returns sandbox id's process pid, with f.mu held.
func (f *fakeDaemon) process(id, pid string) (*wire.ProcessInfo, error) {
	for i, p := range f.procs[id] {
		if p.ID == pid {
			return &f.procs[id][i], nil
		}
	}
	return nil, notFound("process " + pid)
}

func (f *fakeDaemon) ProcessOutput(ctx context.Context, id, pid string, offset int64, follow bool, fn func(wire.ExecFrame) error) error {
	f.mu.Lock()
	f.record("ProcessOutput", id, pid, offset, follow)
	p, err := f.process(id, pid)
	var out string
	if err == nil {
		out = f.script[strings.Join(p.Argv, " ")].stdout
	}
	f.mu.Unlock()
	if err != nil {
		return err
	}
	if offset > int64(len(out)) {
		offset = int64(len(out))
	}
	frames := []wire.ExecFrame{{Start: &wire.OutputStart{Offset: offset}}, {Stdout: []byte(out[offset:])}}
	if !strings.HasPrefix(p.Argv[0], "sleep") {
		frames = append(frames, wire.ExecFrame{Exit: ptr(0)})
	}
	for _, fr := range frames {
		if err := fn(fr); err != nil {
			return err
		}
	}
	if follow && !strings.HasPrefix(p.Argv[0], "sleep") {
		return nil
	}
	if follow {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func (f *fakeDaemon) SignalProcess(ctx context.Context, id, pid, signal string) (*wire.ProcessInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("SignalProcess", id, pid, signal)
	p, err := f.process(id, pid)
	if err != nil {
		return nil, err
	}
	p.State, p.Exit = "exited", &agentwire.ExitStatus{Code: 137, Signal: signal}
	c := *p
	return &c, nil
}

func (f *fakeDaemon) RemoveProcess(ctx context.Context, id, pid string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("RemoveProcess", id, pid)
	if _, err := f.process(id, pid); err != nil {
		return err
	}
	var keep []wire.ProcessInfo
	for _, p := range f.procs[id] {
		if p.ID != pid {
			keep = append(keep, p)
		}
	}
	f.procs[id] = keep
	return nil
}

func (f *fakeDaemon) ReadFile(ctx context.Context, id, p string, w io.Writer) (fs.FileMode, error) {
	f.mu.Lock()
	f.record("ReadFile", id, p)
	b, ok := f.files[id][p]
	f.mu.Unlock()
	if !ok {
		return 0, &client.Error{Status: http.StatusNotFound, Message: "open " + p + ": no such file or directory", Code: "not_found"}
	}
	// As the client copies the HTTP body: io.Copy, which prefers w's
	// ReadFrom.
	if _, err := io.Copy(w, bytes.NewReader(b)); err != nil {
		return 0, fmt.Errorf("read %s:%s: %w", id, p, err)
	}
	return 0o600, nil
}

func (f *fakeDaemon) WriteFile(ctx context.Context, id, p string, r io.Reader, mode fs.FileMode) (*wire.FileInfo, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("WriteFile", id, p, string(b), mode)
	if _, err := f.sandbox(id); err != nil {
		return nil, err
	}
	f.files[id][p] = b
	return &wire.FileInfo{Name: path.Base(p), Size: int64(len(b)), Mode: mode, ModTime: time.Now()}, nil
}

func (f *fakeDaemon) ListFiles(ctx context.Context, id, dir string, depth int) ([]wire.FileInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("ListFiles", id, dir, depth)
	if _, err := f.sandbox(id); err != nil {
		return nil, err
	}
	var l []wire.FileInfo
	for p, b := range f.files[id] {
		if path.Dir(p) == dir {
			l = append(l, wire.FileInfo{Name: path.Base(p), Path: p, Size: int64(len(b)), Mode: 0o644, ModTime: time.Now()})
		}
	}
	return l, nil
}
