package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/warrenvm/warren/hostd/wire"
)

// The process API: processes that outlive the request that started them
// (agentwire's process.go has the semantics). A process keeps running
// whatever happens to its clients' connections; a client comes back to its
// output with ProcessOutput from the offset it had.

// maxFrameLine bounds one NDJSON line of an output or watch stream: the
// agent's largest frame, base64-encoded, with room to spare.
const maxFrameLine = 4 << 20

// ErrStreamEnded is returned by ProcessOutput when a followed stream ended
// before the process's exit (the connection broke: the daemon stopped, or
// the sandbox was paused or restored under it). The process still runs; a
// client reconnects from the offset it has.
var ErrStreamEnded = errors.New("the output stream ended before the process's exit")

// processPath is the daemon's path of sandbox id's process pid, with rest
// appended.
func processPath(id, pid, rest string) string {
	return sbPath(id, "/processes/"+url.PathEscape(pid)+rest)
}

// StartProcess starts a process in sandbox id that outlives this call and
// returns its state once it has started. The sandbox's environment comes
// before req.Env.
func (c *Client) StartProcess(ctx context.Context, id string, req wire.ProcessRequest) (*wire.ProcessInfo, error) {
	return callFor[wire.ProcessInfo](ctx, c, http.MethodPost, sbPath(id, "/processes"), req)
}

// Processes lists sandbox id's processes, oldest first.
func (c *Client) Processes(ctx context.Context, id string) ([]wire.ProcessInfo, error) {
	return listFor[wire.ProcessInfo](ctx, c, sbPath(id, "/processes"))
}

// Process returns the state of sandbox id's process pid (an *Error with
// status 404 when the sandbox does not know it).
func (c *Client) Process(ctx context.Context, id, pid string) (*wire.ProcessInfo, error) {
	return callFor[wire.ProcessInfo](ctx, c, http.MethodGet, processPath(id, pid, ""), nil)
}

// ProcessOutput streams process pid's output from offset (negative: from
// the oldest byte the guest keeps) to fn, one frame at a time: first the
// frame with Start, then Stdout and Stderr frames, and, once the process
// has exited, the frame with Exit. With follow it waits for more output
// until the exit; without, it ends after what is kept now. An error fn
// returns ends the stream and is returned; cancelling ctx stops it (and
// leaves the process running).
//
// A followed stream that ends without the exit returns ErrStreamEnded (or,
// when the daemon said why, an *Error with status 502): the caller may
// reconnect from the offset it reached.
func (c *Client) ProcessOutput(ctx context.Context, id, pid string, offset int64, follow bool, fn func(wire.ExecFrame) error) error {
	q := url.Values{"follow": {"0"}}
	if follow {
		q.Set("follow", "1")
	}
	if offset >= 0 {
		q.Set("offset", strconv.FormatInt(offset, 10))
	}
	resp, err := c.do(ctx, http.MethodGet, processPath(id, pid, "/output?"+q.Encode()), nil, "application/x-ndjson")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxFrameLine)
	for sc.Scan() {
		var f wire.ExecFrame
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			return fmt.Errorf("output of %s in %s: bad frame: %w", pid, id, err)
		}
		if f.Error != "" {
			return &Error{Status: http.StatusBadGateway, Message: f.Error}
		}
		if err := fn(f); err != nil {
			return err
		}
		if f.Exit != nil {
			return nil
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("output of %s in %s: %w: %w", pid, id, ErrStreamEnded, err)
	}
	if follow {
		return fmt.Errorf("output of %s in %s: %w", pid, id, ErrStreamEnded)
	}
	return nil
}

// SendStdin writes r's bytes to process pid's standard input (the process
// must have been started with Stdin or a PTY) as they are read, one
// request per read of at most stdinChunk bytes (so a terminal's keystrokes
// go as they are typed), and then, when eof is set, closes it.
func (c *Client) SendStdin(ctx context.Context, id, pid string, r io.Reader, eof bool) error {
	if r == nil {
		r = bytes.NewReader(nil)
	}
	buf := make([]byte, stdinChunk)
	for {
		n, err := r.Read(buf)
		last := err == io.EOF
		if err != nil && !last {
			return fmt.Errorf("stdin of %s in %s: %w", pid, id, err)
		}
		if l, ok := r.(interface{ Len() int }); ok && l.Len() == 0 {
			last = true // a bytes.Reader or strings.Reader: no empty request for its end
		}
		if n > 0 || (last && eof) {
			if err := c.sendStdinChunk(ctx, id, pid, buf[:n], last && eof); err != nil {
				return err
			}
		}
		if last {
			return nil
		}
	}
}

// stdinChunk is the most SendStdin sends in one request (the daemon takes
// up to agentwire.MaxStdinChunk).
const stdinChunk = 256 << 10

// sendStdinChunk is one POST .../stdin.
func (c *Client) sendStdinChunk(ctx context.Context, id, pid string, b []byte, eof bool) error {
	path := processPath(id, pid, "/stdin")
	if eof {
		path += "?eof=1"
	}
	resp, err := c.send(ctx, http.MethodPost, path, "application/octet-stream", bytes.NewReader(b))
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return nil
}

// SignalProcess sends signal (a name, "SIGTERM" or "TERM", or a number)
// to process pid's process group and returns its state.
func (c *Client) SignalProcess(ctx context.Context, id, pid, signal string) (*wire.ProcessInfo, error) {
	return callFor[wire.ProcessInfo](ctx, c, http.MethodPost, processPath(id, pid, "/signal"), wire.SignalRequest{Signal: signal})
}

// ResizeProcess sets the size of process pid's terminal.
func (c *Client) ResizeProcess(ctx context.Context, id, pid string, size wire.TerminalSize) (*wire.ProcessInfo, error) {
	return callFor[wire.ProcessInfo](ctx, c, http.MethodPost, processPath(id, pid, "/resize"), size)
}

// WaitProcess waits until process pid has exited and returns its state
// (Exit set). Only ctx bounds it.
func (c *Client) WaitProcess(ctx context.Context, id, pid string) (*wire.ProcessInfo, error) {
	return callFor[wire.ProcessInfo](ctx, c, http.MethodGet, processPath(id, pid, "/wait"), nil)
}

// RemoveProcess kills process pid's group if it still runs and forgets it.
func (c *Client) RemoveProcess(ctx context.Context, id, pid string) error {
	return c.call(ctx, http.MethodDelete, processPath(id, pid, ""), nil, nil)
}
