package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The commands of drive's scenario (fakeDaemon's script answers them).
const (
	scenarioExec = "echo hi; echo err >&2; exit 3"
	scenarioBg   = "echo started; sleep 2; echo done"
	// scenarioUTF8 prints more than exec keeps, starting with a two-byte
	// character (cut by the truncation).
	scenarioUTF8 = `printf '\303\251'; head -c 71680 /dev/zero | tr '\0' x; echo end`
	scenarioBig  = "head -c 307200 /dev/zero > /tmp/big"
)

// session is a test's MCP client session, and the progress notifications
// it received.
type session struct {
	t  *testing.T
	cs *mcp.ClientSession
	// mu protects progress: the notifications by progress token.
	mu       sync.Mutex
	progress map[string][]*mcp.ProgressNotificationParams
}

// newSession connects a client to transport and closes it at the test's end.
func newSession(t *testing.T, transport mcp.Transport) *session {
	t.Helper()
	s := &session{t: t, progress: map[string][]*mcp.ProgressNotificationParams{}}
	c := mcp.NewClient(&mcp.Implementation{Name: "warren-test", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			s.mu.Lock()
			defer s.mu.Unlock()
			k := fmt.Sprint(req.Params.ProgressToken)
			s.progress[k] = append(s.progress[k], req.Params)
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := c.Connect(ctx, transport, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	s.cs = cs
	return s
}

// inMemory connects a session to a server of d over in-memory transports.
func inMemory(t *testing.T, d Daemon) *session {
	t.Helper()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := New(d, Options{Version: "test"}).Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatalf("server connect: %v", err)
	}
	t.Cleanup(func() { ss.Close() })
	return newSession(t, ct)
}

// raw calls tool name with args (and a progress token, if not ""),
// failing the test on a protocol error.
func (s *session) raw(name string, args any, token string) *mcp.CallToolResult {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p := &mcp.CallToolParams{Name: name, Arguments: args}
	if token != "" {
		p.SetProgressToken(token)
	}
	res, err := s.cs.CallTool(ctx, p)
	if err != nil {
		s.t.Fatalf("%s %v: protocol error: %v", name, args, err)
	}
	return res
}

// text is a result's text content.
func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			b.WriteString(t.Text)
		}
	}
	return b.String()
}

// short is s cut for a test's message.
func short(s string) string {
	if len(s) > 300 {
		return fmt.Sprintf("%s... (%d bytes)", s[:300], len(s))
	}
	return s
}

// call calls tool name, fails the test on an error result, and decodes its
// structured result into out (if not nil).
func (s *session) call(name string, args, out any) {
	s.t.Helper()
	s.callWith(name, args, out, "")
}

// callWith is call with a progress token.
func (s *session) callWith(name string, args, out any, token string) {
	s.t.Helper()
	res := s.raw(name, args, token)
	if res.IsError {
		s.t.Fatalf("%s %v: tool error: %s", name, args, short(text(res)))
	}
	if out == nil {
		return
	}
	if err := remarshal(res.StructuredContent, out); err != nil {
		s.t.Fatalf("%s: %v", name, err)
	}
}

// remarshal decodes a structured result into out.
func remarshal(v, out any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("structured result %s: %w", short(string(b)), err)
	}
	return nil
}

// callErr calls tool name expecting an error result, and returns its text.
func (s *session) callErr(name string, args any) string {
	s.t.Helper()
	res := s.raw(name, args, "")
	if !res.IsError {
		s.t.Fatalf("%s %v: succeeded (%s), want an error", name, args, short(text(res)))
	}
	return text(res)
}

// streamed waits until the progress notifications of token hold want in
// their messages of stream, and returns those messages joined.
func (s *session) streamed(token, stream, want string) string {
	s.t.Helper()
	var got string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		s.mu.Lock()
		var b strings.Builder
		for _, p := range s.progress[token] {
			if p.Meta["stream"] == stream {
				b.WriteString(p.Message)
			}
		}
		s.mu.Unlock()
		if got = b.String(); strings.Contains(got, want) {
			return got
		}
	}
	s.t.Errorf("progress %s: %s streamed %q, want it to contain %q", token, stream, got, want)
	return got
}

