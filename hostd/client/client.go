// Package client is a Go client for warren-hostd's API (hostd/openapi.yaml):
// over the daemon's unix socket (the tenant in the X-Warren-Tenant header)
// or over TCP with a bearer token. Long operations stream their progress
// (NDJSON) to a callback; exec streams the process's output as it comes.
// EnvConfig (config.go) is the connection settings of the environment
// ($WARREN_HOST, ...); copy.go and input.go are what a client does on
// the host's side of a request: copying files (warren cp), reading
// policy files, labels and secret values.
package client

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/vmmctl"
)

// DefaultSocket is the daemon's default unix socket.
const DefaultSocket = "/run/warren/hostd.sock"

// TenantHeader names the tenant of a request.
const TenantHeader = "X-Warren-Tenant"

// The API's records.
type (
	Template = store.Template
	Sandbox  = store.Sandbox
	Snapshot = store.Snapshot
	Rolling  = store.Rolling
	Image    = store.Image
)

// ExecStatus is how an exec ended.
type ExecStatus struct {
	Exit     int    `json:"exit"`
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
}

// ProgressFunc receives a long operation's steps as they come.
type ProgressFunc func(wire.Progress)

// Error is an error answer of the daemon.
type Error struct {
	Status  int
	Message string
	// Code is the guest agent's error code, when the error came from it
	// (agentwire.Code*).
	Code string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s (%d %s)", e.Message, e.Status, http.StatusText(e.Status))
}

// IsNotFound reports whether err is the daemon's 404.
func IsNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusNotFound
}

// Client talks to one daemon as one tenant.
type Client struct {
	base   string // http://hostd or http://host:port
	tenant string
	token  string
	hc     *http.Client
}

// New returns a client for host: a unix socket path (with or without a
// unix:// prefix; "" is DefaultSocket) or an http:// or https:// URL,
// which needs token. tenant "" is "default" (on TCP the token's tenant
// rules; the header is then sent only when tenant is set). An https://
// daemon's certificate is checked against the system's roots; NewTLS
// takes the operator's CA and a client certificate.
func New(host, tenant, token string) (*Client, error) {
	return NewTLS(host, tenant, token, TLS{})
}

// TLS is how a client reaches an https:// daemon (warren-hostd
// --tls-cert): the PEM files of the roots its certificate must chain to
// (CAFile; "" for the system's) and, for a daemon that asks for one
// (--client-ca), the client's certificate and key.
type TLS struct {
	CAFile, CertFile, KeyFile string
}

// Config returns the tls.Config t describes.
func (t TLS) Config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		b, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("CA file %s: no PEM certificates", t.CAFile)
		}
		cfg.RootCAs = pool
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, errors.New("a client certificate needs both its certificate and its key")
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// NewTLS is New with t for an https:// host (t must be empty for another).
func NewTLS(host, tenant, token string, t TLS) (*Client, error) {
	if host == "" {
		host = DefaultSocket
	}
	c := &Client{tenant: tenant, token: token}
	if t != (TLS{}) && !strings.HasPrefix(host, "https://") {
		return nil, fmt.Errorf("a CA file or client certificate needs an https:// daemon address, not %q", host)
	}
	if strings.HasPrefix(host, "http://") || strings.HasPrefix(host, "https://") {
		u, err := url.Parse(host)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("bad daemon address %q", host)
		}
		c.base = strings.TrimRight(u.String(), "/")
		tr := http.DefaultTransport.(*http.Transport).Clone()
		if u.Scheme == "https" {
			cfg, err := t.Config()
			if err != nil {
				return nil, err
			}
			tr.TLSClientConfig = cfg
		}
		c.hc = &http.Client{Transport: tr}
		return c, nil
	}
	sock := strings.TrimPrefix(host, "unix://")
	if c.tenant == "" {
		c.tenant = "default"
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		MaxIdleConns: 4,
	}
	c.base = "http://hostd"
	c.hc = &http.Client{Transport: tr}
	return c, nil
}

// Tenant is the tenant the client names ("" on TCP without one: the token's).
func (c *Client) Tenant() string { return c.tenant }

