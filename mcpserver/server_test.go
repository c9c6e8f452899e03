package mcpserver

import (
	"context"
	"encoding/json"
	"io/fs"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/warrenvm/warren/hostd/wire"
)

// The tools, as a client lists them.
var toolNames = []string{
	"create_sandbox", "delete_sandbox", "exec", "fork_sandbox", "kill_process", "list_files", "list_processes",
	"list_sandboxes", "list_snapshots", "list_templates", "pause_sandbox", "process_output", "read_file",
	"resume_sandbox", "rollback_sandbox", "snapshot_sandbox", "start_process", "write_file",
}

// schema is the part of a JSON schema the tests read.
type schema struct {
	Type       any                `json:"type"`
	Required   []string           `json:"required"`
	Properties map[string]*schema `json:"properties"`
	// AdditionalProperties is false for the tools' inputs.
	AdditionalProperties any      `json:"additionalProperties"`
	Description          string   `json:"description"`
	Minimum              *float64 `json:"minimum"`
	Maximum              *float64 `json:"maximum"`
	Enum                 []string `json:"enum"`
}

func schemaOf(t *testing.T, v any) *schema {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var s schema
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("schema %s: %v", b, err)
	}
	return &s
}

func TestToolsListed(t *testing.T) {
	s := inMemory(t, newFakeDaemon("tp-000000000001"))
	res, err := s.cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	tools := map[string]*mcp.Tool{}
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
		tools[tool.Name] = tool
		if len(tool.Description) < 30 {
			t.Errorf("%s: description %q is too short to act on", tool.Name, tool.Description)
		}
		if tool.Annotations == nil {
			t.Errorf("%s: no annotations", tool.Name)
		}
		in, out := schemaOf(t, tool.InputSchema), schemaOf(t, tool.OutputSchema)
		if in.Type != "object" || out.Type != "object" {
			t.Errorf("%s: input schema type %q, output %q; want objects", tool.Name, in.Type, out.Type)
		}
		if in.AdditionalProperties != false && len(in.Properties) > 0 {
			t.Errorf("%s: input schema takes unknown properties", tool.Name)
		}
		for name, p := range in.Properties {
			if p.Description == "" {
				t.Errorf("%s: input %s has no description", tool.Name, name)
			}
		}
		if _, ok := in.Properties["sandbox"]; ok && !slices.Contains(in.Required, "sandbox") {
			t.Errorf("%s: sandbox is not required", tool.Name)
		}
	}
	slices.Sort(names)
	if !slices.Equal(names, toolNames) {
		t.Fatalf("tools %v, want %v", names, toolNames)
	}
	exec := schemaOf(t, tools["exec"].InputSchema)
	for _, p := range []string{"sandbox", "command", "argv", "cwd", "env", "timeout_seconds"} {
		if exec.Properties[p] == nil {
			t.Errorf("exec: no input %s", p)
		}
	}
	if m := exec.Properties["timeout_seconds"]; m == nil || m.Minimum == nil || *m.Minimum != 1 || m.Maximum == nil || *m.Maximum != 3600 {
		t.Errorf("exec: timeout_seconds %+v, want 1 to 3600", m)
	}
	if e := schemaOf(t, tools["read_file"].InputSchema).Properties["encoding"]; e == nil || !slices.Equal(e.Enum, []string{"text", "base64"}) {
		t.Errorf("read_file: encoding %+v", e)
	}
	execOut := schemaOf(t, tools["exec"].OutputSchema)
	for _, p := range []string{"exit_code", "stdout", "stderr", "stdout_truncated", "stderr_truncated"} {
		if execOut.Properties[p] == nil {
			t.Errorf("exec: no output %s", p)
		}
	}
}

