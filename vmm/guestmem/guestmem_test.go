package guestmem

import (
	"bytes"
	"errors"
	"os"
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
	got := m.TakeWritten(ForSnapshots)
	for p := uint64(0); p < uint64(len(got))*64; p++ {
		if set := got[p/64]&(1<<(p%64)) != 0; set != want[p] {
			t.Errorf("page %d marked %v, want %v", p, set, want[p])
		}
	}
	for i, w := range m.TakeWritten(ForSnapshots) {
		if w != 0 {
			t.Fatalf("word %d not cleared: %#x", i, w)
		}
	}
}

// TestPopulated checks that a fresh memfd reports only the pages written.
func TestPopulated(t *testing.T) {
	m, err := New(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.WriteAt([]byte{1}, 5*PageSize+10); err != nil {
		t.Fatal(err)
	}
	m.Flat()[200*PageSize] = 2
	bm, err := m.Populated()
	if err != nil {
		t.Fatal(err)
	}
	for p := uint64(0); p < 256; p++ {
		set := bm[p/64]&(1<<(p%64)) != 0
		if set != (p == 5 || p == 200) {
			t.Errorf("page %d: populated=%v", p, set)
		}
	}
}

// TestNewPrivateFile maps an image copy-on-write: writes stay private and
// the file is unchanged.
func TestNewPrivateFile(t *testing.T) {
	path := t.TempDir() + "/ram"
	img := bytes.Repeat([]byte{7}, 64<<10)
	if err := os.WriteFile(path, img, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewPrivateFile(path, 128<<10); err == nil {
		t.Error("a file shorter than RAM was accepted")
	}
	m, err := NewPrivateFile(path, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Private() || !bytes.Equal(m.Flat(), img) {
		t.Fatal("the mapping does not show the file")
	}
	if _, err := m.WriteAt([]byte{9}, 0); err != nil {
		t.Fatal(err)
	}
	if bm, _ := m.Populated(); bm[0] != ^uint64(0)>>48 {
		t.Errorf("private mapping populated bitmap %#x, want all 16 pages", bm[0])
	}
	m.Close()
	if b, _ := os.ReadFile(path); !bytes.Equal(b, img) {
		t.Error("a write to the private mapping reached the file")
	}
}