func (c *Client) newRequest(ctx context.Context, method, path string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	if c.tenant != "" {
		req.Header.Set(TenantHeader, c.tenant)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	return req, nil
}

func jsonBody(v any) (io.Reader, error) {
	if v == nil {
		return nil, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return bytes.NewReader(b), nil
}

// do sends a request and returns the answer, or the daemon's error.
func (c *Client) do(ctx context.Context, method, path string, body any, accept string) (*http.Response, error) {
	r, err := jsonBody(body)
	if err != nil {
		return nil, err
	}
	req, err := c.newRequest(ctx, method, path, r)
	if err != nil {
		return nil, err
	}
	if r != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	return c.roundTrip(req)
}

// roundTrip sends req and returns the answer, or the daemon's error (the
// body then closed).
func (c *Client) roundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("warren-hostd: %w", err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, readError(resp)
	}
	return resp, nil
}

func readError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e wire.Error
	if json.Unmarshal(b, &e) != nil || e.Error == "" {
		e.Error = strings.TrimSpace(string(b))
		if e.Error == "" {
			e.Error = http.StatusText(resp.StatusCode)
		}
	}
	return &Error{Status: resp.StatusCode, Message: e.Error, Code: e.Code}
}

// send sends body (of type contentType, not JSON: an upload) and returns
// the answer, or the daemon's error; the caller closes the answer's body.
func (c *Client) send(ctx context.Context, method, path, contentType string, body io.Reader) (*http.Response, error) {
	req, err := c.newRequest(ctx, method, path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", contentType)
	return c.roundTrip(req)
}

// call sends a request and decodes its JSON answer into out (if not nil).
func (c *Client) call(ctx context.Context, method, path string, body, out any) error {
	resp, err := c.do(ctx, method, path, body, "")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("warren-hostd: bad answer to %s %s: %w", method, path, err)
	}
	return nil
}

