package mcpserver

// The tools of templates and of the sandbox lifecycle: list_templates,
// create_sandbox, list_sandboxes, pause_sandbox, resume_sandbox,
// fork_sandbox, snapshot_sandbox, list_snapshots, rollback_sandbox and
// delete_sandbox.

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/wire"
)

// Template is a template as the tools show it.
type Template struct {
	ID     string `json:"id" jsonschema:"the template id, for create_sandbox"`
	Status string `json:"status" jsonschema:"ready (usable), building or failed"`
	Error  string `json:"error,omitempty" jsonschema:"why a failed template failed"`
	Image  string `json:"image,omitempty" jsonschema:"the container image its root file system came from"`
	MemMiB int    `json:"mem_mib" jsonschema:"guest memory in MiB"`
	CPUs   int    `json:"cpus" jsonschema:"guest vCPUs"`
	// Network says its sandboxes have a network (with an egress policy).
	Network bool      `json:"network" jsonschema:"whether its sandboxes have a network"`
	Created time.Time `json:"created"`
}

func templateOf(t client.Template) Template {
	v := Template{ID: t.ID, Status: t.Status, Error: t.Error, MemMiB: t.MemMiB, CPUs: t.CPUs, Network: t.Network, Created: t.Created}
	if t.Image != nil {
		v.Image = t.Image.Ref
	}
	return v
}

// Sandbox is a sandbox as the tools show it (not the daemon's whole
// record: its host paths and process ids are no business of the model's).
type Sandbox struct {
	ID       string            `json:"id" jsonschema:"the sandbox id (sb-...), for the other tools"`
	Name     string            `json:"name,omitempty" jsonschema:"its name (label \"name\"), usable instead of the id"`
	Status   string            `json:"status" jsonschema:"running, paused, suspended (paused to disk), stopped or failed"`
	Reason   string            `json:"reason,omitempty" jsonschema:"why it is in that status"`
	Template string            `json:"template" jsonschema:"the template it was created from"`
	Parent   string            `json:"parent,omitempty" jsonschema:"the sandbox it was forked from"`
	Labels   map[string]string `json:"labels,omitempty"`
	Network  bool              `json:"network,omitempty" jsonschema:"whether it has a network"`
	// Snapshots counts its snapshots (list_snapshots lists them).
	Snapshots int       `json:"snapshots" jsonschema:"how many snapshots it has (list_snapshots lists them)"`
	Created   time.Time `json:"created"`
}

func sandboxOf(s client.Sandbox) Sandbox {
	return Sandbox{ID: s.ID, Name: s.Labels["name"], Status: s.Status, Reason: s.Reason, Template: s.Template,
		Parent: s.Parent, Labels: s.Labels, Network: s.Network, Snapshots: len(s.Snapshots), Created: s.Created}
}

// Snapshot is a sandbox's snapshot as the tools show it.
type Snapshot struct {
	Name    string    `json:"name" jsonschema:"the snapshot name, for rollback_sandbox"`
	Kind    string    `json:"kind" jsonschema:"full or incremental"`
	Time    time.Time `json:"time"`
	Bytes   int64     `json:"bytes,omitempty" jsonschema:"the size of its memory layer"`
	PauseMS float64   `json:"pause_ms,omitempty" jsonschema:"how long the sandbox was paused to take it"`
}

func snapshotOf(s client.Snapshot) Snapshot {
	return Snapshot{Name: s.Name, Kind: s.Kind, Time: s.Time, Bytes: s.Bytes, PauseMS: s.PauseMS}
}

// SandboxRef is the input of the tools that take only a sandbox, and is
// embedded in the input of the others that take one.
type SandboxRef struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox: its id (sb-...) or its name"`
}

// sandboxInput is a tool input that names a sandbox.
type sandboxInput interface{ sandboxRef() string }

func (r SandboxRef) sandboxRef() string { return r.Sandbox }

// NoInput is the input of the tools that take nothing.
type NoInput struct{}

// Templates is list_templates' output.
type Templates struct {
	Templates []Template `json:"templates"`
}

// Sandboxes is list_sandboxes' output.
type Sandboxes struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// CreateInput is create_sandbox's input.
type CreateInput struct {
	Template string            `json:"template,omitempty" jsonschema:"the template id (list_templates); may be left out when the tenant has exactly one ready template"`
	Name     string            `json:"name,omitempty" jsonschema:"a name for the sandbox, usable instead of its id in the other tools"`
	Env      map[string]string `json:"env,omitempty" jsonschema:"environment variables set in every command run in the sandbox"`
	Labels   map[string]string `json:"labels,omitempty" jsonschema:"free-form labels (list_sandboxes shows them)"`
}

// PauseInput is pause_sandbox's input.
type PauseInput struct {
	SandboxRef
	ToDisk bool `json:"to_disk,omitempty" jsonschema:"snapshot it and stop its VM, freeing its memory (resume_sandbox restores it); default: pause it in memory"`
}

// ForkInput is fork_sandbox's input.
type ForkInput struct {
	SandboxRef
	N int `json:"n,omitempty" jsonschema:"how many copies to make (default 1)"`
}

