//go:build linux

package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenvm/warren/agentwire"
)

// fakeHost accepts re-sync connections on a unix socket and serves them
// the given messages in turn; after serving one it closes the connection
// when told to (a simulated transport reset).
type fakeHost struct {
	l     net.Listener
	msgs  chan agentwire.SyncMessage
	reset chan struct{}
	conns chan struct{}
}

func newFakeHost(t *testing.T) *fakeHost {
	l, err := net.Listen("unix", t.TempDir()+"/sync.sock")
	if err != nil {
		t.Fatal(err)
	}
	h := &fakeHost{l: l, msgs: make(chan agentwire.SyncMessage, 4), reset: make(chan struct{}), conns: make(chan struct{}, 16)}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			h.conns <- struct{}{}
			go func() {
				defer c.Close()
				m := <-h.msgs
				if _, err := c.Write(m.MarshalLine()); err != nil {
					return
				}
				<-h.reset
			}()
		}
	}()
	return h
}

func (h *fakeHost) dial(ctx context.Context) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "unix", h.l.Addr().String())
}

// recorder observes the Syncer's hooks.
type recorder struct {
	mu      sync.Mutex
	clocks  []time.Time
	entropy [][]byte
}

func (r *recorder) setClock(t time.Time) error {
	r.mu.Lock()
	r.clocks = append(r.clocks, t)
	r.mu.Unlock()
	return nil
}

func (r *recorder) addEntropy(b []byte) error {
	r.mu.Lock()
	r.entropy = append(r.entropy, bytes.Clone(b))
	r.mu.Unlock()
	return nil
}

func TestSyncerReconnectsAfterReset(t *testing.T) {
	h := newFakeHost(t)
	rec := &recorder{}
	s := NewSyncer(h.dial)
	s.SetClock, s.AddEntropy = rec.setClock, rec.addEntropy
	s.MinBackoff = 5 * time.Millisecond
	var errs []error
	var errMu sync.Mutex
	s.OnError = func(err error) { errMu.Lock(); errs = append(errs, err); errMu.Unlock() }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	m1 := agentwire.NewSyncMessage(time.Unix(1000, 1))
	m2 := agentwire.NewSyncMessage(time.Unix(2000, 2))
	h.msgs <- m1
	waitSynced(t, s, 1)
	if st := s.Stats(); st.Count != 1 || st.Last.IsZero() {
		t.Fatalf("after first line: %+v", st)
	}
	// The connection stays open: no second connection meanwhile.
	time.Sleep(50 * time.Millisecond)
	if n := len(h.conns); n != 1 {
		t.Fatalf("%d connections before the reset", n)
	}

	// Reset: the host drops the connection; the syncer reconnects and
	// applies the next line.
	h.msgs <- m2
	h.reset <- struct{}{}
	waitSynced(t, s, 2)
	if st := s.Stats(); st.Count != 2 {
		t.Fatalf("after reset: %+v", st)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.clocks) != 2 || !rec.clocks[0].Equal(time.Unix(1000, 1)) || !rec.clocks[1].Equal(time.Unix(2000, 2)) {
		t.Errorf("clocks %v", rec.clocks)
	}
	if len(rec.entropy) != 2 || !bytes.Equal(rec.entropy[0], m1.Entropy) || !bytes.Equal(rec.entropy[1], m2.Entropy) {
		t.Errorf("entropy %x", rec.entropy)
	}
	errMu.Lock()
	defer errMu.Unlock()
	if len(errs) != 0 {
		t.Errorf("errors: %v", errs)
	}
}

