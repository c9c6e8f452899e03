// Package vsockpeer is the host side of the guest agent for the peer VMM
// in Warren's benchmarks: QEMU with the kernel's vhost-vsock, reached over
// AF_VSOCK (Warren's own VMM is reached through its unix socket instead).
package vsockpeer

import (
	"context"
	"fmt"
	"net"

	"github.com/mdlayher/vsock"
	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/agentwire"
)

// Dial dials AF_VSOCK; vsock.Dial takes no context, so a ctx that ends
// first abandons the dial (its connection is closed when it lands).
func Dial(ctx context.Context, cid, port uint32) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := vsock.Dial(cid, port, nil)
		if err != nil {
			// Not a nil *vsock.Conn in a non-nil net.Conn.
			ch <- result{nil, err}
			return
		}
		ch <- result{c, nil}
	}()
	select {
	case r := <-ch:
		return r.c, r.err
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.c != nil {
				r.c.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// ServeSync answers the guest's clock and RNG re-sync connections (CID 2,
// agentwire.SyncPort) for a VMM whose vsock is the kernel's, as Warren's VMM
// does itself, so that the peer's guest is not retrying a refused connect
// in the background. Close the returned listener to stop.
func ServeSync() (net.Listener, error) {
	l, err := vsock.ListenContextID(unix.VMADDR_CID_ANY, agentwire.SyncPort, nil)
	if err != nil {
		return nil, fmt.Errorf("listen on vsock port %d: %w", agentwire.SyncPort, err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go agentclient.ServeSync(c)
		}
	}()
	return l, nil
}
