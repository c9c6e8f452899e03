package agentclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"

	"github.com/warrenvm/warren/agentwire"
)

// processPath is the endpoint of process id, with rest appended.
func processPath(id string, rest string) string {
	return "/processes/" + url.PathEscape(id) + rest
}

// StartProcess starts a process that outlives this call (see
// agentwire.ProcessRequest) and returns its state once it has started. A
// program the guest does not have, or a user it does not know, is an
// *agentwire.Error and nothing runs.
func (c *Client) StartProcess(ctx context.Context, req agentwire.ProcessRequest) (agentwire.ProcessInfo, error) {
	return postRecord[agentwire.ProcessInfo](ctx, c, "/processes", req)
}

// Processes lists the processes the agent keeps, oldest first.
func (c *Client) Processes(ctx context.Context) ([]agentwire.ProcessInfo, error) {
	var l []agentwire.ProcessInfo
	err := c.getJSON(ctx, endpoint("/processes", nil), c.limits.Reply, &l)
	return l, err
}

// Process returns process id's state; an unknown id is an
// *agentwire.Error with Code agentwire.CodeNotFound.
func (c *Client) Process(ctx context.Context, id string) (agentwire.ProcessInfo, error) {
	var pi agentwire.ProcessInfo
	err := c.getJSON(ctx, endpoint(processPath(id, ""), nil), c.small(), &pi)
	return pi, err
}

// OutputFunc receives the frames of a process's output stream: typ is
// agentwire.FrameOutputStart, FrameStdout, FrameStderr or FrameExit, and
// payload is only valid during the call. An error it returns ends the
// stream and is returned.
type OutputFunc func(typ byte, payload []byte) error