// TestArguments checks that each tool refuses bad arguments with a tool
// error that says what is wrong, without calling the daemon.
func TestArguments(t *testing.T) {
	f := newFakeDaemon("tp-000000000001", "tp-000000000002")
	s := inMemory(t, f)
	const sb = "sb-000000000001"
	for _, tc := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"create_sandbox", map[string]any{}, "template is needed: there are 2 ready templates"},
		{"create_sandbox", map[string]any{"template": "tp-000000000001", "env": map[string]any{"A=B": "x"}}, "not a variable name"},
		{"create_sandbox", map[string]any{"template": 7}, "template"},
		{"exec", map[string]any{"command": "true"}, "sandbox"},
		{"exec", map[string]any{"sandbox": sb}, "a command is required"},
		{"exec", map[string]any{"sandbox": sb, "command": "true", "argv": []string{"true"}}, "not both"},
		{"exec", map[string]any{"sandbox": sb, "command": "true", "timeout_seconds": 99999}, "timeout_seconds"},
		{"exec", map[string]any{"sandbox": sb, "command": "true", "timeout_seconds": "x"}, "timeout_seconds"},
		{"exec", map[string]any{"sandbox": sb, "command": "true", "bogus": 1}, "bogus"},
		{"exec", map[string]any{"sandbox": "", "command": "true"}, "sandbox is required"},
		{"start_process", map[string]any{"sandbox": sb}, "a command is required"},
		{"process_output", map[string]any{"sandbox": sb}, "process"},
		{"process_output", map[string]any{"sandbox": sb, "process": "p1", "offset": -1}, "offset"},
		{"process_output", map[string]any{"sandbox": sb, "process": "p1", "wait_seconds": 99999}, "wait_seconds"},
		{"kill_process", map[string]any{"sandbox": sb}, "process"},
		{"read_file", map[string]any{"sandbox": sb, "path": "etc/passwd"}, "path must be absolute"},
		{"read_file", map[string]any{"sandbox": sb, "path": "/etc/passwd", "encoding": "hex"}, "encoding"},
		{"write_file", map[string]any{"sandbox": sb, "path": "/tmp/x"}, "content"},
		{"write_file", map[string]any{"sandbox": sb, "path": "/tmp/x", "content": "x", "mode": "999"}, "mode must be octal"},
		{"write_file", map[string]any{"sandbox": sb, "path": "/tmp/x", "content": "!!", "encoding": "base64"}, "not base64"},
		{"list_files", map[string]any{"sandbox": sb, "path": "/", "depth": 40}, "depth"},
		{"list_files", map[string]any{"sandbox": sb}, "path"},
		{"fork_sandbox", map[string]any{"sandbox": sb, "n": 100}, "n"},
		{"fork_sandbox", map[string]any{"sandbox": sb, "n": -1}, "n"},
		{"rollback_sandbox", map[string]any{"sandbox": sb}, "snapshot"},
		{"pause_sandbox", map[string]any{}, "sandbox"},
		{"delete_sandbox", map[string]any{"sandbox": 1}, "sandbox"},
	} {
		before := f.ncalls()
		msg := s.callErr(tc.tool, tc.args)
		if !strings.Contains(msg, tc.want) {
			t.Errorf("%s %v: %q, want it to say %q", tc.tool, tc.args, msg, tc.want)
		}
		if n := f.ncalls() - before; n > 0 && tc.tool != "create_sandbox" {
			t.Errorf("%s %v: %d daemon calls, want none", tc.tool, tc.args, n)
		}
	}
	// The daemon's errors are tool errors, with its message.
	if msg := s.callErr("exec", map[string]any{"sandbox": "nosuch", "command": "true"}); !strings.Contains(msg, `sandbox "nosuch" not found`) {
		t.Errorf("exec in a sandbox that is not: %q", msg)
	}
}

// TestInMemory runs the scenario against the recording fake, and checks
// the requests the tools made of the daemon.
func TestInMemory(t *testing.T) {
	f := newFakeDaemon("tp-000000000001")
	drive(t, inMemory(t, f), "tp-000000000001")
	checkCalls(t, f)
}

// checkCalls checks the daemon requests of drive's scenario.
func checkCalls(t *testing.T, f *fakeDaemon) {
	t.Helper()
	c := f.callsOf("Create")
	if len(c) != 1 {
		t.Fatalf("Create calls: %+v", c)
	}
	req := c[0].args[0].(wire.SandboxRequest)
	if !slices.Equal(req.Env, []string{"GREETING=hello"}) || req.Labels["suite"] != "mcp" || !strings.HasPrefix(req.Labels["name"], "mcp-test-") {
		t.Errorf("Create %+v", req)
	}
	e := f.callsOf("Exec")[0].args[1].(wire.ExecRequest)
	if !slices.Equal(e.Argv, []string{"/bin/sh", "-c", scenarioExec}) || e.TimeoutMS != 300_000 {
		t.Errorf("Exec %+v", e)
	}
	w := f.callsOf("WriteFile")[0].args
	if w[1] != "/tmp/mcp-test.txt" || w[3] != fs.FileMode(0o600) {
		t.Errorf("WriteFile %v", w)
	}
	if l := f.callsOf("ListFiles")[0].args; l[1] != "/tmp" || l[2] != 1 {
		t.Errorf("ListFiles %v", l)
	}
	p := f.callsOf("StartProcess")[0].args[1].(wire.ProcessRequest)
	if !slices.Equal(p.Argv, []string{"/bin/sh", "-c", scenarioBg}) || p.Tag != "bg" || p.TimeoutMS != 0 {
		t.Errorf("StartProcess %+v", p)
	}
	if o := f.callsOf("ProcessOutput")[0].args; o[2] != int64(0) || o[3] != true {
		t.Errorf("ProcessOutput %v", o)
	}
	if k := f.callsOf("SignalProcess")[0].args; k[2] != "SIGTERM" {
		t.Errorf("SignalProcess %v", k)
	}
	if fk := f.callsOf("Fork")[0].args; fk[1] != 1 {
		t.Errorf("Fork %v", fk)
	}
	if s := f.callsOf("Snapshot")[0].args[1].(wire.SnapshotRequest); s.Name != "s1" || s.Incremental {
		t.Errorf("Snapshot %+v", s)
	}
}

