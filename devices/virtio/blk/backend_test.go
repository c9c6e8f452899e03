package blk

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// memDisk is an in-memory Backend that records what the device asks of
// it. (The package cannot use cow/disk, which imports devices.) Safe for
// concurrent use.
type memDisk struct {
	mu      sync.Mutex
	data    []byte
	syncs   int
	calls   int // ReadAt and WriteAt calls
	closed  bool
	failAll bool // every ReadAt and WriteAt fails
}

func newMemDisk(sectors int, fill byte) *memDisk {
	b := make([]byte, sectors*SectorSize)
	for i := range b {
		b[i] = fill + byte(i/SectorSize)
	}
	return &memDisk{data: b}
}

var errInjected = errors.New("injected I/O error")

func (m *memDisk) ReadAt(p []byte, off int64) (int, error)  { return m.io(p, off, false) }
func (m *memDisk) WriteAt(p []byte, off int64) (int, error) { return m.io(p, off, true) }

// io is ReadAt, or WriteAt when write: each counts a call, and fails
// when failAll is set.
func (m *memDisk) io(p []byte, off int64, write bool) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	switch {
	case m.failAll:
		return 0, errInjected
	case write && off+int64(len(p)) > int64(len(m.data)):
		return 0, errors.New("write past the end")
	case write:
		return copy(m.data[off:], p), nil
	case off >= int64(len(m.data)):
		return 0, errors.New("read past the end")
	}
	n := copy(p, m.data[off:])
	if n < len(p) {
		return n, errors.New("short read")
	}
	return n, nil
}

func (m *memDisk) Size() int64 { return int64(len(m.data)) }

func (m *memDisk) Sync() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.syncs++
	return nil
}

func (m *memDisk) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}

func (m *memDisk) snapshot() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return bytes.Clone(m.data)
}

// discardDisk is a memDisk that can discard, like a cow/disk.Overlay.
type discardDisk struct {
	*memDisk
	discards [][2]int64
}

func (d *discardDisk) Discard(off, n int64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	clear(d.data[off : off+n])
	d.discards = append(d.discards, [2]int64{off, n})
	return nil
}

func seg(sector uint64, n, flags uint32) []byte {
	b := make([]byte, discardSegLen)
	binary.LittleEndian.PutUint64(b, sector)
	binary.LittleEndian.PutUint32(b[8:], n)
	binary.LittleEndian.PutUint32(b[12:], flags)
	return b
}

func newBackendEnv(t *testing.T, b Backend, opts Options) *env {
	t.Helper()
	dev, err := NewWithBackend(b, "mem-disk", opts)
	if err != nil {
		t.Fatal(err)
	}
	return newDevEnv(t, dev)
}

func TestBackendRequests(t *testing.T) {
	b := &discardDisk{memDisk: newMemDisk(64, 1)}
	e := newBackendEnv(t, b, Options{ID: "overlay-1"})
	if e.dev.Path() != "mem-disk" || e.dev.Capacity() != 64 || e.dev.Backend() != Backend(b) {
		t.Fatalf("path %q capacity %d", e.dev.Path(), e.dev.Capacity())
	}
	if e.dev.Features()&FeatureDiscard == 0 {
		t.Error("writable disk does not offer discard")
	}
	// Write split over several buffers (through the bounce buffer), then
	// read back split differently, and in one buffer (directly).
	data := splitRoundTrip(t, e, b.snapshot)
	used, st, addrs := e.do(t, out(hdr(TypeIn, 5)), in(len(data)), in(1))
	if st != StatusOK || used != uint32(len(data))+1 || !bytes.Equal(e.mem[addrs[1]:addrs[1]+uint64(len(data))], data) {
		t.Fatalf("single-buffer read: status %d used %d", st, used)
	}

	if _, st, _ := e.do(t, out(hdr(TypeFlush, 0)), in(1)); st != StatusOK {
		t.Fatalf("flush: status %d", st)
	}
	b.mu.Lock()
	syncs := b.syncs
	b.mu.Unlock()
	if syncs != 1 {
		t.Errorf("flush made %d Syncs, want 1", syncs)
	}

	s := append(seg(8, 8, 0), seg(32, 16, 0)...)
	if _, st, _ := e.do(t, out(hdr(TypeDiscard, 0)), out(s[:20]), out(s[20:]), in(1)); st != StatusOK {
		t.Fatalf("discard: status %d", st)
	}
	if _, st, _ := e.do(t, out(hdr(TypeDiscard, 0)), out(seg(0, 8, 0)), out(seg(60, 8, 0)), in(1)); st != StatusIOErr {
		t.Errorf("discard past the end: status %d", st)
	}
	img := b.snapshot()
	want := [][2]int64{{8 * SectorSize, 8 * SectorSize}, {32 * SectorSize, 16 * SectorSize}}
	if len(b.discards) != 2 || b.discards[0] != want[0] || b.discards[1] != want[1] {
		t.Errorf("discards %v, want %v", b.discards, want)
	}
	if !bytes.Equal(img[8*SectorSize:16*SectorSize], make([]byte, 8*SectorSize)) || img[8*SectorSize-1] != data[len(data)-1] || img[16*SectorSize] != 17 {
		t.Error("discard did not zero exactly its range")
	}

	used, st, addrs = e.do(t, out(hdr(TypeGetID, 0)), in(IDLen), in(1))
	if st != StatusOK || used != IDLen+1 || string(bytes.TrimRight(e.mem[addrs[1]:addrs[1]+IDLen], "\x00")) != "overlay-1" {
		t.Fatalf("get-id: status %d used %d", st, used)
	}
	m := &e.dev.Metrics
	if m.Reads.Load() != 2 || m.Writes.Load() != 1 || m.Flushes.Load() != 1 || m.Discards.Load() != 1 || m.Errors.Load() != 1 {
		t.Errorf("metrics: reads %d writes %d flushes %d discards %d errors %d",
			m.Reads.Load(), m.Writes.Load(), m.Flushes.Load(), m.Discards.Load(), m.Errors.Load())
	}
	e.healthy(t)
	e.tr.Shutdown()
	if err := e.dev.Close(); err != nil || !b.closed {
		t.Errorf("Close: %v, backend closed %v", err, b.closed)
	}
}

