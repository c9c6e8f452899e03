package guestmem

import (
	"slices"
	"testing"
)

// TestLedger: each reader sees every write since its own previous take,
// whichever reader cleared the live record.
func TestLedger(t *testing.T) {
	var l Ledger
	if got := l.Take(ForSnapshots, []uint64{0b0011, 0}); !slices.Equal(got, []uint64{0b0011, 0}) {
		t.Fatalf("first take = %b", got)
	}
	l.Take(ForSnapshots, []uint64{0b0100, 1 << 63})
	if got := l.Take(ForForks, []uint64{0b1000, 0}); !slices.Equal(got, []uint64{0b1111, 1 << 63}) {
		t.Fatalf("forks' take = %b, want every write since the start", got)
	}
	if got := l.Take(ForSnapshots, []uint64{0, 0}); !slices.Equal(got, []uint64{0b1000, 0}) {
		t.Fatalf("snapshots' take = %b, want only what came after its last", got)
	}
	if got := l.Take(ForForks, []uint64{0, 0}); !slices.Equal(got, []uint64{0, 0}) {
		t.Fatalf("forks' second take = %b, want nothing", got)
	}
}

// TestTakeWrittenPerReader: the VMM's writes reach both readers.
func TestTakeWrittenPerReader(t *testing.T) {
	m, err := New(256 * PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.WriteAt([]byte{1}, 3*PageSize)
	m.MarkPageWritten(200)
	m.MarkPageWritten(1 << 40) // past the end: ignored
	if w := m.TakeWritten(ForSnapshots); w[0] != 1<<3 || w[3] != 1<<8 {
		t.Fatalf("snapshots' record %#x", w)
	}
	m.WriteAt([]byte{1}, 4*PageSize)
	if w := m.TakeWritten(ForForks); w[0] != 1<<3|1<<4 || w[3] != 1<<8 {
		t.Fatalf("forks' record %#x, want pages 3, 4 and 200", w)
	}
	m.ForgetWritten()
	if w := m.TakeWritten(ForSnapshots); slices.ContainsFunc(w, func(x uint64) bool { return x != 0 }) {
		t.Fatalf("after ForgetWritten: %#x", w)
	}
}

func TestBitmapRuns(t *testing.T) {
	bm := []uint64{0b1110_0001, 1 << 63, 1, 1 << 2}
	want := []Run{{0, 1}, {5, 3}, {127, 2}, {194, 1}}
	if got := bitmapRuns(bm, 256); !slices.Equal(got, want) {
		t.Fatalf("runs %v, want %v", got, want)
	}
	if got := bitmapRuns(bm, 128); !slices.Equal(got, []Run{{0, 1}, {5, 3}, {127, 1}}) {
		t.Fatalf("runs within 128 pages %v", got)
	}
}

// TestForkWritten: a fork told which pages were written gives the same
// children as one that scans pagemap, and a superset is harmless.
func TestForkWritten(t *testing.T) {
	const pages = 512
	m, err := New(pages * PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	st := image{}
	fill(t, m, st, 0, 10, 0x11)
	m.ForgetWritten()
	b1 := fork(t, m)
	fill(t, m, st, 5, 10, 0x21)
	fill(t, m, st, 300, 3, 0x22)
	written := m.TakeWritten(ForForks)
	b2, err := m.Fork(written)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	checkLayers(t, "tracked fork", b2, 2, []Run{{5, 10}, {300, 3}})
	check(t, "child of the tracked fork", fromBase(t, b2), st)
	check(t, "child of the first fork", fromBase(t, b1), image{0: 0x11, 1: 0x11, 2: 0x11, 3: 0x11, 4: 0x11, 5: 0x11, 6: 0x11, 7: 0x11, 8: 0x11, 9: 0x11})
	if n := privatePages(t, m); n != 0 {
		t.Fatalf("%d private pages after a tracked fork, want 0", n)
	}
	// A superset (pages not written since: copied as they read).
	fill(t, m, st, 400, 1, 0x33)
	super := make([]uint64, pages/64)
	for p := 0; p < pages; p += 7 {
		super[p/64] |= 1 << (p % 64)
	}
	super[400/64] |= 1 << (400 % 64)
	b3, err := m.Fork(super)
	if err != nil {
		t.Fatal(err)
	}
	defer b3.Close()
	check(t, "child of a fork given a superset", fromBase(t, b3), st)
	check(t, "parent", m, st)
	if _, err := m.Fork(super[:1]); err == nil {
		t.Fatal("a short bitmap was accepted")
	}
}