// waitSynced waits until s has counted n syncs (it counts after both
// hooks returned).
func waitSynced(t *testing.T, s *Syncer, n uint64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); s.Stats().Count < n; {
		if time.Now().After(deadline) {
			t.Fatalf("sync %d not applied: %+v", n, s.Stats())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSyncerBackoff: with no host, the syncer keeps dialing with a
// doubling wait and reports each failure; a bad line is an error too.
func TestSyncerBackoff(t *testing.T) {
	var mu sync.Mutex
	var dials []time.Time
	s := NewSyncer(func(ctx context.Context) (net.Conn, error) {
		mu.Lock()
		dials = append(dials, time.Now())
		mu.Unlock()
		return nil, errors.New("connection refused")
	})
	s.MinBackoff, s.MaxBackoff = 10*time.Millisecond, 40*time.Millisecond
	nerr := 0
	s.OnError = func(error) { mu.Lock(); nerr++; mu.Unlock() }
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	s.Run(ctx)
	mu.Lock()
	defer mu.Unlock()
	// 10+20+40+40+... ms: about 10 dials in 400 ms, far fewer than
	// without backoff and more than with a fixed 40 ms... at least 4.
	if len(dials) < 4 || len(dials) > 15 {
		t.Fatalf("%d dials in 400 ms", len(dials))
	}
	for i := 3; i < len(dials); i++ {
		if d := dials[i].Sub(dials[i-1]); d < 35*time.Millisecond {
			t.Errorf("dial %d only %v after the previous", i, d)
		}
	}
	if nerr != len(dials) {
		t.Errorf("%d errors for %d dials", nerr, len(dials))
	}
}

func TestSyncerBadLine(t *testing.T) {
	for _, tt := range []struct {
		name, host string
	}{
		{"garbage", "garbage\n"},
		{"too long", strings.Repeat("x", agentwire.MaxSyncLine+10)},
		{"eof", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			errs := make(chan error, 1)
			s := NewSyncer(func(ctx context.Context) (net.Conn, error) {
				host, guest := net.Pipe()
				go func() { io.WriteString(host, tt.host); host.Close() }()
				return guest, nil
			})
			s.SetClock = func(time.Time) error { t.Error("clock set"); return nil }
			s.AddEntropy = func([]byte) error { t.Error("entropy added"); return nil }
			ctx, cancel := context.WithCancel(context.Background())
			s.OnError = func(err error) {
				select {
				case errs <- err:
				default:
				}
				cancel()
			}
			s.Run(ctx)
			if err := <-errs; err == nil {
				t.Fatal("no error")
			}
			if st := s.Stats(); st.Count != 0 {
				t.Fatalf("counted %+v", st)
			}
		})
	}
}

func TestSyncerLineTimeout(t *testing.T) {
	host, guest := net.Pipe()
	defer host.Close()
	s := NewSyncer(func(ctx context.Context) (net.Conn, error) { return guest, nil })
	s.LineTimeout = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 1)
	s.OnError = func(err error) { errs <- err; cancel() }
	go s.Run(ctx)
	select {
	case err := <-errs:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("err %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no timeout")
	}
}

func TestHealthSync(t *testing.T) {
	h := newFakeHost(t)
	rec := &recorder{}
	s := NewSyncer(h.dial)
	s.SetClock, s.AddEntropy = rec.setClock, rec.addEntropy
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	h.msgs <- agentwire.NewSyncMessage(time.Now())
	waitSynced(t, s, 1)

	c := startWith(t, s)
	hl, err := c.Health(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if hl.Syncs != 1 || hl.LastSync.IsZero() || time.Since(hl.LastSync) > time.Minute {
		t.Fatalf("health %+v", hl)
	}
}

// TestAddEntropy runs the real RNDADDENTROPY ioctl (as root only): it
// checks the rand_pool_info layout the kernel accepts. Mixing 64 random
// bytes into the test machine's pool is harmless.
func TestAddEntropy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_SYS_ADMIN)")
	}
	if err := AddEntropy(agentwire.NewSyncMessage(time.Now()).Entropy); err != nil {
		t.Fatal(err)
	}
	// A buffer that is not a multiple of 4 bytes.
	if err := AddEntropy([]byte{1, 2, 3, 4, 5}); err != nil {
		t.Fatal(err)
	}
}