// ForkOutput is fork_sandbox's output.
type ForkOutput struct {
	Parent   string    `json:"parent"`
	Children []Sandbox `json:"children" jsonschema:"the new sandboxes, each continuing from the parent's state"`
	Errors   []string  `json:"errors,omitempty" jsonschema:"why each child that failed did"`
}

// SnapshotInput is snapshot_sandbox's input.
type SnapshotInput struct {
	SandboxRef
	Name        string `json:"name,omitempty" jsonschema:"the snapshot's name (default snap-<time>)"`
	Incremental bool   `json:"incremental,omitempty" jsonschema:"save only the memory changed since its last snapshot"`
}

// Snapshots is list_snapshots' output.
type Snapshots struct {
	Snapshots []Snapshot `json:"snapshots" jsonschema:"oldest first"`
}

// RollbackInput is rollback_sandbox's input.
type RollbackInput struct {
	SandboxRef
	Snapshot string `json:"snapshot" jsonschema:"the name of one of its snapshots (snapshot_sandbox, list_snapshots)"`
}

// RollbackOutput is rollback_sandbox's output.
type RollbackOutput struct {
	Sandbox  string  `json:"sandbox"`
	Snapshot string  `json:"snapshot"`
	PauseMS  float64 `json:"pause_ms" jsonschema:"how long the sandbox was paused for the rollback"`
}

// Deleted is delete_sandbox's output.
type Deleted struct {
	Deleted string `json:"deleted" jsonschema:"the id of the deleted sandbox"`
}

func (t *tools) addSandboxTools(s *mcp.Server) {
	add(s, &mcp.Tool{Name: "list_templates", Annotations: readOnly,
		Description: "List the templates sandboxes are created from (a template is a booted, snapshotted VM image). Use a ready one's id in create_sandbox."},
		nil, t.listTemplates)
	add(s, &mcp.Tool{Name: "create_sandbox", Annotations: mutating,
		Description: "Create a new sandbox (a Linux microVM) from a template and start it; it is ready for exec when this returns. Returns the sandbox, whose id the other tools take. Delete it with delete_sandbox when done."},
		nil, t.create)
	add(s, &mcp.Tool{Name: "list_sandboxes", Annotations: readOnly,
		Description: "List the sandboxes, oldest first, with their status."},
		nil, t.listSandboxes)
	add(s, &mcp.Tool{Name: "pause_sandbox", Annotations: mutating,
		Description: "Pause a running sandbox: its processes stop where they are until resume_sandbox. With to_disk, its state goes to disk and its VM stops (no memory held)."},
		nil, onSandbox(t, t.pause))
	add(s, &mcp.Tool{Name: "resume_sandbox", Annotations: mutating,
		Description: "Resume a paused sandbox (or restore a suspended or stopped one from its latest snapshot); its processes continue where they were."},
		nil, onSandbox(t, t.resume))
	add(s, &mcp.Tool{Name: "fork_sandbox", Annotations: mutating,
		Description: "Fork a running sandbox into n new sandboxes that continue from its current state (memory, processes and files), e.g. to try several approaches in parallel. The parent keeps running."},
		func(p map[string]*jsonschema.Schema) { bounds(p["n"], 1, t.lim.MaxFork) }, onSandbox(t, t.fork))
	add(s, &mcp.Tool{Name: "snapshot_sandbox", Annotations: mutating,
		Description: "Take a snapshot of a running sandbox's whole state (memory, processes, disk) to roll back to later with rollback_sandbox."},
		nil, onSandbox(t, t.snapshot))
	add(s, &mcp.Tool{Name: "list_snapshots", Annotations: readOnly,
		Description: "List a sandbox's snapshots, oldest first."},
		nil, onSandbox(t, t.listSnapshots))
	add(s, &mcp.Tool{Name: "rollback_sandbox", Annotations: destructive,
		Description: "Put a running sandbox back to one of its snapshots, in place: everything since (files, processes, memory) is undone."},
		nil, onSandbox(t, t.rollback))
	add(s, &mcp.Tool{Name: "delete_sandbox", Annotations: destructive,
		Description: "Stop a sandbox and delete it with its files and snapshots. Cannot be undone."},
		nil, onSandbox(t, t.delete))
}

func (t *tools) listTemplates(ctx context.Context, _ *mcp.CallToolRequest, _ NoInput) (*mcp.CallToolResult, Templates, error) {
	l, err := t.d.Templates(ctx)
	out := Templates{Templates: []Template{}}
	for _, x := range l {
		out.Templates = append(out.Templates, templateOf(x))
	}
	return nil, out, err
}

func (t *tools) listSandboxes(ctx context.Context, _ *mcp.CallToolRequest, _ NoInput) (*mcp.CallToolResult, Sandboxes, error) {
	l, err := t.d.Sandboxes(ctx)
	out := Sandboxes{Sandboxes: []Sandbox{}}
	for _, x := range l {
		out.Sandboxes = append(out.Sandboxes, sandboxOf(x))
	}
	return nil, out, err
}

