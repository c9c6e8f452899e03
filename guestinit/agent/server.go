//go:build linux

package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/warrenvm/warren/agentwire"
)

// Options configures a Server.
type Options struct {
	// Env is the base environment (KEY=VALUE) of every started process,
	// before agentwire.ExecRequest.Env; nil means the agent's own
	// (os.Environ).
	Env []string
	// Sync, when non-nil, is the clock and RNG re-sync loop whose counters
	// /health reports. NewServer wraps its AddEntropy and SetIdentity so
	// that, after each re-sync (the host sends one after every restore:
	// a sandbox created from a template, a fork child, a rollback, a
	// resume from disk) and each identity applied (a forked child's), the
	// processes started from then on are named from a new id namespace
	// (RenewProcessIDs), drawn with the host's fresh entropy mixed in: two
	// sandboxes restored from one template name their processes apart even
	// before their guests' random generators have been reseeded. Call
	// NewServer before the Syncer runs.
	Sync *Syncer
	// Dir is the default working directory of started processes; ""
	// means the agent's own.
	Dir string
	// User is the default user of started processes (a spec as in
	// agentwire.ExecRequest.User); "" means the agent's own credentials,
	// unchanged. A process that runs as a resolved user gets HOME from the
	// user's passwd entry unless Env already has HOME.
	User string
	// EtcDir holds the passwd and group files users are resolved against;
	// "" means /etc.
	EtcDir string
	// LogDir is where services' logs go ("" means agentwire.DefaultLogDir);
	// it is created when the first service starts.
	LogDir string
}

// Server is the guest agent's HTTP server.
//
// Every /exec handler starts its process through the Waiter and is the
// only goroutine that calls that Child's Wait; /kill only signals, through
// Child.SignalGroup, and only processes found in procs.
type Server struct {
	waiter Waiter
	env    []string
	dir    string
	user   string
	etcDir string
	sync   *Syncer
	start  time.Time
	mux    *http.ServeMux
	srv    *http.Server
	// services supervises the services of POST /services.
	services *supervisor
	// table holds the processes of the process API (POST /processes).
	table *processTable
	// maxOutput is how many bytes of each process's output the table's
	// processes keep (agentwire.MaxProcessOutput; tests lower it).
	maxOutput int

	mu sync.Mutex
	// procs holds the processes this server started whose /exec handler
	// is still running, by pid. A process leaves it when its handler
	// returns, after it has been reaped.
	procs map[int]*proc // +checklocks:mu
	// extraEnv is added to env for every process started (SetExtraEnv).
	extraEnv []string // +checklocks:mu
}

// SetExtraEnv makes every process started from now on get env's
// variables on top of the server's environment (a request's own
// variables still win). It replaces what an earlier call set.
func (s *Server) SetExtraEnv(env map[string]string) {
	list := make([]string, 0, len(env))
	for k, v := range env {
		list = append(list, k+"="+v)
	}
	sort.Strings(list)
	s.mu.Lock()
	s.extraEnv = list
	s.mu.Unlock()
}

// NewServer returns a server that starts and collects its children
// through w.
func NewServer(w Waiter, opts Options) *Server {
	resetChildSignals()
	env := opts.Env
	if env == nil {
		env = os.Environ()
	}
	etcDir := opts.EtcDir
	if etcDir == "" {
		etcDir = "/etc"
	}
	logDir := opts.LogDir
	if logDir == "" {
		logDir = agentwire.DefaultLogDir
	}
	s := &Server{waiter: w, env: env, dir: opts.Dir, user: opts.User, etcDir: etcDir, sync: opts.Sync,
		start: time.Now(), mux: http.NewServeMux(), procs: map[int]*proc{},
		table: newProcessTable(agentwire.MaxProcesses), maxOutput: agentwire.MaxProcessOutput}
	s.services = newSupervisor(w, logDir, s.resolve)
	if opts.Sync != nil {
		add := opts.Sync.AddEntropy
		opts.Sync.AddEntropy = func(b []byte) error {
			var err error
			if add != nil {
				err = add(b)
			}
			s.table.renewPrefix(string(b))
			return err
		}
		apply := opts.Sync.SetIdentity
		opts.Sync.SetIdentity = func(id *agentwire.Identity) error {
			var err error
			if apply != nil {
				err = apply(id)
			}
			s.RenewProcessIDs(id)
			return err
		}
	}
	s.mux.HandleFunc("/exec", s.handleExec)
	s.mux.HandleFunc("/services", s.handleServices)
	s.mux.HandleFunc("/kill", s.handleKill)
	s.mux.HandleFunc("/health", s.handleHealth)
	s.mux.HandleFunc("/files", s.handleFiles)
	s.mux.HandleFunc("/stat", getPath(statFile))
	s.mux.HandleFunc("/list", handleList)
	s.mux.HandleFunc("/mkdir", handleMkdir)
	s.mux.HandleFunc("/rename", handleRename)
	s.mux.HandleFunc("/watch", handleWatch)
	s.mux.HandleFunc("/processes", s.handleProcesses)
	s.mux.HandleFunc("/processes/", s.routeProcess)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &agentwire.Error{Message: "no such endpoint " + r.URL.Path, Code: agentwire.CodeNotFound, Status: http.StatusNotFound})
	})
	s.srv = &http.Server{Handler: s.mux, ReadHeaderTimeout: 30 * time.Second}
	return s
}

// Handler returns the server's HTTP handler.
func (s *Server) Handler() http.Handler { return s.mux }

// Serve accepts connections on l until Close; it returns
// http.ErrServerClosed after Close.
func (s *Server) Serve(l net.Listener) error { return s.srv.Serve(l) }

