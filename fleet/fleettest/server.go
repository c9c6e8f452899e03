package fleettest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// logTail is how much of a server's log a failure prints.
const logTail = 32 << 10

// stopGrace is how long a server has to exit after SIGTERM before it
// gets SIGKILL, unless startServer is told otherwise.
const stopGrace = 10 * time.Second

// errPortTaken says a server could not bind one of the ports it was
// given (another process took it after freePorts let it go): the caller
// picks new ports and starts again.
var errPortTaken = errors.New("a port was taken meanwhile")

// server is one process a test started; it lives until the test ends.
type server struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	// exited is closed when cmd.Wait has returned; waitErr is its result,
	// written before.
	exited  chan struct{}
	waitErr error
	// grace is how long terminate waits after SIGTERM; 0: SIGKILL at once.
	grace time.Duration
	stop  sync.Once
}

// startServer runs bin with args in dir, its output to logPath, with a
// minimal environment (HOME and TMPDIR are dir: nothing of the user's
// configuration reaches it). The test's cleanup stops it (terminate,
// with grace) and, when the test failed, prints the end of its log.
func startServer(t testing.TB, name, dir, logPath string, grace time.Duration, bin string, args ...string) (*server, error) {
	t.Helper()
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = []string{"HOME=" + dir, "TMPDIR=" + dir, "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C"}
	cmd.Stdout, cmd.Stderr = f, f
	// Dies with the test binary even when that is killed (no cleanup
	// runs then).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	s := &server{name: name, logPath: logPath, cmd: cmd, exited: make(chan struct{}), grace: grace}
	go func() {
		s.waitErr = cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() {
		s.terminate()
		if t.Failed() {
			t.Logf("%s log (%s), its end:\n%s", s.name, s.logPath, s.tail())
		}
	})
	return s, nil
}

// terminate stops the server: SIGTERM, then SIGKILL after its grace
// (at once without one). It returns once the process has exited; calling
// it again does nothing.
func (s *server) terminate() {
	s.stop.Do(func() {
		if s.grace > 0 {
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-s.exited:
				return
			case <-time.After(s.grace):
			}
		}
		_ = s.cmd.Process.Kill()
		<-s.exited
	})
}

// tail is the last logTail bytes of the server's log.
func (s *server) tail() string {
	f, err := os.Open(s.logPath)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > logTail {
		_, _ = f.Seek(-logTail, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// waitReady calls probe every 100 ms until it returns nil, the server
// exits (an error with the end of its log; errPortTaken among its causes
// when the log says a port was in use) or ctx ends (an error with
// probe's last answer).
func (s *server) waitReady(ctx context.Context, probe func(context.Context) error) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		last = probe(pctx)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-s.exited:
			log := s.tail()
			err := fmt.Errorf("%s exited before it was ready (%v); its log ends:\n%s", s.name, s.waitErr, log)
			if strings.Contains(log, "address already in use") {
				err = fmt.Errorf("%w: %w", errPortTaken, err)
			}
			return err
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w (last: %v)", s.name, ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// freePorts returns n distinct loopback TCP ports that were free a moment
// ago (each bound at once, then let go). A server that then fails to bind
// one reports errPortTaken and is started again on new ones.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// startAttempts is how often a server is started on fresh ports when
// one of its ports was taken meanwhile.
const startAttempts = 3

// withPorts calls start with n free ports until it succeeds, fails for
// another reason than errPortTaken, or startAttempts are used.
func withPorts(n int, start func(ports []int) error) error {
	var err error
	for range startAttempts {
		var ports []int
		if ports, err = freePorts(n); err != nil {
			return err
		}
		if err = start(ports); !errors.Is(err, errPortTaken) {
			return err
		}
	}
	return err
}