// long runs a long operation, streaming its progress to fn, and decodes
// its result into out.
func (c *Client) long(ctx context.Context, method, path string, body, out any, fn ProgressFunc) error {
	resp, err := c.do(ctx, method, path, body, "application/x-ndjson")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if !strings.Contains(resp.Header.Get("Content-Type"), "ndjson") {
		// A daemon that answered without streaming.
		return json.NewDecoder(resp.Body).Decode(out)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var l wire.ProgressLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("warren-hostd: bad progress line %q: %w", sc.Text(), err)
		}
		switch {
		case l.Error != "":
			st := l.Status
			if st == 0 {
				st = 500
			}
			return &Error{Status: st, Message: l.Error}
		case l.Result != nil:
			if out == nil {
				return nil
			}
			if err := json.Unmarshal(l.Result, out); err != nil {
				return fmt.Errorf("warren-hostd: bad result: %w", err)
			}
			return nil
		case l.Progress != nil:
			if fn != nil {
				fn(wire.Progress{Step: *l.Progress, Pct: l.Pct})
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("warren-hostd: %s %s: %w", method, path, err)
	}
	return fmt.Errorf("warren-hostd: %s %s: the stream ended without a result", method, path)
}

// callFor is call with the answer decoded into a new T.
func callFor[T any](ctx context.Context, c *Client, method, path string, body any) (*T, error) {
	var v T
	if err := c.call(ctx, method, path, body, &v); err != nil {
		return nil, err
	}
	return &v, nil
}

// listFor is a GET of path answered by a list of T.
func listFor[T any](ctx context.Context, c *Client, path string) ([]T, error) {
	var l []T
	err := c.call(ctx, http.MethodGet, path, nil, &l)
	return l, err
}

// longFor is long with the result decoded into a new T.
func longFor[T any](ctx context.Context, c *Client, method, path string, body any, fn ProgressFunc) (*T, error) {
	var v T
	if err := c.long(ctx, method, path, body, &v, fn); err != nil {
		return nil, err
	}
	return &v, nil
}

func sbPath(id string, rest ...string) string {
	return "/v1/sandboxes/" + url.PathEscape(id) + strings.Join(rest, "")
}

// Health checks that the daemon answers, and returns the tenant it sees.
func (c *Client) Health(ctx context.Context) (tenant string, err error) {
	var h wire.Health
	err = c.call(ctx, http.MethodGet, "/v1/health", nil, &h)
	return h.Tenant, err
}

// CreateTemplate builds a template: boot, wait for the agent, snapshot.
// req's kernel, initramfs and disks are names of files in the daemon's
// guest directory (warren-hostd --guest-dir), never host paths: the
// daemon answers a path with a 400 (wire.TemplateRequest).
func (c *Client) CreateTemplate(ctx context.Context, req wire.TemplateRequest, fn ProgressFunc) (*Template, error) {
	return longFor[Template](ctx, c, http.MethodPost, "/v1/templates", req, fn)
}

// Templates lists the tenant's templates.
func (c *Client) Templates(ctx context.Context) ([]Template, error) {
	return listFor[Template](ctx, c, "/v1/templates")
}

// Template returns one template.
func (c *Client) Template(ctx context.Context, id string) (*Template, error) {
	return callFor[Template](ctx, c, http.MethodGet, "/v1/templates/"+url.PathEscape(id), nil)
}

// ReadyTemplates returns the ids of the tenant's ready templates (a
// sandbox request that names none gets the only one).
func (c *Client) ReadyTemplates(ctx context.Context) ([]string, error) {
	l, err := c.Templates(ctx)
	var ready []string
	for _, t := range l {
		if t.Status == "ready" {
			ready = append(ready, t.ID)
		}
	}
	return ready, err
}

// DeleteTemplate deletes a template no sandbox uses.
func (c *Client) DeleteTemplate(ctx context.Context, id string) error {
	return c.call(ctx, http.MethodDelete, "/v1/templates/"+url.PathEscape(id), nil, nil)
}

// UploadImage uploads an image, as a docker-archive tar read from r, for
// one template build: its answer's Ref goes into TemplateRequest.Image.
// (warren templates create --image oci-layout:DIR, docker-archive:FILE
// and --rootfs do this: the daemon never reads a host path a client
// names.)
//
// ref, when set, says where the image came from, for people (it becomes the
// base's recorded reference).
func (c *Client) UploadImage(ctx context.Context, r io.Reader, ref string) (*wire.ImageUpload, error) {
	path := "/v1/images"
	if ref != "" {
		path += "?ref=" + url.QueryEscape(ref)
	}
	resp, err := c.send(ctx, http.MethodPost, path, "application/x-tar", r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var u wire.ImageUpload
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&u); err != nil {
		return nil, fmt.Errorf("warren-hostd: bad answer to POST /v1/images: %w", err)
	}
	return &u, nil
}

// Images lists the tenant's image bases.
func (c *Client) Images(ctx context.Context) ([]Image, error) {
	var l wire.ImageList
	err := c.call(ctx, http.MethodGet, "/v1/images", nil, &l)
	return l.Images, err
}

// DeleteImage deletes an image base (by its key) no template uses.
func (c *Client) DeleteImage(ctx context.Context, key string) error {
	return c.call(ctx, http.MethodDelete, "/v1/images/"+url.PathEscape(key), nil, nil)
}

// Create creates a sandbox from a template.
func (c *Client) Create(ctx context.Context, req wire.SandboxRequest, fn ProgressFunc) (*Sandbox, error) {
	return longFor[Sandbox](ctx, c, http.MethodPost, "/v1/sandboxes", req, fn)
}

// Sandboxes lists the tenant's sandboxes, oldest first.
func (c *Client) Sandboxes(ctx context.Context) ([]Sandbox, error) {
	return listFor[Sandbox](ctx, c, "/v1/sandboxes")
}

// Sandbox returns one sandbox.
func (c *Client) Sandbox(ctx context.Context, id string) (*Sandbox, error) {
	return callFor[Sandbox](ctx, c, http.MethodGet, sbPath(id), nil)
}

// Delete stops a sandbox's VMM and deletes everything of it.
func (c *Client) Delete(ctx context.Context, id string) error {
	return c.call(ctx, http.MethodDelete, sbPath(id), nil, nil)
}

// Pause pauses a sandbox in memory, or with toDisk snapshots it and stops
// its VMM (long).
func (c *Client) Pause(ctx context.Context, id string, toDisk bool, fn ProgressFunc) (*Sandbox, error) {
	if toDisk {
		return longFor[Sandbox](ctx, c, http.MethodPost, sbPath(id, "/pause?to_disk=true"), nil, fn)
	}
	return callFor[Sandbox](ctx, c, http.MethodPost, sbPath(id, "/pause"), nil)
}

// Resume resumes a paused sandbox, or restores a suspended or stopped one
// from its latest snapshot (long).
func (c *Client) Resume(ctx context.Context, id string, fn ProgressFunc) (*Sandbox, error) {
	return longFor[Sandbox](ctx, c, http.MethodPost, sbPath(id, "/resume"), nil, fn)
}

// Snapshot takes a snapshot now.
func (c *Client) Snapshot(ctx context.Context, id string, req wire.SnapshotRequest) (*Snapshot, error) {
	return callFor[Snapshot](ctx, c, http.MethodPost, sbPath(id, "/snapshots"), req)
}

// SetRolling starts rolling snapshots every every (keeping keep layers a
// chain), or with every 0 stops them; it returns the setting now (nil: off).
func (c *Client) SetRolling(ctx context.Context, id string, every time.Duration, keep int) (*Rolling, error) {
	req := wire.SnapshotRequest{Every: "0", Keep: keep}
	if every > 0 {
		req.Every = every.String()
	}
	var out wire.RollingReply
	if err := c.call(ctx, http.MethodPost, sbPath(id, "/snapshots"), req, &out); err != nil {
		return nil, err
	}
	return out.Rolling, nil
}

// Snapshots lists a sandbox's snapshots, oldest first, and its rolling setting.
func (c *Client) Snapshots(ctx context.Context, id string) ([]Snapshot, *Rolling, error) {
	var out wire.SnapshotList
	err := c.call(ctx, http.MethodGet, sbPath(id, "/snapshots"), nil, &out)
	return out.Snapshots, out.Rolling, err
}

// Rollback puts a running sandbox back to one of its snapshots, in place;
// it returns the daemon's report.
func (c *Client) Rollback(ctx context.Context, id, snapshot string) (*wire.RollbackReply, error) {
	return callFor[wire.RollbackReply](ctx, c, http.MethodPost, sbPath(id, "/rollback"), wire.RollbackRequest{Snapshot: snapshot})
}

// Fork forks a running sandbox into n new ones.
func (c *Client) Fork(ctx context.Context, id string, n int, fn ProgressFunc) (*wire.ForkResult, error) {
	return longFor[wire.ForkResult](ctx, c, http.MethodPost, sbPath(id, "/fork"), wire.ForkRequest{N: n}, fn)
}

// Exec runs a command in a sandbox, writing its output to stdout and
// stderr as it comes. Cancelling ctx kills the process in the guest.
func (c *Client) Exec(ctx context.Context, id string, req wire.ExecRequest, stdout, stderr io.Writer) (*ExecStatus, error) {
	resp, err := c.do(ctx, http.MethodPost, sbPath(id, "/exec"), req, "application/x-ndjson")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var f wire.ExecFrame
		if err := dec.Decode(&f); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("exec in %s: the stream ended early: %w", id, err)
		}
		switch {
		case f.Error != "":
			return nil, &Error{Status: http.StatusBadGateway, Message: f.Error}
		case f.Exit != nil:
			return &ExecStatus{Exit: *f.Exit, Signal: f.Signal, TimedOut: f.TimedOut}, nil
		}
		if len(f.Stdout) > 0 && stdout != nil {
			if _, err := stdout.Write(f.Stdout); err != nil {
				return nil, err
			}
		}
		if len(f.Stderr) > 0 && stderr != nil {
			if _, err := stderr.Write(f.Stderr); err != nil {
				return nil, err
			}
		}
	}
}

