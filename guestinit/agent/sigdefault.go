//go:build linux

package agent

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// childDefaultSignals are the signals whose disposition a program may
// inherit as "ignored" and that a command run through the agent must
// nevertheless start with at their default: nohup ignores SIGHUP, a
// non-interactive shell starts its background jobs with SIGINT and SIGQUIT
// ignored, and some supervisors ignore SIGPIPE or the job-control signals.
var childDefaultSignals = []os.Signal{
	syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM, syscall.SIGPIPE,
	syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGALRM, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU,
}

var childSignalsOnce sync.Once

// resetChildSignals makes every process the agent starts begin with the
// default action for childDefaultSignals, as a process a user starts in a
// fresh session would, whatever the agent itself inherited.
//
// execve keeps ignored signals ignored but resets caught ones to their
// default, and os.StartProcess cannot change dispositions in the child. So
// for each such signal that this process ignores, the agent catches it
// instead, into a channel nobody reads: the agent still ignores it in
// effect (a full channel drops the signal), and its children start with the
// default. Signals that are not ignored are left alone.
func resetChildSignals() {
	childSignalsOnce.Do(func() {
		sink := make(chan os.Signal, 1)
		for _, sig := range childDefaultSignals {
			if signal.Ignored(sig) {
				signal.Notify(sink, sig)
			}
		}
	})
}
