package cli

// An interactive session with a process of the process API (warren exec
// -t / -i / --user, warren attach, warren logs -f): its output followed
// (and followed again, from the offset reached, when the stream breaks:
// a rollback, a daemon restart), standard input forwarded, and, for a
// process on a terminal, the local terminal in raw mode with its size
// kept in step.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/wire"
)

// detachKey, typed on a raw terminal, detaches from the process (which
// runs on): Ctrl-], as telnet's escape.
const detachKey = 0x1d

// session is one client's connection to a process.
type session struct {
	d       *daemonCmd
	id, pid string
	// forward copies d.stdin to the process; pty says it is on a
	// terminal (the local one then goes raw, when it is one).
	forward, pty bool
	// kill makes an interrupt kill the process (exec); otherwise the
	// client detaches and it runs on (attach, logs).
	kill bool
}

// localTerminal returns the descriptor of the command's standard input if
// it is a terminal.
func (d *daemonCmd) localTerminal() (int, bool) {
	f, ok := d.stdin.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return 0, false
	}
	return int(f.Fd()), true
}

// terminalSize is the local terminal's size, or 24x80 when there is none.
func (d *daemonCmd) terminalSize() wire.TerminalSize {
	if fd, ok := d.localTerminal(); ok {
		if w, h, err := term.GetSize(fd); err == nil && w > 0 && h > 0 {
			return wire.TerminalSize{Rows: uint16(min(h, 65535)), Cols: uint16(min(w, 65535))}
		}
	}
	return wire.TerminalSize{Rows: 24, Cols: 80}
}

// run follows the process's output from offset (negative: the oldest byte
// kept) to the command's stdout and stderr until it exits, forwarding
// input as the session says, and returns the command's exit code: the
// process's, or that of the interrupt, detach or failure.
func (s *session) run(offset int64) int {
	ctx, stop := context.WithCancel(s.d.ctx)
	defer stop()
	restore, raw := func() {}, false
	if fd, ok := s.d.localTerminal(); ok && s.pty {
		if st, err := term.MakeRaw(fd); err == nil {
			restore, raw = func() { term.Restore(fd, st) }, true
			go s.keepSize(ctx, fd)
		}
	}
	detached := make(chan struct{})
	if s.forward && s.d.stdin != nil {
		detach := make(chan struct{}, 1)
		go s.pumpStdin(ctx, raw, detach)
		go func() {
			select {
			case <-detach:
				close(detached)
				stop()
			case <-ctx.Done():
			}
		}()
	}
	exit, err := s.follow(ctx, offset)
	restore()
	select {
	case <-detached:
		fmt.Fprintf(s.d.stderr, "\n%s: detached; process %s runs on (warren attach %s %s)\n", s.d.name, s.pid, s.id, s.pid)
		return 0
	default:
	}
	switch {
	case exit != nil:
		if exit.TimedOut {
			fmt.Fprintf(s.d.stderr, "%s: timed out; the process was killed\n", s.d.name)
			return exitTimedOut
		}
		return *exit.Exit
	case s.d.ctx.Err() != nil && s.kill:
		kctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.d.c.RemoveProcess(kctx, s.id, s.pid)
		fmt.Fprintf(s.d.stderr, "%s: interrupted; the process in the guest was killed\n", s.d.name)
		return exitInterrupted
	case s.d.ctx.Err() != nil:
		fmt.Fprintf(s.d.stderr, "%s: interrupted; process %s runs on (warren attach %s %s)\n", s.d.name, s.pid, s.id, s.pid)
		return exitInterrupted
	}
	s.d.fail(err)
	return exitExecFailed
}

// maxReconnects is how many times in a row follow reconnects to a stream
// that broke without output in between.
const maxReconnects = 8

// follow streams the process's output from offset to the command's
// stdout and stderr until the exit frame, which it returns; a stream that
// breaks before it is followed again from the offset reached.
func (s *session) follow(ctx context.Context, offset int64) (*wire.ExecFrame, error) {
	next := offset
	var exit *wire.ExecFrame
	for tries := 0; ; tries++ {
		before := next
		err := s.d.c.ProcessOutput(ctx, s.id, s.pid, next, true, func(f wire.ExecFrame) error {
			if f.Start != nil {
				if f.Start.Dropped > 0 {
					fmt.Fprintf(s.d.stderr, "%s: %d bytes of output before offset %d are no longer kept\n", s.d.name, f.Start.Dropped, f.Start.Offset)
				}
				next = f.Start.Offset
			}
			if _, err := s.d.stdout.Write(f.Stdout); err != nil {
				return err
			}
			if _, err := s.d.stderr.Write(f.Stderr); err != nil {
				return err
			}
			next += int64(len(f.Stdout) + len(f.Stderr))
			if f.Exit != nil {
				exit = &f
			}
			return nil
		})
		if exit != nil || ctx.Err() != nil {
			return exit, ctx.Err()
		}
		if !reconnectable(err) {
			return nil, err
		}
		if next != before {
			tries = 0
		}
		if tries >= maxReconnects {
			return nil, fmt.Errorf("the output stream broke %d times: %w (warren logs --offset %d -f %s %s goes on from here)", tries, err, next, s.id, s.pid)
		}
		select {
		case <-time.After(time.Duration(100<<min(tries, 5)) * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// reconnectable says a followed output stream ended in a way a new
// request may get past: it broke, or the daemon ended it (a 502 error
// line: the agent's stream failed, the sandbox was rolled back).
func reconnectable(err error) bool {
	var ce *client.Error
	return errors.Is(err, client.ErrStreamEnded) || errors.As(err, &ce) && ce.Status == http.StatusBadGateway
}

// pumpStdin copies the command's standard input to the process, a
// request per read (keystrokes go as they are typed), and closes the
// process's input at its end. On a raw terminal, detachKey stops it and
// signals detach instead.
func (s *session) pumpStdin(ctx context.Context, raw bool, detach chan<- struct{}) {
	buf := make([]byte, 32<<10)
	for {
		n, err := s.d.stdin.Read(buf)
		b := buf[:n]
		if i := bytes.IndexByte(b, detachKey); raw && i >= 0 {
			if i > 0 {
				s.d.c.SendStdin(ctx, s.id, s.pid, bytes.NewReader(b[:i]), false)
			}
			detach <- struct{}{}
			return
		}
		if n > 0 {
			if s.d.c.SendStdin(ctx, s.id, s.pid, bytes.NewReader(b), false) != nil {
				return // the process's input is closed (it exited), or the session ends
			}
		}
		if err != nil {
			if err == io.EOF {
				s.d.c.SendStdin(ctx, s.id, s.pid, nil, true)
			}
			return
		}
	}
}

// keepSize sets the process's terminal to the local terminal's size now
// and at each SIGWINCH, until ctx ends.
func (s *session) keepSize(ctx context.Context, fd int) {
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	for {
		if w, h, err := term.GetSize(fd); err == nil && w > 0 && h > 0 {
			s.d.c.ResizeProcess(ctx, s.id, s.pid, wire.TerminalSize{Rows: uint16(min(h, 65535)), Cols: uint16(min(w, 65535))})
		}
		select {
		case <-winch:
		case <-ctx.Done():
			return
		}
	}
}