func TestExecDefaults(t *testing.T) {
	f := newFakeDaemon("tp-000000000001")
	s := inMemory(t, f)
	var sb Sandbox
	s.call("create_sandbox", map[string]any{}, &sb) // the only ready template
	if sb.Template != "tp-000000000001" {
		t.Errorf("create_sandbox without a template: %+v", sb)
	}
	s.call("exec", map[string]any{"sandbox": sb.ID, "argv": []string{"sleep", "600"}, "cwd": "/srv",
		"env": map[string]string{"B": "2", "A": "1"}, "timeout_seconds": 5}, nil)
	e := f.callsOf("Exec")[0].args[1].(wire.ExecRequest)
	if !slices.Equal(e.Argv, []string{"sleep", "600"}) || e.Cwd != "/srv" || !slices.Equal(e.Env, []string{"A=1", "B=2"}) || e.TimeoutMS != 5000 {
		t.Errorf("Exec %+v", e)
	}
	// No progress token: nothing streamed.
	if len(s.progress) != 0 {
		t.Errorf("progress without a token: %v", s.progress)
	}
	// Output of a process still running, read without waiting.
	var p Process
	s.call("start_process", map[string]any{"sandbox": sb.ID, "argv": []string{"sleep", "600"}, "timeout_seconds": 60}, &p)
	var out OutputOutput
	s.call("process_output", map[string]any{"sandbox": sb.ID, "process": p.ID}, &out)
	if out.Exited || out.NextOffset != 0 {
		t.Errorf("process_output of a running process: %+v", out)
	}
	if o := f.callsOf("ProcessOutput")[0].args; o[3] != false {
		t.Errorf("ProcessOutput without wait_seconds follows: %v", o)
	}
	// wait_seconds ends the wait without an error.
	start := time.Now()
	s.call("process_output", map[string]any{"sandbox": sb.ID, "process": p.ID, "wait_seconds": 1}, &out)
	if d := time.Since(start); d < time.Second || out.Exited {
		t.Errorf("process_output waited %v: %+v", d, out)
	}
	var killed Process
	s.call("kill_process", map[string]any{"sandbox": sb.ID, "process": p.ID}, &killed)
	if k := f.callsOf("SignalProcess")[0].args; k[2] != "SIGKILL" || killed.State != "exited" || killed.ExitCode == nil || *killed.ExitCode != 137 {
		t.Errorf("kill_process: %v, %+v", k, killed)
	}
}

// TestProcessOutputPages checks that a process's output longer than a
// call returns comes in pages, cut between characters.
func TestProcessOutputPages(t *testing.T) {
	f := newFakeDaemon("tp-000000000001")
	s := inMemory(t, f)
	var sb Sandbox
	s.call("create_sandbox", map[string]any{}, &sb)
	var p Process
	s.call("start_process", map[string]any{"sandbox": sb.ID, "command": scenarioUTF8}, &p)
	var all string
	var out OutputOutput
	for i := 0; i < 5 && !out.Exited; i++ {
		s.call("process_output", map[string]any{"sandbox": sb.ID, "process": p.ID, "offset": out.NextOffset}, &out)
		if len(out.Stdout) > DefaultLimits.Output || !utf8.ValidString(out.Stdout) {
			t.Fatalf("page of %d bytes, valid %v", len(out.Stdout), utf8.ValidString(out.Stdout))
		}
		all += out.Stdout
	}
	want := f.script["/bin/sh -c "+scenarioUTF8].stdout
	if all != want || !out.Exited || out.NextOffset != int64(len(want)) {
		t.Errorf("paged output: %d bytes, want %d; last %+v", len(all), len(want), out.NextOffset)
	}
}