// envList turns an env map into the daemon's KEY=VALUE list, sorted.
func envList(env map[string]string) ([]string, error) {
	var l []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, fmt.Errorf("env: %q is not a variable name", k)
		}
		l = append(l, k+"="+env[k])
	}
	return l, nil
}

func (t *tools) create(ctx context.Context, req *mcp.CallToolRequest, in CreateInput) (*mcp.CallToolResult, Sandbox, error) {
	env, err := envList(in.Env)
	if err != nil {
		return nil, Sandbox{}, err
	}
	labels := maps.Clone(in.Labels)
	for k := range labels {
		if k == "" {
			return nil, Sandbox{}, fmt.Errorf("labels: an empty label name")
		}
	}
	if in.Name != "" {
		if labels == nil {
			labels = map[string]string{}
		}
		labels["name"] = in.Name
	}
	tpl := in.Template
	if tpl == "" {
		ready, err := t.d.ReadyTemplates(ctx)
		if err != nil {
			return nil, Sandbox{}, err
		}
		if len(ready) != 1 {
			return nil, Sandbox{}, fmt.Errorf("template is needed: there are %d ready templates (list_templates lists them)", len(ready))
		}
		tpl = ready[0]
	}
	sb, err := t.d.Create(ctx, wire.SandboxRequest{Template: tpl, Env: env, Labels: labels}, progress(ctx, req))
	if err != nil {
		return nil, Sandbox{}, err
	}
	return nil, sandboxOf(*sb), nil
}

// onSandbox is the handler of a tool whose input names a sandbox: it
// resolves the sandbox and runs do with its id.
func onSandbox[In sandboxInput, Out any](t *tools, do func(ctx context.Context, req *mcp.CallToolRequest, id string, in In) (Out, error)) mcp.ToolHandlerFor[In, Out] {
	return func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		var zero Out
		id, err := t.resolve(ctx, in.sandboxRef())
		if err != nil {
			return nil, zero, err
		}
		out, err := do(ctx, req, id, in)
		if err != nil {
			return nil, zero, err
		}
		return nil, out, nil
	}
}

func (t *tools) pause(ctx context.Context, req *mcp.CallToolRequest, id string, in PauseInput) (Sandbox, error) {
	sb, err := t.d.Pause(ctx, id, in.ToDisk, progress(ctx, req))
	if err != nil {
		return Sandbox{}, err
	}
	return sandboxOf(*sb), nil
}

func (t *tools) resume(ctx context.Context, req *mcp.CallToolRequest, id string, _ SandboxRef) (Sandbox, error) {
	sb, err := t.d.Resume(ctx, id, progress(ctx, req))
	if err != nil {
		return Sandbox{}, err
	}
	return sandboxOf(*sb), nil
}

func (t *tools) fork(ctx context.Context, req *mcp.CallToolRequest, id string, in ForkInput) (ForkOutput, error) {
	n := in.N
	if n == 0 {
		n = 1
	}
	if n < 1 || n > t.lim.MaxFork {
		return ForkOutput{}, fmt.Errorf("n must be between 1 and %d", t.lim.MaxFork)
	}
	r, err := t.d.Fork(ctx, id, n, progress(ctx, req))
	if err != nil {
		return ForkOutput{}, err
	}
	out := ForkOutput{Parent: r.Parent, Children: []Sandbox{}, Errors: r.Errors}
	for _, c := range r.Children {
		out.Children = append(out.Children, sandboxOf(c))
	}
	return out, nil
}

func (t *tools) snapshot(ctx context.Context, _ *mcp.CallToolRequest, id string, in SnapshotInput) (Snapshot, error) {
	s, err := t.d.Snapshot(ctx, id, wire.SnapshotRequest{Name: in.Name, Incremental: in.Incremental})
	if err != nil {
		return Snapshot{}, err
	}
	return snapshotOf(*s), nil
}

func (t *tools) listSnapshots(ctx context.Context, _ *mcp.CallToolRequest, id string, _ SandboxRef) (Snapshots, error) {
	l, _, err := t.d.Snapshots(ctx, id)
	out := Snapshots{Snapshots: []Snapshot{}}
	for _, s := range l {
		out.Snapshots = append(out.Snapshots, snapshotOf(s))
	}
	return out, err
}

func (t *tools) rollback(ctx context.Context, _ *mcp.CallToolRequest, id string, in RollbackInput) (RollbackOutput, error) {
	if in.Snapshot == "" {
		return RollbackOutput{}, fmt.Errorf("snapshot is required: a snapshot name (list_snapshots lists them)")
	}
	r, err := t.d.Rollback(ctx, id, in.Snapshot)
	if err != nil {
		return RollbackOutput{}, err
	}
	return RollbackOutput{Sandbox: id, Snapshot: r.Snapshot, PauseMS: r.PauseMS}, nil
}

func (t *tools) delete(ctx context.Context, _ *mcp.CallToolRequest, id string, _ SandboxRef) (Deleted, error) {
	return Deleted{Deleted: id}, t.d.Delete(ctx, id)
}
