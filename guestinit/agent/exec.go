//go:build linux

package agent

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/warrenvm/warren/agentwire"
)

// drainGrace is how long output pipes are still read after the process
// exits, for data that descendants holding the pipes may still write.
const drainGrace = time.Second

// mergeEnv returns base with extra's KEY=VALUE entries replacing or
// adding variables.
func mergeEnv(base, extra []string) []string {
	idx := map[string]int{}
	out := make([]string, 0, len(base)+len(extra))
	for _, kv := range append(append([]string(nil), base...), extra...) {
		k, _, _ := strings.Cut(kv, "=")
		if i, ok := idx[k]; ok {
			out[i] = kv
			continue
		}
		idx[k] = len(out)
		out = append(out, kv)
	}
	return out
}

// lookPath finds prog in the PATH of env.
func lookPath(prog string, env []string) (string, error) {
	if strings.Contains(prog, "/") {
		return prog, nil
	}
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, prog)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", &agentwire.Error{Message: prog + ": executable file not found in PATH", Code: agentwire.CodeNotFound, Status: http.StatusNotFound}
}

// frameWriter serializes frames from several goroutines onto the response.
type frameWriter struct {
	mu  sync.Mutex
	w   io.Writer
	rc  *http.ResponseController
	err error
}

// write writes one frame and flushes it to the client, except the final
// FrameExit or FrameError: net/http flushes that together with the end of
// the chunked stream when the handler returns, one write (one vsock
// packet) instead of two.
func (fw *frameWriter) write(typ byte, p []byte) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if fw.err != nil {
		return fw.err
	}
	if err := agentwire.WriteFrame(fw.w, typ, p); err != nil {
		fw.err = err
		return err
	}
	if typ == agentwire.FrameExit || typ == agentwire.FrameError {
		return nil
	}
	if err := fw.rc.Flush(); err != nil {
		fw.err = err
	}
	return fw.err
}

// proc is a process started by /exec: its Child and whether the agent
// killed it at its timeout.
type proc struct {
	pid   int
	child Child
	mu    sync.Mutex
	// timedOut records that the timeout's SIGKILL was delivered.
	timedOut bool // +checklocks:mu
}

// kill SIGKILLs the process group unless the leader was already reaped
// (after which its pid, and so the group id, may be reused: Child
// guarantees that).
func (p *proc) kill(timeout bool) {
	err := p.child.SignalGroup(syscall.SIGKILL)
	if timeout && err == nil {
		p.mu.Lock()
		p.timedOut = true
		p.mu.Unlock()
	}
}

// readErrorReader records whether the request body failed (the client went
// away) as opposed to the process's stdin.
type readErrorReader struct {
	r   io.Reader
	err error
}

func (r *readErrorReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF {
		r.err = err
	}
	return n, err
}

