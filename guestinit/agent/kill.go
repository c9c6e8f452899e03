//go:build linux

package agent

import (
	"errors"
	"net/http"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/agentwire"
)

func (s *Server) addProc(p *proc) {
	s.mu.Lock()
	s.procs[p.pid] = p
	s.mu.Unlock()
}

func (s *Server) removeProc(p *proc) {
	s.mu.Lock()
	if s.procs[p.pid] == p {
		delete(s.procs, p.pid)
	}
	s.mu.Unlock()
}

// parseSignal accepts a signal name with or without "SIG" ("TERM",
// "sigkill") or a number between 1 and 64.
func parseSignal(v string) (unix.Signal, bool) {
	if n, err := strconv.Atoi(v); err == nil {
		return unix.Signal(n), n >= 1 && n <= 64
	}
	name := strings.ToUpper(v)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	sig := unix.SignalNum(name)
	return sig, sig != 0
}

// handleKill serves POST /kill?pid=N&signal=S: it signals the process
// group of a process that this server started and has not reaped yet.
// Any other pid is not_found, so the agent never signals a process it
// does not own, nor a reused pid.
func (s *Server) handleKill(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, r, "POST")
		return
	}
	q := r.URL.Query()
	pid, err := strconv.Atoi(q.Get("pid"))
	if err != nil || pid <= 0 {
		writeError(w, badRequest("bad pid %q", q.Get("pid")))
		return
	}
	sigName := q.Get("signal")
	if sigName == "" {
		sigName = "TERM"
	}
	sig, ok := parseSignal(sigName)
	if !ok {
		writeError(w, badRequest("unknown signal %q", sigName))
		return
	}
	s.mu.Lock()
	p := s.procs[pid]
	s.mu.Unlock()
	notFound := &agentwire.Error{Message: "no running process " + strconv.Itoa(pid) + " started by this agent", Code: agentwire.CodeNotFound, Status: http.StatusNotFound}
	if p == nil {
		writeError(w, notFound)
		return
	}
	if err := p.child.SignalGroup(sig); err != nil {
		if errors.Is(err, ErrReaped) || errors.Is(err, unix.ESRCH) {
			writeError(w, notFound)
			return
		}
		writeError(w, errorFrom(err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
