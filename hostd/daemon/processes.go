package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/hostd/wire"
)

// The process API (/v1/sandboxes/{id}/processes): the guest agent's, passed
// on (agentwire's process.go has the semantics). Processes live in the
// guest's memory, so the daemon keeps nothing of them: each request goes to
// the sandbox's agent, and a pause, snapshot, rollback or fork takes them
// along with the rest of the guest.
//
// No handler holds the sandbox's lock while it talks to the agent (like
// exec): a client following a process's output for hours must not keep a
// pause, snapshot or fork from happening. A long stream (output, wait,
// watch) instead ends when something happens to the sandbox that breaks or
// rewinds its agent's connection (see disturbed): the client comes back
// with the offset it has.
//
// Everything the agent sends is bounded by agentclient (one record, one
// frame, one line at a time); a tenant's process id goes to the agent path
// escaped, as one path segment.

// processRoutes registers the process API's routes.
func (d *Daemon) processRoutes(handle func(string, handlerFunc)) {
	handle("POST /v1/sandboxes/{id}/processes", d.withSandbox(withBody(d.startProcess)))
	handle("GET /v1/sandboxes/{id}/processes", d.withSandbox(d.listProcesses))
	handle("GET /v1/sandboxes/{id}/processes/{pid}", d.withSandbox(d.getProcess))
	handle("DELETE /v1/sandboxes/{id}/processes/{pid}", d.withSandbox(d.removeProcess))
	handle("GET /v1/sandboxes/{id}/processes/{pid}/output", d.withSandbox(d.processOutput))
	handle("POST /v1/sandboxes/{id}/processes/{pid}/stdin", d.withSandbox(d.processStdin))
	handle("POST /v1/sandboxes/{id}/processes/{pid}/signal", d.withSandbox(withBody(d.signalProcess)))
	handle("POST /v1/sandboxes/{id}/processes/{pid}/resize", d.withSandbox(withBody(d.resizeProcess)))
	handle("GET /v1/sandboxes/{id}/processes/{pid}/wait", d.withSandbox(d.waitProcess))
}

func (d *Daemon) startProcess(w http.ResponseWriter, r *http.Request, s *sbState, req wire.ProcessRequest) {
	if len(req.Argv) == 0 {
		writeErr(w, errf(400, "argv is required"))
		return
	}
	c, env, err := d.readyAgent(s)
	if err != nil {
		writeErr(w, err)
		return
	}
	req.Env = append(append([]string(nil), env...), req.Env...)
	pi, err := c.StartProcess(r.Context(), req)
	if err != nil {
		writeErr(w, agentErr(err))
		return
	}
	writeJSON(w, 200, pi)
}

func (d *Daemon) listProcesses(w http.ResponseWriter, r *http.Request, s *sbState) {
	d.askAgent(w, s, nil, func(c *agentclient.Client) (any, error) {
		l, err := c.Processes(r.Context())
		return nonNil(l), err
	})
}

func (d *Daemon) getProcess(w http.ResponseWriter, r *http.Request, s *sbState) {
	d.askAgent(w, s, nil, func(c *agentclient.Client) (any, error) { return c.Process(r.Context(), r.PathValue("pid")) })
}

func (d *Daemon) removeProcess(w http.ResponseWriter, r *http.Request, s *sbState) {
	pid := r.PathValue("pid")
	d.askAgent(w, s, nil, func(c *agentclient.Client) (any, error) {
		return map[string]string{"deleted": pid}, c.RemoveProcess(r.Context(), pid)
	})
}

func (d *Daemon) signalProcess(w http.ResponseWriter, r *http.Request, s *sbState, req wire.SignalRequest) {
	var bad error
	if req.Signal == "" {
		bad = errf(400, "signal is required")
	}
	d.askAgent(w, s, bad, func(c *agentclient.Client) (any, error) {
		return c.SignalProcess(r.Context(), r.PathValue("pid"), req.Signal)
	})
}

func (d *Daemon) resizeProcess(w http.ResponseWriter, r *http.Request, s *sbState, req wire.TerminalSize) {
	var bad error
	if req.Rows == 0 || req.Cols == 0 {
		bad = errf(400, "rows and cols must be positive")
	}
	d.askAgent(w, s, bad, func(c *agentclient.Client) (any, error) {
		return c.ResizeProcess(r.Context(), r.PathValue("pid"), req)
	})
}

