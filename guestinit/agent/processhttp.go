//go:build linux

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warrenvm/warren/agentwire"
)

// HTTP handlers of the process API (agentwire/process.go).

// stdinWriteTimeout bounds one POST /processes/{id}/stdin write to a
// process that does not read its input, besides the request's context.
const stdinWriteTimeout = time.Minute

// maxSmallRequest bounds the JSON body of a signal or resize request.
const maxSmallRequest = 64 << 10

// readJSON decodes r's body, at most limit bytes, into v.
func readJSON(r *http.Request, limit int64, what string, v any) *agentwire.Error {
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return badRequest("read %s: %v", what, err)
	}
	if int64(len(b)) > limit {
		return badRequest("%s larger than %d bytes", what, limit)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return badRequest("decode %s: %v", what, err)
	}
	return nil
}

// handleProcesses serves /processes: GET lists, POST starts.
func (s *Server) handleProcesses(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
		ps := s.table.all()
		l := make([]agentwire.ProcessInfo, 0, len(ps))
		for _, p := range ps {
			l = append(l, p.state())
		}
		writeJSON(w, l)
	case http.MethodPost:
		var req agentwire.ProcessRequest
		if e := readJSON(r, maxProcessRequest, "process request", &req); e != nil {
			writeError(w, e)
			return
		}
		p, err := s.startProcess(req)
		if err != nil {
			writeError(w, errorFrom(err))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(p.state())
	default:
		methodNotAllowed(w, r, "GET, POST")
	}
}

// handleProcess serves /processes/{id}: GET its state, DELETE it.
// routeProcess sends /processes/ID to handleProcess and
// /processes/ID/OP to handleProcessOp, with the path values "id" and
// "op" set. It parses the path itself instead of registering
// "/processes/{id}" patterns: the initramfs's busybox build of the agent
// is a module of an older go version, where net/http's mux keeps its
// Go 1.21 behaviour (GODEBUG httpmuxgo121) and takes "{id}" literally.
func (s *Server) routeProcess(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, "/processes/")
	id, op, hasOp := strings.Cut(rest, "/")
	if id == "" || (hasOp && (op == "" || strings.Contains(op, "/"))) {
		writeError(w, &agentwire.Error{Message: "no such endpoint " + r.URL.Path, Code: agentwire.CodeNotFound, Status: http.StatusNotFound})
		return
	}
	r.SetPathValue("id", id)
	if !hasOp {
		s.handleProcess(w, r)
		return
	}
	r.SetPathValue("op", op)
	s.handleProcessOp(w, r)
}

func (s *Server) handleProcess(w http.ResponseWriter, r *http.Request) {
	p, err := s.table.get(r.PathValue("id"))
	if err != nil {
		writeError(w, errorFrom(err))
		return
	}
	switch r.Method {
	case http.MethodGet:
		writeJSON(w, p.state())
	case http.MethodDelete:
		p.kill(false)
		select {
		case <-p.done:
		case <-r.Context().Done():
			return // the client is gone; the process dies all the same
		}
		s.table.remove(p)
		w.WriteHeader(http.StatusNoContent)
	default:
		methodNotAllowed(w, r, "GET, DELETE")
	}
}

// handleProcessOp serves /processes/{id}/{op}.
func (s *Server) handleProcessOp(w http.ResponseWriter, r *http.Request) {
	p, err := s.table.get(r.PathValue("id"))
	if err != nil {
		writeError(w, errorFrom(err))
		return
	}
	op := r.PathValue("op")
	var method string
	switch op {
	case "output", "wait":
		method = http.MethodGet
	case "stdin", "signal", "resize":
		method = http.MethodPost
	default:
		writeError(w, &agentwire.Error{Message: "no such endpoint " + r.URL.Path, Code: agentwire.CodeNotFound, Status: http.StatusNotFound})
		return
	}
	if r.Method != method {
		methodNotAllowed(w, r, method)
		return
	}
	switch op {
	case "output":
		streamOutput(w, r, p)
	case "stdin":
		sendStdin(w, r, p)
	case "signal":
		var req agentwire.SignalRequest
		if e := readJSON(r, maxSmallRequest, "signal request", &req); e != nil {
			writeError(w, e)
			return
		}
		sig, ok := parseSignal(req.Signal)
		if !ok {
			writeError(w, badRequest("unknown signal %q", req.Signal))
			return
		}
		err := p.child.SignalGroup(sig)
		if err != nil && !errors.Is(err, ErrReaped) && !errors.Is(err, syscall.ESRCH) {
			writeError(w, errorFrom(err))
			return
		}
		writeJSON(w, p.state()) // a process that has exited is no error
	case "resize":
		var size agentwire.TerminalSize
		if e := readJSON(r, maxSmallRequest, "terminal size", &size); e != nil {
			writeError(w, e)
			return
		}
		err := p.resize(size)
		writeResult(w, p.state(), err)
	case "wait":
		select {
		case <-p.done:
			writeJSON(w, p.state())
		case <-r.Context().Done():
		}
	}
}

