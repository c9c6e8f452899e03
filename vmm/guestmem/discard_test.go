package guestmem

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// memfdPages is how many pages of m's memfd hold storage (st_blocks).
func memfdPages(t *testing.T, m *Memory) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(m.FD(), &st); err != nil {
		t.Fatal(err)
	}
	return uint64(st.Blocks) * 512 / PageSize
}

// pageBytes fills a page with v.
func pageBytes(v byte) []byte { return bytes.Repeat([]byte{v}, PageSize) }

// checkPages fails t unless guest pages [first, first+n) from gpa base
// each read as want.
func checkPages(t *testing.T, m *Memory, base, first, n uint64, want byte) {
	t.Helper()
	buf := make([]byte, PageSize)
	for p := first; p < first+n; p++ {
		if _, err := m.ReadAt(buf, int64(base+p*PageSize)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, pageBytes(want)) {
			t.Fatalf("page %d at %#x reads %#x..., want all %#x", p, base, buf[0], want)
		}
	}
}

// TestDiscardMemfd: on a MAP_SHARED memfd, Discard punches exactly the
// whole pages of the range out of the memfd (its storage drops by that
// many pages) and they read back as zeros; partial pages at the ends and
// the pages around are kept.
func TestDiscardMemfd(t *testing.T) {
	const pages = 64
	m, err := New(pages * PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for p := uint64(0); p < pages; p++ {
		if _, err := m.WriteAt(pageBytes(0xaa), int64(p*PageSize)); err != nil {
			t.Fatal(err)
		}
	}
	if got := memfdPages(t, m); got != pages {
		t.Fatalf("memfd holds %d pages after writing %d", got, pages)
	}
	if err := m.Discard(8*PageSize, 16*PageSize); err != nil {
		t.Fatal(err)
	}
	if got := memfdPages(t, m); got != pages-16 {
		t.Fatalf("memfd holds %d pages after discarding 16 of %d", got, pages)
	}
	// (Reading a hole through the shared mapping allocates a zero page
	// in the memfd again: storage is counted before content is checked.)
	checkPages(t, m, 0, 0, 8, 0xaa)
	checkPages(t, m, 0, 8, 16, 0)
	checkPages(t, m, 0, 24, pages-24, 0xaa)
	if err := m.Discard(8*PageSize, 16*PageSize); err != nil {
		t.Fatal(err)
	}

	// Partial pages are kept: [40 pages + 100, +3 pages) holds whole
	// pages 41 and 42 only; a range inside one page discards nothing.
	if err := m.Discard(40*PageSize+100, 3*PageSize); err != nil {
		t.Fatal(err)
	}
	if err := m.Discard(50*PageSize+1, PageSize-2); err != nil {
		t.Fatal(err)
	}
	if got := memfdPages(t, m); got != pages-18 {
		t.Fatalf("memfd holds %d pages, want %d", got, pages-18)
	}
	checkPages(t, m, 0, 40, 1, 0xaa)
	checkPages(t, m, 0, 41, 2, 0)
	checkPages(t, m, 0, 43, pages-43, 0xaa)

	// The guest touching a discarded page gets a fresh zero page, which
	// it can write again.
	if _, err := m.WriteAt(pageBytes(0x55), 9*PageSize); err != nil {
		t.Fatal(err)
	}
	checkPages(t, m, 0, 9, 1, 0x55)
	if err := m.Discard(0, 0); err != nil {
		t.Errorf("empty range: %v", err)
	}
}

// TestDiscardRefusesOutsideRAM: ranges past the end of RAM, wrapping
// around, or in or across the MMIO hole are refused with ErrOutOfRange and
// discard nothing; RAM above the hole is translated to its memfd offset.
func TestDiscardRefusesOutsideRAM(t *testing.T) {
	// RAM reaching past the hole: 3 GiB below it (sparse, never touched)
	// and 4 pages above it, at 4 GiB.
	m, err := New(MMIOHoleStart + 4*PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	high := uint64(MMIOHoleEnd)
	for p := uint64(0); p < 4; p++ {
		if _, err := m.WriteAt(pageBytes(0x77), int64(high+p*PageSize)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.WriteAt(pageBytes(0x66), MMIOHoleStart-PageSize); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ gpa, n uint64 }{
		{MMIOHoleStart, PageSize},                  // in the hole
		{MMIOHoleStart - PageSize, 2 * PageSize},   // across its start
		{MMIOHoleEnd - PageSize, 2 * PageSize},     // across its end
		{high + 4*PageSize, PageSize},              // past the end
		{high + 3*PageSize, 2 * PageSize},          // across the end
		{high, ^uint64(0)},                         // wraps around
		{^uint64(0) &^ (PageSize - 1), PageSize},   // far out
		{MMIOHoleStart - PageSize, ^uint64(0) - 1}, // huge
	} {
		if err := m.Discard(c.gpa, c.n); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("Discard(%#x, %#x) = %v, want ErrOutOfRange", c.gpa, c.n, err)
		}
	}
	checkPages(t, m, MMIOHoleStart-PageSize, 0, 1, 0x66)
	checkPages(t, m, high, 0, 4, 0x77)
	before := memfdPages(t, m)
	if err := m.Discard(high+PageSize, 2*PageSize); err != nil {
		t.Fatal(err)
	}
	if got := memfdPages(t, m); got != before-2 {
		t.Fatalf("memfd holds %d pages, want %d", got, before-2)
	}
	// The punched pages are the memfd's, at the flat offset of 4 GiB + 1
	// page: MMIOHoleStart + 1 page.
	bm, err := m.Populated()
	if err != nil {
		t.Fatal(err)
	}
	first := uint64(MMIOHoleStart / PageSize)
	for p, want := range []bool{true, false, false, true} {
		q := first + uint64(p)
		if got := bm[q/64]&(1<<(q%64)) != 0; got != want {
			t.Errorf("flat page %d populated %v, want %v", q, got, want)
		}
	}
	checkPages(t, m, high, 0, 1, 0x77)
	checkPages(t, m, high, 1, 2, 0)
	checkPages(t, m, high, 3, 1, 0x77)
}

// TestDiscardPrivate: on a private copy-on-write mapping, Discard drops the
// pages' private copies (PrivatePages falls by exactly that many) and they
// read back as the file's content, which is never written.
func TestDiscardPrivate(t *testing.T) {
	const pages = 32
	path := filepath.Join(t.TempDir(), "image")
	if err := os.WriteFile(path, bytes.Repeat([]byte{0x11}, pages*PageSize), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := NewPrivateFile(path, pages*PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for p := uint64(0); p < pages; p++ {
		if _, err := m.WriteAt(pageBytes(0x22), int64(p*PageSize)); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := m.PrivatePages(); err != nil || n != pages {
		t.Fatalf("PrivatePages = %d, %v after writing %d", n, err, pages)
	}
	if err := m.Discard(4*PageSize, 10*PageSize); err != nil {
		t.Fatal(err)
	}
	if n, err := m.PrivatePages(); err != nil || n != pages-10 {
		t.Fatalf("PrivatePages = %d, %v after discarding 10 of %d", n, err, pages)
	}
	checkPages(t, m, 0, 0, 4, 0x22)
	checkPages(t, m, 0, 4, 10, 0x11)
	checkPages(t, m, 0, 14, pages-14, 0x22)
	img, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(img, bytes.Repeat([]byte{0x11}, pages*PageSize)) {
		t.Fatal("the image file changed")
	}
	if err := m.Discard(pages*PageSize, PageSize); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("past the end: %v", err)
	}
}

// TestDiscardClosed: a closed Memory refuses.
func TestDiscardClosed(t *testing.T) {
	m, err := New(PageSize)
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	if err := m.Discard(0, PageSize); err == nil {
		t.Fatal("Discard on a closed memory succeeded")
	}
}

// TestDiscardSlice: a chain buffer (a Slice of guest RAM) is discarded by
// its host bytes, whole pages only; host bytes that are not guest RAM are
// refused.
func TestDiscardSlice(t *testing.T) {
	const pages = 16
	m, err := New(pages * PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for p := uint64(0); p < pages; p++ {
		if _, err := m.WriteAt(pageBytes(0xcc), int64(p*PageSize)); err != nil {
			t.Fatal(err)
		}
	}
	b, err := m.Slice(2*PageSize+8, 4*PageSize) // whole pages 3, 4 and 5
	if err != nil {
		t.Fatal(err)
	}
	if err := m.DiscardSlice(b); err != nil {
		t.Fatal(err)
	}
	if got := memfdPages(t, m); got != pages-3 {
		t.Fatalf("memfd holds %d pages, want %d", got, pages-3)
	}
	checkPages(t, m, 0, 2, 1, 0xcc)
	checkPages(t, m, 0, 3, 3, 0)
	checkPages(t, m, 0, 6, 1, 0xcc)
	for _, foreign := range [][]byte{make([]byte, PageSize), append(m.Flat()[pages*PageSize-PageSize:pages*PageSize:pages*PageSize], 0)} {
		if err := m.DiscardSlice(foreign); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("foreign slice: %v", err)
		}
	}
	if err := m.DiscardSlice(nil); err != nil {
		t.Errorf("empty slice: %v", err)
	}
}

// TestDiscardForgetsWrites: the VMM's write record loses exactly the
// discarded pages (a reported buffer was marked when its chain was
// popped), so no snapshot or fork reads them back.
func TestDiscardForgetsWrites(t *testing.T) {
	const pages = 200
	m, err := New(pages * PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.MarkWritten(0, pages*PageSize)
	if err := m.Discard(10*PageSize, 150*PageSize); err != nil { // pages 10 to 159: across words
		t.Fatal(err)
	}
	for p := uint64(0); p < pages; p++ {
		want := p < 10 || p >= 160
		if got := m.written[p/64].Load()&(1<<(p%64)) != 0; got != want {
			t.Fatalf("page %d marked written %v, want %v", p, got, want)
		}
	}
}
