// Package wire holds the JSON bodies of warren-hostd's HTTP API
// (hostd/openapi.yaml) that the daemon (hostd/daemon) and its clients
// (hostd/client) both read or write: requests, replies, the lines of a
// long operation's progress stream, exec frames, events and the error
// body. The records themselves (store.Template, store.Sandbox,
// store.Snapshot, store.Rolling) are hostd/store's.
//
// The JSON names are the API's: changing one changes the wire, and
// openapi.yaml with it. A reply that the daemon used to write as a Go map
// has its fields in alphabetical order, as encoding/json wrote the map's
// keys, so that its bytes on the wire are unchanged.
package wire

import (
	"encoding/json"
	"time"

	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/hostd/pagestore"
	"github.com/warrenvm/warren/hostd/store"
)

// TemplateRequest is the body of POST /v1/templates.
type TemplateRequest struct {
	// Kernel (a vmlinux or bzImage), Initramfs and Disks (raw images) are
	// names of files in the daemon's guest directory (warren-hostd
	// --guest-dir), which its operator keeps; never host paths: a name
	// with a '/' (absolute or relative), "." or "..", a symbolic link or
	// anything but a regular file is refused (400). The daemon opens them
	// itself and the VMM gets descriptors or copies, never their paths.
	// A disk "NAME,ro" is copied into the template read-only and shared
	// by every sandbox; a disk "NAME" is writable: the template freezes
	// its own clone of it and each sandbox writes to an overlay of its
	// own. With Image, Kernel and Initramfs default to the daemon's guest
	// kernel and initramfs (warren-hostd --guest-kernel, --guest-initramfs).
	Kernel    string   `json:"kernel,omitempty"`
	Initramfs string   `json:"initramfs,omitempty"`
	Disks     []string `json:"disks,omitempty"`
	// MemMiB and CPUs size the guest (the daemon's defaults: 256 and 1);
	// Cmdline is the kernel's command line.
	MemMiB  int    `json:"mem_mib,omitempty"`
	CPUs    int    `json:"cpus,omitempty"`
	Cmdline string `json:"cmdline,omitempty"`
	// Network gives the template's VMM, and every sandbox of it, a
	// private network whose egress is filtered (deny all until a
	// sandbox's policy says otherwise).
	Network bool `json:"network,omitempty"`
	// Balloon gives the template's VMM, and so every sandbox of it (a
	// restore keeps the snapshot's devices), a memory balloon with free
	// page reporting (`warren run --balloon`): the guest gives back the
	// memory it frees, and PUT /v1/sandboxes/{id}/balloon sets how much
	// of its memory the balloon takes from it.
	Balloon bool `json:"balloon,omitempty"`
	// Image makes the template's root file system from a container
	// image: a registry reference ("registry.example/repo:tag",
	// "repo@sha256:..."), pulled by the daemon (auth from its Docker
	// config keychain), or "upload:ID" for an image uploaded with
	// POST /v1/images. The image's layers become one read-only ext4 base
	// per image digest, shared by the tenant's templates; the template's
	// guest boots with it as its root (disk 0, under a copy-on-write
	// overlay of the template's own, and of each sandbox's own), and
	// Disks follow it as disks 1, 2, ...
	Image string `json:"image,omitempty"`
	// InsecureRegistry pulls Image over plain HTTP (a registry on loopback).
	InsecureRegistry bool `json:"insecure_registry,omitempty"`
	// DiskMiB is the size of the image's root file system (sparse: only
	// what is written takes space); 0 means the daemon's default.
	DiskMiB int `json:"disk_mib,omitempty"`
	// StartCmd, a shell command line (run with /bin/sh -c in the image's
	// environment), is started and supervised (restarted when it exits)
	// in the template's guest before its snapshot is taken, so it runs in
	// every sandbox. StartImageCmd runs the image's own Entrypoint and
	// Cmd instead. ReadyCmd, when set, is run (/bin/sh -c) until it exits
	// 0 before the snapshot, for at most ReadyTimeoutS seconds (default
	// 120); without it the snapshot waits until the start command has
	// run for a second.
	StartCmd      string `json:"start_cmd,omitempty"`
	StartImageCmd bool   `json:"start_image_cmd,omitempty"`
	ReadyCmd      string `json:"ready_cmd,omitempty"`
	ReadyTimeoutS int    `json:"ready_timeout_s,omitempty"`
}

