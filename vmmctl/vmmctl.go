package vmmctl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"

	"github.com/warrenvm/warren/cow"
	"github.com/warrenvm/warren/ebpf/policy"
	"github.com/warrenvm/warren/memsnap/vmsnap"
)

// SnapshotRequest is the body of POST /v1/snapshot.
type SnapshotRequest struct {
	Path string      `json:"path"`
	Kind vmsnap.Kind `json:"kind"`
}

// SnapshotReply describes a snapshot taken.
type SnapshotReply struct {
	Path       string  `json:"path"`
	Kind       string  `json:"kind"`
	PauseMS    float64 `json:"pause_ms"`
	TotalMS    float64 `json:"total_ms"`
	Pages      uint64  `json:"pages"`
	LayerBytes int64   `json:"layer_bytes"`
	StateBytes int64   `json:"state_bytes"`
	Layer      string  `json:"layer"`
	// Disks are the writable disks: the layer the snapshot records for
	// each (frozen at its instant, or merged), the layer's chain, and the
	// live top the VM writes to now. Never null (absent from a VMM from
	// before snapshots held disks).
	Disks []cow.DiskFiles `json:"disks"`
	// Line is the one-line summary `warren snapshot` prints.
	Line string `json:"line"`
}

// RollbackRequest is the body of POST /v1/rollback.
type RollbackRequest struct {
	Path string `json:"path"`
}

// RollbackReply describes a rollback done.
type RollbackReply struct {
	Path    string  `json:"path"`
	PauseMS float64 `json:"pause_ms"`
	TotalMS float64 `json:"total_ms"`
	LoadMS  float64 `json:"load_ms"`
	Written uint64  `json:"pages_written"`
	Cleared uint64  `json:"pages_cleared"`
	// Disks are the writable disks' new live tops (over the snapshot's
	// layers) and their chains. Never null.
	Disks []cow.DiskFiles `json:"disks"`
	// Line is the one-line summary `warren rollback` prints.
	Line string `json:"line"`
}

// DisksReply is the answer of GET /v1/disks.
type DisksReply struct {
	// Disks are the writable disks' live tops and chains. Never null.
	Disks []cow.DiskFiles `json:"disks"`
}

// PauseReply is the body of the pause and resume answers.
type PauseReply struct {
	Paused bool `json:"paused"`
}

// ErrorReply is the body of an error answer.
type ErrorReply struct {
	Error string `json:"error"`
}

// MaxForkChildren bounds one fork request.
const MaxForkChildren = 256

// ForkRequest is the body of POST /v1/fork.
type ForkRequest struct {
	// N is the number of children (1 to MaxForkChildren).
	N int `json:"n"`
	// Prefix is where the children's sockets and files go: PREFIX-K.*.
	// It must be an absolute path; "" means beside the parent's API
	// socket, named after it.
	Prefix string `json:"prefix,omitempty"`
	// NetNS starts each child in a network namespace of its own, where
	// its tap is created (only with a tap): children can then reuse the
	// parent's guest IP addresses without meeting on the host.
	NetNS bool `json:"netns,omitempty"`
	// Egress, when set, is the children's egress policy, which must
	// narrow the parent's (policy.Narrows); by default they inherit the
	// parent's policy in force. Only for a parent with an egress policy.
	Egress *policy.Policy `json:"egress,omitempty"`
	// DiskDirs, when set, are the directories of the children's disk
	// overlays, one per child, absolute and existing: each child's own
	// (the daemon's sandbox directories), so that the layers a child's
	// snapshots make are its own and the parent's stay foreign to it. By
	// default they go beside the parent's disks.
	DiskDirs []string `json:"disk_dirs,omitempty"`
	// Prefixes, when set, are the children's own path prefixes, one
	// each, absolute, instead of PREFIX-K: child K's files are
	// Prefixes[K].{api,vsock,console,log,...}, in a directory that is its
	// own (the daemon's, for a child that runs as its own uid).
	Prefixes []string `json:"prefixes,omitempty"`
	// Secrets, when set, are the children's own secrets files, one each
	// (for a parent with egress: what each one's credential proxy reads,
	// written by the daemon for a child's uid), instead of the parent's.
	Secrets []string `json:"secrets,omitempty"`
	// Grants, one per child, are warren-hostd's signed grants
	// (vmmproc/jail.Grant: the child's uid and cgroup) under which the
	// VMM's jail-init starts the children, when it does (a VMM told so
	// by vmmproc/jail.SpawnEnv takes no fork without them, any other VMM
	// none with them). The VMM passes them on unread.
	Grants []string `json:"grants,omitempty"`
}

// ForkChild describes one child started.
type ForkChild struct {
	Index int    `json:"index"`
	PID   int    `json:"pid"`
	API   string `json:"api"`
	Vsock string `json:"vsock,omitempty"`
	CID   uint64 `json:"cid,omitempty"`
	Tap   string `json:"tap,omitempty"`
	// NetNS is the child's network namespace (/proc/PID/ns/net) when
	// it has one of its own made by the fork.
	NetNS string `json:"netns,omitempty"`
	MAC   string `json:"mac,omitempty"`
	// Audit is the child's egress audit log, when it has egress.
	Audit     string `json:"audit,omitempty"`
	Hostname  string `json:"hostname"`
	MachineID string `json:"machine_id"`
	Console   string `json:"console"`
	Log       string `json:"log"`
	// ReadyMS is the time from the end of the parent's pause to the
	// child's first KVM_RUN.
	ReadyMS float64 `json:"ready_ms"`
	// Disks are the child's writable disks: its own overlay (Top) over
	// the parent's layer frozen by the fork, and that layer's chain.
	Disks []cow.DiskFiles `json:"disks"`
}

