//go:build linux

package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/agentwire"
)

// Syncer is the guest side of the re-sync protocol (see agentwire.SyncMessage): it
// keeps a connection to the host's re-sync service, applies each message
// it receives, and reconnects whenever the connection fails, which after
// a snapshot restore it does at once (the transport reset).
//
// Set the exported fields before Run; they must not change after. Run is
// the only goroutine that dials and applies; Stats may be called from
// any goroutine.
type Syncer struct {
	dial func(context.Context) (net.Conn, error)

	// SetClock sets the guest's CLOCK_REALTIME; the default is
	// SetRealtime.
	SetClock func(time.Time) error
	// AddEntropy adds bytes to the kernel's random pool, credited; the
	// default is AddEntropy.
	AddEntropy func([]byte) error
	// SetIdentity applies a message's identity (a forked child's); the
	// default is ApplyIdentity.
	SetIdentity func(*agentwire.Identity) error
	// SetEgress applies a message's egress configuration (trust store and
	// placeholder environment); nil ignores it. The agent's PID 1 sets it
	// to ApplyTrust plus its server's SetExtraEnv.
	SetEgress func(*agentwire.Egress) error
	// OnError, if non-nil, is told about every failure (dial, a bad line,
	// a failed apply). A connection that ends after a message was applied
	// is expected (a restore) and is not an error.
	OnError func(error)
	// MinBackoff and MaxBackoff bound the wait before reconnecting: it
	// starts at MinBackoff (also the wait after a connection that had
	// applied its message) and doubles after each failure up to
	// MaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// LineTimeout bounds the wait for the host's line after connecting.
	LineTimeout time.Duration

	mu sync.Mutex
	// stats counts the applied messages. +checklocks:mu
	stats SyncStats
}

// SyncStats counts the re-syncs a Syncer has applied.
type SyncStats struct {
	// Count is the number of messages applied.
	Count uint64
	// Last is when the last one was applied, read from the clock after
	// setting it; zero if none was.
	Last time.Time
}

// NewSyncer returns a Syncer that reaches the host through dial (in the
// guest, a vsock dial of CID 2, agentwire.SyncPort), with the default
// hooks, a 50 ms to 2 s backoff and a 5 s line timeout.
func NewSyncer(dial func(context.Context) (net.Conn, error)) *Syncer {
	return &Syncer{
		dial:        dial,
		SetClock:    SetRealtime,
		AddEntropy:  AddEntropy,
		SetIdentity: ApplyIdentity,
		MinBackoff:  50 * time.Millisecond,
		MaxBackoff:  2 * time.Second,
		LineTimeout: 5 * time.Second,
	}
}

// Stats returns the counters.
func (s *Syncer) Stats() SyncStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Run syncs until ctx is done, then closes its connection and returns.
func (s *Syncer) Run(ctx context.Context) {
	backoff := s.MinBackoff
	for ctx.Err() == nil {
		applied, err := s.session(ctx)
		if err != nil && ctx.Err() == nil && s.OnError != nil {
			s.OnError(err)
		}
		if applied {
			backoff = s.MinBackoff
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if !applied {
			backoff = min(2*backoff, s.MaxBackoff)
		}
	}
}

// session runs one connection: dial, read and apply the line, then wait
// for the connection to end. applied says the message was applied.
func (s *Syncer) session(ctx context.Context) (applied bool, err error) {
	c, err := s.dial(ctx)
	if err != nil {
		return false, fmt.Errorf("sync: dial: %w", err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()

	if err := c.SetReadDeadline(time.Now().Add(s.LineTimeout)); err != nil {
		return false, fmt.Errorf("sync: %w", err)
	}
	br := bufio.NewReaderSize(c, agentwire.MaxSyncLine)
	line, err := br.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			err = fmt.Errorf("line longer than %d bytes", agentwire.MaxSyncLine)
		}
		return false, fmt.Errorf("sync: read line: %w", err)
	}
	m, err := agentwire.ParseSyncMessage(line)
	if err != nil {
		return false, err
	}
	if err := s.apply(m); err != nil {
		// Retrying would not help (say, no CAP_SYS_TIME): report it and
		// keep the connection, so that the next restore still syncs.
		if s.OnError != nil && ctx.Err() == nil {
			s.OnError(err)
		}
	}
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		return true, fmt.Errorf("sync: %w", err)
	}
	// The host sends nothing more; this returns when the connection is
	// reset (restore, fork), closed by the host, or closed by ctx.
	_, _ = io.Copy(io.Discard, br)
	return true, nil
}

// apply sets the clock, adds the entropy and applies the identity, if
// any; it counts the sync only if all succeeded.
func (s *Syncer) apply(m agentwire.SyncMessage) error {
	errClock := s.SetClock(time.Unix(0, m.UnixNanos))
	if errClock != nil {
		errClock = fmt.Errorf("sync: set clock: %w", errClock)
	}
	errRand := s.AddEntropy(m.Entropy)
	if errRand != nil {
		errRand = fmt.Errorf("sync: add entropy: %w", errRand)
	}
	var errID error
	if m.Identity != nil && s.SetIdentity != nil {
		errID = s.SetIdentity(m.Identity)
	}
	var errEgress error
	if m.Egress != nil && s.SetEgress != nil {
		errEgress = s.SetEgress(m.Egress)
	}
	if err := errors.Join(errClock, errRand, errID, errEgress); err != nil {
		return err
	}
	s.mu.Lock()
	s.stats.Count++
	s.stats.Last = time.Now()
	s.mu.Unlock()
	return nil
}

// SetRealtime sets CLOCK_REALTIME to t (needs CAP_SYS_TIME).
func SetRealtime(t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	return unix.ClockSettime(unix.CLOCK_REALTIME, &ts)
}

// AddEntropy writes b into the kernel's random pool with the RNDADDENTROPY
// ioctl on /dev/random, crediting 8 bits per byte (needs CAP_SYS_ADMIN).
// The host's CSPRNG output is full entropy from the guest's point of view.
func AddEntropy(b []byte) error {
	f, err := os.OpenFile("/dev/random", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	words := make([]uint32, 2+(len(b)+3)/4)
	words[0] = uint32(8 * len(b))
	words[1] = uint32(len(b))
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), 4*len(words))
	copy(raw[8:], b)
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno unix.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&words[0])))
	}); err != nil {
		return err
	}
	if errno != 0 {
		return fmt.Errorf("ioctl RNDADDENTROPY: %w", errno)
	}
	return nil
}