// Close closes the listeners and all connections (running execs see their
// client disconnect and are killed), stops the services (SIGKILL at once),
// SIGKILLs the processes of the process API, and waits until they all
// have been reaped.
func (s *Server) Close() error {
	err := s.srv.Close()
	s.services.stopAll(0)
	s.table.killAll()
	return err
}

// RenewProcessIDs makes the processes started from now on (POST
// /processes) take their ids from a new namespace (a new random prefix,
// drawn with id's fields mixed in, when id is not nil); the processes
// kept keep theirs. A forked child calls it when it takes its identity,
// so that its new processes' ids never collide with its parent's.
func (s *Server) RenewProcessIDs(id *agentwire.Identity) {
	var salt string
	if id != nil {
		salt = id.MachineID + "\x00" + id.Hostname + "\x00" + id.MAC
	}
	s.table.renewPrefix(salt)
}

// writeJSON writes v with status 200.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// writeResult writes err (errorFrom) when it is not nil, else v with
// status 200.
func writeResult(w http.ResponseWriter, v any, err error) {
	if err != nil {
		writeError(w, errorFrom(err))
		return
	}
	writeJSON(w, v)
}

// writeError writes e as a JSON body with its status.
func writeError(w http.ResponseWriter, e *agentwire.Error) {
	if e.Status == 0 {
		e.Status = http.StatusInternalServerError
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_ = json.NewEncoder(w).Encode(e)
}

// errorFrom maps a Go error to an agentwire.Error with a status and code.
func errorFrom(err error) *agentwire.Error {
	var e *agentwire.Error
	if errors.As(err, &e) {
		return e
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &agentwire.Error{Message: err.Error(), Code: agentwire.CodeNotFound, Status: http.StatusNotFound}
	case errors.Is(err, fs.ErrPermission):
		return &agentwire.Error{Message: err.Error(), Code: agentwire.CodePermission, Status: http.StatusForbidden}
	case errors.Is(err, fs.ErrExist):
		return &agentwire.Error{Message: err.Error(), Code: agentwire.CodeExists, Status: http.StatusConflict}
	case errors.Is(err, syscall.EISDIR):
		return &agentwire.Error{Message: err.Error(), Code: agentwire.CodeIsDirectory, Status: http.StatusBadRequest}
	case errors.Is(err, syscall.ENOTDIR):
		return &agentwire.Error{Message: err.Error(), Code: agentwire.CodeNotDirectory, Status: http.StatusBadRequest}
	}
	return &agentwire.Error{Message: err.Error(), Code: agentwire.CodeInternal, Status: http.StatusInternalServerError}
}

func badRequest(format string, a ...any) *agentwire.Error {
	return &agentwire.Error{Message: fmt.Sprintf(format, a...), Code: agentwire.CodeBadRequest, Status: http.StatusBadRequest}
}

func methodNotAllowed(w http.ResponseWriter, r *http.Request, allow string) {
	w.Header().Set("Allow", allow)
	writeError(w, &agentwire.Error{Message: r.Method + " not allowed", Code: agentwire.CodeMethodNotAllowed, Status: http.StatusMethodNotAllowed})
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	t0 := time.Now()
	if r.Method != http.MethodGet {
		methodNotAllowed(w, r, "GET")
		return
	}
	h, err := readHealth()
	if err != nil {
		writeError(w, errorFrom(err))
		return
	}
	h.AgentUptimeSeconds = time.Since(s.start).Seconds()
	// The hostname before the machine id: ApplyIdentity changes them in
	// the other order, so a new hostname comes with its machine id.
	h.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile(MachineIDPath); err == nil {
		h.MachineID = strings.TrimSpace(string(b))
	}
	if s.sync != nil {
		st := s.sync.Stats()
		h.Syncs, h.LastSync = st.Count, st.Last
	}
	h.Services = s.services.list()
	w.Header().Set(agentwire.AgentTimeHeader, strconv.FormatInt(int64(time.Since(t0)), 10))
	writeJSON(w, h)
}

// readHealth reads /proc/uptime, /proc/loadavg and /proc/meminfo.
func readHealth() (agentwire.Health, error) {
	h := agentwire.Health{Version: agentwire.Version}
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return h, err
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return h, fmt.Errorf("agent: malformed /proc/uptime %q", b)
	}
	if h.UptimeSeconds, err = strconv.ParseFloat(f[0], 64); err != nil {
		return h, fmt.Errorf("agent: /proc/uptime: %w", err)
	}
	if b, err = os.ReadFile("/proc/loadavg"); err != nil {
		return h, err
	}
	if f = strings.Fields(string(b)); len(f) < 3 {
		return h, fmt.Errorf("agent: malformed /proc/loadavg %q", b)
	}
	for i := range 3 {
		if h.Load[i], err = strconv.ParseFloat(f[i], 64); err != nil {
			return h, fmt.Errorf("agent: /proc/loadavg: %w", err)
		}
	}
	if b, err = os.ReadFile("/proc/meminfo"); err != nil {
		return h, err
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		var dst *uint64
		switch f[0] {
		case "MemTotal:":
			dst = &h.MemTotalBytes
		case "MemFree:":
			dst = &h.MemFreeBytes
		case "MemAvailable:":
			dst = &h.MemAvailableBytes
		default:
			continue
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return h, fmt.Errorf("agent: /proc/meminfo %s: %w", f[0], err)
		}
		if len(f) > 2 && f[2] == "kB" {
			v *= 1024
		}
		*dst = v
	}
	return h, nil
}
