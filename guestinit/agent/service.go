//go:build linux

package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/warrenvm/warren/agentwire"
)

// Supervised services (POST /services): processes tied to no request's
// connection, restarted when they exit, their output in a rotated log.
// They are started and reaped through the agent's Waiter like /exec
// processes (see guestinit/README.md "Reaping"): the supervisor's run
// goroutine of a service is the only caller of its Child's Wait.

// maxServiceRequest bounds the JSON body of POST /services.
const maxServiceRequest = 1 << 20

// Bounds on a ServiceSpec.
const (
	maxServiceName = 64
	maxServiceArgs = 4096
)

// backoff is the restart policy: the first restart waits min; a restart
// after a run shorter than reset waits twice as long as the one before,
// up to max; a run of at least reset starts over at min.
type backoff struct {
	min, max, reset time.Duration
}

// next is the wait before the next start, given the previous wait (0
// before the first restart) and how long the process ran.
func (b backoff) next(prev, ran time.Duration) time.Duration {
	if prev <= 0 || ran >= b.reset {
		return b.min
	}
	return min(2*prev, b.max)
}

// serviceDefaults is the policy services run under.
var serviceDefaults = backoff{min: agentwire.MinServiceBackoff, max: agentwire.MaxServiceBackoff, reset: agentwire.ServiceResetAfter}

// supervisor runs the services of one Server.
type supervisor struct {
	waiter  Waiter
	logDir  string
	logMax  int64
	policy  backoff
	resolve func(argv, env []string, cwd, user string) (launch, error)
	// now and after are time.Now and time.After; tests replace them.
	now   func() time.Time
	after func(time.Duration) <-chan time.Time

	mu sync.Mutex
	// services holds every service not yet removed by stop, by name; a
	// name is reserved here before its first start. +checklocks:mu
	services map[string]*service
}

func newSupervisor(w Waiter, logDir string, resolve func(argv, env []string, cwd, user string) (launch, error)) *supervisor {
	return &supervisor{waiter: w, logDir: logDir, logMax: agentwire.MaxServiceLog, policy: serviceDefaults, resolve: resolve,
		now: time.Now, after: time.After, services: map[string]*service{}}
}

// service is one supervised service. Its run goroutine owns the loop
// (start, wait, back off); stop asks it to end through stop and waits on
// done.
type service struct {
	spec agentwire.ServiceSpec
	log  *rotatingLog
	stop chan struct{} // closed once, by the first supervisor.stop
	done chan struct{} // closed when run has returned

	mu sync.Mutex
	// st is the status GET /services reports. +checklocks:mu
	st agentwire.ServiceStatus
	// child is the running process, nil when none runs. +checklocks:mu
	child Child
	// started is when child started (monotonic). +checklocks:mu
	started time.Time
	// stopping is set by stop; run starts nothing after it. +checklocks:mu
	stopping bool
}

func (svc *service) status() agentwire.ServiceStatus {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	st := svc.st
	st.Argv = slices.Clone(st.Argv)
	if st.LastExit != nil {
		e := *st.LastExit
		st.LastExit = &e
	}
	return st
}

// running records a started process. A service being stopped gets its
// SIGTERM here, so that a stop racing with a restart cannot miss it.
func (svc *service) running(c Child, now time.Time) {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	svc.child, svc.started = c, now
	svc.st.State, svc.st.Pid, svc.st.RunningSince, svc.st.LastError = agentwire.ServiceRunning, c.Pid(), now, ""
	svc.st.Starts++
	svc.st.Restarts = svc.st.Starts - 1
	if svc.stopping {
		_ = c.SignalGroup(syscall.SIGTERM)
	}
}

// exited records the end of the running process and returns how long it
// ran.
func (svc *service) exited(ws syscall.WaitStatus, err error, now time.Time) time.Duration {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	ran := now.Sub(svc.started)
	e := &agentwire.ServiceExit{At: now, RanMS: ran.Milliseconds()}
	if err != nil {
		e.Code = -1
		svc.st.LastError = "wait: " + err.Error()
	} else {
		e.Code, e.Signal = exitCode(ws)
	}
	svc.child = nil
	svc.st.LastExit, svc.st.Pid, svc.st.RunningSince = e, 0, time.Time{}
	return ran
}

