//go:build linux

package guestinit

import (
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

// Reaper collects exited children of PID 1: its own and every orphan the
// kernel reparents to it.
//
// It waits for any child (wait4(-1)), so it races with os/exec's
// Cmd.Wait: a later agent that starts processes from PID 1 must either
// run them from a different process or collect their status through the
// reaper instead of Cmd.Wait.
type Reaper struct {
	sigs chan os.Signal
}

// NewReaper subscribes to SIGCHLD. Call it before starting any child so
// that no exit goes unnoticed.
func NewReaper() *Reaper {
	r := &Reaper{sigs: make(chan os.Signal, 1)}
	signal.Notify(r.sigs, unix.SIGCHLD)
	return r
}

// ReapAll collects every child that has already exited, without blocking,
// and returns how many it collected.
func (r *Reaper) ReapAll() int {
	n := 0
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 { // ECHILD: no children; 0: none exited
			return n
		}
		n++
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
