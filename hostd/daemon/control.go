package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/warrenvm/warren/cow"
	"github.com/warrenvm/warren/hostd/store"
)

// The VMM's control API (`warren run|restore --api PATH`, see
// cmd/warren/cli/api.go), as the daemon uses it.

type vmmSnapshotReply struct {
	Path       string  `json:"path"`
	Kind       string  `json:"kind"`
	PauseMS    float64 `json:"pause_ms"`
	TotalMS    float64 `json:"total_ms"`
	LayerBytes int64   `json:"layer_bytes"`
	// Disks name each writable disk's layer in the snapshot, its chain
	// and the VMM's new live top (absent from a VMM from before
	// snapshots held disks).
	Disks []cow.DiskFiles `json:"disks"`
}

// vmmDisksReply is the answer of GET /v1/disks, and the part of the
// rollback answer the daemon reads.
type vmmDisksReply struct {
	Disks []cow.DiskFiles `json:"disks"`
}

// snapshotDisks turns a snapshot answer's disks into the record's.
func snapshotDisks(ds []cow.DiskFiles) []store.DiskLayer {
	var out []store.DiskLayer
	for _, d := range ds {
		out = append(out, store.DiskLayer{Index: d.Index, Layer: d.Layer, Chain: d.Chain})
	}
	return out
}

// liveDisks turns an answer's disks into the live tops the record keeps.
func liveDisks(ds []cow.DiskFiles) []store.LiveDisk {
	var out []store.LiveDisk
	for _, d := range ds {
		out = append(out, store.LiveDisk{Index: d.Index, Top: d.Top, Chain: d.Chain})
	}
	return out
}

type vmmForkChild struct {
	Index   int    `json:"index"`
	PID     int    `json:"pid"`
	API     string `json:"api"`
	Vsock   string `json:"vsock"`
	CID     uint64 `json:"cid"`
	Console string `json:"console"`
	Log     string `json:"log"`
	// Hostname is the child's new guest hostname.
	Hostname string `json:"hostname"`
	// Disks are the child's writable disks: its overlays and their chains.
	Disks []cow.DiskFiles `json:"disks"`
}

type vmmForkReply struct {
	PauseMS  float64        `json:"pause_ms"`
	TotalMS  float64        `json:"total_ms"`
	Children []vmmForkChild `json:"children"`
	// Disks are the parent's writable disks after the fork.
	Disks []cow.DiskFiles `json:"disks"`
}

// vmmCall sends body (JSON-encoded, nil for none) with method to
// /v1/VERB on the control socket sock and decodes the answer into resp.
func vmmCall(ctx context.Context, sock, method, verb string, req, resp any) error {
	var body io.Reader
	if req != nil {
		b, err := json.Marshal(req)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	defer c.CloseIdleConnections()
	hr, err := http.NewRequestWithContext(ctx, method, "http://vmm/v1/"+verb, body)
	if err != nil {
		return err
	}
	if body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	res, err := c.Do(hr)
	if err != nil {
		return fmt.Errorf("VMM control API: %w", err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 8<<20))
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			if res.StatusCode == http.StatusConflict {
				// The VM refuses in its current state (e.g. a rollback to
				// a snapshot without disk state): the caller's conflict too.
				return errf(http.StatusConflict, "VMM: %s", e.Error)
			}
			return fmt.Errorf("VMM: %s", e.Error)
		}
		return fmt.Errorf("VMM: %s: %s", res.Status, bytes.TrimSpace(b))
	}
	if resp == nil {
		return nil
	}
	return json.Unmarshal(b, resp)
}

// vmmAnswers reports whether the control API at sock answers HTTP at all.
func vmmAnswers(sock string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err := vmmCall(ctx, sock, http.MethodGet, "egress", nil, nil)
	if err == nil {
		return nil
	}
	// Any HTTP answer (an error reply for a VM without egress) will do.
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) || isConnErr(err) {
		return err
	}
	return nil
}

func isConnErr(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe)
}
