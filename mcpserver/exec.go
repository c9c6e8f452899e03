package mcpserver

// The tools that run commands: exec (foreground, its output streamed as
// progress notifications), and start_process, list_processes,
// process_output and kill_process (background processes that outlive the
// call, the daemon's process API).

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/wire"
)

// RunSpec is what to run, as exec and start_process take it.
type RunSpec struct {
	Command string            `json:"command,omitempty" jsonschema:"a shell command line, run with /bin/sh -c (give either command or argv)"`
	Argv    []string          `json:"argv,omitempty" jsonschema:"the program and its arguments, run without a shell (give either command or argv)"`
	Cwd     string            `json:"cwd,omitempty" jsonschema:"the working directory (default: the image's)"`
	Env     map[string]string `json:"env,omitempty" jsonschema:"environment variables added to the sandbox's"`
}

// argv returns the command's argv: Argv, or Command through /bin/sh -c.
func (c RunSpec) argv() ([]string, error) {
	switch {
	case c.Command != "" && len(c.Argv) > 0:
		return nil, errors.New("give either command (a shell command line) or argv, not both")
	case c.Command != "":
		return []string{"/bin/sh", "-c", c.Command}, nil
	case len(c.Argv) > 0 && c.Argv[0] != "":
		return c.Argv, nil
	}
	return nil, errors.New("a command is required: command (a shell command line) or argv (the program and its arguments)")
}

// ExecInput is exec's input.
type ExecInput struct {
	SandboxRef
	RunSpec
	TimeoutSeconds int `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds (default 300)"`
}

// ExecOutput is exec's output.
type ExecOutput struct {
	ExitCode int    `json:"exit_code" jsonschema:"the exit code (128+N when killed by signal N)"`
	Signal   string `json:"signal,omitempty" jsonschema:"the signal that killed it, if one did"`
	TimedOut bool   `json:"timed_out,omitempty" jsonschema:"it was killed at its timeout"`
	Stdout   string `json:"stdout" jsonschema:"its standard output (the last 64 KiB when stdout_truncated)"`
	Stderr   string `json:"stderr" jsonschema:"its standard error (the last 64 KiB when stderr_truncated)"`
	// The truncation flags say the output was longer than kept: only its
	// end is in Stdout or Stderr.
	StdoutTruncated bool  `json:"stdout_truncated,omitempty" jsonschema:"stdout holds only the end of the output"`
	StderrTruncated bool  `json:"stderr_truncated,omitempty" jsonschema:"stderr holds only the end of the output"`
	StdoutBytes     int64 `json:"stdout_bytes" jsonschema:"the whole standard output's size"`
	StderrBytes     int64 `json:"stderr_bytes" jsonschema:"the whole standard error's size"`
}

// StartInput is start_process' input.
type StartInput struct {
	SandboxRef
	RunSpec
	TimeoutSeconds int    `json:"timeout_seconds,omitempty" jsonschema:"kill the process after this many seconds (default: never)"`
	Tag            string `json:"tag,omitempty" jsonschema:"a label of yours, shown by list_processes"`
}

// Process is a background process as the tools show it.
type Process struct {
	ID          string    `json:"id" jsonschema:"the process id, for process_output and kill_process"`
	Pid         int       `json:"pid" jsonschema:"its pid in the guest"`
	Argv        []string  `json:"argv"`
	Cwd         string    `json:"cwd,omitempty"`
	Tag         string    `json:"tag,omitempty"`
	State       string    `json:"state" jsonschema:"running, exited, or removed (kill_process with remove)"`
	ExitCode    *int      `json:"exit_code,omitempty" jsonschema:"its exit code, once exited"`
	Signal      string    `json:"signal,omitempty" jsonschema:"the signal that killed it, if one did"`
	TimedOut    bool      `json:"timed_out,omitempty"`
	StartedAt   time.Time `json:"started_at"`
	OutputBytes int64     `json:"output_bytes" jsonschema:"its output so far (stdout and stderr), the offset process_output reaches at the end"`
}

func processOf(p wire.ProcessInfo) Process {
	v := Process{ID: p.ID, Pid: p.Pid, Argv: p.Argv, Cwd: p.Cwd, Tag: p.Tag, State: p.State, StartedAt: p.StartedAt, OutputBytes: p.OutputBytes}
	if p.Exit != nil {
		v.ExitCode, v.Signal, v.TimedOut = ptr(p.Exit.Code), p.Exit.Signal, p.Exit.TimedOut
	}
	if v.Argv == nil {
		v.Argv = []string{}
	}
	return v
}

// Processes is list_processes' output.
type Processes struct {
	Processes []Process `json:"processes" jsonschema:"oldest first"`
}

