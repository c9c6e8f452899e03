package mcpserver

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"log/slog"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/wire"
)

// Daemon is what the server needs of warren-hostd: the methods of
// *client.Client it calls (their documentation is there).
type Daemon interface {
	Templates(ctx context.Context) ([]client.Template, error)
	ReadyTemplates(ctx context.Context) ([]string, error)
	Create(ctx context.Context, req wire.SandboxRequest, fn client.ProgressFunc) (*client.Sandbox, error)
	Sandboxes(ctx context.Context) ([]client.Sandbox, error)
	Resolve(ctx context.Context, ref string) (string, error)
	Delete(ctx context.Context, id string) error
	Pause(ctx context.Context, id string, toDisk bool, fn client.ProgressFunc) (*client.Sandbox, error)
	Resume(ctx context.Context, id string, fn client.ProgressFunc) (*client.Sandbox, error)
	Fork(ctx context.Context, id string, n int, fn client.ProgressFunc) (*wire.ForkResult, error)
	Snapshot(ctx context.Context, id string, req wire.SnapshotRequest) (*client.Snapshot, error)
	Snapshots(ctx context.Context, id string) ([]client.Snapshot, *client.Rolling, error)
	Rollback(ctx context.Context, id, snapshot string) (*wire.RollbackReply, error)

	Exec(ctx context.Context, id string, req wire.ExecRequest, stdout, stderr io.Writer) (*client.ExecStatus, error)
	StartProcess(ctx context.Context, id string, req wire.ProcessRequest) (*wire.ProcessInfo, error)
	Processes(ctx context.Context, id string) ([]wire.ProcessInfo, error)
	ProcessOutput(ctx context.Context, id, pid string, offset int64, follow bool, fn func(wire.ExecFrame) error) error
	SignalProcess(ctx context.Context, id, pid, signal string) (*wire.ProcessInfo, error)
	RemoveProcess(ctx context.Context, id, pid string) error

	ReadFile(ctx context.Context, id, path string, w io.Writer) (fs.FileMode, error)
	WriteFile(ctx context.Context, id, path string, r io.Reader, mode fs.FileMode) (*wire.FileInfo, error)
	ListFiles(ctx context.Context, id, path string, depth int) ([]wire.FileInfo, error)
}

// The client a Daemon is in production.
var _ Daemon = (*client.Client)(nil)

// Limits bound what the tools hand an MCP client and ask of the daemon.
// The zero value of a field is its Default.
type Limits struct {
	// Output is the most an exec keeps of each of stdout and stderr (the
	// last bytes), and the most one process_output call returns.
	Output int
	// ReadFile is the largest file read_file returns.
	ReadFile int64
	// WriteFile is the largest content write_file takes.
	WriteFile int
	// ListEntries is the most entries list_files returns.
	ListEntries int
	// ExecTimeout is an exec's timeout when the call gives none;
	// MaxTimeout the longest a call may ask for.
	ExecTimeout, MaxTimeout int
	// MaxFork is the most children one fork_sandbox makes.
	MaxFork int
}

// DefaultLimits are the limits of the zero Limits.
var DefaultLimits = Limits{
	Output:      64 << 10,
	ReadFile:    256 << 10,
	WriteFile:   8 << 20,
	ListEntries: 1000,
	ExecTimeout: 300,
	MaxTimeout:  3600,
	MaxFork:     16,
}

// withDefaults returns l with its zero fields DefaultLimits'.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.Output > 0 {
		d.Output = l.Output
	}
	if l.ReadFile > 0 {
		d.ReadFile = l.ReadFile
	}
	if l.WriteFile > 0 {
		d.WriteFile = l.WriteFile
	}
	if l.ListEntries > 0 {
		d.ListEntries = l.ListEntries
	}
	if l.ExecTimeout > 0 {
		d.ExecTimeout = l.ExecTimeout
	}
	if l.MaxTimeout > 0 {
		d.MaxTimeout = l.MaxTimeout
	}
	if l.MaxFork > 0 {
		d.MaxFork = l.MaxFork
	}
	return d
}

