package clienttest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
)

// The stub's process API (/v1/sandboxes/{id}/processes), in memory. A
// process "runs" its argv as follows:
//
//   - `exit N` writes its argv on stdout and exits N;
//   - `sleep ...` writes nothing and runs until a signal or a delete;
//   - one with stdin or a PTY echoes what it is sent on stdout (and, for
//     `exit N` on stdin, "N"), and exits 0 at its stdin's end (on a PTY
//     also at a Ctrl-D byte);
//   - any other writes its argv on stdout, "err" on stderr, and exits 0.
//
// Its output is kept whole and replayed from any offset; a follower
// waits for more until the exit.

// stubProc is one process.
type stubProc struct {
	info   wire.ProcessInfo
	chunks []stubChunk
	// changed is closed (and replaced) at each change of the process.
	changed chan struct{}
}

// stubChunk is one chunk of a process's output at offset off.
type stubChunk struct {
	off    int64
	stderr bool
	data   []byte
}

// Process returns sandbox id's process pid as the stub has it.
func (s *Stub) Process(id, pid string) (wire.ProcessInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.procs[id+"/"+pid]
	if p == nil {
		return wire.ProcessInfo{}, false
	}
	return p.info, true
}

// write appends data to p's output; s.mu is held.
func (p *stubProc) write(stderr bool, data []byte) {
	if len(data) == 0 {
		return
	}
	p.chunks = append(p.chunks, stubChunk{off: p.info.OutputBytes, stderr: stderr, data: append([]byte(nil), data...)})
	p.info.OutputBytes += int64(len(data))
	p.notify()
}

// exit ends p; s.mu is held.
func (p *stubProc) exit(code int, signal string) {
	if p.info.State == agentwire.ProcessExited {
		return
	}
	p.info.State = agentwire.ProcessExited
	p.info.StdinOpen = false
	p.info.Exit = &agentwire.ExitStatus{Code: code, Signal: signal}
	p.notify()
}

func (p *stubProc) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// signals are the signals the stub knows, by name and number.
var signals = map[string]int{"HUP": 1, "INT": 2, "QUIT": 3, "KILL": 9, "TERM": 15, "USR1": 10, "USR2": 12}