func TestHTTP(t *testing.T) {
	const token = "test-token"
	h, err := Handler(New(newFakeDaemon("tp-000000000001"), Options{}), token, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Handler(nil, "", nil); err == nil {
		t.Error("a handler without a token")
	}
	ln, loopback, err := Listen(":0")
	if err != nil {
		t.Fatal(err)
	}
	if !loopback {
		t.Errorf("Listen(:0) on %s, want loopback", ln.Addr())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeHTTP(ctx, ln, h) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeHTTP: %v", err)
		}
	}()
	url := URL(ln)

	for _, auth := range []string{"", "Bearer wrong", "Bearer " + token + "x", token} {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("Authorization %q: %s, want 401 with WWW-Authenticate", auth, resp.Status)
		}
	}

	f := newFakeDaemon("tp-000000000001")
	h2, _ := Handler(New(f, Options{}), token, nil)
	ln2, _, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go ServeHTTP(ctx, ln2, h2)
	s := newSession(t, &mcp.StreamableClientTransport{Endpoint: URL(ln2),
		HTTPClient: &http.Client{Transport: bearer{token, http.DefaultTransport}}})
	drive(t, s, "tp-000000000001")
	checkCalls(t, f)
}

// bearer adds the bearer token to a client's requests.
type bearer struct {
	token string
	rt    http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.rt.RoundTrip(r)
}

func TestTail(t *testing.T) {
	for _, tc := range []struct {
		writes    []string
		max       int
		want      string
		truncated bool
	}{
		{[]string{"ab", "cd"}, 8, "abcd", false},
		{[]string{"abcdef", "gh"}, 4, "efgh", true},
		{[]string{"abcdefgh"}, 4, "efgh", true},
		{[]string{"ab", "cdefghij"}, 4, "ghij", true},
		// A character cut at the front is dropped, not garbled.
		{[]string{"aé", "bc"}, 3, "bc", true},
		{[]string{"\xff\xfeok"}, 8, "\ufffdok", false},
	} {
		tl := &tail{max: tc.max}
		n := 0
		for _, w := range tc.writes {
			tl.Write([]byte(w))
			n += len(w)
		}
		if got := tl.String(); got != tc.want || tl.truncated() != tc.truncated || tl.total != int64(n) {
			t.Errorf("%q into %d: %q truncated %v total %d, want %q %v", tc.writes, tc.max, got, tl.truncated(), tl.total, tc.want, tc.truncated)
		}
	}
}

func TestCompleteRunes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{"", 0}, {"abc", 3}, {"aé", 3}, {"a\xc3", 1}, {"a\xe2\x82", 1}, {"a€", 4}, {"\xf0\x9f\x98", 0}, {"x\x80", 2}, {"\x80\x80\x80\x80", 4},
	} {
		if got := completeRunes([]byte(tc.in)); got != tc.want {
			t.Errorf("completeRunes(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

// TestStreamer checks that streamed chunks are never cut inside a
// character, and that streaming stops at its limit.
func TestStreamer(t *testing.T) {
	type note struct {
		stream, msg string
		sent        int64
	}
	var notes []note
	st := &streamer{limit: 8, notify: func(stream, msg string, sent int64) { notes = append(notes, note{stream, msg, sent}) }}
	out, errw := st.writer("stdout", &tail{max: 100}), st.writer("stderr", &tail{max: 100})
	out.Write([]byte("a\xc3"))
	out.Write([]byte("\xa9b"))
	errw.Write([]byte("\xe2\x82"))
	errw.flush()
	out.Write([]byte("cdefghij"))
	out.Write([]byte("more"))
	out.flush()
	want := []note{{"stdout", "a", 1}, {"stdout", "éb", 4}, {"stderr", "\ufffd", 7},
		{"stdout", "[warren: output streaming stopped after 7 bytes; the result has the end of the output]\n", 7}}
	if !slices.Equal(notes, want) {
		t.Errorf("notifications %+v, want %+v", notes, want)
	}
	if out.keep.String() != "aébcdefghijmore" {
		t.Errorf("kept %q", out.keep.String())
	}
	// Without a streamer (no progress token) a writer only keeps.
	var none *streamer
	w := none.writer("stdout", &tail{max: 100})
	w.Write([]byte("x"))
	w.flush()
	if w.keep.String() != "x" {
		t.Errorf("kept %q", w.keep.String())
	}
}
