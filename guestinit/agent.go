//go:build linux

package guestinit

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/mdlayher/vsock"
	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/guestinit/agent"
)

// agentEnv is the base environment of the processes the agent starts on
// the initramfs (PID 1's own, from the kernel, has no PATH). u-root's busybox binary
// and its command links live in /bbin; /bin/sh links to it too. The other
// directories are for what a data disk or a later image may bring.
var agentEnv = []string{
	"PATH=/bbin:/bin:/usr/bin:/sbin:/usr/sbin",
	"HOME=/",
	"TERM=linux",
}

// agentOptions are the agent's defaults: on the initramfs agentEnv and
// the agent's own working directory and credentials; in an image root the
// image's configuration (imageRoot.agentOptions).
func agentOptions(img *imageRoot) agent.Options {
	if img == nil {
		return agent.Options{Env: agentEnv}
	}
	env, dir, user, logDir := img.agentOptions()
	return agent.Options{Env: env, Dir: dir, User: user, LogDir: logDir}
}

// errNoVsock means the VM has no virtio-vsock device (or the kernel no
// vsock support): the agent is not started, and that is not a failure.
var errNoVsock = errors.New("no vsock device")

// startAgent serves the guest agent on vsock port agentwire.Port and starts
// the clock and RNG re-sync loop against the host (CID 2,
// agentwire.SyncPort), each on goroutines of their own that live as long as
// PID 1. The agent starts its processes through r, which must be reaping
// (Run) for their exits to be reported. It returns errNoVsock, and starts
// nothing, when the VM has no vsock device.
//
// The listener is bound to VMADDR_CID_ANY rather than to the guest's
// current CID: a forked VM comes back with a new CID, and a listener
// bound to the old one would no longer receive connections. Listening
// sockets survive the transport reset of a restore; connections do not,
// and the host reconnects.
func startAgent(r *Reaper, opts agent.Options) error {
	// The vsock core registers /dev/vsock even with no device, and then
	// reports the local CID as VMADDR_CID_ANY, or VMADDR_CID_LOCAL (1)
	// with the loopback transport (seen with our 6.1 kernel under QEMU
	// without a vsock device). A guest's CID from a virtio-vsock device
	// is 3 or more.
	cid, err := vsock.ContextID()
	if err != nil || !isGuestCID(cid) {
		return errNoVsock
	}
	l, err := vsock.ListenContextID(unix.VMADDR_CID_ANY, agentwire.Port, nil)
	if err != nil {
		return fmt.Errorf("agent: listen on vsock port %d: %w", agentwire.Port, err)
	}
	syncer := agent.NewSyncer(func(context.Context) (net.Conn, error) {
		// The kernel bounds connect (SO_VM_SOCKETS_CONNECT_TIMEOUT, 2 s).
		return vsock.Dial(vsock.Host, agentwire.SyncPort, nil)
	})
	syncer.OnError = newRepeatFilter(report).report
	opts.Sync = syncer
	srv := agent.NewServer(r, opts)
	syncer.SetEgress = func(e *agentwire.Egress) error {
		srv.SetExtraEnv(e.Env)
		return agent.ApplyTrust(e.TrustPEM)
	}
	go func() {
		err := srv.Serve(l)
		report(fmt.Errorf("agent: stopped serving: %w", err))
	}()
	go syncer.Run(context.Background())
	return nil
}

// isGuestCID reports whether cid is one a virtio-vsock device can give a
// guest: not VMADDR_CID_ANY and above the reserved 0 (hypervisor), 1
// (local) and 2 (host).
func isGuestCID(cid uint32) bool {
	return cid > unix.VMADDR_CID_HOST && cid != unix.VMADDR_CID_ANY
}

// repeatFilter passes an error on only when its text differs from the
// previous one's, so that a host without the re-sync service (a dial
// refused every 2 s, forever) prints one line, not one per attempt. It is
// used from one goroutine (the Syncer's Run) and has no lock.
type repeatFilter struct {
	out  func(error)
	last string
}

func newRepeatFilter(out func(error)) *repeatFilter { return &repeatFilter{out: out} }

func (f *repeatFilter) report(err error) {
	if msg := err.Error(); msg != f.last {
		f.last = msg
		f.out(err)
	}
}