func (s *Stub) processRoutes(mux *http.ServeMux, sb func(func(http.ResponseWriter, *http.Request, *store.Sandbox)) http.HandlerFunc) {
	// proc resolves {pid} of a running sandbox.
	proc := func(h func(w http.ResponseWriter, r *http.Request, x *store.Sandbox, p *stubProc)) http.HandlerFunc {
		return sb(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) {
			s.mu.Lock()
			p, status := s.procs[x.ID+"/"+r.PathValue("pid")], x.Status
			s.mu.Unlock()
			if status != store.Running {
				fail(w, 409, "sandbox "+x.ID+" is "+status)
				return
			}
			if p == nil {
				reply(w, 404, wire.Error{Error: "guest agent: process " + r.PathValue("pid") + " not found (not_found, HTTP 404)", Code: agentwire.CodeNotFound})
				return
			}
			h(w, r, x, p)
		})
	}
	info := func(w http.ResponseWriter, p *stubProc) {
		s.mu.Lock()
		pi := p.info
		s.mu.Unlock()
		reply(w, 200, pi)
	}
	mux.HandleFunc("POST /v1/sandboxes/{id}/processes", sb(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) {
		var req wire.ProcessRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || len(req.Argv) == 0 {
			fail(w, 400, "argv is required")
			return
		}
		if req.Argv[0] == "no-such-program" {
			reply(w, 404, wire.Error{Error: "guest agent: no-such-program: executable file not found in $PATH (not_found, HTTP 404)", Code: agentwire.CodeNotFound})
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.nproc++
		p := &stubProc{changed: make(chan struct{}), info: wire.ProcessInfo{ID: fmt.Sprintf("p%d", s.nproc), Pid: 100 + s.nproc,
			Argv: req.Argv, Cwd: req.Cwd, User: req.User, Tag: req.Tag, PTY: req.PTY, State: agentwire.ProcessRunning,
			StartedAt: time.Now(), StdinOpen: req.Stdin || req.PTY != nil}}
		s.procs[x.ID+"/"+p.info.ID] = p
		s.procOrder[x.ID] = append(s.procOrder[x.ID], p.info.ID)
		line := []byte(strings.Join(req.Argv, " ") + "\n")
		switch {
		case len(req.Argv) == 2 && req.Argv[0] == "exit":
			code, _ := strconv.Atoi(req.Argv[1])
			p.write(false, line)
			p.exit(code, "")
		case req.Argv[0] == "sleep", p.info.StdinOpen:
		default:
			p.write(false, line)
			p.write(true, []byte("err\n"))
			p.exit(0, "")
		}
		reply(w, 200, p.info)
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/processes", sb(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox) {
		s.mu.Lock()
		l := []wire.ProcessInfo{}
		for _, pid := range s.procOrder[x.ID] {
			if p := s.procs[x.ID+"/"+pid]; p != nil {
				l = append(l, p.info)
			}
		}
		s.mu.Unlock()
		reply(w, 200, l)
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/processes/{pid}", proc(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox, p *stubProc) {
		info(w, p)
	}))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}/processes/{pid}", proc(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox, p *stubProc) {
		s.mu.Lock()
		p.exit(128+9, "KILL")
		delete(s.procs, x.ID+"/"+p.info.ID)
		s.mu.Unlock()
		reply(w, 200, map[string]string{"deleted": p.info.ID})
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/processes/{pid}/signal", proc(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox, p *stubProc) {
		var req wire.SignalRequest
		json.NewDecoder(r.Body).Decode(&req)
		name := strings.TrimPrefix(strings.ToUpper(req.Signal), "SIG")
		n, ok := signals[name]
		if !ok {
			if n, _ = strconv.Atoi(name); n <= 0 || n > 64 {
				fail(w, 400, "unknown signal "+req.Signal)
				return
			}
		}
		s.mu.Lock()
		if p.info.State == agentwire.ProcessRunning {
			p.exit(128+n, name)
		}
		s.mu.Unlock()
		info(w, p)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/processes/{pid}/resize", proc(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox, p *stubProc) {
		var req wire.TerminalSize
		json.NewDecoder(r.Body).Decode(&req)
		s.mu.Lock()
		if p.info.PTY == nil {
			s.mu.Unlock()
			fail(w, 409, "process "+p.info.ID+" has no terminal")
			return
		}
		p.info.PTY = &req
		s.mu.Unlock()
		info(w, p)
	}))
	mux.HandleFunc("POST /v1/sandboxes/{id}/processes/{pid}/stdin", proc(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox, p *stubProc) {
		b, err := io.ReadAll(io.LimitReader(r.Body, agentwire.MaxStdinChunk+1))
		if err != nil || len(b) > agentwire.MaxStdinChunk {
			fail(w, 413, "stdin chunk too large")
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if !p.info.StdinOpen {
			fail(w, 409, "process "+p.info.ID+": stdin is closed")
			return
		}
		if i := strings.IndexByte(string(b), 4); p.info.PTY != nil && i >= 0 {
			b = b[:i]
			r.URL.RawQuery = "eof=1"
		}
		p.write(false, b)
		if r.URL.Query().Get("eof") == "1" {
			p.exit(0, "")
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/processes/{pid}/wait", proc(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox, p *stubProc) {
		for {
			s.mu.Lock()
			pi, ch := p.info, p.changed
			s.mu.Unlock()
			if pi.State == agentwire.ProcessExited {
				reply(w, 200, pi)
				return
			}
			select {
			case <-ch:
			case <-r.Context().Done():
				return
			}
		}
	}))
	mux.HandleFunc("GET /v1/sandboxes/{id}/processes/{pid}/output", proc(func(w http.ResponseWriter, r *http.Request, x *store.Sandbox, p *stubProc) {
		pos, _ := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
		pos = max(pos, 0)
		follow := r.URL.Query().Get("follow") != "0"
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		enc.Encode(wire.ExecFrame{Start: &wire.OutputStart{Offset: pos}})
		for {
			s.mu.Lock()
			var out []wire.ExecFrame
			for _, c := range p.chunks {
				if end := c.off + int64(len(c.data)); end > pos {
					d := c.data[max(pos-c.off, 0):]
					if c.stderr {
						out = append(out, wire.ExecFrame{Stderr: d})
					} else {
						out = append(out, wire.ExecFrame{Stdout: d})
					}
					pos = end
				}
			}
			exit, ch := p.info.Exit, p.changed
			s.mu.Unlock()
			for _, f := range out {
				enc.Encode(f)
			}
			if exit != nil {
				code := exit.Code
				enc.Encode(wire.ExecFrame{Exit: &code, Signal: exit.Signal})
				return
			}
			if !follow {
				return
			}
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
			select {
			case <-ch:
			case <-r.Context().Done():
				return
			}
		}
	}))
}
