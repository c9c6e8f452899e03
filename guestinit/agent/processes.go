//go:build linux

package agent

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/warrenvm/warren/agentwire"
)

// The process API (agentwire/process.go): processes that outlive the
// request that started them. Each is started through the Server's Waiter
// like an /exec process; its monitor goroutine is the only caller of its
// Child's Wait, and its pumps read its output into its outputBuffer from
// its start until every holder of the output's write end has closed it
// (or drainGrace after the exit). Nothing ties a process to a connection.

// Bounds on a ProcessRequest.
const (
	maxProcessRequest = 1 << 20
	maxProcessTag     = 256
	maxProcessArgs    = 4096
	maxProcessCwd     = 4096
	maxProcessUser    = 256
	// maxTimeoutMS is the longest timeout a time.Duration holds.
	maxTimeoutMS = math.MaxInt64 / int64(time.Millisecond)
)

// defaultTerm is a terminal process's TERM unless its request sets one.
const defaultTerm = "xterm-256color"

// process is one process of the process API.
type process struct {
	// info holds what does not change: ID, Pid, Argv, Cwd, User, Tag,
	// StartedAt.
	info  agentwire.ProcessInfo
	child Child
	out   *outputBuffer
	// term is the terminal's master side (stdin and output of a PTY
	// process), nil without one; the monitor closes it at the end.
	term *os.File
	// piped says the process's stdin is a pipe (ProcessRequest.Stdin).
	piped bool
	// stdinTurn is held (a value in it) by the one stdin write under way.
	stdinTurn chan struct{}
	// done is closed once the process has exited, its output has ended
	// and its exit is recorded.
	done chan struct{}

	mu sync.Mutex
	// stdin is the write end of the standard input pipe, nil without one
	// or once closed (eof, or the exit). +checklocks:mu
	stdin *os.File
	// size is the terminal's size (nil without one). +checklocks:mu
	size *agentwire.TerminalSize
	// exit is set, with exitedAt, once the process has exited and its
	// output has ended. +checklocks:mu
	exit     *agentwire.ExitStatus
	exitedAt time.Time // +checklocks:mu
	// timedOut records that the timeout's SIGKILL was delivered.
	timedOut bool // +checklocks:mu
}

// state is the process's ProcessInfo now, out's counters included.
func (p *process) state() agentwire.ProcessInfo {
	pi := p.info
	pi.Argv = slices.Clone(pi.Argv)
	pi.OutputFrom, pi.OutputBytes = p.out.bounds()
	p.mu.Lock()
	defer p.mu.Unlock()
	pi.State = agentwire.ProcessRunning
	if p.exit != nil {
		pi.State = agentwire.ProcessExited
		e := *p.exit
		pi.Exit = &e
	}
	if p.size != nil {
		sz := *p.size
		pi.PTY = &sz
	}
	pi.StdinOpen = p.stdin != nil || (p.term != nil && p.exit == nil)
	return pi
}

// exited reports whether the process has exited, and when.
func (p *process) exited() (bool, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit != nil, p.exitedAt
}

// exitStatus returns the exit status, nil while the process runs.
func (p *process) exitStatus() *agentwire.ExitStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exit
}

// kill SIGKILLs the process group unless the leader was already reaped;
// timeout records that the timeout did it. The flag is set under mu
// together with the signal, so the monitor, which reads it under mu after
// the reap, never misses a SIGKILL that landed.
func (p *process) kill(timeout bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.child.SignalGroup(syscall.SIGKILL); err == nil && timeout {
		p.timedOut = true
	}
}

// monitor waits for the process, kills its group at its timeout, lets its
// pumps drain its output (at most drainGrace after the exit: descendants
// may keep the output open), then records the exit and ends the output.
// outputs are the read ends the pumps read; pumps counts them.
func (p *process) monitor(timeout time.Duration, outputs []*os.File, pumps *sync.WaitGroup) {
	var timer *time.Timer
	if timeout > 0 {
		timer = time.AfterFunc(timeout, func() { p.kill(true) })
	}
	ws, err := p.child.Wait()
	if timer != nil {
		timer.Stop()
	}
	drained := make(chan struct{})
	go func() { pumps.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainGrace):
		for _, f := range outputs {
			_ = f.SetReadDeadline(time.Now())
		}
		<-drained
	}
	for _, f := range outputs {
		f.Close() // the terminal's master among them
	}
	st := agentwire.ExitStatus{Code: -1}
	if err == nil {
		st.Code, st.Signal = exitCode(ws)
	}
	p.mu.Lock()
	st.TimedOut = p.timedOut
	p.exit, p.exitedAt = &st, time.Now()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	p.mu.Unlock()
	p.out.close()
	close(p.done)
}

