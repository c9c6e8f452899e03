//go:build linux

package agent

import (
	"errors"
	"fmt"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrReaped is returned by Child.SignalGroup once the child has been
// reaped: its pid, and with it the process group id, may have been reused.
var ErrReaped = errors.New("agent: process already reaped")

// Waiter starts the agent's children and collects their exit statuses.
//
// The invariant every Waiter keeps: a child's exit status is never
// collected by anyone before the child is registered with the Waiter, and
// after it is collected the child is never signalled again. In the guest
// PID 1's reaper waits for any child (wait4(-1)), so the agent cannot use
// os/exec's Wait, which would race with it; instead the reaper itself is
// the Waiter (see guestinit.Reaper): Start forks the child while holding
// the mutex the reaper holds around each wait4, and registers the pid
// before releasing it.
type Waiter interface {
	// Start calls start, which must start exactly one child process and
	// return its pid (and must not wait for it), and registers that child.
	// When start fails Start returns its error and registers nothing.
	Start(start func() (pid int, err error)) (Child, error)
}

// Child is a process started through a Waiter.
type Child interface {
	// Pid is the child's process id (and process group id).
	Pid() int
	// Wait blocks until the child has exited and has been reaped, and
	// returns its wait status. Only one goroutine may call Wait, once.
	Wait() (syscall.WaitStatus, error)
	// SignalGroup sends sig to the child's process group (the child must
	// have been started as a group leader) if the child has not been
	// reaped yet, and ErrReaped after. It is safe to call from any
	// goroutine, also concurrently with Wait.
	SignalGroup(sig syscall.Signal) error
}

// ProcessWaiter is a Waiter for an agent that is not PID 1 and whose
// children nobody else reaps (tests, or an agent run as an ordinary
// process). Its zero value is ready to use.
type ProcessWaiter struct{}

// Start implements Waiter.
func (ProcessWaiter) Start(start func() (int, error)) (Child, error) {
	pid, err := start()
	if err != nil {
		return nil, err
	}
	return &processChild{pid: pid}, nil
}

// processChild waits for one child by pid. It first waits without reaping
// (waitid with WNOWAIT), so that the pid stays allocated while mu is not
// held, then reaps under mu; SignalGroup signals only under mu and before
// the reap, so it can never reach a reused pid.
type processChild struct {
	pid int
	mu  sync.Mutex
	// reaped is set, under mu, in the same critical section as the reap.
	reaped bool // +checklocks:mu
}

func (c *processChild) Pid() int { return c.pid }

func (c *processChild) Wait() (syscall.WaitStatus, error) {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, c.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("agent: waitid %d: %w", c.pid, err)
		}
		break
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var ws unix.WaitStatus
	for {
		pid, err := unix.Wait4(c.pid, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("agent: wait4 %d: %w", c.pid, err)
		}
		if pid != c.pid {
			return 0, fmt.Errorf("agent: wait4 %d: child not exited after waitid", c.pid)
		}
		break
	}
	c.reaped = true
	return syscall.WaitStatus(ws), nil
}

func (c *processChild) SignalGroup(sig syscall.Signal) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reaped {
		return ErrReaped
	}
	return unix.Kill(-c.pid, sig)
}