// OutputInput is process_output's input.
type OutputInput struct {
	SandboxRef
	Process     string `json:"process" jsonschema:"the process id (start_process, list_processes)"`
	Offset      int64  `json:"offset,omitempty" jsonschema:"where to start in the process's output (stdout and stderr together): the next_offset of the previous call; default 0, from the start (or the oldest byte still kept)"`
	WaitSeconds int    `json:"wait_seconds,omitempty" jsonschema:"wait up to this many seconds for more output or the exit (default 0: return what there is now)"`
}

// OutputOutput is process_output's output.
type OutputOutput struct {
	Stdout string `json:"stdout" jsonschema:"standard output from offset"`
	Stderr string `json:"stderr" jsonschema:"standard error from offset"`
	// Offset is where the returned output starts, NextOffset where the
	// next call should.
	Offset     int64  `json:"offset" jsonschema:"where the returned output starts (past offset when older output was dropped)"`
	NextOffset int64  `json:"next_offset" jsonschema:"the offset to give the next process_output call"`
	Dropped    int64  `json:"dropped,omitempty" jsonschema:"bytes between the offset asked for and offset that were no longer kept"`
	More       bool   `json:"more,omitempty" jsonschema:"more output is already there: call again from next_offset"`
	Exited     bool   `json:"exited" jsonschema:"the process has exited and this is the end of its output"`
	ExitCode   *int   `json:"exit_code,omitempty"`
	Signal     string `json:"signal,omitempty"`
	TimedOut   bool   `json:"timed_out,omitempty"`
}

// KillInput is kill_process' input.
type KillInput struct {
	SandboxRef
	Process string `json:"process" jsonschema:"the process id (start_process, list_processes)"`
	Signal  string `json:"signal,omitempty" jsonschema:"the signal to send its process group: a name (SIGTERM, SIGINT, SIGKILL...) or number; default SIGKILL"`
	Remove  bool   `json:"remove,omitempty" jsonschema:"also forget the process and its output (it is killed with SIGKILL if it still runs)"`
}

func (t *tools) addExecTools(s *mcp.Server) {
	add(s, &mcp.Tool{Name: "exec", Annotations: running,
		Description: "Run a command in a sandbox and wait for it to finish. Returns its exit code, stdout and stderr (the last 64 KiB of each; the *_truncated flags say when more was cut). " +
			"While it runs, its output is streamed as progress notifications when the call has a progress token. " +
			"For servers and other long-running commands use start_process instead."},
		func(p map[string]*jsonschema.Schema) { bounds(p["timeout_seconds"], 1, t.lim.MaxTimeout) }, onSandbox(t, t.exec))
	add(s, &mcp.Tool{Name: "start_process", Annotations: running,
		Description: "Start a command in a sandbox in the background and return at once with its process id. It keeps running after this call (and across pause, snapshot and fork); read its output with process_output, stop it with kill_process."},
		func(p map[string]*jsonschema.Schema) { bounds(p["timeout_seconds"], 0, 1<<30) }, onSandbox(t, t.startProcess))
	add(s, &mcp.Tool{Name: "list_processes", Annotations: readOnly,
		Description: "List a sandbox's background processes (start_process), running and exited, oldest first."},
		nil, onSandbox(t, t.listProcesses))
	add(s, &mcp.Tool{Name: "process_output", Annotations: readOnly,
		Description: "Read a background process's output from an offset: stdout and stderr, at most 64 KiB a call, and whether it has exited (with its exit code). " +
			"Call again with next_offset to read on; wait_seconds waits for new output."},
		func(p map[string]*jsonschema.Schema) {
			bounds(p["wait_seconds"], 0, t.lim.MaxTimeout)
			p["offset"].Minimum = ptr(0.0)
		}, onSandbox(t, t.processOutput))
	add(s, &mcp.Tool{Name: "kill_process", Annotations: destructive,
		Description: "Send a signal (default SIGKILL) to a background process's process group; with remove, also forget it and its output."},
		nil, onSandbox(t, t.killProcess))
}