// TestBackendNoDiscard: a backend without Discard takes DISCARD as the
// hint it is, and leaves its data alone.
func TestBackendNoDiscard(t *testing.T) {
	b := newMemDisk(16, 1)
	e := newBackendEnv(t, b, Options{})
	if _, st, _ := e.do(t, out(hdr(TypeDiscard, 0)), out(seg(0, 8, 0)), in(1)); st != StatusOK {
		t.Fatalf("discard: status %d", st)
	}
	if _, st, _ := e.do(t, out(hdr(TypeDiscard, 0)), out(seg(0, 8, 1)), in(1)); st != StatusUnsupp {
		t.Fatalf("discard with flags: status %d", st)
	}
	if img := b.snapshot(); img[0] != 1 {
		t.Error("data changed")
	}
}

func TestBackendReadOnlyAndErrors(t *testing.T) {
	b := newMemDisk(16, 1)
	e := newBackendEnv(t, b, Options{ReadOnly: true, Log: slog.New(slog.DiscardHandler)})
	if e.dev.Features()&FeatureRO == 0 {
		t.Error("read-only disk does not say so")
	}
	if _, st, _ := e.do(t, out(hdr(TypeOut, 0)), out(make([]byte, SectorSize)), in(1)); st != StatusIOErr {
		t.Errorf("write on read-only disk: status %d", st)
	}
	if _, st, _ := e.do(t, out(hdr(TypeFlush, 0)), in(1)); st != StatusOK || b.syncs != 0 {
		t.Errorf("flush on read-only disk: status %d, %d Syncs", st, b.syncs)
	}
	if img := b.snapshot(); img[0] != 1 {
		t.Error("read-only backend written")
	}
	b.mu.Lock()
	b.failAll = true
	b.mu.Unlock()
	if _, st, _ := e.do(t, out(hdr(TypeIn, 0)), in(SectorSize), in(1)); st != StatusIOErr {
		t.Errorf("read with a failing backend: status %d", st)
	}
	e.healthy(t)
}

func TestNewWithBackendErrors(t *testing.T) {
	odd := &memDisk{data: make([]byte, 1000)}
	if _, err := NewWithBackend(odd, "odd", Options{}); err == nil || !strings.Contains(err.Error(), "multiple of 512") {
		t.Errorf("odd size: %v", err)
	}
	if _, err := NewWithBackend(nil, "nil", Options{}); err == nil {
		t.Error("nil backend accepted")
	}
	if _, err := NewWithBackend(newMemDisk(1, 0), "x", Options{ID: strings.Repeat("x", IDLen+1)}); err == nil {
		t.Error("long ID accepted")
	}
}