// ReadFile copies a guest file to w and returns its permission bits.
func (c *Client) ReadFile(ctx context.Context, id, path string, w io.Writer) (fs.FileMode, error) {
	resp, err := c.do(ctx, http.MethodGet, sbPath(id, "/files?path="+url.QueryEscape(path)), nil, "")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	mode, _ := strconv.ParseUint(resp.Header.Get("X-Warren-Mode"), 8, 32)
	if _, err := io.Copy(w, resp.Body); err != nil {
		return 0, fmt.Errorf("read %s:%s: %w", id, path, err)
	}
	return fs.FileMode(mode), nil
}

// WriteFile writes (replaces) a guest file with r's bytes and mode's
// permission bits.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, mode fs.FileMode) (*wire.FileInfo, error) {
	q := "/files?path=" + url.QueryEscape(path) + "&mode=" + strconv.FormatUint(uint64(mode.Perm()), 8)
	resp, err := c.send(ctx, http.MethodPut, sbPath(id, q), "application/octet-stream", r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var fi wire.FileInfo
	if err := json.NewDecoder(resp.Body).Decode(&fi); err != nil {
		return nil, fmt.Errorf("warren-hostd: bad answer to file upload: %w", err)
	}
	return &fi, nil
}

// Egress returns a network sandbox's egress policy in force and its
// counters, as its VMM reports them.
func (c *Client) Egress(ctx context.Context, id string) (*wire.EgressReply, error) {
	return callFor[wire.EgressReply](ctx, c, http.MethodGet, sbPath(id, "/egress"), nil)
}