func (t *tools) exec(ctx context.Context, req *mcp.CallToolRequest, id string, in ExecInput) (ExecOutput, error) {
	argv, err := in.argv()
	if err != nil {
		return ExecOutput{}, err
	}
	env, err := envList(in.Env)
	if err != nil {
		return ExecOutput{}, err
	}
	timeout := in.TimeoutSeconds
	if timeout == 0 {
		timeout = t.lim.ExecTimeout
	}
	if timeout < 0 || timeout > t.lim.MaxTimeout {
		return ExecOutput{}, fmt.Errorf("timeout_seconds must be between 1 and %d", t.lim.MaxTimeout)
	}
	st := newStreamer(ctx, req, int64(16*t.lim.Output))
	stdout, stderr := &tail{max: t.lim.Output}, &tail{max: t.lim.Output}
	ow, ew := st.writer("stdout", stdout), st.writer("stderr", stderr)
	status, err := t.d.Exec(ctx, id, wire.ExecRequest{Argv: argv, Env: env, Cwd: in.Cwd, TimeoutMS: int64(timeout) * 1000}, ow, ew)
	ow.flush()
	ew.flush()
	if err != nil {
		return ExecOutput{}, err
	}
	return ExecOutput{
		ExitCode: status.Exit, Signal: status.Signal, TimedOut: status.TimedOut,
		Stdout: stdout.String(), Stderr: stderr.String(),
		StdoutTruncated: stdout.truncated(), StderrTruncated: stderr.truncated(),
		StdoutBytes: stdout.total, StderrBytes: stderr.total,
	}, nil
}

func (t *tools) startProcess(ctx context.Context, _ *mcp.CallToolRequest, id string, in StartInput) (Process, error) {
	argv, err := in.argv()
	if err != nil {
		return Process{}, err
	}
	env, err := envList(in.Env)
	if err != nil {
		return Process{}, err
	}
	if in.TimeoutSeconds < 0 {
		return Process{}, errors.New("timeout_seconds must not be negative")
	}
	p, err := t.d.StartProcess(ctx, id, wire.ProcessRequest{Argv: argv, Env: env, Cwd: in.Cwd, TimeoutMS: int64(in.TimeoutSeconds) * 1000, Tag: in.Tag})
	if err != nil {
		return Process{}, err
	}
	return processOf(*p), nil
}

func (t *tools) listProcesses(ctx context.Context, _ *mcp.CallToolRequest, id string, _ SandboxRef) (Processes, error) {
	l, err := t.d.Processes(ctx, id)
	out := Processes{Processes: []Process{}}
	for _, p := range l {
		out.Processes = append(out.Processes, processOf(p))
	}
	return out, err
}

// errEnough stops an output stream once a call has all it returns.
var errEnough = errors.New("enough output")

func (t *tools) processOutput(ctx context.Context, _ *mcp.CallToolRequest, id string, in OutputInput) (OutputOutput, error) {
	if in.Process == "" {
		return OutputOutput{}, errors.New("process is required: a process id (list_processes lists them)")
	}
	if in.Offset < 0 || in.WaitSeconds < 0 || in.WaitSeconds > t.lim.MaxTimeout {
		return OutputOutput{}, fmt.Errorf("offset must not be negative, wait_seconds between 0 and %d", t.lim.MaxTimeout)
	}
	sctx, cancel := ctx, context.CancelFunc(func() {})
	if in.WaitSeconds > 0 {
		sctx, cancel = context.WithTimeout(ctx, time.Duration(in.WaitSeconds)*time.Second)
	}
	defer cancel()
	out := OutputOutput{Offset: in.Offset, NextOffset: in.Offset}
	var stdout, stderr []byte
	room := t.lim.Output
	err := t.d.ProcessOutput(sctx, id, in.Process, in.Offset, in.WaitSeconds > 0, func(f wire.ExecFrame) error {
		switch {
		case f.Start != nil:
			out.Offset, out.NextOffset, out.Dropped = f.Start.Offset, f.Start.Offset, f.Start.Dropped
		case f.Exit != nil:
			out.Exited, out.ExitCode, out.Signal, out.TimedOut = true, ptr(*f.Exit), f.Signal, f.TimedOut
		}
		for _, c := range []struct {
			b   []byte
			dst *[]byte
		}{{f.Stdout, &stdout}, {f.Stderr, &stderr}} {
			b := c.b
			if len(b) > room {
				// Cut at a rune boundary: the next call starts there.
				b = b[:completeRunes(b[:room])]
				out.More = true
			}
			*c.dst = append(*c.dst, b...)
			room -= len(b)
			out.NextOffset += int64(len(b))
			if out.More {
				return errEnough
			}
		}
		return nil
	})
	switch {
	case err == nil, errors.Is(err, errEnough), errors.Is(err, client.ErrStreamEnded):
		// ErrStreamEnded: the stream broke (a pause, a restore); what came
		// is returned, and the next call goes on from there.
	case sctx.Err() != nil && ctx.Err() == nil:
		// wait_seconds passed.
	default:
		return OutputOutput{}, err
	}
	out.Stdout, out.Stderr = strings.ToValidUTF8(string(stdout), "\uFFFD"), strings.ToValidUTF8(string(stderr), "\uFFFD")
	return out, nil
}