// Options configure New.
type Options struct {
	// Version is the server's version reported to clients ("" is "dev").
	Version string
	// Limits bound the tools' answers (zero fields: DefaultLimits).
	Limits Limits
	// Logger, if set, receives the SDK's log (never stdout: in stdio mode
	// stdout is the protocol's).
	Logger *slog.Logger
}

// Name is the server's name in its MCP implementation info.
const Name = "warren"

// New returns the MCP server of d's sandboxes, with every tool added.
// One server serves any number of sessions (Handler gives each HTTP
// session the same one).
func New(d Daemon, opts Options) *mcp.Server {
	version := opts.Version
	if version == "" {
		version = "dev"
	}
	s := mcp.NewServer(&mcp.Implementation{Name: Name, Title: "Warren sandboxes", Version: version}, &mcp.ServerOptions{
		Instructions: instructions,
		Logger:       opts.Logger,
	})
	t := &tools{d: d, lim: opts.Limits.withDefaults()}
	t.addSandboxTools(s)
	t.addExecTools(s)
	t.addFileTools(s)
	return s
}

// instructions tell the model what the server is for and how its tools
// fit together.
const instructions = `Warren runs Linux microVM sandboxes. Typical use: list_templates, then create_sandbox (it returns the sandbox id), then exec commands, read_file/write_file/list_files, and delete_sandbox when done. A sandbox can be paused and resumed, snapshotted and rolled back to a snapshot (undo), or forked into copies that continue from the same state. Long-running commands (servers, builds) go in start_process and are read back with process_output. Tools that take "sandbox" accept its id (sb-...) or its name (the name given to create_sandbox).`

// tools is the tools' shared state: the daemon and the limits.
type tools struct {
	d   Daemon
	lim Limits
}

// add adds a tool whose input schema is In's, passed through tweak (to add
// what struct tags cannot say: bounds, enums), and whose output schema is
// Out's.
func add[In, Out any](s *mcp.Server, tool *mcp.Tool, tweak func(props map[string]*jsonschema.Schema), h mcp.ToolHandlerFor[In, Out]) {
	if tweak != nil {
		in, err := jsonschema.For[In](nil)
		if err != nil {
			panic(fmt.Sprintf("mcpserver: tool %s: input schema: %v", tool.Name, err))
		}
		tweak(in.Properties)
		tool.InputSchema = in
	}
	mcp.AddTool(s, tool, h)
}

// bounds sets an integer property's minimum and maximum.
func bounds(p *jsonschema.Schema, lo, hi int) {
	l, h := float64(lo), float64(hi)
	p.Minimum, p.Maximum = &l, &h
}

// enum restricts a string property to values.
func enum(p *jsonschema.Schema, values ...string) {
	for _, v := range values {
		p.Enum = append(p.Enum, v)
	}
}

// Annotations of the tools (hints to the client about their effects).
var (
	readOnly    = &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)}
	mutating    = &mcp.ToolAnnotations{DestructiveHint: ptr(false), OpenWorldHint: ptr(false)}
	destructive = &mcp.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(false)}
	// running a command may do anything, the network included.
	running = &mcp.ToolAnnotations{DestructiveHint: ptr(true), OpenWorldHint: ptr(true)}
)

func ptr[T any](v T) *T { return &v }

// resolve turns a tool's sandbox argument (an id or a name) into its id.
func (t *tools) resolve(ctx context.Context, ref string) (string, error) {
	if ref == "" {
		return "", fmt.Errorf("sandbox is required: a sandbox id (sb-...) or name; list_sandboxes lists them")
	}
	return t.d.Resolve(ctx, ref)
}

// progress returns a client.ProgressFunc that sends a long operation's
// steps to the client as progress notifications when the call asked for
// them (it sent a progress token), or nil.
func progress(ctx context.Context, req *mcp.CallToolRequest) client.ProgressFunc {
	tok := req.Params.GetProgressToken()
	if tok == nil || req.Session == nil {
		return nil
	}
	return func(p wire.Progress) {
		// Best effort: a client gone away fails the call itself.
		_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
			ProgressToken: tok, Progress: float64(p.Pct), Total: 100, Message: p.Step,
		})
	}
}