// ForkReply describes a fork done.
type ForkReply struct {
	PauseMS  float64     `json:"pause_ms"`
	TotalMS  float64     `json:"total_ms"`
	Layers   int         `json:"memory_layers"`
	Children []ForkChild `json:"children"`
	// Disks are the parent's writable disks after the fork: its new live
	// tops over the layers the fork froze.
	Disks []cow.DiskFiles `json:"disks"`
}

// EgressReply is the answer of GET and PUT /v1/egress: the policy in
// force, the filter's, resolver's and proxy's counters (vmmproc/egress
// Stats) and the path of the audit log.
type EgressReply struct {
	Policy json.RawMessage `json:"policy"`
	Stats  json.RawMessage `json:"stats"`
	Audit  string          `json:"audit"`
}

// MaxReply bounds an answer the Client reads.
const MaxReply = 8 << 20

// Client calls the control API on the unix socket Socket.
type Client struct{ Socket string }

// Error is a refusal: the answer's status and its message.
type Error struct {
	Status  int
	Message string
}

func (e *Error) Error() string { return e.Message }

// Do sends body (JSON, or nil) with method to /v1/VERB and decodes the
// answer into resp (nil: ignored). A refusal is an *Error; a failure to
// reach the socket wraps the dial error.
func (c Client) Do(ctx context.Context, method, verb string, body []byte, resp any) error {
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", c.Socket)
		},
	}}
	defer hc.CloseIdleConnections()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	hr, err := http.NewRequestWithContext(ctx, method, "http://vmm/v1/"+verb, rd)
	if err != nil {
		return err
	}
	if body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	res, err := hc.Do(hr)
	if err != nil {
		return fmt.Errorf("VM control API %s: %w", c.Socket, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, MaxReply+1))
	if err != nil {
		return fmt.Errorf("VM control API %s: %w", c.Socket, err)
	}
	if len(b) > MaxReply {
		return fmt.Errorf("VM control API %s: an answer of more than %d bytes", c.Socket, MaxReply)
	}
	if res.StatusCode != http.StatusOK {
		var e ErrorReply
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			return &Error{Status: res.StatusCode, Message: e.Error}
		}
		return &Error{Status: res.StatusCode, Message: fmt.Sprintf("%s: %s", res.Status, bytes.TrimSpace(b))}
	}
	if resp == nil {
		return nil
	}
	return json.Unmarshal(b, resp)
}

// Call POSTs req, JSON-encoded, to /v1/VERB and decodes the answer into resp.
func (c Client) Call(ctx context.Context, verb string, req, resp any) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	return c.Do(ctx, http.MethodPost, verb, b, resp)
}

// Pause pauses the VM's vCPUs.
func (c Client) Pause(ctx context.Context) error {
	return c.Call(ctx, "pause", struct{}{}, nil)
}

// Resume resumes them.
func (c Client) Resume(ctx context.Context) error {
	return c.Call(ctx, "resume", struct{}{}, nil)
}

// Snapshot takes a snapshot.
func (c Client) Snapshot(ctx context.Context, req SnapshotRequest) (*SnapshotReply, error) {
	var r SnapshotReply
	if err := c.Call(ctx, "snapshot", req, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Rollback puts the running VM back to the snapshot at path.
func (c Client) Rollback(ctx context.Context, path string) (*RollbackReply, error) {
	var r RollbackReply
	if err := c.Call(ctx, "rollback", RollbackRequest{Path: path}, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Fork forks the VM.
func (c Client) Fork(ctx context.Context, req ForkRequest) (*ForkReply, error) {
	var r ForkReply
	if err := c.Call(ctx, "fork", req, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Disks answers the writable disks' live tops and chains.
func (c Client) Disks(ctx context.Context) (*DisksReply, error) {
	var r DisksReply
	if err := c.Do(ctx, http.MethodGet, "disks", nil, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// Egress answers the egress policy in force and the counters.
func (c Client) Egress(ctx context.Context) (*EgressReply, error) {
	var r EgressReply
	if err := c.Do(ctx, http.MethodGet, "egress", nil, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// SetEgress puts the policy pol (JSON) in force and answers as Egress.
func (c Client) SetEgress(ctx context.Context, pol []byte) (*EgressReply, error) {
	if !json.Valid(pol) {
		return nil, errors.New("egress: the policy is not JSON")
	}
	var r EgressReply
	if err := c.Do(ctx, http.MethodPut, "egress", pol, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// SetEgressFile is SetEgress with the policy of the file path, once it
// parses as a policy with wildcard credential hosts allowed (the VM
// checks it with its operator's allowances).
func (c Client) SetEgressFile(ctx context.Context, path string) (*EgressReply, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if _, err := policy.ParseWith(b, policy.Options{WildcardCredentials: true}); err != nil {
		return nil, err
	}
	return c.SetEgress(ctx, b)
}
