package guestmem

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// image is the expected content of guest RAM: page -> fill byte; pages
// not listed are zero.
type image map[uint64]byte

func (im image) clone() image {
	c := make(image, len(im))
	for p, v := range im {
		c[p] = v
	}
	return c
}

// fill writes v over whole pages [first, first+n) of m (through WriteAt)
// and records it in im.
func fill(t *testing.T, m *Memory, im image, first, n uint64, v byte) {
	t.Helper()
	buf := bytes.Repeat([]byte{v}, int(n*PageSize))
	if _, err := m.WriteAt(buf, int64(first*PageSize)); err != nil {
		t.Fatal(err)
	}
	for p := first; p < first+n; p++ {
		im[p] = v
	}
}

// check compares every page of m with im.
func check(t *testing.T, what string, m *Memory, im image) {
	t.Helper()
	flat := m.Flat()
	bad := 0
	for p := uint64(0); p < m.Size()/PageSize; p++ {
		page := flat[p*PageSize : (p+1)*PageSize]
		want := im[p]
		if page[0] != want || page[PageSize-1] != want || !bytes.Equal(page, bytes.Repeat([]byte{want}, PageSize)) {
			if bad++; bad <= 5 {
				t.Errorf("%s: page %d starts %#x, want all %#x", what, p, page[0], want)
			}
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d pages wrong in all", what, bad)
	}
}

func privatePages(t *testing.T, m *Memory) uint64 {
	t.Helper()
	n, err := m.PrivatePages()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func runPages(runs []Run) (n uint64) {
	for _, r := range runs {
		n += r.Count
	}
	return n
}

// checkLayers fails t unless b has n layers, the top one with runs.
func checkLayers(t *testing.T, what string, b *Base, n int, runs []Run) {
	t.Helper()
	if len(b.Layers) != n || !slices.Equal(b.Layers[n-1].Runs, runs) {
		t.Fatalf("%s layers = %+v, want %d, the top one with runs %v", what, b.Layers, n, runs)
	}
}

func fromBase(t *testing.T, b *Base) *Memory {
	t.Helper()
	c, err := NewFromBase(b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func fork(t *testing.T, m *Memory) *Base {
	t.Helper()
	addr, size := unsafe.SliceData(m.Flat()), m.Size()
	b, err := m.Fork(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if unsafe.SliceData(m.Flat()) != addr || m.Size() != size {
		t.Fatal("Fork moved the mapping: KVM memory slots would be stale")
	}
	if !m.Private() {
		t.Fatal("a forked memory is not private")
	}
	if n := privatePages(t, m); n != 0 {
		t.Fatalf("%d private pages right after Fork, want 0", n)
	}
	if b.Size != size {
		t.Fatalf("base size %d, want %d", b.Size, size)
	}
	return b
}

// TestFork follows a parent through two forks and children of each, over
// three generations.
func TestFork(t *testing.T) {
	const size = 1 << 20 // 256 pages
	m, err := New(size)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	st1 := image{}
	fill(t, m, st1, 0, 10, 0x11)
	fill(t, m, st1, 100, 1, 0x12)
	fill(t, m, st1, 255, 1, 0x13)
	m.TakeWritten(ForSnapshots)

	b1 := fork(t, m) // first fork: the memfd becomes the bottom layer
	if len(b1.Layers) != 1 || b1.Layers[0].Runs != nil {
		t.Fatalf("first fork layers = %+v, want only the memfd", b1.Layers)
	}
	check(t, "parent after fork 1", m, st1)

	st2 := st1.clone() // the parent writes on
	fill(t, m, st2, 5, 10, 0x21)
	fill(t, m, st2, 200, 1, 0x22)
	if n := privatePages(t, m); n != 11 {
		t.Errorf("parent holds %d private pages, want 11", n)
	}
	if w := m.TakeWritten(ForSnapshots); w[0] != 0x7fe0 || w[3] != 1<<8 {
		t.Errorf("written bitmap after fork = %#x, want pages 5-14 and 200", w)
	}
	// The memfd (FD, the bottom layer) keeps the fork-time content.
	probe := make([]byte, 1)
	if _, err := unix.Pread(m.FD(), probe, 5*PageSize); err != nil || probe[0] != 0x11 {
		t.Errorf("bottom layer page 5 = %#x (%v), want 0x11", probe[0], err)
	}

	c1, c2 := fromBase(t, b1), fromBase(t, b1)
	check(t, "child 1", c1, st1)
	c1st := st1.clone()
	fill(t, c1, c1st, 0, 1, 0xc1)
	fill(t, c1, c1st, 50, 1, 0xc2)
	check(t, "child 1 after its writes", c1, c1st)
	check(t, "child 2 after child 1 wrote", c2, st1)
	check(t, "parent after child 1 wrote", m, st2)
	if n := privatePages(t, c1); n != 2 {
		t.Errorf("child 1 holds %d private pages, want 2", n)
	}

	b2 := fork(t, m) // second fork: a layer of the pages written since
	checkLayers(t, "second fork", b2, 2, []Run{{5, 10}, {200, 1}})
	if n := runPages(b2.Layers[1].Runs); n != 11 {
		t.Errorf("top layer holds %d pages, want the 11 written", n)
	}
	check(t, "parent after fork 2", m, st2)
	if _, err := b2.Layers[1].File.WriteAt([]byte{1}, 0); err == nil {
		t.Error("a layer file Fork made accepts writes")
	}

	st3 := st2.clone()
	fill(t, m, st3, 7, 1, 0x31) // over a page of the top layer
	fill(t, m, st3, 1, 1, 0x32) // over a page of the bottom layer
	if n := privatePages(t, m); n != 2 {
		t.Errorf("parent holds %d private pages after fork 2, want 2", n)
	}

	c3 := fromBase(t, b2)
	b1.Close()
	b2.Close() // children keep their mappings and files
	check(t, "child of fork 2", c3, st2)
	check(t, "child 1 after fork 2", c1, c1st)
	check(t, "parent after writing over fork 2", m, st3)

	// Generation 3: a child forks.
	c3st := st2.clone()
	fill(t, c3, c3st, 30, 2, 0x41)
	fill(t, c3, c3st, 6, 1, 0x42)
	b3 := fork(t, c3)
	checkLayers(t, "grandchild base", b3, 3, []Run{{6, 1}, {30, 2}})
	c4 := fromBase(t, b3)
	check(t, "grandchild", c4, c3st)
	check(t, "child 3 after forking", c3, c3st)
	c4st := c3st.clone()
	fill(t, c4, c4st, 255, 1, 0x51)
	b4 := fork(t, c4)
	checkLayers(t, "great-grandchild base", b4, 4, []Run{{255, 1}})
	check(t, "great-grandchild", fromBase(t, b4), c4st)
	check(t, "grandchild's parent", c3, c3st)
	check(t, "parent at the end", m, st3)

	// A Fork with nothing written adds no layer.
	b5 := fork(t, c4)
	if len(b5.Layers) != 4 {
		t.Errorf("fork with no writes has %d layers, want 4", len(b5.Layers))
	}
}

// TestForkPrivateFile forks a memory mapped from an image file.
func TestForkPrivateFile(t *testing.T) {
	path := t.TempDir() + "/ram"
	if err := os.WriteFile(path, bytes.Repeat([]byte{7}, 16*PageSize), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := NewPrivateFile(path, 16*PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	im := image{}
	for p := uint64(0); p < 16; p++ {
		im[p] = 7
	}
	fill(t, m, im, 3, 2, 9)
	b := fork(t, m)
	checkLayers(t, "image fork", b, 2, []Run{{3, 2}})
	check(t, "child of an image", fromBase(t, b), im)
	check(t, "image parent", m, im)
}

// TestDescriptorRoundTrip passes a two-layer base through JSON and dup'd
// files, as to a child process.
func TestDescriptorRoundTrip(t *testing.T) {
	m, err := New(64 * PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	im := image{}
	fill(t, m, im, 0, 4, 1)
	fork(t, m)
	fill(t, m, im, 2, 4, 2)
	fill(t, m, im, 63, 1, 3)
	b := fork(t, m)

	d, files := b.Descriptor()
	if len(files) != 2 || len(d.Layers) != 2 || d.Layers[1].File != 1 {
		t.Fatalf("descriptor %+v with %d files", d, len(files))
	}
	js, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	var d2 BaseDescriptor
	if err := json.Unmarshal(js, &d2); err != nil {
		t.Fatal(err)
	}
	dups := make([]*os.File, len(files))
	for i, f := range files {
		fd, err := dupFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dups[i] = os.NewFile(uintptr(fd), "inherited")
	}
	ob, err := OpenBase(d2, dups)
	if err != nil {
		t.Fatalf("OpenBase(%s): %v", js, err)
	}
	c, err := NewFromBase(ob)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := ob.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := dups[0].Stat(); err == nil {
		t.Error("Base.Close left a file open")
	}
	check(t, "child from descriptor", c, im)
	check(t, "child of the original base", fromBase(t, b), im)
}

// TestOpenBaseRejects feeds OpenBase bad descriptors.
func TestOpenBaseRejects(t *testing.T) {
	mk := func(pages int64) *os.File {
		fd, err := unix.MemfdCreate("t", unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Ftruncate(fd, pages*PageSize); err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), "t")
		t.Cleanup(func() { f.Close() })
		return f
	}
	bottom, top, short := mk(16), mk(16), mk(4)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	files := []*os.File{bottom, top}
	const size = 16 * PageSize
	lay := func(ls ...LayerDescriptor) []LayerDescriptor { return ls }
	good := lay(LayerDescriptor{File: 0}, LayerDescriptor{File: 1, Runs: []Run{{0, 2}, {2, 3}, {15, 1}}})
	if b, err := OpenBase(BaseDescriptor{Size: size, Layers: good}, files); err != nil {
		t.Fatalf("a good descriptor was refused: %v", err)
	} else if len(b.Layers) != 2 {
		t.Fatalf("layers %+v", b.Layers)
	}
	for _, c := range []struct {
		name  string
		d     BaseDescriptor
		files []*os.File
		want  string
	}{
		{"zero size", BaseDescriptor{Size: 0, Layers: good}, files, "size"},
		{"odd size", BaseDescriptor{Size: size + 1, Layers: good}, files, "size"},
		{"no layers", BaseDescriptor{Size: size}, nil, "layers"},
		{"negative index", BaseDescriptor{Size: size, Layers: lay(LayerDescriptor{File: -1})}, files, "file index"},
		{"index past files", BaseDescriptor{Size: size, Layers: lay(LayerDescriptor{File: 0}, LayerDescriptor{File: 2, Runs: []Run{{0, 1}}})}, files, "file index"},
		{"nil file", BaseDescriptor{Size: size, Layers: lay(LayerDescriptor{File: 0})}, []*os.File{nil}, "no file"},
		{"unused file", BaseDescriptor{Size: size, Layers: lay(LayerDescriptor{File: 0})}, files, "used by no layer"},
		{"bottom with runs", BaseDescriptor{Size: size, Layers: lay(LayerDescriptor{File: 0, Runs: []Run{{0, 1}}}, LayerDescriptor{File: 1, Runs: []Run{{0, 1}}})}, files, "bottom"},
		{"upper without runs", BaseDescriptor{Size: size, Layers: lay(LayerDescriptor{File: 0}, LayerDescriptor{File: 1})}, files, "no runs"},
		{"empty run", BaseDescriptor{Size: size, Layers: lay(LayerDescriptor{File: 0}, LayerDescriptor{File: 1, Runs: []Run{{3, 0}}})}, files, "empty or outside"},
		{"run past end", BaseDescriptor{Size: size, Layers: lay(LayerDescriptor{File: 0}, LayerDescriptor{File: 1, Runs: []Run{{15, 2}}})}, files, "empty or outside"},
		{"run starting past end", BaseDescriptor{Size: size, Layers: lay(LayerDescriptor{File: 0}, LayerDescriptor{File: 1, Runs: []Run{{16, 1}}})}, files, "empty or outside"},
		{"run overflowing", BaseDescriptor{Size: size, Layers: lay(LayerDescriptor{File: 0}, LayerDescriptor{File: 1, Runs: []Run{{2, ^uint64(0)}}})}, files, "empty or outside"},
		{"unsorted", BaseDescriptor{Size: size, Layers: lay(LayerDescriptor{File: 0}, LayerDescriptor{File: 1, Runs: []Run{{5, 1}, {1, 1}}})}, files, "out of order"},
		{"overlapping", BaseDescriptor{Size: size, Layers: lay(LayerDescriptor{File: 0}, LayerDescriptor{File: 1, Runs: []Run{{1, 3}, {3, 1}}})}, files, "overlaps"},
		{"short bottom", BaseDescriptor{Size: size, Layers: lay(LayerDescriptor{File: 0})}, []*os.File{short}, "bytes"},
		{"short upper", BaseDescriptor{Size: size, Layers: lay(LayerDescriptor{File: 0}, LayerDescriptor{File: 1, Runs: []Run{{4, 1}}})}, []*os.File{bottom, short}, "bytes"},
		{"pipe", BaseDescriptor{Size: size, Layers: lay(LayerDescriptor{File: 0})}, []*os.File{pr}, "regular"},
		{"too many layers", BaseDescriptor{Size: size, Layers: append(lay(LayerDescriptor{File: 0}), make([]LayerDescriptor, maxLayers)...)}, []*os.File{bottom}, "layers"},
	} {
		if _, err := OpenBase(c.d, c.files); err == nil {
			t.Errorf("%s: accepted", c.name)
		} else if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q does not mention %q", c.name, err, c.want)
		}
	}
	if _, err := NewFromBase(&Base{Size: size, Layers: []Layer{{File: short}}}); err == nil {
		t.Error("NewFromBase accepted a short bottom layer")
	}
	if _, err := NewFromBase(nil); err == nil {
		t.Error("NewFromBase accepted nil")
	}
}

// TestPrivatePages counts the pages a private mapping wrote, not those it
// only read.
func TestPrivatePages(t *testing.T) {
	m, err := New(32 * PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	fill(t, m, image{}, 0, 32, 5)
	if n := privatePages(t, m); n != 0 {
		t.Errorf("shared memfd: %d private pages, want 0", n)
	}
	fork(t, m)
	var sum int
	for _, v := range m.Flat() {
		sum += int(v)
	}
	if n := privatePages(t, m); n != 0 {
		t.Errorf("after reading everything: %d private pages, want 0", n)
	}
	fill(t, m, image{}, 3, 1, 6)
	fill(t, m, image{}, 10, 4, 6)
	m.Flat()[31*PageSize+100] = 1 // a raw write counts too
	if n := privatePages(t, m); n != 6 {
		t.Errorf("after writing 6 pages: %d private pages", n)
	}
	m.Close()
	if _, err := m.PrivatePages(); err == nil {
		t.Error("PrivatePages of a closed memory succeeded")
	}
	if _, err := m.Fork(nil); err == nil {
		t.Error("Fork of a closed memory succeeded")
	}
}

// TestForkFlatten lowers the limits so that Fork compacts (upper layers
// merged into one over the same bottom layer) and, past the run bound
// even merged, flattens.
func TestForkFlatten(t *testing.T) {
	defer func(l, r int) { maxLayers, maxRuns = l, r }(maxLayers, maxRuns)
	maxLayers, maxRuns = 3, 6
	m, err := New(64 * PageSize)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	im := image{}
	var kids []*Memory
	var kidImages []image
	inode := func(f *os.File) uint64 {
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino
	}
	var bottom uint64
	for i, want := range []int{1, 2, 3, 2, 3, 2} { // layers after each fork
		fill(t, m, im, uint64(i), 1, byte(0x10+i))
		b := fork(t, m)
		if len(b.Layers) != want {
			t.Fatalf("fork %d: %d layers, want %d", i, len(b.Layers), want)
		}
		if i == 0 {
			bottom = inode(b.Layers[0].File)
		} else if got := inode(b.Layers[0].File); got != bottom {
			t.Fatalf("fork %d: the bottom layer was copied (inode %d, was %d): compaction must keep it", i, got, bottom)
		}
		if i >= 3 && want == 2 {
			// Compacted: the upper layers and the new page merged into one
			// (pages 1..i, one written before each fork: one run).
			if got := b.Layers[1].Runs; len(got) != 1 || got[0] != (Run{1, uint64(i)}) {
				t.Fatalf("fork %d: merged layer runs %v, want [{1 %d}]", i, got, i)
			}
		}
		check(t, "parent", m, im)
		kids = append(kids, fromBase(t, b))
		kidImages = append(kidImages, im.clone())
	}
	for i, k := range kids {
		check(t, "child", k, kidImages[i])
	}
	// Too many runs in one fork: 6 scattered pages over a layer of 1 run
	// exceed 6 runs.
	for p := uint64(20); p < 32; p += 2 {
		fill(t, m, im, p, 1, 0x77)
	}
	b := fork(t, m)
	if len(b.Layers) != 1 {
		t.Fatalf("a fork past maxRuns has %d layers, want 1 (flattened)", len(b.Layers))
	}
	// The flattened layer is sparse: zero pages were not written. (Check
	// before reading through a mapping: a read fault on a memfd hole
	// allocates a page.)
	if data, err := unix.Seek(int(b.Layers[0].File.Fd()), 31*PageSize, unix.SEEK_DATA); err == nil {
		t.Errorf("flattened layer has data at %#x, past the last non-zero page", data)
	}
	check(t, "parent after run flatten", m, im)
	check(t, "child after run flatten", fromBase(t, b), im)
}

// TestForkSharing checks that a fork shares pages rather than copying
// them: a child that reads all of a 64 MiB memory holds no page of its
// own, nor does the parent until it writes.
func TestForkSharing(t *testing.T) {
	const size = 64 << 20
	m, err := New(size)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	flat := m.Flat()
	for off := 0; off < size; off += PageSize {
		flat[off] = byte(off/PageSize) | 1
	}
	b := fork(t, m)
	c := fromBase(t, b)
	var sum uint64
	for off := 0; off < size; off += 64 {
		sum += uint64(c.Flat()[off])
	}
	var want uint64
	for p := 0; p < size/PageSize; p++ {
		want += uint64(byte(p) | 1)
	}
	if sum != want {
		t.Fatalf("child content sum %d, want %d", sum, want)
	}
	if n := privatePages(t, c); n != 0 {
		t.Errorf("child holds %d private pages after reading all, want 0", n)
	}
	if n := privatePages(t, m); n != 0 {
		t.Errorf("parent holds %d private pages before writing, want 0", n)
	}
	for p := 0; p < 8; p++ {
		flat[p*1000*PageSize] = 0
	}
	if n := privatePages(t, m); n != 8 {
		t.Errorf("parent holds %d private pages after writing 8, want 8", n)
	}
	b2 := fork(t, m)
	if n := runPages(b2.Layers[1].Runs); n != 8 {
		t.Errorf("second fork layer holds %d pages, want 8", n)
	}
}

// TestPopulatedAfterFork: a forked memory reports the pages that hold data
// (the bottom memfd's data, upper layers' runs, its own private pages),
// not every page, so snapshots and rollbacks of forked VMs do not read,
// and thereby allocate, the holes.
func TestPopulatedAfterFork(t *testing.T) {
	m, err := New(1 << 20) // 256 pages
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	im := image{}
	fill(t, m, im, 10, 3, 1) // pages 10-12
	fork(t, m)
	fill(t, m, im, 100, 2, 2) // private: 100-101
	fork(t, m)                // a layer with 100-101
	fill(t, m, im, 200, 1, 3) // private: 200
	bm, err := m.Populated()
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for p := uint64(0); p < 256; p++ {
		if bm[p/64]&(1<<(p%64)) != 0 {
			got = append(got, p)
		}
	}
	want := []uint64{10, 11, 12, 100, 101, 200}
	if !slices.Equal(got, want) {
		t.Fatalf("Populated after forks = %v, want %v", got, want)
	}
	check(t, "after Populated", m, im)
}