// SetEgress replaces a network sandbox's egress policy (JSON) live; it
// stays in force across the sandbox's later restores.
func (c *Client) SetEgress(ctx context.Context, id string, policy json.RawMessage) (*wire.EgressReply, error) {
	return callFor[wire.EgressReply](ctx, c, http.MethodPut, sbPath(id, "/egress"), policy)
}

// Balloon returns the memory balloon of a sandbox whose template was
// built with a balloon: its target, what the guest's driver holds, the
// guest's latest memory statistics and the device's counters, as its VMM
// reports them.
func (c *Client) Balloon(ctx context.Context, id string) (*vmmctl.BalloonReply, error) {
	return callFor[vmmctl.BalloonReply](ctx, c, http.MethodGet, sbPath(id, "/balloon"), nil)
}

// SetBalloon changes a running sandbox's balloon as req says (its target,
// at most the guest's memory, is recorded on the sandbox) and returns it
// as Balloon does.
func (c *Client) SetBalloon(ctx context.Context, id string, req vmmctl.BalloonRequest) (*vmmctl.BalloonReply, error) {
	return callFor[vmmctl.BalloonReply](ctx, c, http.MethodPut, sbPath(id, "/balloon"), req)
}

// SetSecret creates or replaces the tenant's secret name with value's
// bytes (at most 64 KiB of UTF-8).
func (c *Client) SetSecret(ctx context.Context, name string, value io.Reader) error {
	resp, err := c.send(ctx, http.MethodPut, "/v1/secrets/"+url.PathEscape(name), "application/octet-stream", value)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return nil
}

// Secrets lists the names of the tenant's secrets, sorted (the daemon
// never returns a value).
func (c *Client) Secrets(ctx context.Context) ([]string, error) {
	var l wire.SecretList
	err := c.call(ctx, http.MethodGet, "/v1/secrets", nil, &l)
	return l.Names, err
}

// DeleteSecret deletes the tenant's secret name.
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	return c.call(ctx, http.MethodDelete, "/v1/secrets/"+url.PathEscape(name), nil, nil)
}

// Key returns the tenant's encryption key's ID, or that it is revoked
// (an *Error with status 404 when it has none, 501 when the daemon runs
// without --keys).
func (c *Client) Key(ctx context.Context) (wire.KeyInfo, error) {
	var k wire.KeyInfo
	err := c.call(ctx, http.MethodGet, "/v1/keys", nil, &k)
	return k, err
}

// CreateKey creates the tenant's encryption key: its snapshots and idle
// disks are sealed under it from now on.
func (c *Client) CreateKey(ctx context.Context) (wire.KeyInfo, error) {
	var k wire.KeyInfo
	err := c.call(ctx, http.MethodPost, "/v1/keys", nil, &k)
	return k, err
}

// RevokeKey revokes the tenant's key (crypto-shredding: its snapshots and
// disks can no longer be read) and stops its running sandboxes.
func (c *Client) RevokeKey(ctx context.Context) (wire.KeyInfo, error) {
	var k wire.KeyInfo
	err := c.call(ctx, http.MethodDelete, "/v1/keys", nil, &k)
	return k, err
}

// Events streams the tenant's lifecycle events to fn until ctx ends, fn
// returns false or the daemon ends the stream.
func (c *Client) Events(ctx context.Context, fn func(wire.Event) bool) error {
	resp, err := c.do(ctx, http.MethodGet, "/v1/events", nil, "application/x-ndjson")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var e wire.Event
		if err := dec.Decode(&e); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, io.EOF) {
				return nil // the daemon closed the stream (it stops)
			}
			return fmt.Errorf("events: %w", err)
		}
		if !fn(e) {
			return nil
		}
	}
}

// Resolve turns a sandbox reference into its id: an id, or the value of a
// sandbox's "name" label (which must name exactly one).
func (c *Client) Resolve(ctx context.Context, ref string) (string, error) {
	if store.ValidID(ref) {
		return ref, nil
	}
	l, err := c.Sandboxes(ctx)
	if err != nil {
		return "", err
	}
	var ids []string
	for _, s := range l {
		if s.ID == ref || s.Labels["name"] == ref {
			ids = append(ids, s.ID)
		}
	}
	switch len(ids) {
	case 0:
		return "", &Error{Status: http.StatusNotFound, Message: fmt.Sprintf("sandbox %q not found", ref)}
	case 1:
		return ids[0], nil
	}
	return "", fmt.Errorf("%q names %d sandboxes (%s): use an id", ref, len(ids), strings.Join(ids, ", "))
}