// drive runs the scenario every transport and daemon must pass: it
// creates a sandbox from template, runs commands in it (foreground and
// background), writes, reads and lists files, pauses and resumes it,
// snapshots and rolls it back, forks it and deletes it all.
func drive(t *testing.T, s *session, template string) {
	var tpls Templates
	s.call("list_templates", nil, &tpls)
	found := false
	for _, x := range tpls.Templates {
		found = found || x.ID == template && x.Status == "ready"
	}
	if !found {
		t.Fatalf("list_templates: %+v, want %s ready", tpls, template)
	}

	name := fmt.Sprintf("mcp-test-%d", time.Now().UnixNano()%1e9)
	var sb Sandbox
	s.callWith("create_sandbox", map[string]any{"template": template, "name": name,
		"env": map[string]string{"GREETING": "hello"}, "labels": map[string]string{"suite": "mcp"}}, &sb, "create")
	deleted := false
	defer func() {
		if !deleted {
			s.raw("delete_sandbox", map[string]any{"sandbox": sb.ID}, "")
		}
	}()
	if sb.ID == "" || sb.Name != name || sb.Status != "running" || sb.Labels["suite"] != "mcp" || sb.Template != template {
		t.Fatalf("create_sandbox: %+v", sb)
	}
	var sbs Sandboxes
	s.call("list_sandboxes", nil, &sbs)
	if !hasSandbox(sbs, sb.ID) {
		t.Errorf("list_sandboxes: %+v, want %s", sbs, sb.ID)
	}

	// exec, by the sandbox's name, streamed.
	var ex ExecOutput
	s.callWith("exec", map[string]any{"sandbox": name, "command": scenarioExec}, &ex, "exec")
	if ex.ExitCode != 3 || ex.Stdout != "hi\n" || ex.Stderr != "err\n" || ex.StdoutTruncated || ex.StdoutBytes != 3 {
		t.Errorf("exec %q: %+v", scenarioExec, ex)
	}
	s.streamed("exec", "stdout", "hi\n")
	s.streamed("exec", "stderr", "err\n")
	s.call("exec", map[string]any{"sandbox": sb.ID, "command": "echo $GREETING"}, &ex)
	if ex.ExitCode != 0 || ex.Stdout != "hello\n" {
		t.Errorf("exec with the sandbox's env: %+v", ex)
	}
	s.call("exec", map[string]any{"sandbox": sb.ID, "command": scenarioUTF8}, &ex)
	if !ex.StdoutTruncated || len(ex.Stdout) > DefaultLimits.Output || !strings.HasSuffix(ex.Stdout, "xend\n") ||
		!strings.HasPrefix(ex.Stdout, "x") || !utf8.ValidString(ex.Stdout) || ex.StdoutBytes != 2+70<<10+4 {
		t.Errorf("exec of %d bytes: truncated %v, %d bytes kept, starts %q", ex.StdoutBytes, ex.StdoutTruncated, len(ex.Stdout), ex.Stdout[:min(len(ex.Stdout), 8)])
	}

	// Files.
	const content = "hello\nwörld\n"
	var w WriteOutput
	s.call("write_file", map[string]any{"sandbox": sb.ID, "path": "/tmp/mcp-test.txt", "content": content, "mode": "600"}, &w)
	if w.Size != int64(len(content)) || w.Mode != "600" {
		t.Errorf("write_file: %+v", w)
	}
	var r ReadOutput
	s.call("read_file", map[string]any{"sandbox": sb.ID, "path": "/tmp/mcp-test.txt"}, &r)
	if r.Content != content || r.Encoding != "text" || r.Size != len(content) || r.Mode != "600" {
		t.Errorf("read_file: %+v", r)
	}
	s.call("read_file", map[string]any{"sandbox": sb.ID, "path": "/tmp/mcp-test.txt", "encoding": "base64"}, &r)
	if b, err := base64.StdEncoding.DecodeString(r.Content); err != nil || string(b) != content {
		t.Errorf("read_file base64: %+v", r)
	}
	s.call("exec", map[string]any{"sandbox": sb.ID, "command": scenarioBig}, nil)
	if msg := s.callErr("read_file", map[string]any{"sandbox": sb.ID, "path": "/tmp/big"}); !strings.Contains(msg, "larger than 256 KiB") {
		t.Errorf("read_file of 300 KiB: %s", msg)
	}
	if msg := s.callErr("read_file", map[string]any{"sandbox": sb.ID, "path": "/tmp/no-such-file"}); !strings.Contains(msg, "no such file") {
		t.Errorf("read_file of a missing file: %s", msg)
	}
	var ls ListOutput
	s.call("list_files", map[string]any{"sandbox": sb.ID, "path": "/tmp"}, &ls)
	found = false
	for _, f := range ls.Files {
		found = found || f.Path == "/tmp/mcp-test.txt" && f.Type == "file" && f.Size == int64(len(content))
	}
	if !found {
		t.Errorf("list_files /tmp: %+v", ls)
	}

	driveProcesses(t, s, sb.ID)

	// Snapshot and rollback: a file written after the snapshot is gone.
	var snap Snapshot
	s.call("snapshot_sandbox", map[string]any{"sandbox": sb.ID, "name": "s1"}, &snap)
	if snap.Name != "s1" {
		t.Errorf("snapshot_sandbox: %+v", snap)
	}
	var snaps Snapshots
	s.call("list_snapshots", map[string]any{"sandbox": sb.ID}, &snaps)
	if len(snaps.Snapshots) == 0 || snaps.Snapshots[len(snaps.Snapshots)-1].Name != "s1" {
		t.Errorf("list_snapshots: %+v", snaps)
	}
	s.call("write_file", map[string]any{"sandbox": sb.ID, "path": "/tmp/after.txt", "content": "after"}, nil)
	var rb RollbackOutput
	s.call("rollback_sandbox", map[string]any{"sandbox": sb.ID, "snapshot": "s1"}, &rb)
	if rb.Snapshot != "s1" || rb.Sandbox != sb.ID {
		t.Errorf("rollback_sandbox: %+v", rb)
	}
	s.callErr("read_file", map[string]any{"sandbox": sb.ID, "path": "/tmp/after.txt"})
	s.call("read_file", map[string]any{"sandbox": sb.ID, "path": "/tmp/mcp-test.txt"}, &r)
	if r.Content != content {
		t.Errorf("read_file after the rollback: %+v", r)
	}

	// Fork: the child has the parent's files.
	var fk ForkOutput
	s.call("fork_sandbox", map[string]any{"sandbox": sb.ID, "n": 1}, &fk)
	if fk.Parent != sb.ID || len(fk.Children) != 1 || fk.Children[0].Parent != sb.ID || len(fk.Errors) > 0 {
		t.Fatalf("fork_sandbox: %+v", fk)
	}
	child := fk.Children[0].ID
	s.call("read_file", map[string]any{"sandbox": child, "path": "/tmp/mcp-test.txt"}, &r)
	if r.Content != content {
		t.Errorf("read_file in the fork: %+v", r)
	}
	var del Deleted
	s.call("delete_sandbox", map[string]any{"sandbox": child}, &del)

	s.call("delete_sandbox", map[string]any{"sandbox": sb.ID}, &del)
	deleted = true
	if del.Deleted != sb.ID {
		t.Errorf("delete_sandbox: %+v", del)
	}
	s.call("list_sandboxes", nil, &sbs)
	if hasSandbox(sbs, sb.ID) || hasSandbox(sbs, child) {
		t.Errorf("list_sandboxes after delete_sandbox: %+v", sbs)
	}
	// The daemon's error, as a tool error.
	if msg := s.callErr("exec", map[string]any{"sandbox": sb.ID, "command": "true"}); !strings.Contains(msg, "not found") {
		t.Errorf("exec in a deleted sandbox: %s", msg)
	}
}