// resize sets the terminal's size; a process that has exited is left
// alone.
func (p *process) resize(size agentwire.TerminalSize) error {
	if p.term == nil {
		return badRequest("process %s has no terminal", p.info.ID)
	}
	if size.Rows == 0 || size.Cols == 0 {
		return badRequest("terminal size %dx%d: rows and cols must be positive", size.Rows, size.Cols)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exit != nil {
		return nil
	}
	if err := setTerminalSize(p.term, size); err != nil {
		if errors.Is(err, os.ErrClosed) {
			return nil // the monitor closed it: the process has exited
		}
		return err
	}
	p.size = &size
	return nil
}

// streamOutput serves GET /processes/{id}/output?offset=&follow=: the
// kept output from offset, then (follow) the new output until the exit.
// A reader that falls behind what is kept is sent another
// FrameOutputStart saying where its stream goes on and what it missed.
// Nothing the reader does holds up the process or other readers.
func streamOutput(w http.ResponseWriter, r *http.Request, p *process) {
	q := r.URL.Query()
	offset := int64(-1)
	if v := q.Get("offset"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			writeError(w, badRequest("bad offset %q", v))
			return
		}
		offset = n
	}
	var follow bool
	switch v := q.Get("follow"); v {
	case "", "1", "true":
		follow = true
	case "0", "false":
	default:
		writeError(w, badRequest("bad follow %q", v))
		return
	}
	from, end := p.out.bounds()
	start := outputStartAt(offset, from)
	limit := int64(math.MaxInt64)
	if !follow {
		limit = end
	}

	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	frame := func(typ byte, payload []byte) bool {
		return agentwire.WriteFrame(w, typ, payload) == nil
	}
	b, _ := json.Marshal(start)
	if !frame(agentwire.FrameOutputStart, b) {
		return
	}
	pos := start.Offset
	buf := make([]byte, maxChunkBytes)
	for {
		rd := p.out.next(pos, limit, buf)
		if rd.n > 0 {
			if rd.at > pos {
				b, _ := json.Marshal(agentwire.OutputStart{Offset: rd.at, Dropped: rd.at - pos})
				if !frame(agentwire.FrameOutputStart, b) {
					return
				}
			}
			if !frame(rd.typ, buf[:rd.n]) {
				return
			}
			pos = rd.at + int64(rd.n)
			continue
		}
		if rd.closed && pos >= rd.end {
			b, _ := json.Marshal(p.exitStatus())
			_ = agentwire.WriteFrame(w, agentwire.FrameExit, b)
			return
		}
		if !follow {
			return
		}
		if rc.Flush() != nil {
			return
		}
		select {
		case <-rd.wake:
		case <-r.Context().Done():
			return
		}
	}
}

// outputStartAt is where an output stream asked for at offset starts
// when from is the oldest byte kept: offset itself, or from when offset
// is negative (no Dropped) or was dropped.
func outputStartAt(offset, from int64) agentwire.OutputStart {
	switch {
	case offset < 0:
		return agentwire.OutputStart{Offset: from}
	case offset < from:
		return agentwire.OutputStart{Offset: from, Dropped: from - offset}
	}
	return agentwire.OutputStart{Offset: offset}
}

// sendStdin serves POST /processes/{id}/stdin?eof=: the body (at most
// agentwire.MaxStdinChunk bytes) to the process's standard input, then,
// with eof=1, its end: the pipe closed, or a terminal's EOF character
// (^D) written.
func sendStdin(w http.ResponseWriter, r *http.Request, p *process) {
	var eof bool
	switch v := r.URL.Query().Get("eof"); v {
	case "", "0", "false":
	case "1", "true":
		eof = true
	default:
		writeError(w, badRequest("bad eof %q", v))
		return
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, agentwire.MaxStdinChunk+1))
	if err != nil {
		writeError(w, badRequest("read stdin: %v", err))
		return
	}
	if len(data) > agentwire.MaxStdinChunk {
		writeError(w, &agentwire.Error{Message: fmt.Sprintf("stdin chunk larger than %d bytes", agentwire.MaxStdinChunk), Code: agentwire.CodeBadRequest, Status: http.StatusRequestEntityTooLarge})
		return
	}
	if err := p.writeStdin(r.Context(), data, eof); err != nil {
		writeError(w, errorFrom(err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// writeStdin writes data to the process's input (one write at a time),
// and then ends it when eof is set. A process that does not read is
// given until ctx ends, at most stdinWriteTimeout.
func (p *process) writeStdin(ctx context.Context, data []byte, eof bool) error {
	select {
	case p.stdinTurn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-p.stdinTurn }()
	p.mu.Lock()
	f, exited := p.stdin, p.exit != nil
	if p.term != nil && !exited {
		f = p.term
	}
	p.mu.Unlock()
	switch {
	case f == nil && exited:
		return badRequest("process %s has exited", p.info.ID)
	case f == nil && p.term == nil && !p.piped:
		return badRequest("process %s has no stdin (start it with stdin set)", p.info.ID)
	case f == nil:
		return badRequest("stdin of process %s is closed", p.info.ID)
	}
	if eof && p.term != nil {
		data = append(data, 4) // VEOF, ^D
	}
	if len(data) > 0 {
		if err := f.SetWriteDeadline(time.Now().Add(stdinWriteTimeout)); err != nil {
			return err
		}
		fired := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			_ = f.SetWriteDeadline(time.Now())
			close(fired)
		})
		n, err := f.Write(data)
		if !stop() {
			<-fired
		}
		switch {
		case errors.Is(err, os.ErrClosed), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.EIO):
			return badRequest("process %s has exited or closed its stdin", p.info.ID)
		case errors.Is(err, os.ErrDeadlineExceeded):
			return &agentwire.Error{Message: fmt.Sprintf("process %s did not read its stdin: wrote %d of %d bytes", p.info.ID, n, len(data)),
				Code: agentwire.CodeInternal, Status: http.StatusGatewayTimeout}
		case err != nil:
			return err
		}
	}
	if eof && p.term == nil {
		p.mu.Lock()
		if p.stdin == f {
			p.stdin = nil
			f.Close()
		}
		p.mu.Unlock()
	}
	return nil
}