func (s *Server) handleExec(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, r, "POST")
		return
	}
	rc := http.NewResponseController(w)
	br := bufio.NewReader(r.Body)
	line, err := br.ReadBytes('\n')
	if err != nil && (err != io.EOF || len(line) == 0) {
		writeError(w, badRequest("read exec request: %v", err))
		return
	}
	var req agentwire.ExecRequest
	if err := json.Unmarshal(line, &req); err != nil {
		writeError(w, badRequest("decode exec request: %v", err))
		return
	}
	decoded := time.Now() // the start of ExitStatus.AgentNs
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		writeError(w, badRequest("empty argv"))
		return
	}
	if !req.Stdin {
		// Reading to EOF lets net/http watch the connection, so that a
		// client disconnect cancels r.Context().
		_, _ = io.Copy(io.Discard, br)
	} else if err := rc.EnableFullDuplex(); err != nil {
		writeError(w, errorFrom(err))
		return
	}

	l, err := s.resolve(req.Argv, req.Env, req.Cwd, req.User)
	if err != nil {
		writeError(w, errorFrom(err))
		return
	}

	// files are the child's ends (stdin, stdout, stderr), closed once it
	// has started; ours the agent's, closed too if it does not start.
	var files, ours []*os.File
	closeAll := func(fs []*os.File) {
		for _, f := range fs {
			f.Close()
		}
	}
	var stdinR, stdinW *os.File
	if req.Stdin {
		stdinR, stdinW, err = os.Pipe()
		if err == nil {
			ours = append(ours, stdinW)
		}
	} else {
		stdinR, err = os.Open(os.DevNull)
	}
	if err != nil {
		writeError(w, errorFrom(err))
		return
	}
	files = append(files, stdinR)
	var outputs [2]*os.File // our ends of stdout and stderr
	for i := range outputs {
		r, wr, err := os.Pipe()
		if err != nil {
			closeAll(files)
			closeAll(ours)
			writeError(w, errorFrom(err))
			return
		}
		outputs[i] = r
		ours = append(ours, r)
		files = append(files, wr)
	}
	outR, errR := outputs[0], outputs[1]

	child, err := s.waiter.Start(func() (int, error) {
		process, err := os.StartProcess(l.prog, l.argv, &os.ProcAttr{
			Dir:   l.dir,
			Env:   l.env,
			Files: files,
			Sys:   &syscall.SysProcAttr{Setpgid: true, Credential: l.cred},
		})
		if err != nil {
			return 0, err
		}
		// The Waiter collects the status; this handle only holds a pidfd.
		pid := process.Pid
		_ = process.Release()
		return pid, nil
	})
	closeAll(files)
	if err != nil {
		closeAll(ours)
		e := errorFrom(err)
		if e.Code == agentwire.CodeInternal {
			e.Code, e.Status = agentwire.CodeStartFailed, http.StatusBadRequest
		}
		writeError(w, e)
		return
	}
	p := &proc{pid: child.Pid(), child: child}
	s.addProc(p)
	defer s.removeProc(p)

	w.Header().Set(agentwire.PidHeader, strconv.Itoa(p.pid))
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	fw := &frameWriter{w: w, rc: rc}
	_ = rc.Flush()

	// Output: each pipe on its own goroutine; a failed write means the
	// client is gone, so the process group is killed.
	var outWG sync.WaitGroup
	pump := func(typ byte, f *os.File) {
		defer outWG.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := f.Read(buf)
			if n > 0 && fw.write(typ, buf[:n]) != nil {
				p.kill(false)
				// Keep draining so that the process does not block on
				// a full pipe before the SIGKILL lands.
			}
			if err != nil {
				return
			}
		}
	}
	outWG.Add(2)
	go pump(agentwire.FrameStdout, outR)
	go pump(agentwire.FrameStderr, errR)

	// Stdin: its own goroutine, so a process that never reads does not
	// hold up its output.
	stdinDone := make(chan struct{})
	var body *readErrorReader
	if stdinW != nil {
		body = &readErrorReader{r: br}
		go func() {
			defer close(stdinDone)
			_, _ = io.Copy(stdinW, body)
			stdinW.Close()
			if body.err != nil {
				p.kill(false)
			}
		}()
	} else {
		close(stdinDone)
	}

	// Wait for exit, killing on timeout or disconnect meanwhile.
	type result struct {
		ws  syscall.WaitStatus
		err error
	}
	waited := make(chan result, 1)
	go func() {
		ws, err := p.child.Wait()
		waited <- result{ws, err}
	}()
	var timeout <-chan time.Time
	if req.TimeoutMS > 0 {
		t := time.NewTimer(time.Duration(req.TimeoutMS) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	gone := r.Context().Done()
	var res result
wait:
	for {
		select {
		case res = <-waited:
			break wait
		case <-timeout:
			p.kill(true)
			timeout = nil
		case <-gone:
			p.kill(false)
			gone = nil
		}
	}

	// Drain output: descendants may hold the pipes open, so stop after a
	// grace period.
	drained := make(chan struct{})
	go func() { outWG.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainGrace):
		outR.SetReadDeadline(time.Now())
		errR.SetReadDeadline(time.Now())
		<-drained
	}
	outR.Close()
	errR.Close()

	// The request body must not be read after the handler returns.
	if stdinW != nil {
		select {
		case <-stdinDone:
		default:
			_ = rc.SetReadDeadline(time.Now())
			stdinW.Close()
			<-stdinDone
		}
	}

	if res.err != nil {
		b, _ := json.Marshal(&agentwire.Error{Message: "wait: " + res.err.Error(), Code: agentwire.CodeInternal})
		_ = fw.write(agentwire.FrameError, b)
		return
	}
	p.mu.Lock()
	st := agentwire.ExitStatus{TimedOut: p.timedOut}
	p.mu.Unlock()
	st.Code, st.Signal = exitCode(res.ws)
	st.AgentNs = int64(time.Since(decoded))
	b, _ := json.Marshal(st)
	_ = fw.write(agentwire.FrameExit, b)
}

// exitCode is a wait status as a shell reports it: the exit code, or
// 128+N and the signal's name for a process killed by signal N; -1 for
// anything else.
func exitCode(ws syscall.WaitStatus) (code int, signal string) {
	switch {
	case ws.Exited():
		return ws.ExitStatus(), ""
	case ws.Signaled():
		return 128 + int(ws.Signal()), sigName(ws.Signal())
	}
	return -1, ""
}

// sigName names a signal like "SIGKILL".
func sigName(sig syscall.Signal) string {
	switch sig {
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGHUP:
		return "SIGHUP"
	case syscall.SIGPIPE:
		return "SIGPIPE"
	case syscall.SIGSEGV:
		return "SIGSEGV"
	case syscall.SIGABRT:
		return "SIGABRT"
	}
	return sig.String()
}

// execArgv is the argv a process is started with: argv[0] found in PATH is
// replaced by the path it was found at. u-root's busybox binary picks the
// command from argv[0] and follows its symlink chain (/bin/sh -> gosh ->
// bb) only when argv[0] is a path; a bare "sh" would not run.
func execArgv(argv []string, prog string) []string {
	if strings.Contains(argv[0], "/") {
		return argv
	}
	return append([]string{prog}, argv[1:]...)
}
