package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// tenantHeader names the tenant on warren-hostd's unix socket.
const tenantHeader = "X-Warren-Tenant"

// api is a client of warren-hostd's API on its unix socket, as one tenant.
type api struct {
	hc     *http.Client
	tenant string
}

func newAPI(sock, tenant string) *api {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
		MaxIdleConns:        64,
		MaxIdleConnsPerHost: 64,
	}
	return &api{hc: &http.Client{Transport: tr}, tenant: tenant}
}

func (a *api) close() { a.hc.CloseIdleConnections() }

// do sends a request; body, when not nil, is sent as JSON.
func (a *api) do(ctx context.Context, method, path string, body any, accept string) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://hostd"+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set(tenantHeader, a.tenant)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	return a.hc.Do(req)
}

// call sends a request and decodes a JSON answer of status want into out
// (when not nil); another status is an error carrying the answer.
func (a *api) call(ctx context.Context, method, path string, body any, want int, out any) error {
	res, err := a.do(ctx, method, path, body, "")
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 4<<20))
	if err != nil {
		return err
	}
	if res.StatusCode != want {
		return fmt.Errorf("%s %s: %s: %s", method, path, res.Status, bytes.TrimSpace(b))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// health waits for the daemon to answer GET /v1/health.
func (a *api) health(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, cancel := context.WithTimeout(ctx, time.Second)
		err := a.call(c, http.MethodGet, "/v1/health", nil, http.StatusOK, nil)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("warren-hostd did not answer in %s: %w", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// templateRequest is POST /v1/templates's body (hostd/openapi.yaml).
type templateRequest struct {
	Kernel    string `json:"kernel"`
	Initramfs string `json:"initramfs,omitempty"`
	MemMiB    int    `json:"mem_mib,omitempty"`
	CPUs      int    `json:"cpus,omitempty"`
	Cmdline   string `json:"cmdline,omitempty"`
}

// template is the part of a Template used.
type template struct {
	ID      string  `json:"id"`
	Status  string  `json:"status"`
	BuildMS float64 `json:"build_ms"`
}

// progressLine is one line of a long operation's NDJSON answer.
type progressLine struct {
	Progress string          `json:"progress"`
	Pct      int             `json:"pct"`
	Result   json.RawMessage `json:"result"`
	Error    string          `json:"error"`
	Status   int             `json:"status"`
}

// buildTemplate builds a template with progress streamed (NDJSON), each
// line printed to log as it comes.
func (a *api) buildTemplate(ctx context.Context, req templateRequest, log io.Writer) (template, error) {
	var t template
	res, err := a.do(ctx, http.MethodPost, "/v1/templates", req, "application/x-ndjson")
	if err != nil {
		return t, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		return t, fmt.Errorf("POST /v1/templates: %s: %s", res.Status, bytes.TrimSpace(b))
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		fmt.Fprintf(log, "  template: %s\n", line)
		var p progressLine
		if err := json.Unmarshal(line, &p); err != nil {
			return t, fmt.Errorf("template progress line %q: %w", line, err)
		}
		switch {
		case p.Error != "":
			return t, fmt.Errorf("template build failed (%d): %s", p.Status, p.Error)
		case p.Result != nil:
			if err := json.Unmarshal(p.Result, &t); err != nil {
				return t, err
			}
			return t, nil
		}
	}
	if err := sc.Err(); err != nil {
		return t, err
	}
	return t, errors.New("template build: the stream ended without a result")
}

// sandbox is the part of a Sandbox used.
type sandbox struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	PID    int    `json:"pid"`
}

// create creates a sandbox from template tpl (answered once its guest
// agent answers) and returns its id and the time from sending the request
// to having the 201 answer.
func (a *api) create(ctx context.Context, tpl string) (sandbox, time.Duration, error) {
	var sb sandbox
	start := time.Now()
	err := a.call(ctx, http.MethodPost, "/v1/sandboxes", map[string]string{"template": tpl}, http.StatusCreated, &sb)
	d := time.Since(start)
	if err != nil {
		return sandbox{}, d, err
	}
	if sb.ID == "" || sb.Status != "running" {
		return sb, d, fmt.Errorf("created sandbox %q is %q, not running", sb.ID, sb.Status)
	}
	return sb, d, nil
}

func (a *api) deleteSandbox(ctx context.Context, id string) error {
	return a.call(ctx, http.MethodDelete, "/v1/sandboxes/"+id, nil, http.StatusOK, nil)
}

func (a *api) deleteTemplate(ctx context.Context, id string) error {
	return a.call(ctx, http.MethodDelete, "/v1/templates/"+id, nil, http.StatusOK, nil)
}

func (a *api) sandboxes(ctx context.Context) ([]sandbox, error) {
	var l []sandbox
	return l, a.call(ctx, http.MethodGet, "/v1/sandboxes", nil, http.StatusOK, &l)
}

// oneLine shortens an error message for a progress line.
func oneLine(err error) string {
	s := strings.ReplaceAll(err.Error(), "\n", " ")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}
