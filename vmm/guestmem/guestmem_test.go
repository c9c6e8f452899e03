package guestmem

import (
	"bytes"
	"errors"
	"os"
	"slices"
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

// recordingPager records the Ensure and Forget calls it gets, and fails
// every Ensure with err when err is set.
type recordingPager struct {
	err     error
	ensured [][2]uint64
	forgot  [][2]uint64
}

func (p *recordingPager) Ensure(off, n uint64) error {
	p.ensured = append(p.ensured, [2]uint64{off, n})
	return p.err
}

func (p *recordingPager) Forget(off, n uint64) { p.forgot = append(p.forgot, [2]uint64{off, n}) }

var errPagerTest = errors.New("test pager")

// TestPagerRange checks that the accessors ask the Pager for the flat
// range they touch, translated across the MMIO hole, and nothing for
// ranges they refuse. The pager fails every call, so no access reaches
// the (absent) mapping: RAM above the hole without mapping 3 GiB.
func TestPagerRange(t *testing.T) {
	m := &Memory{regions: Layout(MMIOHoleStart + 8*PageSize)}
	p := &recordingPager{err: errPagerTest}
	m.SetPager(p)
	buf := make([]byte, 100)
	calls := []struct {
		name string
		do   func() error
		want [2]uint64 // {0, 0}: no call
	}{
		{"slice below the hole", func() error { _, err := m.Slice(PageSize-1, 2); return err }, [2]uint64{PageSize - 1, 2}},
		{"slice above the hole", func() error { _, err := m.Slice(MMIOHoleEnd+3*PageSize+5, 10); return err }, [2]uint64{MMIOHoleStart + 3*PageSize + 5, 10}},
		{"read above the hole", func() error { _, err := m.ReadAt(buf, MMIOHoleEnd); return err }, [2]uint64{MMIOHoleStart, 100}},
		{"write at the end", func() error { _, err := m.WriteAt(buf, MMIOHoleEnd+8*PageSize-100); return err }, [2]uint64{MMIOHoleStart + 8*PageSize - 100, 100}},
		{"slice in the hole", func() error { _, err := m.Slice(MMIOHoleStart+PageSize, 1); return err }, [2]uint64{}},
		{"slice across the hole", func() error { _, err := m.Slice(MMIOHoleStart-1, 2); return err }, [2]uint64{}},
		{"slice past the end", func() error { _, err := m.Slice(MMIOHoleEnd+8*PageSize-1, 2); return err }, [2]uint64{}},
	}
	for _, c := range calls {
		p.ensured = nil
		err := c.do()
		if c.want == ([2]uint64{}) {
			if !errors.Is(err, ErrOutOfRange) || len(p.ensured) != 0 {
				t.Errorf("%s: err %v, pager calls %v; want ErrOutOfRange and none", c.name, err, p.ensured)
			}
			continue
		}
		if !errors.Is(err, errPagerTest) {
			t.Errorf("%s: err %v, want the pager's", c.name, err)
		}
		if len(p.ensured) != 1 || p.ensured[0] != c.want {
			t.Errorf("%s: pager calls %#v, want one of %#v", c.name, p.ensured, c.want)
		}
	}
	if m.written != nil {
		t.Error("a refused write was recorded")
	}
}

// TestPager checks a Pager on real memory: accesses succeed once it has
// answered, empty ranges and a removed pager cost no call, Ensure checks
// its flat range, and Discard tells a Forgetter the whole pages it
// discarded.
func TestPager(t *testing.T) {
	m, err := New(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	p := &recordingPager{}
	m.SetPager(p)
	if _, err := m.WriteAt([]byte("paged"), 7*PageSize-2); err != nil {
		t.Fatal(err)
	}
	b, err := m.Slice(7*PageSize-2, 5)
	if err != nil || string(b) != "paged" {
		t.Fatalf("Slice = %q, %v", b, err)
	}
	if _, err := m.Slice(3*PageSize, 0); err != nil {
		t.Fatal(err)
	}
	if err := m.Ensure(9*PageSize, PageSize); err != nil {
		t.Fatal(err)
	}
	if err := m.Ensure(1<<20-PageSize, PageSize+1); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("Ensure past the end: %v", err)
	}
	want := [][2]uint64{{7*PageSize - 2, 5}, {7*PageSize - 2, 5}, {9 * PageSize, PageSize}}
	if len(p.ensured) != len(want) {
		t.Fatalf("pager calls %#v, want %#v", p.ensured, want)
	}
	for i := range want {
		if p.ensured[i] != want[i] {
			t.Errorf("pager call %d: %#v, want %#v", i, p.ensured[i], want[i])
		}
	}
	if err := m.Discard(5*PageSize+1, 3*PageSize); err != nil {
		t.Fatal(err)
	}
	if err := m.Discard(5*PageSize+1, PageSize); err != nil { // no whole page
		t.Fatal(err)
	}
	if len(p.forgot) != 1 || p.forgot[0] != [2]uint64{6 * PageSize, 2 * PageSize} {
		t.Errorf("Forget calls %#v, want pages 6 and 7", p.forgot)
	}
	m.SetPager(nil)
	p.ensured = nil
	if _, err := m.ReadAt(make([]byte, 8), 0); err != nil || len(p.ensured) != 0 {
		t.Errorf("without a pager: %v, calls %v", err, p.ensured)
	}
	p.err = errPagerTest
	m.SetPager(p)
	if _, err := m.ReadAt(make([]byte, 8), 0); !errors.Is(err, errPagerTest) {
		t.Errorf("a failing pager: ReadAt err %v", err)
	}
}

// nopPager is present everywhere.
type nopPager struct{}

func (nopPager) Ensure(off, n uint64) error { return nil }

// BenchmarkSlice measures the accessor a virtio queue calls for every
// ring field and buffer, without a pager and with one that answers at
// once.
func BenchmarkSlice(b *testing.B) {
	m, err := New(1 << 20)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	run := func(b *testing.B) {
		for i := range b.N {
			if _, err := m.Slice(uint64(i%200)*PageSize+8, 16); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("nopager", run)
	m.SetPager(nopPager{})
	b.Run("pager", run)
}

// TestEnsurePages: one pager call per run of the bitmap, none without a
// pager.
func TestEnsurePages(t *testing.T) {
	m, err := New(256 * PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	want := make([]uint64, 4)
	want[0] = 0b1110_0001
	want[1] = 1 << 63
	want[2] = 1
	if err := m.EnsurePages(want); err != nil {
		t.Fatal(err)
	}
	p := &recordingPager{}
	m.SetPager(p)
	if err := m.EnsurePages(want); err != nil {
		t.Fatal(err)
	}
	runs := [][2]uint64{{0, PageSize}, {5 * PageSize, 3 * PageSize}, {127 * PageSize, 2 * PageSize}}
	if !slices.Equal(p.ensured, runs) {
		t.Fatalf("pager calls %v, want %v", p.ensured, runs)
	}
}