// ProcessOutput streams process id's output from offset (negative: the
// oldest byte kept) to fn, following it until the process exits when
// follow is set. It returns nil at the stream's end (after FrameExit, or,
// without follow, after what is kept); cancelling ctx stops it and leaves
// the process running. A FrameError from the agent is returned as an
// *agentwire.Error.
func (c *Client) ProcessOutput(ctx context.Context, id string, offset int64, follow bool, fn OutputFunc) error {
	q := url.Values{"follow": {"0"}}
	if follow {
		q.Set("follow", "1")
	}
	if offset >= 0 {
		q.Set("offset", strconv.FormatInt(offset, 10))
	}
	resp, err := c.do(ctx, http.MethodGet, endpoint(processPath(id, "/output"), q), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	var buf []byte
	for {
		typ, payload, err := agentwire.ReadFrame(br, buf)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		buf = payload[:0]
		switch typ {
		case agentwire.FrameOutputStart, agentwire.FrameStdout, agentwire.FrameStderr, agentwire.FrameExit:
			if err := fn(typ, payload); err != nil {
				return err
			}
			if typ == agentwire.FrameExit {
				return nil
			}
		case agentwire.FrameError:
			e := &agentwire.Error{}
			if err := json.Unmarshal(payload, e); err != nil {
				return fmt.Errorf("agent: bad error frame: %w", err)
			}
			return e
		default:
			return fmt.Errorf("agent: unknown frame type %d", typ)
		}
	}
}

// SendStdin writes r's bytes (at most agentwire.MaxStdinChunk) to process
// id's standard input, and then closes it when eof is set.
func (c *Client) SendStdin(ctx context.Context, id string, r io.Reader, eof bool) error {
	q := url.Values{}
	if eof {
		q.Set("eof", "1")
	}
	ctx, cancel := c.replyCtx(ctx)
	defer cancel()
	resp, err := c.do(ctx, http.MethodPost, endpoint(processPath(id, "/stdin"), q), r)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// SignalProcess sends signal (a name, with or without "SIG", or a
// number) to process id's group and returns its state.
func (c *Client) SignalProcess(ctx context.Context, id, signal string) (agentwire.ProcessInfo, error) {
	return c.postProcess(ctx, id, "/signal", agentwire.SignalRequest{Signal: signal})
}

// ResizeProcess sets process id's terminal size.
func (c *Client) ResizeProcess(ctx context.Context, id string, size agentwire.TerminalSize) (agentwire.ProcessInfo, error) {
	return c.postProcess(ctx, id, "/resize", size)
}

func (c *Client) postProcess(ctx context.Context, id, rest string, body any) (agentwire.ProcessInfo, error) {
	return postRecord[agentwire.ProcessInfo](ctx, c, processPath(id, rest), body)
}

// postRecord POSTs body as JSON to path and decodes the agent's answer of
// one record (at most the client's small reply limit) into a T.
func postRecord[T any](ctx context.Context, c *Client, path string, body any) (T, error) {
	var v T
	b, err := json.Marshal(body)
	if err != nil {
		return v, err
	}
	err = c.callJSON(ctx, http.MethodPost, endpoint(path, nil), bytes.NewReader(b), c.small(), &v)
	return v, err
}

// WaitProcess waits until process id has exited and returns its state
// (Exit set). It is bounded by ctx only, not by the client's
// ReplyTimeout: a process may run for days.
func (c *Client) WaitProcess(ctx context.Context, id string) (agentwire.ProcessInfo, error) {
	var pi agentwire.ProcessInfo
	resp, err := c.do(ctx, http.MethodGet, endpoint(processPath(id, "/wait"), nil), nil)
	if err != nil {
		return pi, err
	}
	defer resp.Body.Close()
	err = decodeReply(resp.Body, c.small(), &pi)
	return pi, err
}

// RemoveProcess SIGKILLs process id's group if it still runs, waits for
// it, and forgets it.
func (c *Client) RemoveProcess(ctx context.Context, id string) error {
	ctx, cancel := c.replyCtx(ctx)
	defer cancel()
	resp, err := c.do(ctx, http.MethodDelete, endpoint(processPath(id, ""), nil), nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// ListDepth returns the entries under the guest directory at path, depth
// levels down (1: its own entries; at most agentwire.MaxListDepth), each
// with its Path, parents before their children, siblings by name.
func (c *Client) ListDepth(ctx context.Context, path string, depth int) ([]agentwire.FileInfo, error) {
	var l []agentwire.FileInfo
	q := url.Values{"path": {path}, "depth": {strconv.Itoa(depth)}}
	err := c.getJSON(ctx, endpoint("/list", q), c.limits.Reply, &l)
	return l, err
}

// Mkdir creates the guest directory path with mode's permission bits
// (and its missing parents when parents is set; an existing directory is
// then no error) and returns its FileInfo.
func (c *Client) Mkdir(ctx context.Context, path string, mode fs.FileMode, parents bool) (agentwire.FileInfo, error) {
	q := url.Values{"path": {path}, "mode": {strconv.FormatUint(uint64(mode.Perm()), 8)}}
	if parents {
		q.Set("parents", "1")
	}
	var fi agentwire.FileInfo
	err := c.callJSON(ctx, http.MethodPost, endpoint("/mkdir", q), nil, c.small(), &fi)
	return fi, err
}

// Remove removes the guest file or empty directory at path, or, when
// recursive is set, a directory and everything under it.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "1")
	}
	ctx, cancel := c.replyCtx(ctx)
	defer cancel()
	resp, err := c.do(ctx, http.MethodDelete, endpoint("/files", q), nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Rename renames the guest file from to to (rename(2): to is replaced)
// and returns to's FileInfo.
func (c *Client) Rename(ctx context.Context, from, to string) (agentwire.FileInfo, error) {
	var fi agentwire.FileInfo
	err := c.callJSON(ctx, http.MethodPost, endpoint("/rename", url.Values{"from": {from}, "to": {to}}), nil, c.small(), &fi)
	return fi, err
}

// Watch watches the guest directory at path (and, when recursive is
// set, the directories under it, new ones included) and calls fn with
// each change until fn returns false, ctx ends or the agent ends the
// stream. The first event is Op "ready": the watches are in place. Each
// line is bounded (64 KiB).
func (c *Client) Watch(ctx context.Context, path string, recursive bool, fn func(agentwire.WatchEvent) bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "1")
	}
	resp, err := c.do(ctx, http.MethodGet, endpoint("/watch", q), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 4096), maxSmallReply)
	for sc.Scan() {
		var ev agentwire.WatchEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("agent: bad watch event: %w", err)
		}
		if !fn(ev) {
			return nil
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return fmt.Errorf("%w: a watch event of more than %d bytes", ErrReplyTooLarge, maxSmallReply)
		}
		return err
	}
	return ctx.Err()
}