// ImageUpload is the answer to POST /v1/images: an image the client
// uploaded (a docker-archive tar), which a TemplateRequest names by Ref
// until a template build uses it.
type ImageUpload struct {
	ID    string `json:"id"`
	Ref   string `json:"ref"` // "upload:" + ID
	Bytes int64  `json:"bytes"`
}

// ImageList is the answer to GET /v1/images: the tenant's image bases.
type ImageList struct {
	Images []store.Image `json:"images"`
}

// SandboxRequest is the body of POST /v1/sandboxes.
type SandboxRequest struct {
	// Template is the id of the template to restore.
	Template string `json:"template"`
	// MemMiB and CPUs are the VMM's cgroup limits (the guest's own size
	// is its template's); default the template's.
	MemMiB int `json:"mem_mib,omitempty"`
	CPUs   int `json:"cpus,omitempty"`
	// Egress is the egress policy (ebpf/policy JSON; needs a network
	// template); Env is KEY=VALUE added to every exec; Secrets names the
	// tenant's secrets (PUT /v1/secrets/{name}) the sandbox's credential
	// proxy may use: every credential of Egress must name one of them;
	// Labels are free-form (label "name" is how clients find a sandbox by
	// name).
	Egress  json.RawMessage   `json:"egress,omitempty"`
	Env     []string          `json:"env,omitempty"`
	Secrets []string          `json:"secrets,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
}

// Secret is the answer of PUT and DELETE /v1/secrets/{name}: the name
// only, never the value.
type Secret struct {
	Name string `json:"name"`
}

// KeyInfo is the answer of the /v1/keys calls: the tenant's key ID (a
// fingerprint, never the key), or that its key is revoked; after a
// revocation, the sandboxes it stopped.
type KeyInfo struct {
	Tenant  string   `json:"tenant"`
	KeyID   string   `json:"key_id,omitempty"`
	Revoked bool     `json:"revoked,omitempty"`
	Stopped []string `json:"stopped,omitempty"`
}

// SecretList is the answer of GET /v1/secrets.
type SecretList struct {
	// Names are the tenant's secrets, sorted, never null.
	Names []string `json:"names"`
}

// EgressReply is the answer of GET and PUT /v1/sandboxes/{id}/egress: the
// sandbox VMM's own answer (GET /v1/egress of its control API).
type EgressReply struct {
	// Policy is the policy in force; Stats the filter's, resolver's and
	// proxy's counters; Audit the path of its egress audit log.
	Policy json.RawMessage `json:"policy"`
	Stats  json.RawMessage `json:"stats"`
	Audit  string          `json:"audit,omitempty"`
}

// SnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshots.
type SnapshotRequest struct {
	// Name (default snap-<UTC time>) and Incremental describe a snapshot
	// taken now.
	Name        string `json:"name,omitempty"`
	Incremental bool   `json:"incremental,omitempty"`
	// Every, when set, starts rolling snapshots at that interval (a Go
	// duration), or with "0" stops them; Keep is the layers a chain has
	// before the next full one (default 8).
	Every string `json:"every,omitempty"`
	Keep  int    `json:"keep,omitempty"`
}

// RollingReply is the answer of POST /v1/sandboxes/{id}/snapshots with
// Every set.
type RollingReply struct {
	// Rolling is the setting now; nil when rolling snapshots are off.
	Rolling *store.Rolling `json:"rolling"`
}

// SnapshotList is the answer of GET /v1/sandboxes/{id}/snapshots.
type SnapshotList struct {
	// Rolling is the rolling-snapshot setting (nil: off); Snapshots are
	// oldest first, never null.
	Rolling   *store.Rolling   `json:"rolling"`
	Snapshots []store.Snapshot `json:"snapshots"`
}

// RollbackRequest is the body of POST /v1/sandboxes/{id}/rollback.
type RollbackRequest struct {
	// Snapshot is the name of one of the sandbox's snapshots.
	Snapshot string `json:"snapshot"`
}

// RollbackReply is the answer to a rollback: what the VMM did, without
// the host's paths (its snapshot and disk files), and the line `warren
// rollback` prints.
type RollbackReply struct {
	// Snapshot is the snapshot's name, as asked.
	Snapshot string `json:"snapshot"`
	// PauseMS is how long the guest was paused, TotalMS the whole
	// rollback in the VMM and LoadMS the snapshot's load within it.
	PauseMS float64 `json:"pause_ms"`
	TotalMS float64 `json:"total_ms"`
	LoadMS  float64 `json:"load_ms"`
	// PagesWritten were rewritten from the snapshot; PagesCleared zeroed.
	PagesWritten uint64 `json:"pages_written"`
	PagesCleared uint64 `json:"pages_cleared"`
	// Line is the one-line summary.
	Line string `json:"line"`
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork.
type ForkRequest struct {
	// N is the number of children, 1 to 64 (0 is 1).
	N int `json:"n"`
}

// ForkResult is the answer of POST /v1/sandboxes/{id}/fork.
type ForkResult struct {
	// Children are the new sandboxes, failed ones included; Errors says
	// why each failed one did.
	Children []store.Sandbox `json:"children"`
	Errors   []string        `json:"errors,omitempty"`
	// Parent is the forked sandbox's id; PauseMS how long the VMM paused
	// it to fork.
	Parent  string  `json:"parent"`
	PauseMS float64 `json:"pause_ms"`
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec.
type ExecRequest struct {
	// Argv is the command (required); Env is added to the sandbox's own,
	// Cwd is the working directory, TimeoutMS (0: none) kills it.
	Argv      []string `json:"argv"`
	Env       []string `json:"env,omitempty"`
	Cwd       string   `json:"cwd,omitempty"`
	TimeoutMS int64    `json:"timeout_ms,omitempty"`
	// Stdin is the process's whole standard input (base64 in JSON).
	Stdin []byte `json:"stdin,omitempty"`
}

// ExecFrame is one line of an exec's NDJSON answer: exactly one of
// Stdout, Stderr, Exit (with Signal, TimedOut) or Error.
type ExecFrame struct {
	// Stdout and Stderr are output as it came (base64 in JSON).
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
	// Exit, set in the last frame, is the exit code; Signal names the
	// signal that killed the process, TimedOut says the timeout did.
	Exit     *int   `json:"exit,omitempty"`
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	// Error, in the last frame instead of Exit, says the exec failed
	// after its output had started.
	Error string `json:"error,omitempty"`
	// Start, in the first frame of a process's output stream (GET
	// /v1/sandboxes/{id}/processes/{pid}/output), says at which offset of
	// the process's output the stream starts and how many bytes asked
	// for were no longer kept; a later frame with Start says the reader
	// fell behind what is kept: the stream goes on from that offset,
	// Dropped bytes lost.
	Start *OutputStart `json:"start,omitempty"`
}

// The process API (/v1/sandboxes/{id}/processes): the guest agent's,
// passed on (see agentwire's process.go for the semantics). The daemon adds
// the sandbox's Env before a request's own, and turns the output stream's
// frames into ExecFrame lines.
type (
	// ProcessRequest is the body of POST /v1/sandboxes/{id}/processes.
	ProcessRequest = agentwire.ProcessRequest
	// ProcessInfo is a process's state: the answer of the process calls.
	ProcessInfo = agentwire.ProcessInfo
	// TerminalSize is the body of POST .../processes/{pid}/resize.
	TerminalSize = agentwire.TerminalSize
	// SignalRequest is the body of POST .../processes/{pid}/signal.
	SignalRequest = agentwire.SignalRequest
	// OutputStart is ExecFrame.Start.
	OutputStart = agentwire.OutputStart
	// WatchEvent is a line of GET /v1/sandboxes/{id}/files/watch.
	WatchEvent = agentwire.WatchEvent
)

// RenameRequest is the body of POST /v1/sandboxes/{id}/files/rename.
type RenameRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// FileInfo describes a guest file: the answer of PUT
// /v1/sandboxes/{id}/files. It is the guest agent's, passed on as the
// agent wrote it (name, size, mode, mod_time, is_dir, link).
type FileInfo = agentwire.FileInfo

// Event is one lifecycle event of a tenant's sandbox or template: a line
// of GET /v1/events.
type Event struct {
	// Time is when it happened (UTC).
	Time time.Time `json:"time"`
	// Type is one of created, paused, resumed, snapshotted, forked,
	// rolled_back, stopped, deleted, template_ready, template_failed,
	// template_deleted, key_created, key_revoked.
	Type string `json:"type"`
	// Sandbox and Template are the ids it concerns; Detail says more.
	Sandbox  string `json:"sandbox,omitempty"`
	Template string `json:"template,omitempty"`
	Detail   string `json:"detail,omitempty"`
}

// Health is the answer of GET /v1/health.
type Health struct {
	// Cgroups is the cgroup version the daemon uses (0: none), OK is
	// always true, Tenant the tenant the request acts for.
	Cgroups int    `json:"cgroups"`
	OK      bool   `json:"ok"`
	Tenant  string `json:"tenant"`
}

// Error is the body of an error answer (with Status 0, left out), and the
// last line of a failed long operation's stream (with its Status).
type Error struct {
	Error  string `json:"error"`
	Status int    `json:"status,omitempty"`
	// Code, when set, is the guest agent's error code (agentwire.Code*:
	// "not_found" for a program the guest does not have, ...) on an
	// error that came from the agent.
	Code string `json:"code,omitempty"`
}

// Progress is a step line of a long operation's stream (Accept:
// application/x-ndjson): what it does now and how far along it is.
type Progress struct {
	Step string `json:"progress"`
	Pct  int    `json:"pct"`
}

// Result is the last line of a successful long operation's stream: the
// answer it would have had unstreamed, and that answer's status.
type Result struct {
	Result any `json:"result"`
	Status int `json:"status"`
}

// ProgressLine is any line of a long operation's stream, as a reader
// decodes it: a step (Progress set) or the last line, with Result or
// Error, and Status. The daemon writes them as Progress, Result and
// Error.
type ProgressLine struct {
	Progress *string         `json:"progress"`
	Pct      int             `json:"pct"`
	Result   json.RawMessage `json:"result"`
	Error    string          `json:"error"`
	Status   int             `json:"status"`
}

// StoreStats is the answer of GET /v1/store: the tenant's part of the
// host's page store (hostd/pagestore), where its sandboxes' snapshot
// layers keep each distinct block of guest memory once.
type StoreStats struct {
	Tenant string `json:"tenant"`
	// LogicalBytes is what the tenant's snapshot layers would take as
	// plain layer files (each one holding all its pages); StoredBytes is
	// what they take: the store's chunks, the reference files and the
	// layers not in the store (a running sandbox's newest). CacheBytes is
	// what the caches rebuilt from the store take besides (templates'
	// layers and their flattened images, which the daemon drops when the
	// template has been idle: warren-hostd --template-cache-idle).
	LogicalBytes int64            `json:"logical_bytes"`
	StoredBytes  int64            `json:"stored_bytes"`
	CacheBytes   int64            `json:"cache_bytes"`
	Namespaces   []StoreNamespace `json:"namespaces"`
}

// StoreNamespace is one namespace of a tenant: "plain", or its key's ID
// (chunks sealed under the key, never shared with another key or tenant).
// Unreferenced is -1 when the namespace's reference files could not be
// read (warren store stats --state without --keys).
type StoreNamespace = pagestore.Stats

// Sum sets s's totals from its namespaces. Plain layers and caches are
// counted once (every namespace's scan finds the same ones).
func (s *StoreStats) Sum() {
	s.LogicalBytes, s.StoredBytes, s.CacheBytes = 0, 0, 0
	var layers int64
	for _, n := range s.Namespaces {
		s.LogicalBytes += n.LogicalBytes
		s.StoredBytes += n.ChunkBytes + n.RefBytes
		layers = max(layers, n.LayerBytes)
		s.CacheBytes = max(s.CacheBytes, n.CacheBytes)
	}
	s.LogicalBytes += layers
	s.StoredBytes += layers
}
