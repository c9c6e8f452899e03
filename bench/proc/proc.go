// Package proc stops the benchmarks' VMM and QEMU processes the way a user
// would.
package proc

import (
	"fmt"
	"syscall"
	"time"
)

// StopGroup stops the process group led by pid: SIGTERM (both Warren and
// QEMU stop their VM and exit), SIGKILL only if that takes over 10 s (in
// the nested KVM host, SIGKILLed VMMs were followed by L1 soft lockups),
// and a warning, not a hang, if it is still not gone 30 s later. exited is
// closed when the process has been waited for; name is for the warning.
func StopGroup(pid int, exited <-chan struct{}, name string) {
	syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-exited:
		return
	case <-time.After(10 * time.Second):
	}
	syscall.Kill(-pid, syscall.SIGKILL)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		fmt.Printf("warning: %s (pid %d) not gone 30s after SIGKILL; going on\n", name, pid)
	}
}
