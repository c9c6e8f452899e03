// Package nsenter runs a function inside a named network namespace (one
// that `ip netns add NAME` made, bound at /run/netns/NAME), for the tests
// and benchmarks that keep their taps, bridges and sockets away from the
// host's network.
package nsenter

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Net runs fn on an OS thread of its own that has entered the network
// namespace named ns, and returns fn's error. Descriptors fn opens (taps,
// sockets) stay in ns. Afterwards the thread switches back to the
// namespace it came from; a thread that cannot is discarded (left locked,
// so that the runtime ends it) rather than returned to other goroutines.
func Net(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		target, err := os.Open("/run/netns/" + ns)
		if err != nil {
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		err = fn()
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}