func (t *tools) killProcess(ctx context.Context, _ *mcp.CallToolRequest, id string, in KillInput) (Process, error) {
	if in.Process == "" {
		return Process{}, errors.New("process is required: a process id (list_processes lists them)")
	}
	if in.Remove {
		if err := t.d.RemoveProcess(ctx, id, in.Process); err != nil {
			return Process{}, err
		}
		return Process{ID: in.Process, Argv: []string{}, State: "removed"}, nil
	}
	sig := in.Signal
	if sig == "" {
		sig = "SIGKILL"
	}
	p, err := t.d.SignalProcess(ctx, id, in.Process, sig)
	if err != nil {
		return Process{}, err
	}
	return processOf(*p), nil
}

// tail keeps the last max bytes written to it, and counts them all.
type tail struct {
	max   int
	buf   []byte
	total int64
}

func (t *tail) Write(p []byte) (int, error) {
	t.total += int64(len(p))
	if len(p) >= t.max {
		t.buf = append(t.buf[:0], p[len(p)-t.max:]...)
		return len(p), nil
	}
	if over := len(t.buf) + len(p) - t.max; over > 0 {
		t.buf = t.buf[:copy(t.buf, t.buf[over:])]
	}
	t.buf = append(t.buf, p...)
	return len(p), nil
}

// truncated reports whether bytes were dropped from the front.
func (t *tail) truncated() bool { return t.total > int64(len(t.buf)) }

// String returns the bytes kept as text: a rune cut at the front by the
// truncation is dropped, and invalid UTF-8 becomes U+FFFD.
func (t *tail) String() string {
	b := t.buf
	if t.truncated() {
		for i := 0; i < utf8.UTFMax && len(b) > 0 && !utf8.RuneStart(b[0]); i++ {
			b = b[1:]
		}
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// completeRunes returns the length of b without the incomplete UTF-8
// sequence it may end with (so that text split into chunks is not cut
// inside a character).
func completeRunes(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if c := b[i]; c < utf8.RuneSelf {
			return len(b)
		} else if utf8.RuneStart(c) {
			if utf8.FullRune(b[i:]) {
				return len(b)
			}
			return i
		}
	}
	return len(b)
}

// A streamer sends a running command's output to the client as progress
// notifications (the call's progress token; the chunk in Message, its
// stream in _meta.stream, the bytes so far in Progress). It sends at most
// limit bytes, then one note that it stopped. A nil streamer (no token)
// sends nothing.
type streamer struct {
	// notify sends one notification.
	notify func(stream, msg string, sent int64)
	limit  int64
	// mu protects sent, stopped and the notifications' order.
	mu      sync.Mutex
	sent    int64
	stopped bool
}

// newStreamer returns the streamer of a call, or nil when the call has no
// progress token.
func newStreamer(ctx context.Context, req *mcp.CallToolRequest, limit int64) *streamer {
	tok := req.Params.GetProgressToken()
	if tok == nil || req.Session == nil {
		return nil
	}
	return &streamer{limit: limit, notify: func(stream, msg string, sent int64) {
		// Best effort: a client gone away fails the call itself.
		_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
			Meta: mcp.Meta{"stream": stream}, ProgressToken: tok, Progress: float64(sent), Message: msg,
		})
	}}
}

// writer returns the writer of one stream (stdout or stderr) of the
// command: it keeps the output in keep and streams it.
func (s *streamer) writer(stream string, keep *tail) *streamWriter {
	return &streamWriter{s: s, stream: stream, keep: keep}
}

func (s *streamer) send(stream, msg string) {
	if s == nil || msg == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	n := int64(len(msg))
	if s.sent+n > s.limit {
		s.stopped = true
		msg = fmt.Sprintf("[warren: output streaming stopped after %d bytes; the result has the end of the output]\n", s.sent)
	} else {
		s.sent += n
	}
	s.notify(stream, msg, s.sent)
}

// A streamWriter is one stream of a streamer: it holds back an incomplete
// UTF-8 sequence at the end of a write until the next one.
type streamWriter struct {
	s       *streamer
	stream  string
	keep    *tail
	pending []byte
}

func (w *streamWriter) Write(p []byte) (int, error) {
	w.keep.Write(p)
	if w.s == nil {
		return len(p), nil
	}
	b := append(w.pending, p...)
	n := completeRunes(b)
	w.s.send(w.stream, strings.ToValidUTF8(string(b[:n]), "\uFFFD"))
	w.pending = append(w.pending[:0:0], b[n:]...)
	return len(p), nil
}

// flush sends what is held back.
func (w *streamWriter) flush() {
	if w.s != nil {
		w.s.send(w.stream, strings.ToValidUTF8(string(w.pending), "\uFFFD"))
		w.pending = nil
	}
}