// TestBackendTransferChunks: data split over many buffers, more than the
// bounce buffer holds, reaches the backend whole and in order.
func TestBackendTransferChunks(t *testing.T) {
	const size = 3*maxBounce + 5*SectorSize
	b := &memDisk{data: make([]byte, size+SectorSize)}
	w := &scratch{}
	be := newBackendRef(b)
	var bufs [][]byte
	var want []byte
	for i := 0; len(want) < size; i++ {
		n := min(i%4099+1, size-len(want))
		buf := bytes.Repeat([]byte{byte(i)}, n)
		bufs = append(bufs, buf)
		want = append(want, buf...)
	}
	if err := w.transfer(be, append([][]byte(nil), bufs...), SectorSize, true); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b.data[SectorSize:], want) || !bytes.Equal(b.data[:SectorSize], make([]byte, SectorSize)) {
		t.Fatal("write through the bounce buffer")
	}
	if b.calls != 4 || cap(w.bounce) != maxBounce {
		t.Errorf("%d backend calls, bounce buffer %d bytes; want 4 and %d", b.calls, cap(w.bounce), maxBounce)
	}
	for _, buf := range bufs {
		clear(buf)
	}
	if err := w.transfer(be, append([][]byte(nil), bufs...), SectorSize, false); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bytes.Join(bufs, nil), want) {
		t.Fatal("read through the bounce buffer")
	}
	if err := w.transfer(be, [][]byte{make([]byte, 10), make([]byte, 2*SectorSize)}, size, false); err == nil {
		t.Error("read past the end succeeded")
	}
}

// TestSwapBackend: a swap between requests, with the transport quiesced,
// sends every later request to the new backend; the old one is handed
// back open, and Close closes the new one only.
func TestSwapBackend(t *testing.T) {
	a, b := newMemDisk(32, 1), &discardDisk{memDisk: newMemDisk(32, 101)}
	e := newBackendEnv(t, a, Options{})
	if _, st, addrs := e.do(t, out(hdr(TypeIn, 2)), in(SectorSize), in(1)); st != StatusOK || e.mem[addrs[1]] != 3 {
		t.Fatalf("read before swap: status %d byte %d", st, e.mem[addrs[1]])
	}
	if _, err := e.dev.SwapBackend(newMemDisk(31, 0)); err == nil {
		t.Error("swap to a backend of another size accepted")
	}
	if _, err := e.dev.SwapBackend(nil); err == nil {
		t.Error("swap to nil accepted")
	}

	if err := e.tr.Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	old, err := e.dev.SwapBackend(b)
	if err != nil || old != Backend(a) || e.dev.Backend() != Backend(b) {
		t.Fatalf("swap: %v, old %p (a %p)", err, old, a)
	}
	if err := e.tr.Resume(); err != nil {
		t.Fatal(err)
	}
	if _, st, addrs := e.do(t, out(hdr(TypeIn, 2)), in(SectorSize), in(1)); st != StatusOK || e.mem[addrs[1]] != 103 {
		t.Fatalf("read after swap: status %d byte %d", st, e.mem[addrs[1]])
	}
	if _, st, _ := e.do(t, out(hdr(TypeOut, 4)), out(bytes.Repeat([]byte{0xab}, SectorSize)), in(1)); st != StatusOK {
		t.Fatalf("write after swap: status %d", st)
	}
	if _, st, _ := e.do(t, out(hdr(TypeFlush, 0)), in(1)); st != StatusOK {
		t.Fatalf("flush after swap: status %d", st)
	}
	if _, st, _ := e.do(t, out(hdr(TypeDiscard, 0)), out(seg(8, 8, 0)), in(1)); st != StatusOK {
		t.Fatalf("discard after swap: status %d", st)
	}
	if img := b.snapshot(); img[4*SectorSize] != 0xab || img[8*SectorSize] != 0 || b.syncs != 1 || len(b.discards) != 1 {
		t.Errorf("new backend: byte %#x, %d syncs, discards %v", img[4*SectorSize], b.syncs, b.discards)
	}
	if img := a.snapshot(); img[4*SectorSize] != 5 || img[8*SectorSize] != 9 || a.syncs != 0 {
		t.Error("old backend touched after the swap")
	}
	e.tr.Shutdown()
	if err := e.dev.Close(); err != nil || a.closed || !b.closed {
		t.Errorf("Close: %v; old closed %v, new closed %v", err, a.closed, b.closed)
	}
}

// TestSwapBackendRace swaps between two backends with the same content
// while requests run (which a caller must not do, but it must not be a
// data race: run with -race): every request completes OK on one of them.
func TestSwapBackendRace(t *testing.T) {
	a, b := newMemDisk(32, 1), newMemDisk(32, 1)
	e := newBackendEnv(t, a, Options{})
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		cur, next := Backend(a), Backend(b)
		for !stop.Load() {
			old, err := e.dev.SwapBackend(next)
			if err != nil || old != cur {
				t.Errorf("swap: %v", err)
				return
			}
			cur, next = next, cur
		}
	}()
	for i := range 100 {
		if _, st, addrs := e.do(t, out(hdr(TypeIn, uint64(i%32))), in(SectorSize), in(1)); st != StatusOK || e.mem[addrs[1]] != byte(i%32+1) {
			t.Fatalf("request %d: status %d", i, st)
		}
	}
	stop.Store(true)
	wg.Wait()
}
