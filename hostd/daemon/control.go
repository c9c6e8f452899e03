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
)

// The VMM's control API (`warren run|restore --api PATH`, see
// cmd/warren/cli/api.go), as the daemon uses it.

type vmmSnapshotReply struct {
	Path       string  `json:"path"`
	Kind       string  `json:"kind"`
	PauseMS    float64 `json:"pause_ms"`
	TotalMS    float64 `json:"total_ms"`
	LayerBytes int64   `json:"layer_bytes"`
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
}

type vmmForkReply struct {
	PauseMS  float64        `json:"pause_ms"`
	TotalMS  float64        `json:"total_ms"`
	Children []vmmForkChild `json:"children"`
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
