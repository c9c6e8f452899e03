package guestmem

import (
	"bytes"
	"errors"
	"sync/atomic"
	"testing"
)

func TestLayout(t *testing.T) {
	if got := Layout(256 << 20); len(got) != 1 || got[0] != (Region{0, 256 << 20, 0}) {
		t.Fatalf("256 MiB layout = %+v", got)
	}
	got := Layout(4 << 30)
	want := []Region{{0, MMIOHoleStart, 0}, {MMIOHoleEnd, 1 << 30, MMIOHoleStart}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("4 GiB layout = %+v, want %+v", got, want)
	}
}

func TestNewRejectsBadSizes(t *testing.T) {
	for _, size := range []uint64{0, 4095, 4097} {
		if _, err := New(size); err == nil {
			t.Errorf("New(%d) succeeded", size)
		}
	}
}

func TestAccessBounds(t *testing.T) {
	m, err := New(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.WriteAt([]byte("hello"), 0xFFFFB); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := m.ReadAt(buf, 0xFFFFB); err != nil || !bytes.Equal(buf, []byte("hello")) {
		t.Fatalf("read back %q, %v", buf, err)
	}
	for _, c := range []struct{ gpa, n uint64 }{{1 << 20, 1}, {0xFFFFC, 5}, {^uint64(0), 2}, {0, 1<<20 + 1}} {
		if _, err := m.Slice(c.gpa, c.n); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("Slice(%#x, %d) err = %v, want ErrOutOfRange", c.gpa, c.n, err)
		}
	}
	if _, err := m.ReadAt(buf, -1); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("negative ReadAt err = %v", err)
	}
}

func TestMarkWritten(t *testing.T) {
	// Two regions: RAM above the 32-bit hole continues at 4 GiB, but the
	// bitmap follows memfd offsets.
	m := &Memory{regions: Layout(MMIOHoleStart + 8*PageSize)}
	m.written = make([]atomic.Uint64, (uint64(MMIOHoleStart+8*PageSize)/PageSize+63)/64)
	m.MarkWritten(PageSize-1, 2)               // pages 0 and 1
	m.MarkWritten(MMIOHoleEnd+3*PageSize, 1)   // first region's pages + 3
	m.MarkWritten(MMIOHoleStart+PageSize, 100) // in the hole: ignored
	m.MarkWritten(5*PageSize, 0)               // empty: ignored
	holePages := uint64(MMIOHoleStart / PageSize)
	want := map[uint64]bool{0: true, 1: true, holePages + 3: true}
	got := m.TakeWritten()
	for p := uint64(0); p < uint64(len(got))*64; p++ {
		if set := got[p/64]&(1<<(p%64)) != 0; set != want[p] {
			t.Errorf("page %d marked %v, want %v", p, set, want[p])
		}
	}
	for i, w := range m.TakeWritten() {
		if w != 0 {
			t.Fatalf("word %d not cleared: %#x", i, w)
		}
	}
}