// setState sets the state unless the service is stopping, when it is
// ServiceStopped whatever was asked; it reports whether it is stopping.
func (svc *service) setState(state string) (stopping bool) {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	if svc.stopping {
		state = agentwire.ServiceStopped
	}
	svc.st.State = state
	return svc.stopping
}

func (svc *service) startFailed(err error) {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	svc.st.LastError = err.Error()
}

// validServiceName accepts 1 to 64 letters, digits, '.', '_' and '-',
// starting with a letter or digit (so it is a plain file name).
func validServiceName(n string) bool {
	if n == "" || len(n) > maxServiceName {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case (c == '.' || c == '_' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return true
}

// checkSpec validates a ServiceSpec before anything is started.
func checkSpec(spec agentwire.ServiceSpec) *agentwire.Error {
	switch {
	case !validServiceName(spec.Name):
		return badRequest("service name %q: want 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit", spec.Name, maxServiceName)
	case len(spec.Argv) == 0 || spec.Argv[0] == "":
		return badRequest("service %s: empty argv", spec.Name)
	case len(spec.Argv) > maxServiceArgs || len(spec.Env) > maxServiceArgs:
		return badRequest("service %s: more than %d arguments or environment entries", spec.Name, maxServiceArgs)
	}
	for _, kv := range spec.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return badRequest("service %s: env entry %q is not KEY=VALUE", spec.Name, kv)
		}
	}
	return nil
}

// add validates spec, starts its first process and supervises it from
// then on. A first start that fails is an error and leaves nothing
// behind but the log file, so that a bad argv or user is reported to the
// caller instead of being retried forever.
func (sv *supervisor) add(spec agentwire.ServiceSpec) (agentwire.ServiceStatus, error) {
	if e := checkSpec(spec); e != nil {
		return agentwire.ServiceStatus{}, e
	}
	logPath := filepath.Join(sv.logDir, spec.Name+".log")
	var log *rotatingLog
	err := os.MkdirAll(sv.logDir, 0o755)
	if err == nil {
		log, err = openLog(logPath, sv.logMax)
	}
	if err != nil {
		return agentwire.ServiceStatus{}, fmt.Errorf("service %s: log: %w", spec.Name, err)
	}
	svc := &service{spec: spec, log: log, stop: make(chan struct{}), done: make(chan struct{})}
	svc.spec.Argv, svc.spec.Env = slices.Clone(spec.Argv), slices.Clone(spec.Env)
	svc.st = agentwire.ServiceStatus{Name: spec.Name, Argv: slices.Clone(spec.Argv), Log: logPath}
	sv.mu.Lock()
	if _, ok := sv.services[spec.Name]; ok {
		sv.mu.Unlock()
		log.Close()
		return agentwire.ServiceStatus{}, &agentwire.Error{Message: "service " + spec.Name + " exists", Code: agentwire.CodeExists, Status: http.StatusConflict}
	}
	if len(sv.services) >= agentwire.MaxServices {
		sv.mu.Unlock()
		log.Close()
		return agentwire.ServiceStatus{}, badRequest("already %d services", agentwire.MaxServices)
	}
	sv.services[spec.Name] = svc // reserved until its first start
	sv.mu.Unlock()

	c, err := sv.spawn(svc)
	if err != nil {
		log.Close()
		sv.mu.Lock()
		delete(sv.services, spec.Name)
		sv.mu.Unlock()
		e := errorFrom(err)
		if e.Code == agentwire.CodeInternal {
			e.Code, e.Status = agentwire.CodeStartFailed, http.StatusBadRequest
		}
		return agentwire.ServiceStatus{}, e
	}
	svc.running(c, sv.now())
	go sv.run(svc, c)
	return svc.status(), nil
}