// pump copies f into the output buffer as stream typ until f ends (EOF,
// or EIO from a terminal's master once no one holds its other side).
func (p *process) pump(typ byte, f *os.File, wg *sync.WaitGroup) {
	defer wg.Done()
	buf := make([]byte, maxChunkBytes)
	for {
		n, err := f.Read(buf)
		p.out.write(typ, buf[:n])
		if err != nil {
			return
		}
	}
}

// abbreviate returns argv cut to max bytes in all: the arguments past
// the bound dropped, the one across it cut (at a UTF-8 boundary); cut
// says it was.
func abbreviate(argv []string, max int) (out []string, cut bool) {
	out = make([]string, 0, len(argv))
	for _, a := range argv {
		if len(a) > max {
			return append(out, strings.ToValidUTF8(a[:max], "")), true
		}
		out = append(out, a)
		max -= len(a)
	}
	return out, false
}

// processTable holds a Server's processes, oldest first, at most max.
type processTable struct {
	max int

	mu sync.Mutex
	// prefix names the processes started from now on ("<prefix>-<seq>");
	// renewPrefix replaces it when the guest takes a new identity.
	prefix string // +checklocks:mu
	seq    uint64 // +checklocks:mu
	// list holds the processes, in the order they started.
	list []*process // +checklocks:mu
	// starting counts the slots reserved by starts under way.
	starting int // +checklocks:mu
}

// newProcessTable returns an empty table that keeps max processes.
func newProcessTable(max int) *processTable {
	t := &processTable{max: max}
	t.mu.Lock()
	t.prefix = t.newPrefixLocked("")
	t.mu.Unlock()
	return t
}

// newPrefixLocked returns a random id prefix (8 hex digits) that no
// process in the table has, drawn from the kernel's random numbers and
// salt: a forked child's kernel may not have reseeded its generator
// since the fork, but its identity (the salt) is its own.
//
// +checklocks:t.mu
func (t *processTable) newPrefixLocked(salt string) string {
	for {
		var b [16]byte
		_, _ = rand.Read(b[:]) // never fails (crypto/rand)
		h := sha256.Sum256(append(b[:], salt...))
		p := hex.EncodeToString(h[:4])
		if p == t.prefix || slices.ContainsFunc(t.list, func(q *process) bool { return strings.HasPrefix(q.info.ID, p+"-") }) {
			continue
		}
		return p
	}
}

// renewPrefix gives the processes started from now on names from a new
// namespace (salt as in newPrefixLocked); the processes kept keep their
// ids.
func (t *processTable) renewPrefix(salt string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.prefix = t.newPrefixLocked(salt)
}

// idPrefix returns the current id prefix.
func (t *processTable) idPrefix() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.prefix
}

// reserve takes a slot for a process about to start: when the table is
// full it forgets the exited process that exited longest ago, and when
// every process kept runs it refuses. A reserved slot is given back by
// insert or unreserve.
func (t *processTable) reserve() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.list)+t.starting >= t.max {
		oldest := -1
		var oldestAt time.Time
		for i, p := range t.list {
			if ok, at := p.exited(); ok && (oldest < 0 || at.Before(oldestAt)) {
				oldest, oldestAt = i, at
			}
		}
		if oldest < 0 {
			return &agentwire.Error{Message: "already " + strconv.Itoa(t.max) + " processes running", Code: agentwire.CodeBadRequest, Status: http.StatusTooManyRequests}
		}
		t.list = slices.Delete(t.list, oldest, oldest+1)
	}
	t.starting++
	return nil
}

// unreserve gives back a slot reserve took for a start that failed.
func (t *processTable) unreserve() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.starting--
}

// insert names p and adds it in the slot reserve took.
func (t *processTable) insert(p *process) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.starting--
	t.seq++
	p.info.ID = t.prefix + "-" + strconv.FormatUint(t.seq, 10)
	t.list = append(t.list, p)
}

// get returns the process named id, or a not_found error.
func (t *processTable) get(id string) (*process, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.list {
		if p.info.ID == id {
			return p, nil
		}
	}
	return nil, &agentwire.Error{Message: "no process " + strconv.Quote(id), Code: agentwire.CodeNotFound, Status: http.StatusNotFound}
}

// all returns the processes, oldest first.
func (t *processTable) all() []*process {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.list)
}

// remove forgets p.
func (t *processTable) remove(p *process) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i := slices.Index(t.list, p); i >= 0 {
		t.list = slices.Delete(t.list, i, i+1)
	}
}

// killAll SIGKILLs every running process and waits until each has been
// reaped and its output has ended.
func (t *processTable) killAll() {
	ps := t.all()
	for _, p := range ps {
		p.kill(false)
	}
	for _, p := range ps {
		<-p.done
	}
}

