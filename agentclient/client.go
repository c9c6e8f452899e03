package agentclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/warrenvm/warren/agentwire"
)

// DialFunc opens a connection to the agent (a vsock connection through the
// VMM, or a unix socket in tests).
type DialFunc func(ctx context.Context) (net.Conn, error)

// Client talks to one agent over connections from a DialFunc.
//
// The agent runs in the guest, and the guest is hostile: the client runs
// in the host daemon, outside any jail, on behalf of every tenant. So
// every reply it reads is bounded in size and, but for the streams a
// caller asked for (exec output, file contents), in time: a reply past
// its limit fails with an error wrapping ErrReplyTooLarge, a reply that
// does not end in time with one wrapping context.DeadlineExceeded, and
// neither grows the host's memory.
type Client struct {
	hc     *http.Client
	limits Limits
}

// Limits bound what a Client reads from the agent. Zero fields take the
// DefaultLimits' values.
type Limits struct {
	// Reply is the most bytes of one JSON list reply (a directory
	// listing, the services) the client reads before it gives up; a
	// reply of one record (health, stat, a service's status) is held to
	// 64 KiB or Reply, whichever is less, and an exec's status frames to
	// MaxFrame.
	Reply int64
	// File is the most bytes ReadFile copies from one guest file.
	File int64
	// ReplyTimeout bounds each call that answers with one JSON reply
	// (from the request until its reply is read in full) when the
	// caller's context has no earlier deadline; a guest that trickles or
	// never ends its reply cannot hold a daemon request forever.
	ReplyTimeout time.Duration
	// Header is the most bytes of a reply's header (http.Transport's
	// MaxResponseHeaderBytes).
	Header int64
}

// DefaultLimits are a Client's limits when none are given (New, NewDial):
// 4 MiB replies (a directory of some ten thousand entries), 64 GiB files,
// 2 minutes per JSON reply, 64 KiB headers.
var DefaultLimits = Limits{Reply: 4 << 20, File: 64 << 30, ReplyTimeout: 2 * time.Minute, Header: 64 << 10}

// ErrReplyTooLarge is wrapped by the error of a call whose reply, or a
// file ReadFile copies, exceeds the client's Limits.
var ErrReplyTooLarge = errors.New("agent: reply too large")

// ErrTimedOut is returned (wrapped) by Client.Exec when the agent killed
// the process at its timeout.
var ErrTimedOut = errors.New("agent: exec timed out")

// NewDial returns a client that reaches the agent through dial, with
// DefaultLimits.
func NewDial(dial DialFunc) *Client { return NewDialLimits(dial, Limits{}) }

// NewDialLimits is NewDial with limits (zero fields: DefaultLimits').
func NewDialLimits(dial DialFunc, limits Limits) *Client {
	if limits.Reply <= 0 {
		limits.Reply = DefaultLimits.Reply
	}
	if limits.File <= 0 {
		limits.File = DefaultLimits.File
	}
	if limits.ReplyTimeout <= 0 {
		limits.ReplyTimeout = DefaultLimits.ReplyTimeout
	}
	if limits.Header <= 0 {
		limits.Header = DefaultLimits.Header
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dial(ctx)
		},
		MaxIdleConnsPerHost:    16,
		DisableCompression:     true,
		MaxResponseHeaderBytes: limits.Header,
	}
	return &Client{hc: &http.Client{Transport: tr}, limits: limits}
}

// Limits returns c's limits.
func (c *Client) Limits() Limits { return c.limits }

// replyCtx bounds a call answered with one JSON reply by ReplyTimeout,
// unless ctx already ends sooner.
func (c *Client) replyCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= c.limits.ReplyTimeout {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.limits.ReplyTimeout)
}

// decodeReply decodes one JSON value from body into v, reading at most
// limit bytes: a longer reply (an endless value, or trailing bytes past
// the limit) is an error wrapping ErrReplyTooLarge. What is left unread
// is not read: the caller closes body, which drops the connection.
func decodeReply(body io.Reader, limit int64, v any) error {
	lr := &io.LimitedReader{R: body, N: limit + 1}
	dec := json.NewDecoder(lr)
	err := dec.Decode(v)
	if lr.N <= 0 {
		return fmt.Errorf("%w: more than %d bytes", ErrReplyTooLarge, limit)
	}
	if err != nil {
		return fmt.Errorf("agent: decode response: %w", err)
	}
	return nil
}