// spawn starts one process of svc: stdin /dev/null, stdout and stderr a
// pipe that a goroutine copies into the service's log until every holder
// of its write end has closed it; its own session (so also its own
// process group, for SignalGroup).
func (sv *supervisor) spawn(svc *service) (Child, error) {
	l, err := sv.resolve(svc.spec.Argv, svc.spec.Env, svc.spec.Cwd, svc.spec.User)
	if err != nil {
		return nil, err
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer devnull.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	c, err := sv.waiter.Start(func() (int, error) {
		p, err := os.StartProcess(l.prog, l.argv, &os.ProcAttr{
			Dir:   l.dir,
			Env:   l.env,
			Files: []*os.File{devnull, w, w},
			Sys:   &syscall.SysProcAttr{Setsid: true, Credential: l.cred},
		})
		if err != nil {
			return 0, err
		}
		pid := p.Pid
		_ = p.Release() // the Waiter collects the status
		return pid, nil
	})
	w.Close()
	if err != nil {
		r.Close()
		return nil, err
	}
	go drain(r, svc.log)
	return c, nil
}

// drain copies r to log until r's end, then closes r. Output the log
// cannot take is dropped: the pipe is read all the same, so a service is
// never blocked or killed by SIGPIPE because its log failed.
func drain(r *os.File, log io.Writer) {
	defer r.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			_, _ = log.Write(buf[:n])
		}
		if err != nil {
			return
		}
	}
}

// run supervises svc from its first process c until it is stopped.
func (sv *supervisor) run(svc *service, c Child) {
	defer close(svc.done)
	var wait time.Duration
	for {
		var ran time.Duration
		if c != nil {
			ws, err := c.Wait()
			ran = svc.exited(ws, err, sv.now())
		}
		if svc.setState(agentwire.ServiceBackoff) {
			return
		}
		wait = sv.policy.next(wait, ran)
		select {
		case <-sv.after(wait):
		case <-svc.stop:
			svc.setState(agentwire.ServiceStopped)
			return
		}
		var err error
		if c, err = sv.spawn(svc); err != nil {
			svc.startFailed(err)
			c = nil
			continue
		}
		svc.running(c, sv.now())
	}
}

// get returns the status of the service name.
func (sv *supervisor) get(name string) (agentwire.ServiceStatus, bool) {
	sv.mu.Lock()
	svc := sv.services[name]
	sv.mu.Unlock()
	if svc == nil {
		return agentwire.ServiceStatus{}, false
	}
	st := svc.status()
	return st, st.Starts > 0 // one reserved by add, not yet started, is not there yet
}

