//go:build linux

package agent

import (
	"fmt"
	"os"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/agentwire"
)

// openTerminal opens a new pseudo-terminal of size: its master side (the
// agent's: reads are the terminal's output, writes its input) and its
// terminal (the child's fds 0, 1 and 2; the caller closes it once the
// child has started).
//
// The master is non-blocking and in Go's poller, so that its reads and
// writes honour deadlines: a terminal that a descendant of the process
// keeps open, or a process that reads no input, must not hold up the
// agent's goroutines for good.
func openTerminal(size agentwire.TerminalSize) (master, tty *os.File, err error) {
	ptmx, tty, err := pty.Open()
	if err != nil {
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	// creack/pty's ioctls go through Fd, which leaves the File in
	// blocking mode for good. A new File of a non-blocking duplicate is
	// in the poller (os.NewFile); the duplicate shares the terminal.
	fd, err := unix.FcntlInt(ptmx.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	ptmx.Close()
	if err == nil {
		err = unix.SetNonblock(fd, true)
		if err != nil {
			unix.Close(fd)
		}
	}
	if err != nil {
		tty.Close()
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	master = os.NewFile(uintptr(fd), "/dev/ptmx")
	if err := setTerminalSize(master, size); err != nil {
		master.Close()
		tty.Close()
		return nil, nil, err
	}
	return master, tty, nil
}

// setTerminalSize sets the terminal's window size (TIOCSWINSZ on its
// master side); the kernel sends SIGWINCH to its foreground process group.
// It goes through the file's raw connection rather than Fd (which the
// creack/pty helpers use), which would put the master back in blocking
// mode and end its read deadlines.
func setTerminalSize(master *os.File, size agentwire.TerminalSize) error {
	rc, err := master.SyscallConn()
	if err != nil {
		return fmt.Errorf("set terminal size: %w", err)
	}
	var ioErr error
	err = rc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: size.Rows, Col: size.Cols})
	})
	if err == nil {
		err = ioErr
	}
	if err != nil {
		return fmt.Errorf("set terminal size %dx%d: %w", size.Rows, size.Cols, err)
	}
	return nil
}