// startProcess starts req's process and adds it to the table.
func (s *Server) startProcess(req agentwire.ProcessRequest) (*process, error) {
	switch {
	case len(req.Argv) == 0 || req.Argv[0] == "":
		return nil, badRequest("empty argv")
	case len(req.Argv) > maxProcessArgs || len(req.Env) > maxProcessArgs:
		return nil, badRequest("more than %d arguments or environment entries", maxProcessArgs)
	case len(req.Tag) > maxProcessTag:
		return nil, badRequest("tag longer than %d bytes", maxProcessTag)
	case len(req.Cwd) > maxProcessCwd || len(req.User) > maxProcessUser:
		return nil, badRequest("cwd longer than %d bytes or user longer than %d", maxProcessCwd, maxProcessUser)
	case req.TimeoutMS < 0 || req.TimeoutMS > maxTimeoutMS:
		return nil, badRequest("timeout_ms %d out of range", req.TimeoutMS)
	case req.PTY != nil && (req.PTY.Rows == 0 || req.PTY.Cols == 0):
		return nil, badRequest("terminal size %dx%d: rows and cols must be positive", req.PTY.Rows, req.PTY.Cols)
	}
	l, err := s.resolve(req.Argv, req.Env, req.Cwd, req.User)
	if err != nil {
		return nil, err
	}
	if req.PTY != nil && !hasEnv(req.Env, "TERM") {
		l.env = mergeEnv(l.env, []string{"TERM=" + defaultTerm})
	}
	if err := s.table.reserve(); err != nil {
		return nil, err
	}
	p, err := s.spawnProcess(l, req)
	if err != nil {
		s.table.unreserve()
		e := errorFrom(err)
		if e.Code == agentwire.CodeInternal {
			e.Code, e.Status = agentwire.CodeStartFailed, http.StatusBadRequest
		}
		return nil, e
	}
	s.table.insert(p)
	return p, nil
}

// spawnProcess starts l: on a new terminal (as its session leader, the
// terminal its controlling one) when req.PTY is set, else in a process
// group of its own with pipes for its output and, when req.Stdin is set,
// its input. It starts the pumps and the monitor.
func (s *Server) spawnProcess(l launch, req agentwire.ProcessRequest) (*process, error) {
	// files are the child's fds 0, 1, 2, closed here once it has
	// started; ours are the agent's ends, closed too if it does not.
	var files, ours []*os.File
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	p := &process{
		info: agentwire.ProcessInfo{Cwd: l.dir, User: req.User, Tag: req.Tag},
		out:  newOutputBuffer(s.maxOutput), stdinTurn: make(chan struct{}, 1), done: make(chan struct{}),
	}
	if p.info.User == "" {
		p.info.User = s.user
	}
	p.info.Argv, p.info.ArgvTruncated = abbreviate(req.Argv, agentwire.MaxInfoArgv)
	// outputs are the ends the pumps read, with their frame types.
	var outputs []*os.File
	var types []byte
	sys := &syscall.SysProcAttr{Credential: l.cred}
	if req.PTY != nil {
		master, tty, err := openTerminal(*req.PTY)
		if err != nil {
			return nil, err
		}
		files, ours = []*os.File{tty, tty, tty}, []*os.File{master}
		outputs, types = []*os.File{master}, []byte{agentwire.FrameStdout}
		sys.Setsid, sys.Setctty, sys.Ctty = true, true, 0
		p.term = master
		sz := *req.PTY
		p.size = &sz
	} else {
		sys.Setpgid = true
		var stdinR *os.File
		var err error
		if req.Stdin {
			var stdinW *os.File
			if stdinR, stdinW, err = os.Pipe(); err == nil {
				ours = append(ours, stdinW)
				p.stdin, p.piped = stdinW, true
			}
		} else {
			stdinR, err = os.Open(os.DevNull)
		}
		if err != nil {
			return nil, err
		}
		files = append(files, stdinR)
		for _, typ := range []byte{agentwire.FrameStdout, agentwire.FrameStderr} {
			r, w, err := os.Pipe()
			if err != nil {
				closeAll(files)
				closeAll(ours)
				return nil, err
			}
			outputs, types = append(outputs, r), append(types, typ)
			ours, files = append(ours, r), append(files, w)
		}
	}
	child, err := s.waiter.Start(func() (int, error) {
		proc, err := os.StartProcess(l.prog, l.argv, &os.ProcAttr{Dir: l.dir, Env: l.env, Files: files, Sys: sys})
		if err != nil {
			return 0, err
		}
		// The Waiter collects the status; this handle only holds a pidfd.
		pid := proc.Pid
		_ = proc.Release()
		return pid, nil
	})
	closeAll(slices.Compact(files)) // a terminal is the same file three times
	if err != nil {
		closeAll(ours)
		return nil, err
	}
	p.child = child
	p.info.Pid, p.info.StartedAt = child.Pid(), time.Now()
	pumps := &sync.WaitGroup{}
	pumps.Add(len(outputs))
	for i, f := range outputs {
		go p.pump(types[i], f, pumps)
	}
	go p.monitor(time.Duration(req.TimeoutMS)*time.Millisecond, outputs, pumps)
	return p, nil
}