// Close closes idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// url builds a request URL; the host part is unused by the dialer.
func endpoint(path string, q url.Values) string {
	u := url.URL{Scheme: "http", Host: "agent", Path: path}
	if q != nil {
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// do sends a request and turns a non-2xx response into *Error.
func (c *Client) do(ctx context.Context, method, u string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

func decodeError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &agentwire.Error{Status: resp.StatusCode}
	if json.Unmarshal(b, e) != nil || e.Code == "" {
		e.Message, e.Code = fmt.Sprintf("unexpected response %q", bytes.TrimSpace(b)), agentwire.CodeInternal
	}
	return e
}

func (c *Client) getJSON(ctx context.Context, u string, limit int64, v any) error {
	return c.callJSON(ctx, http.MethodGet, u, nil, limit, v)
}

// maxSmallReply bounds the replies of one record (health, a FileInfo, a
// service's status): however many requests a tenant has in flight, each
// holds at most this much of what its guest sent.
const maxSmallReply = 64 << 10

// small is the limit of a one-record reply; the client's Limits.Reply is
// that of a list.
func (c *Client) small() int64 { return min(c.limits.Reply, maxSmallReply) }

// callJSON sends a request answered with one JSON reply (decoded into v,
// at most limit bytes, within the client's ReplyTimeout).
func (c *Client) callJSON(ctx context.Context, method, u string, body io.Reader, limit int64, v any) error {
	ctx, cancel := c.replyCtx(ctx)
	defer cancel()
	resp, err := c.do(ctx, method, u, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return decodeReply(resp.Body, limit, v)
}

// Exec runs req.Argv in the guest, copying its standard output and error
// to stdout and stderr as they arrive, and returns its exit code (128+n
// for a process killed by signal n). If req.Input is non-nil it is
// streamed to the process's standard input. When the agent killed the
// process at its timeout, the error wraps ErrTimedOut. Cancelling ctx
// disconnects, which makes the agent kill the process group. If
// req.OnStart is non-nil it is called with the process's pid (for Kill)
// before any output is copied.
func (c *Client) Exec(ctx context.Context, req agentwire.ExecRequest, stdout, stderr io.Writer) (exitCode int, err error) {
	st, err := c.ExecStatus(ctx, req, stdout, stderr)
	return st.Code, err
}

// ExecStatus is Exec returning the whole agentwire.ExitStatus, with the
// agent's own time for the request (AgentNs). On a failure before the
// process exited (no agentwire.FrameExit) its Code is -1.
func (c *Client) ExecStatus(ctx context.Context, req agentwire.ExecRequest, stdout, stderr io.Writer) (agentwire.ExitStatus, error) {
	fail := agentwire.ExitStatus{Code: -1}
	if req.Input != nil {
		req.Stdin = true
	}
	line, err := json.Marshal(req)
	if err != nil {
		return fail, err
	}
	line = append(line, '\n')
	var body io.Reader = bytes.NewReader(line)
	if req.Input != nil {
		body = io.MultiReader(body, req.Input)
	}
	resp, err := c.do(ctx, http.MethodPost, endpoint("/exec", nil), body)
	if err != nil {
		return fail, err
	}
	defer resp.Body.Close()
	if req.OnStart != nil {
		pid, err := strconv.Atoi(resp.Header.Get(agentwire.PidHeader))
		if err != nil {
			return fail, fmt.Errorf("agent: bad %s header: %w", agentwire.PidHeader, err)
		}
		req.OnStart(pid)
	}
	buf := make([]byte, 32<<10)
	for {
		typ, payload, err := agentwire.ReadFrame(resp.Body, buf)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return fail, fmt.Errorf("agent: exec stream: %w", err)
		}
		if cap(payload) > cap(buf) {
			buf = payload
		}
		if (typ == agentwire.FrameExit || typ == agentwire.FrameError) && int64(len(payload)) > c.small() {
			return fail, fmt.Errorf("agent: exec stream: %w: a %d-byte status frame", ErrReplyTooLarge, len(payload))
		}
		switch typ {
		case agentwire.FrameStdout, agentwire.FrameStderr:
			w := stdout
			if typ == agentwire.FrameStderr {
				w = stderr
			}
			if w == nil {
				continue
			}
			if _, err := w.Write(payload); err != nil {
				return fail, err
			}
		case agentwire.FrameExit:
			var st agentwire.ExitStatus
			if err := json.Unmarshal(payload, &st); err != nil {
				return fail, fmt.Errorf("agent: decode exit status: %w", err)
			}
			// Read the end of the stream (the agent sends it with this
			// frame), so that the connection is reused, not closed.
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
			if st.TimedOut {
				return st, fmt.Errorf("%w (killed by %s)", ErrTimedOut, st.Signal)
			}
			return st, nil
		case agentwire.FrameError:
			e := &agentwire.Error{}
			if err := json.Unmarshal(payload, e); err != nil {
				return fail, fmt.Errorf("agent: decode error frame: %w", err)
			}
			return fail, e
		default:
			return fail, fmt.Errorf("agent: unknown frame type %d", typ)
		}
	}
}

// Kill sends signal (a name such as "TERM", "KILL", "INT", "HUP", with or
// without "SIG", or a number) to the process group of pid, a process
// started by Exec on this agent that has not been reaped yet. Any other
// pid gives an *agentwire.Error with Code agentwire.CodeNotFound.
func (c *Client) Kill(ctx context.Context, pid int, signal string) error {
	q := url.Values{"pid": {strconv.Itoa(pid)}, "signal": {signal}}
	resp, err := c.do(ctx, http.MethodPost, endpoint("/kill", q), nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Health returns the guest's health.
func (c *Client) Health(ctx context.Context) (agentwire.Health, error) {
	h, _, err := c.HealthTimed(ctx)
	return h, err
}

// WaitHealth calls Health until the agent answers (a guest still booting
// or just restored may not yet listen), every 200 ms, each call bounded by
// attempt, until deadline passes or ctx is done; it then returns the last
// error.
func (c *Client) WaitHealth(ctx context.Context, deadline time.Time, attempt time.Duration) (agentwire.Health, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, attempt)
		h, err := c.Health(actx)
		cancel()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return h, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// HealthTimed is Health also returning the agent's own time for the
// request in the guest (agentwire.AgentTimeHeader); 0 from an agent that does not
// report it.
func (c *Client) HealthTimed(ctx context.Context) (agentwire.Health, time.Duration, error) {
	var h agentwire.Health
	ctx, cancel := c.replyCtx(ctx)
	defer cancel()
	resp, err := c.do(ctx, http.MethodGet, endpoint("/health", nil), nil)
	if err != nil {
		return h, 0, err
	}
	defer resp.Body.Close()
	if err := decodeReply(resp.Body, c.small(), &h); err != nil {
		return h, 0, err
	}
	return h, AgentTime(resp.Header), nil
}

// AgentTime reads agentwire.AgentTimeHeader from a response's header; 0 when it is
// absent or malformed.
func AgentTime(h http.Header) time.Duration {
	ns, err := strconv.ParseInt(h.Get(agentwire.AgentTimeHeader), 10, 64)
	if err != nil || ns < 0 {
		return 0
	}
	return time.Duration(ns)
}

// ReadFile copies the guest file at path (absolute) to w and returns its
// permission bits. A file longer than the client's Limits.File fails
// with an error wrapping ErrReplyTooLarge once that much has been copied.
func (c *Client) ReadFile(ctx context.Context, path string, w io.Writer) (fs.FileMode, error) {
	resp, err := c.do(ctx, http.MethodGet, endpoint("/files", url.Values{"path": {path}}), nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	mode, err := strconv.ParseUint(resp.Header.Get(agentwire.ModeHeader), 8, 32)
	if err != nil {
		return 0, fmt.Errorf("agent: bad %s header: %w", agentwire.ModeHeader, err)
	}
	n, err := io.Copy(w, io.LimitReader(resp.Body, c.limits.File+1))
	if err != nil {
		return 0, err
	}
	if n > c.limits.File {
		return 0, fmt.Errorf("%w: %s: more than %d bytes", ErrReplyTooLarge, path, c.limits.File)
	}
	return fs.FileMode(mode), nil
}

// WriteFile replaces the guest file at path (absolute) with r's contents
// and mode's permission bits, and returns the new file's
// agentwire.FileInfo.
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader, mode fs.FileMode) (agentwire.FileInfo, error) {
	m := uint64(mode.Perm())
	if mode&fs.ModeSetuid != 0 {
		m |= 0o4000
	}
	if mode&fs.ModeSetgid != 0 {
		m |= 0o2000
	}
	if mode&fs.ModeSticky != 0 {
		m |= 0o1000
	}
	q := url.Values{"path": {path}, "mode": {strconv.FormatUint(m, 8)}}
	// The upload may take any time; its reply, once the agent answers,
	// may not.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := c.do(ctx, http.MethodPut, endpoint("/files", q), r)
	if err != nil {
		return agentwire.FileInfo{}, err
	}
	defer resp.Body.Close()
	t := time.AfterFunc(c.limits.ReplyTimeout, cancel)
	defer t.Stop()
	var fi agentwire.FileInfo
	if err := decodeReply(resp.Body, c.small(), &fi); err != nil {
		if !t.Stop() && ctx.Err() != nil {
			return agentwire.FileInfo{}, fmt.Errorf("agent: write %s: reply not read in %v: %w", path, c.limits.ReplyTimeout, context.DeadlineExceeded)
		}
		return agentwire.FileInfo{}, err
	}
	return fi, nil
}

// Stat returns the guest file's agentwire.FileInfo, not following a final symlink.
func (c *Client) Stat(ctx context.Context, path string) (agentwire.FileInfo, error) {
	var fi agentwire.FileInfo
	err := c.getJSON(ctx, endpoint("/stat", url.Values{"path": {path}}), c.small(), &fi)
	return fi, err
}

// List returns the entries of the guest directory at path, sorted by name.
func (c *Client) List(ctx context.Context, path string) ([]agentwire.FileInfo, error) {
	var l []agentwire.FileInfo
	err := c.getJSON(ctx, endpoint("/list", url.Values{"path": {path}}), c.limits.Reply, &l)
	return l, err
}

// StartService asks the agent to run spec as a supervised service (see
// agentwire.ServiceSpec) and returns its status once its first process
// has started. A name in use is an *agentwire.Error with Code
// agentwire.CodeExists; a first start that fails (no such program, no
// such user) is an *agentwire.Error, and nothing is left running.
func (c *Client) StartService(ctx context.Context, spec agentwire.ServiceSpec) (agentwire.ServiceStatus, error) {
	return postRecord[agentwire.ServiceStatus](ctx, c, "/services", spec)
}

// Services returns the status of every supervised service, sorted by name.
func (c *Client) Services(ctx context.Context) ([]agentwire.ServiceStatus, error) {
	var l []agentwire.ServiceStatus
	err := c.getJSON(ctx, endpoint("/services", nil), c.limits.Reply, &l)
	return l, err
}

// Service returns the status of the service name; an unknown name is an
// *agentwire.Error with Code agentwire.CodeNotFound.
func (c *Client) Service(ctx context.Context, name string) (agentwire.ServiceStatus, error) {
	var st agentwire.ServiceStatus
	err := c.getJSON(ctx, endpoint("/services", url.Values{"name": {name}}), c.small(), &st)
	return st, err
}

// StopService stops the service name (SIGTERM to its process group,
// SIGKILL after agentwire.ServiceStopGrace; no more restarts) and returns
// its final status once its process has been reaped.
func (c *Client) StopService(ctx context.Context, name string) (agentwire.ServiceStatus, error) {
	var st agentwire.ServiceStatus
	err := c.callJSON(ctx, http.MethodDelete, endpoint("/services", url.Values{"name": {name}}), nil, c.small(), &st)
	return st, err
}

// maxPollOutput bounds the output of PollExec's last attempt that its
// error quotes.
const maxPollOutput = 4 << 10

// PollExec runs req (a ready check, say `curl -fsS localhost:8080/health`
// after StartService) until it exits 0, waiting every between the end of
// one attempt and the start of the next, and returns the number of
// attempts. When ctx ends first the error wraps ctx's and quotes the last
// attempt's exit code and the end of its output. An error from the agent
// itself (it cannot be reached, the program does not exist) is retried
// too, since a guest still starting may not answer yet; it is in the final
// error. Set req.TimeoutMS to bound each attempt.
func (c *Client) PollExec(ctx context.Context, req agentwire.ExecRequest, every time.Duration) (attempts int, err error) {
	last := "no attempt finished"
	for {
		attempts++
		var out tailBuffer
		code, err := c.Exec(ctx, req, &out, &out)
		switch {
		case err == nil && code == 0:
			return attempts, nil
		case ctx.Err() != nil:
			// Cut short by ctx: the attempt before says more.
		case err != nil:
			last = err.Error()
		default:
			last = fmt.Sprintf("exit code %d, output %q", code, out.String())
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return attempts, fmt.Errorf("agent: %v not ready after %d attempts (last: %s): %w", req.Argv, attempts, last, ctx.Err())
		case <-t.C:
		}
	}
}

// tailBuffer keeps the last maxPollOutput bytes written to it.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > maxPollOutput {
		t.b = append(t.b[:0], t.b[len(t.b)-maxPollOutput:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.b) }