// list returns every service's status, sorted by name.
func (sv *supervisor) list() []agentwire.ServiceStatus {
	sv.mu.Lock()
	svcs := make([]*service, 0, len(sv.services))
	for _, svc := range sv.services {
		svcs = append(svcs, svc)
	}
	sv.mu.Unlock()
	out := make([]agentwire.ServiceStatus, 0, len(svcs))
	for _, svc := range svcs {
		st := svc.status()
		if st.Starts > 0 {
			out = append(out, st)
		}
	}
	slices.SortFunc(out, func(a, b agentwire.ServiceStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// stop stops the service name: no more restarts, SIGTERM to the running
// process's group, SIGKILL after grace if it has not exited, and it
// returns the final status once the process has been reaped. The service
// is then forgotten (its log stays).
func (sv *supervisor) stop(name string, grace time.Duration) (agentwire.ServiceStatus, error) {
	sv.mu.Lock()
	svc := sv.services[name]
	sv.mu.Unlock()
	if svc != nil {
		svc.mu.Lock()
		reserved := svc.st.Starts == 0 // by add, not yet started
		svc.mu.Unlock()
		if reserved {
			svc = nil
		}
	}
	if svc == nil {
		return agentwire.ServiceStatus{}, &agentwire.Error{Message: "no service " + name, Code: agentwire.CodeNotFound, Status: http.StatusNotFound}
	}
	svc.mu.Lock()
	first := !svc.stopping
	svc.stopping = true
	c := svc.child
	svc.mu.Unlock()
	if first {
		close(svc.stop)
	}
	if c != nil {
		_ = c.SignalGroup(syscall.SIGTERM)
	}
	select {
	case <-svc.done:
	case <-sv.after(grace):
		svc.mu.Lock()
		c = svc.child
		svc.mu.Unlock()
		if c != nil {
			_ = c.SignalGroup(syscall.SIGKILL)
		}
		<-svc.done
	}
	sv.mu.Lock()
	if sv.services[name] == svc {
		delete(sv.services, name)
	}
	sv.mu.Unlock()
	svc.log.Close()
	return svc.status(), nil
}

// stopAll stops every service, each with grace.
func (sv *supervisor) stopAll(grace time.Duration) {
	var names []string
	for _, st := range sv.list() {
		names = append(names, st.Name)
	}
	var wg sync.WaitGroup
	for _, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = sv.stop(n, grace)
		}()
	}
	wg.Wait()
}

// handleServices serves GET /services[?name=N], POST /services (a JSON
// ServiceSpec; 201 and its ServiceStatus once its first process started)
// and DELETE /services?name=N (stop it; its final ServiceStatus).
func (s *Server) handleServices(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("name")
	switch r.Method {
	case http.MethodGet:
		if name == "" {
			writeJSON(w, s.services.list())
			return
		}
		st, ok := s.services.get(name)
		if !ok {
			writeError(w, &agentwire.Error{Message: "no service " + name, Code: agentwire.CodeNotFound, Status: http.StatusNotFound})
			return
		}
		writeJSON(w, st)
	case http.MethodPost:
		var spec agentwire.ServiceSpec
		b, err := io.ReadAll(io.LimitReader(r.Body, maxServiceRequest+1))
		if err != nil {
			writeError(w, badRequest("read service request: %v", err))
			return
		}
		if len(b) > maxServiceRequest {
			writeError(w, badRequest("service request larger than %d bytes", maxServiceRequest))
			return
		}
		if err := json.Unmarshal(b, &spec); err != nil {
			writeError(w, badRequest("decode service request: %v", err))
			return
		}
		st, err := s.services.add(spec)
		if err != nil {
			writeError(w, errorFrom(err))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(st)
	case http.MethodDelete:
		if name == "" {
			writeError(w, badRequest("missing name parameter"))
			return
		}
		st, err := s.services.stop(name, agentwire.ServiceStopGrace)
		writeResult(w, st, err)
	default:
		methodNotAllowed(w, r, "GET, POST, DELETE")
	}
}

// rotatingLog is a service's log file: appended to, and rotated (renamed
// to PATH.1, replacing the previous one, and started anew) when a write
// would take it past max. It is shared by every process of the service
// (a restarted process's output goes on in the same file, as may that of
// descendants of an earlier one still holding its pipe).
type rotatingLog struct {
	path string
	max  int64

	mu sync.Mutex
	// f is the open log, nil once closed or after a failed rotation
	// (later output is dropped). +checklocks:mu
	f *os.File
	// size is f's size. +checklocks:mu
	size int64
}

func openLog(path string, max int64) (*rotatingLog, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &rotatingLog{path: path, max: max, f: f, size: fi.Size()}, nil
}

// Write appends p, rotating first when p would not fit.
func (l *rotatingLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return 0, os.ErrClosed
	}
	if l.size > 0 && l.size+int64(len(p)) > l.max {
		l.f.Close()
		l.f = nil
		if err := os.Rename(l.path, l.path+".1"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return 0, err
		}
		f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o640)
		if err != nil {
			return 0, err
		}
		l.f, l.size = f, 0
	}
	n, err := l.f.Write(p)
	l.size += int64(n)
	return n, err
}

// Close closes the file; later writes fail.
func (l *rotatingLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