// driveProcesses is drive's part of the background processes of sandbox
// id: start, list, read the output of, and (through a pause and resume of
// the sandbox) kill them.
func driveProcesses(t *testing.T, s *session, id string) {
	// The first call says whether the daemon (and its guest agent) has the
	// process API: without, the rest is skipped (the test fails all the same).
	res := s.raw("start_process", map[string]any{"sandbox": id, "command": scenarioBg, "tag": "bg"}, "")
	if res.IsError {
		t.Errorf("start_process: %s (the process tools are not tested further)", short(text(res)))
		pauseResume(t, s, id)
		return
	}
	var bg Process
	if err := remarshal(res.StructuredContent, &bg); err != nil {
		t.Fatal(err)
	}
	if bg.ID == "" || bg.Tag != "bg" {
		t.Errorf("start_process: %+v", bg)
	}
	var procs Processes
	s.call("list_processes", map[string]any{"sandbox": id}, &procs)
	if !hasProcess(procs, bg.ID) {
		t.Errorf("list_processes: %+v, want %s", procs, bg.ID)
	}
	var out OutputOutput
	var stdout string
	offset := int64(0)
	for deadline := time.Now().Add(time.Minute); !out.Exited && time.Now().Before(deadline); {
		s.call("process_output", map[string]any{"sandbox": id, "process": bg.ID, "offset": offset, "wait_seconds": 20}, &out)
		stdout += out.Stdout
		offset = out.NextOffset
	}
	if !out.Exited || out.ExitCode == nil || *out.ExitCode != 0 || stdout != "started\ndone\n" || offset != int64(len(stdout)) {
		t.Errorf("process_output of %q: %q, last %+v", scenarioBg, stdout, out)
	}
	var sleeper Process
	s.call("start_process", map[string]any{"sandbox": id, "argv": []string{"sleep", "600"}}, &sleeper)

	// Pause and resume: the background process lives on.
	pauseResume(t, s, id)
	s.call("list_processes", map[string]any{"sandbox": id}, &procs)
	if p := findProcess(procs, sleeper.ID); p == nil || p.State != "running" {
		t.Errorf("after pause and resume: %+v, want %s running", procs, sleeper.ID)
	}
	var killed Process
	s.call("kill_process", map[string]any{"sandbox": id, "process": sleeper.ID, "signal": "SIGTERM"}, &killed)
	if killed.ID != sleeper.ID {
		t.Errorf("kill_process: %+v", killed)
	}
	s.call("kill_process", map[string]any{"sandbox": id, "process": sleeper.ID, "remove": true}, &killed)
	if killed.State != "removed" {
		t.Errorf("kill_process remove: %+v", killed)
	}
}

// pauseResume pauses and resumes sandbox id.
func pauseResume(t *testing.T, s *session, id string) {
	var st Sandbox
	s.call("pause_sandbox", map[string]any{"sandbox": id}, &st)
	if st.Status != "paused" {
		t.Errorf("pause_sandbox: %+v", st)
	}
	s.call("resume_sandbox", map[string]any{"sandbox": id}, &st)
	if st.Status != "running" {
		t.Errorf("resume_sandbox: %+v", st)
	}
}

func hasSandbox(l Sandboxes, id string) bool {
	for _, s := range l.Sandboxes {
		if s.ID == id {
			return true
		}
	}
	return false
}

func findProcess(l Processes, id string) *Process {
	for i, p := range l.Processes {
		if p.ID == id {
			return &l.Processes[i]
		}
	}
	return nil
}

func hasProcess(l Processes, id string) bool { return findProcess(l, id) != nil }
