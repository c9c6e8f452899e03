package agentclient

import (
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/warrenvm/warren/agentwire"
)

// SyncService is the host side of the re-sync protocol (see
// agentwire.SyncMessage) for one VM whose identity may change (a forked
// child's is set before its guest runs).
// Serve is safe for concurrent use; SetIdentity may be called any time.
type SyncService struct {
	identity atomic.Pointer[agentwire.Identity]
	egress   atomic.Pointer[agentwire.Egress]
}

// SetEgress makes every later sync line carry e (nil: none).
func (s *SyncService) SetEgress(e *agentwire.Egress) { s.egress.Store(e) }

// SetIdentity makes every later sync line carry id (nil: none).
func (s *SyncService) SetIdentity(id *agentwire.Identity) { s.identity.Store(id) }

// Identity is the identity sync lines carry now, or nil.
func (s *SyncService) Identity() *agentwire.Identity { return s.identity.Load() }

// Serve is ServeSync with the service's identity in the line.
func (s *SyncService) Serve(c net.Conn) {
	defer c.Close()
	m := agentwire.NewSyncMessage(time.Now())
	m.Identity = s.identity.Load()
	m.Egress = s.egress.Load()
	if _, err := c.Write(m.MarshalLine()); err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, c)
}

// ServeSync is the host side of one re-sync connection: it writes the line
// for time.Now() with fresh entropy, then reads (and discards) until the
// guest closes the connection or it fails, and closes it. The VMM runs it
// on its own goroutine for each guest connection to agentwire.SyncPort.
func ServeSync(c net.Conn) {
	defer c.Close()
	if _, err := c.Write(agentwire.NewSyncMessage(time.Now()).MarshalLine()); err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, c)
}
