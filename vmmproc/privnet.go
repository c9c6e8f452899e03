package vmmproc

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// A VM with a private network (`warren run --private-net`, recorded in its
// snapshots) has its tap and the tap's egress services in a network
// namespace of its own, made when the VM is built: the tap, its host
// address, the filter's attachment and the resolver's and the credential
// proxy's listening sockets belong to that namespace, because they are
// made by a thread inside it. Everything the VMM makes afterwards on its
// other threads stays in the host's namespace; in particular the resolver's
// and the proxy's upstream connections go out through the host's network.
// So every sandbox can use the same tap name and addresses, and none can
// reach another's tap, without any routing set up for it. The namespace
// lives as long as something in it is open (the tap, the sockets): it ends
// with the VMM process.
//
// A thread that enters a namespace never leaves it: it runs a goroutine
// that stays locked to it until it returns, and the Go runtime then ends
// the thread, so no other goroutine ever runs in the private namespace by
// accident.

// inPrivateNetns makes a network namespace with its loopback up and runs
// fn on the thread that made it (so nothing needs setns, which the jail
// refuses a fork child), and returns a handle to it (the caller closes it
// when it needs it no more).
func inPrivateNetns(fn func() error) (netns.NsHandle, error) {
	h := netns.None()
	err := onLockedThread(func() error {
		var err error
		if h, err = netns.New(); err != nil {
			return fmt.Errorf("private network namespace: %w", err)
		}
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			return fmt.Errorf("private network namespace: loopback: %w", err)
		}
		return fn()
	})
	if err != nil && h.IsOpen() {
		h.Close()
		h = netns.None()
	}
	return h, err
}

// inNetns runs fn on a thread inside the namespace h.
func inNetns(h netns.NsHandle, fn func() error) error {
	return onLockedThread(func() error {
		if err := netns.Set(h); err != nil {
			return fmt.Errorf("enter the private network namespace: %w", err)
		}
		return fn()
	})
}

// onLockedThread runs fn in a new goroutine locked to its thread for good:
// whatever fn changes about the thread (its network namespace) dies with
// it.
func onLockedThread(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		errc <- fn()
	}()
	return <-errc
}
