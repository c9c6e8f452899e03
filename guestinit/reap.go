//go:build linux

package guestinit

import (
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/guestinit/agent"
)

// Reaper collects exited children of PID 1: its own, the agent's, and
// every orphan the kernel reparents to it. It is also the agent's
// agent.Waiter.
//
// Who reaps: only the Reaper calls wait4 in PID 1, always wait4(-1) and
// always while holding mu; nothing else in PID 1 may wait (no os/exec
// Cmd.Wait, no os.Process.Wait). Who may wait for what: a child started
// through Start is registered in children in the same critical section
// as its fork, so its exit is never collected before it is registered;
// the reaper hands its status to the child's channel and forgets it, and
// only the agent's Child.Wait reads that channel. Statuses of
// unregistered pids (orphans, the debug shell) are dropped.
type Reaper struct {
	sigs chan os.Signal

	// mu is held around each wait4 and around each Start (fork plus
	// registration), so that a registered child can only be reaped after
	// registration and a child is only signalled before it is reaped.
	mu sync.Mutex
	// children maps the pids of registered, not yet reaped children to
	// their Child. +checklocks:mu
	children map[int]*reapedChild
}

// NewReaper subscribes to SIGCHLD. Call it before starting any child so
// that no exit goes unnoticed.
func NewReaper() *Reaper {
	r := &Reaper{sigs: make(chan os.Signal, 1), children: map[int]*reapedChild{}}
	signal.Notify(r.sigs, unix.SIGCHLD)
	return r
}

// ReapAll collects every child that has already exited, without blocking,
// and returns how many it collected. The status of a registered child
// goes to its Child; every other status is dropped.
func (r *Reaper) ReapAll() int {
	n := 0
	for r.reapOne() {
		n++
	}
	return n
}

// reapOne collects one exited child, if there is one.
func (r *Reaper) reapOne() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 { // ECHILD: no children; 0: none exited
			return false
		}
		if c, ok := r.children[pid]; ok {
			delete(r.children, pid)
			c.reaped = true
			c.status <- syscall.WaitStatus(ws) // buffered, never blocks
		}
		return true
	}
}

// Run reaps forever. Signals coalesce, so each SIGCHLD drains all exited
// children, and one drain runs first for those that exited before
// NewReaper.
func (r *Reaper) Run() {
	r.ReapAll()
	for range r.sigs {
		r.ReapAll()
	}
}

// Start implements agent.Waiter: it runs start (the fork) and registers
// the new pid while holding the lock the reaper takes around wait4.
// Run must be running (or ReapAll be called on SIGCHLD) for Wait to
// return.
func (r *Reaper) Start(start func() (int, error)) (agent.Child, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := start()
	if err != nil {
		return nil, err
	}
	c := &reapedChild{r: r, pid: pid, status: make(chan syscall.WaitStatus, 1)}
	r.children[pid] = c
	return c, nil
}

// reapedChild is a child registered with a Reaper.
type reapedChild struct {
	r   *Reaper
	pid int
	// status receives the wait status once, from the reaper.
	status chan syscall.WaitStatus
	// reaped is set when the reaper collected the child.
	// +checklocks:r.mu
	reaped bool
}

func (c *reapedChild) Pid() int { return c.pid }

func (c *reapedChild) Wait() (syscall.WaitStatus, error) { return <-c.status, nil }

func (c *reapedChild) SignalGroup(sig syscall.Signal) error {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	if c.reaped {
		return agent.ErrReaped
	}
	return unix.Kill(-c.pid, sig)
}

var _ agent.Waiter = (*Reaper)(nil)
