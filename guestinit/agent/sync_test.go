//go:build linux

package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseSyncMessage(t *testing.T) {
	good := NewSyncMessage(time.Unix(1700000000, 5))
	big := SyncMessage{UnixNanos: 1, Entropy: make([]byte, MaxSyncEntropy+1)}
	bigLine, _ := json.Marshal(big)
	for _, tt := range []struct {
		name string
		in   string
		ok   bool
	}{
		{"good", string(good.MarshalLine()), true},
		{"no newline", strings.TrimSpace(string(good.MarshalLine())), true},
		{"empty", "", false},
		{"not json", "hello\n", false},
		{"zero time", `{"unix_nanos":0,"entropy":"AAAA"}`, false},
		{"negative time", `{"unix_nanos":-5,"entropy":"AAAA"}`, false},
		{"no entropy", `{"unix_nanos":5}`, false},
		{"empty entropy", `{"unix_nanos":5,"entropy":""}`, false},
		{"bad base64", `{"unix_nanos":5,"entropy":"!!"}`, false},
		{"too much entropy", string(bigLine), false},
		{"unknown field", `{"unix_nanos":5,"entropy":"AAAA","x":1}`, false},
		{"trailing", `{"unix_nanos":5,"entropy":"AAAA"} {}`, false},
		{"too long", `{"unix_nanos":5,"entropy":"AAAA"}` + strings.Repeat(" ", MaxSyncLine), false},
	} {
		m, err := ParseSyncMessage([]byte(tt.in))
		if (err == nil) != tt.ok {
			t.Errorf("%s: err %v, want ok=%v", tt.name, err, tt.ok)
		}
		if tt.name == "good" && (m.UnixNanos != good.UnixNanos || !bytes.Equal(m.Entropy, good.Entropy)) {
			t.Errorf("good: got %+v want %+v", m, good)
		}
	}
}

func FuzzParseSyncMessage(f *testing.F) {
	f.Add(NewSyncMessage(time.Unix(1, 0)).MarshalLine())
	f.Add([]byte(`{"unix_nanos":5,"entropy":"AAAA"}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseSyncMessage(b)
		if err != nil {
			return
		}
		if m.UnixNanos <= 0 || len(m.Entropy) == 0 || len(m.Entropy) > MaxSyncEntropy {
			t.Fatalf("accepted %+v", m)
		}
	})
}

func TestServeSync(t *testing.T) {
	host, guest := net.Pipe()
	done := make(chan struct{})
	go func() { ServeSync(host); close(done) }()
	before := time.Now()
	line, err := bufio.NewReader(guest).ReadBytes('\n')
	if err != nil {
		t.Fatal(err)
	}
	m, err := ParseSyncMessage(line)
	if err != nil {
		t.Fatal(err)
	}
	if got := time.Unix(0, m.UnixNanos); got.Before(before.Add(-time.Second)) || got.After(time.Now().Add(time.Second)) {
		t.Errorf("time %v, now %v", got, before)
	}
	if len(m.Entropy) != SyncEntropyBytes || bytes.Equal(m.Entropy, make([]byte, SyncEntropyBytes)) {
		t.Errorf("entropy %x", m.Entropy)
	}
	// It keeps the connection open until the guest closes it.
	select {
	case <-done:
		t.Fatal("ServeSync returned with the connection open")
	case <-time.After(50 * time.Millisecond):
	}
	guest.Close()
	<-done
}

// fakeHost accepts re-sync connections on a unix socket and serves them
// the given messages in turn; after serving one it closes the connection
// when told to (a simulated transport reset).
type fakeHost struct {
	l     net.Listener
	msgs  chan SyncMessage
	reset chan struct{}
	conns chan struct{}
}

func newFakeHost(t *testing.T) *fakeHost {
	l, err := net.Listen("unix", t.TempDir()+"/sync.sock")
	if err != nil {
		t.Fatal(err)
	}
	h := &fakeHost{l: l, msgs: make(chan SyncMessage, 4), reset: make(chan struct{}), conns: make(chan struct{}, 16)}
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

	m1 := NewSyncMessage(time.Unix(1000, 1))
	m2 := NewSyncMessage(time.Unix(2000, 2))
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
		{"too long", strings.Repeat("x", MaxSyncLine+10)},
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
	h.msgs <- NewSyncMessage(time.Now())
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
	if err := AddEntropy(NewSyncMessage(time.Now()).Entropy); err != nil {
		t.Fatal(err)
	}
	// A buffer that is not a multiple of 4 bytes.
	if err := AddEntropy([]byte{1, 2, 3, 4, 5}); err != nil {
		t.Fatal(err)
	}
}