// processStdin passes one bounded chunk (agentwire.MaxStdinChunk) of a
// process's standard input on. The chunk is read whole first: a body too
// large is refused (413) before any of it reaches the process.
func (d *Daemon) processStdin(w http.ResponseWriter, r *http.Request, s *sbState) {
	eof, err := queryBool(r, "eof", false)
	if err != nil {
		writeErr(w, err)
		return
	}
	if r.ContentLength > agentwire.MaxStdinChunk {
		writeErr(w, errf(413, "stdin chunk of %d bytes: at most %d a request", r.ContentLength, agentwire.MaxStdinChunk))
		return
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, agentwire.MaxStdinChunk+1))
	if err != nil {
		writeErr(w, errf(400, "read stdin: %v", err))
		return
	}
	if len(b) > agentwire.MaxStdinChunk {
		writeErr(w, errf(413, "stdin chunk over %d bytes", agentwire.MaxStdinChunk))
		return
	}
	c, _, err := d.readyAgent(s)
	if err != nil {
		writeErr(w, err)
		return
	}
	if err := c.SendStdin(r.Context(), r.PathValue("pid"), bytes.NewReader(b), eof); err != nil {
		writeErr(w, agentErr(err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// waitProcess answers once the process has exited (its ProcessInfo, Exit
// set). It waits as long as the client does, unless the sandbox is
// disturbed (409: ask again).
func (d *Daemon) waitProcess(w http.ResponseWriter, r *http.Request, s *sbState) {
	c, _, err := d.readyAgent(s)
	if err != nil {
		writeErr(w, err)
		return
	}
	ctx, stop := d.disturbed(r.Context(), s)
	defer stop()
	pi, err := c.WaitProcess(ctx, r.PathValue("pid"))
	if err != nil {
		if r.Context().Err() != nil {
			return // the client went away
		}
		if cause := context.Cause(ctx); ctx.Err() != nil && cause != nil {
			writeErr(w, errf(409, "wait: %v", cause))
			return
		}
		writeErr(w, agentErr(err))
		return
	}
	writeJSON(w, 200, pi)
}

// processOutput streams a process's output as wire.ExecFrame lines: first
// the Start frame, then stdout and stderr chunks as they come (each
// flushed), and last the Exit frame once the process has exited, or an
// Error frame when the agent's stream broke after the answer had started.
func (d *Daemon) processOutput(w http.ResponseWriter, r *http.Request, s *sbState) {
	q := query{r: r}
	offset := int64(-1)
	if v := r.URL.Query().Get("offset"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			q.keep(errf(400, "bad offset %q", v))
		}
		offset = max(n, -1)
	}
	follow := q.flag("follow", true)
	if q.err != nil {
		writeErr(w, q.err)
		return
	}
	c, _, err := d.readyAgent(s)
	if err != nil {
		writeErr(w, err)
		return
	}
	ctx, stop := d.disturbed(r.Context(), s)
	defer stop()
	fw := &frameWriter{w: w}
	err = c.ProcessOutput(ctx, r.PathValue("pid"), offset, follow, func(typ byte, payload []byte) error {
		f, err := outputFrame(typ, payload)
		if err != nil {
			return err
		}
		return fw.frame(f)
	})
	if err == nil || r.Context().Err() != nil {
		return
	}
	if cause := context.Cause(ctx); ctx.Err() != nil && cause != nil {
		err = cause
	}
	if !fw.started {
		writeErr(w, agentErr(err))
		return
	}
	fw.frame(wire.ExecFrame{Error: err.Error()})
}

// outputFrame turns one frame of the agent's output stream into an
// ExecFrame; the guest wrote its JSON payloads, so they are checked.
func outputFrame(typ byte, payload []byte) (wire.ExecFrame, error) {
	switch typ {
	case agentwire.FrameOutputStart:
		var st wire.OutputStart
		if err := json.Unmarshal(payload, &st); err != nil {
			return wire.ExecFrame{}, fmt.Errorf("agent: bad output start frame: %w", err)
		}
		return wire.ExecFrame{Start: &st}, nil
	case agentwire.FrameStdout:
		return wire.ExecFrame{Stdout: payload}, nil
	case agentwire.FrameStderr:
		return wire.ExecFrame{Stderr: payload}, nil
	case agentwire.FrameExit:
		var st agentwire.ExitStatus
		if err := json.Unmarshal(payload, &st); err != nil {
			return wire.ExecFrame{}, fmt.Errorf("agent: bad exit frame: %w", err)
		}
		code := st.Code
		return wire.ExecFrame{Exit: &code, Signal: st.Signal, TimedOut: st.TimedOut}, nil
	}
	return wire.ExecFrame{}, fmt.Errorf("agent: unexpected frame type %d", typ)
}
