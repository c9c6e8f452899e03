package disk

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

// createOver creates the overlay o.ovl in a new directory over a base in
// memory, pattern(size, seed), and returns it with its path, its base and
// a copy of the base's bytes (to model the overlay's content).
func createOver(t *testing.T, size int64, seed uint64, opts CreateOptions) (o *Overlay, path string, base *bytes.Reader, model []byte) {
	t.Helper()
	model = pattern(size, seed)
	base = bytes.NewReader(bytes.Clone(model))
	path = filepath.Join(t.TempDir(), "o.ovl")
	o, err := Create(path, base, opts)
	if err != nil {
		t.Fatal(err)
	}
	return o, path, base, model
}

// pattern fills a base image: a position-dependent byte, with zero runs
// (holes in a file made by writeBase) every fourth 16 KiB.
func pattern(size int64, seed uint64) []byte {
	b := make([]byte, size)
	for i := range b {
		if (i/(16<<10))%4 == 3 {
			continue
		}
		b[i] = byte(uint64(i)*2654435761>>13 ^ seed)
	}
	return b
}

// writeBase writes b to a new sparse raw file (its zero 16 KiB runs are
// holes) and returns its path.
func writeBase(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(int64(len(b))); err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(b); off += 16 << 10 {
		c := b[off:min(off+16<<10, len(b))]
		if !allZero(c) {
			if _, err := f.WriteAt(c, int64(off)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return path
}

// checkView compares the whole of d with want, and a Flatten of it.
func checkView(t *testing.T, d Backing, want []byte, flatten bool) {
	t.Helper()
	got := make([]byte, len(want))
	if n, err := d.ReadAt(got, 0); n != len(got) || (err != nil && err != io.EOF) {
		t.Fatalf("read all: %d, %v", n, err)
	}
	if i := firstDiff(got, want); i >= 0 {
		t.Fatalf("view differs from the model at byte %d: %#x, want %#x", i, got[i], want[i])
	}
	if !flatten {
		return
	}
	flat := reference(t, d)
	if i := firstDiff(flat, want); i >= 0 || len(flat) != len(want) {
		t.Fatalf("Flatten differs from the model at byte %d (len %d, want %d)", i, len(flat), len(want))
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// randSpan picks an offset and length in a disk of size: block-aligned
// whole blocks, unaligned within a block, or spanning several.
func randSpan(r *rand.Rand, size, bs int64) (off, n int64) {
	switch r.IntN(4) {
	case 0: // whole blocks
		nb := (size + bs - 1) / bs
		b := r.Int64N(nb)
		off = b * bs
		n = min(size-off, bs*(1+r.Int64N(3)))
	case 1: // a sector
		off = r.Int64N(size/512) * 512
		n = min(512, size-off)
	case 2: // a few bytes anywhere
		off = r.Int64N(size)
		n = 1 + r.Int64N(min(100, size-off))
	default: // unaligned, spanning up to 3 blocks
		off = r.Int64N(size)
		n = 1 + r.Int64N(min(3*bs, size-off))
	}
	return off, n
}

// TestModel runs random reads, writes, discards, syncs and reopens against
// an in-memory model of the disk.
func TestModel(t *testing.T) {
	for _, tc := range []struct {
		name string
		bs   int
		size int64
		ops  int
	}{
		{"4k-blocks", 4 << 10, 256 << 10, 3000},
		{"64k-blocks-ragged-end", 64 << 10, 1<<20 + 1234, 2000},
		{"disk-smaller-than-a-block", 16 << 10, 5000, 500},
		{"default-block-size", 0, 3<<20 + 512, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			model := pattern(tc.size, 7)
			base, err := OpenRaw(writeBase(t, dir, "base.img", model), false)
			if err != nil {
				t.Fatal(err)
			}
			defer base.Close()
			path := filepath.Join(dir, "top.ovl")
			o, err := Create(path, base, CreateOptions{BlockSize: tc.bs, BasePath: "base.img"})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { o.Close() }()
			r := rand.New(rand.NewPCG(1, uint64(tc.size)))
			bs := o.BlockSize()
			for i := range tc.ops {
				off, n := randSpan(r, tc.size, bs)
				switch op := r.IntN(100); {
				case op < 45:
					p := make([]byte, n)
					for j := range p {
						p[j] = byte(r.Uint32())
					}
					if m, err := o.WriteAt(p, off); err != nil || m != len(p) {
						t.Fatalf("op %d: WriteAt(%d bytes at %d) = %d, %v", i, n, off, m, err)
					}
					copy(model[off:], p)
				case op < 80:
					p := make([]byte, n)
					if m, err := o.ReadAt(p, off); m != len(p) || (err != nil && err != io.EOF) {
						t.Fatalf("op %d: ReadAt(%d bytes at %d) = %d, %v", i, n, off, m, err)
					}
					if j := firstDiff(p, model[off:off+n]); j >= 0 {
						t.Fatalf("op %d: ReadAt(%d bytes at %d) differs at +%d", i, n, off, j)
					}
				case op < 90:
					if err := o.Discard(off, n); err != nil {
						t.Fatalf("op %d: Discard(%d at %d): %v", i, n, off, err)
					}
					clear(model[off : off+n])
				case op < 96:
					if err := o.Sync(); err != nil {
						t.Fatal(err)
					}
				default:
					if err := o.Close(); err != nil {
						t.Fatal(err)
					}
					if o, err = Open(path, base, Options{}); err != nil {
						t.Fatal(err)
					}
				}
			}
			checkView(t, o, model, true)
			if o.Allocated() == 0 || o.Allocated() > int64(o.Header().Blocks()) {
				t.Errorf("Allocated = %d of %d blocks", o.Allocated(), o.Header().Blocks())
			}
			// The base is untouched.
			checkView(t, base, pattern(tc.size, 7), false)
		})
	}
}

// TestReadWriteBounds checks the edges of ReadAt and WriteAt.
func TestReadWriteBounds(t *testing.T) {
	o, path, base, _ := createOver(t, 100<<10, 1, CreateOptions{BlockSize: 4096})
	defer o.Close()
	p := make([]byte, 10)
	if n, err := o.ReadAt(p, 100<<10-4); n != 4 || err != io.EOF {
		t.Errorf("read across the end = %d, %v; want 4, EOF", n, err)
	}
	if n, err := o.ReadAt(p, 100<<10); n != 0 || err != io.EOF {
		t.Errorf("read at the end = %d, %v; want 0, EOF", n, err)
	}
	if _, err := o.ReadAt(p, -1); err == nil {
		t.Error("read at -1 succeeded")
	}
	for _, off := range []int64{-1, 100<<10 - 4, 100 << 10, 1 << 62} {
		if n, err := o.WriteAt(p, off); err == nil || n != 0 {
			t.Errorf("WriteAt(10 bytes at %d) = %d, %v; want an error", off, n, err)
		}
	}
	if err := o.Discard(100<<10-4, 5); err == nil {
		t.Error("discard past the end succeeded")
	}
	if o.Allocated() != 0 {
		t.Errorf("refused writes allocated %d blocks", o.Allocated())
	}
	o.Close()
	ro, err := Open(path, base, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if _, err := ro.WriteAt(p, 0); err == nil {
		t.Error("write to a read-only overlay succeeded")
	}
}

// TestReopenKeepsData writes, closes, reopens and reads back.
func TestReopenKeepsData(t *testing.T) {
	o, path, base, model := createOver(t, 1<<20, 3, CreateOptions{})
	for i, off := range []int64{0, 70000, 1<<20 - 3, 300 << 10} {
		p := bytes.Repeat([]byte{byte(i + 1)}, 3)
		o.WriteAt(p, off)
		copy(model[off:], p)
	}
	if err := o.Discard(128<<10, 64<<10); err != nil { // a whole block
		t.Fatal(err)
	}
	clear(model[128<<10 : 192<<10])
	alloc := o.Allocated()
	m := &o.Metrics
	if m.CopyUps.Load() != 4 || m.CopyUpBytes.Load() != 4*64<<10 || m.ZeroedBlocks.Load() != 1 {
		t.Errorf("metrics: %d copy-ups of %d bytes, %d zeroed blocks; want 4, 256 KiB, 1",
			m.CopyUps.Load(), m.CopyUpBytes.Load(), m.ZeroedBlocks.Load())
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	o, err := Open(path, base, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	checkView(t, o, model, false)
	if o.Allocated() != alloc {
		t.Errorf("Allocated after reopen = %d, want %d", o.Allocated(), alloc)
	}
}

// TestCrashBeforeSync drops the overlay without Sync (as a killed process
// would: the page cache survives, the bitmap write does not happen) and
// checks the documented guarantee: synced blocks keep their data, blocks
// allocated after the last Sync read from the base.
func TestCrashBeforeSync(t *testing.T) {
	o, path, base, orig := createOver(t, 512<<10, 5, CreateOptions{})
	a := bytes.Repeat([]byte{0xaa}, 1000)
	o.WriteAt(a, 10) // block 0
	if err := o.Sync(); err != nil {
		t.Fatal(err)
	}
	b := bytes.Repeat([]byte{0xbb}, 1000)
	o.WriteAt(b, 20)      // block 0 again: allocated, so in place
	o.WriteAt(b, 200<<10) // block 3: new
	o.f.Close()           // crash: no Sync, no bitmap
	o, err := Open(path, base, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	want := bytes.Clone(orig)
	copy(want[10:], a)
	copy(want[20:], b) // in the page cache of an allocated block
	checkView(t, o, want, false)
	if o.Allocated() != 1 {
		t.Errorf("Allocated = %d, want 1", o.Allocated())
	}
	// A later copy-up of block 3 must not show the stale bytes the crash
	// left in the file.
	o.WriteAt([]byte{1}, 200<<10+5000)
	want[200<<10+5000] = 1
	checkView(t, o, want, false)
}

// TestOpenRefuses checks that Open refuses what it must, with the right
// error.
func TestOpenRefuses(t *testing.T) {
	baseBytes := pattern(3<<20, 9)
	for _, tc := range []struct {
		name  string
		patch func(t *testing.T, path string) // changes the overlay file
		base  func() Backing                  // the base given to Open
		want  error
	}{
		{name: "bad magic", patch: patchAt(0, []byte("XRNCOWD1")), want: ErrNotOverlay},
		{name: "version 3", patch: patchAt(8, []byte{3, 0, 0, 0}), want: ErrVersion},
		{name: "version 0", patch: patchAt(8, []byte{0, 0, 0, 0}), want: ErrVersion},
		{name: "header checksum", patch: patchAt(17, []byte{0x20}), want: ErrCorrupt},
		{name: "truncated file", patch: func(t *testing.T, p string) { os.Truncate(p, 8192) }, want: ErrCorrupt},
		{name: "empty file", patch: func(t *testing.T, p string) { os.Truncate(p, 0) }, want: ErrNotOverlay},
		{name: "bitmap bit past the end", patch: patchAt(HeaderSize+6, []byte{1}), want: ErrCorrupt},
		{name: "base resized", base: func() Backing { return bytes.NewReader(baseBytes[:2<<20]) }, want: ErrBaseMismatch},
		{name: "base changed at the start", base: func() Backing {
			b := bytes.Clone(baseBytes)
			b[510] ^= 1
			return bytes.NewReader(b)
		}, want: ErrBaseMismatch},
		{name: "base changed at the end", base: func() Backing {
			b := bytes.Clone(baseBytes)
			b[len(b)-1] ^= 1
			return bytes.NewReader(b)
		}, want: ErrBaseMismatch},
		{name: "another base", base: func() Backing { return bytes.NewReader(pattern(3<<20, 10)) }, want: ErrBaseMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "o.ovl")
			o, err := Create(path, bytes.NewReader(baseBytes), CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := o.Close(); err != nil {
				t.Fatal(err)
			}
			if tc.patch != nil {
				tc.patch(t, path)
			}
			base := Backing(bytes.NewReader(baseBytes))
			if tc.base != nil {
				base = tc.base()
			}
			o, err = Open(path, base, Options{})
			if err == nil {
				o.Close()
				t.Fatal("Open succeeded")
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Open: %v; want %v", err, tc.want)
			}
			t.Log(err)
		})
	}
}

func patchAt(off int64, b []byte) func(*testing.T, string) {
	return func(t *testing.T, path string) {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFlattenSparse checks that Flatten leaves zero chunks as holes.
func TestFlattenSparse(t *testing.T) {
	dir := t.TempDir()
	const size = 4 << 20
	base, err := OpenRaw(writeBase(t, dir, "base.img", make([]byte, size)), false)
	if err != nil {
		t.Fatal(err)
	}
	defer base.Close()
	o, err := Create(filepath.Join(dir, "o.ovl"), base, CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	model := make([]byte, size)
	p := bytes.Repeat([]byte{7}, 100)
	o.WriteAt(p, 1<<20+5)
	copy(model[1<<20+5:], p)
	checkView(t, o, model, true)
	out := filepath.Join(dir, "flat.img")
	if err := Flatten(o, out); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(out, &st); err != nil {
		t.Fatal(err)
	}
	if used := st.Blocks * 512; used > 256<<10 {
		t.Errorf("flattened image uses %d bytes of disk for 100 non-zero bytes; want it sparse", used)
	}
	if err := Flatten(o, out); err == nil {
		t.Error("Flatten over an existing file succeeded")
	}
}

// TestClone clones a raw image (reflink where the file system can, an
// overlay otherwise) and checks that the copy reads like the source and
// that writing it leaves the source alone.
func TestClone(t *testing.T) {
	dir := t.TempDir()
	src := pattern(1<<20, 11)
	srcPath := writeBase(t, dir, "src.img", src)
	dst := filepath.Join(dir, "dst")
	kind, err := Clone(srcPath, dst)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Clone made a %v copy", kind)
	var d interface {
		Backing
		io.WriterAt
		Close() error
	}
	switch kind {
	case Reflinked:
		d, err = OpenRaw(dst, true)
	case Overlaid:
		d, err = OpenChain(dst, false)
	default:
		t.Fatalf("kind %v", kind)
	}
	if err != nil {
		t.Fatal(err)
	}
	checkView(t, d, src, false)
	if _, err := d.WriteAt([]byte("fork"), 1000); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(srcPath)
	if !bytes.Equal(got, src) {
		t.Error("writing the clone changed the source")
	}
}

// TestConcurrent has several goroutines read, write and sync at once, on
// distinct blocks and on distinct bytes of shared blocks (which races
// copy-up), and checks every byte at the end. Run it with -race.
func TestConcurrent(t *testing.T) {
	const (
		workers = 6
		size    = 512 << 10
		sector  = 512
	)
	for _, tc := range []struct {
		name  string
		owner func(off int64) int // which worker writes the sector at off
	}{
		{"distinct blocks", func(off int64) int { return int(off/(size/workers)) % workers }},
		{"interleaved sectors of shared blocks", func(off int64) int { return int(off/sector) % workers }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			orig := pattern(size, 13)
			base := bytes.NewReader(bytes.Clone(orig))
			o, err := Create(filepath.Join(t.TempDir(), "o.ovl"), base, CreateOptions{BlockSize: 4096})
			if err != nil {
				t.Fatal(err)
			}
			defer o.Close()
			models := make([][]byte, workers) // each worker's view of its sectors
			var wg sync.WaitGroup
			errs := make(chan error, 2*workers)
			stop := make(chan struct{})
			for g := range workers {
				models[g] = bytes.Clone(orig)
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(g), 99))
					var mine []int64
					for off := int64(0); off < size; off += sector {
						if tc.owner(off) == g {
							mine = append(mine, off)
						}
					}
					buf := make([]byte, sector)
					for i := range 400 {
						off := mine[r.IntN(len(mine))]
						// Write a random part of the sector.
						a := r.Int64N(sector)
						b := a + 1 + r.Int64N(sector-a)
						p := make([]byte, b-a)
						for j := range p {
							p[j] = byte(g<<5 ^ i)
						}
						if _, err := o.WriteAt(p, off+a); err != nil {
							errs <- err
							return
						}
						copy(models[g][off+a:], p)
						off = mine[r.IntN(len(mine))]
						if _, err := o.ReadAt(buf, off); err != nil {
							errs <- err
							return
						}
						if j := firstDiff(buf, models[g][off:off+sector]); j >= 0 {
							errs <- fmt.Errorf("worker %d: sector at %d differs at +%d", g, off, j)
							return
						}
					}
				})
			}
			// A reader of everything and a syncer, running until the
			// writers are done.
			var bg sync.WaitGroup
			bg.Go(func() {
				buf := make([]byte, 20000)
				for off := int64(0); ; off = (off + 7777) % size {
					select {
					case <-stop:
						return
					default:
					}
					if _, err := o.ReadAt(buf, off); err != nil && err != io.EOF {
						errs <- err
						return
					}
				}
			})
			bg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					if err := o.Sync(); err != nil {
						errs <- err
						return
					}
				}
			})
			wg.Wait()
			close(stop)
			bg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			want := make([]byte, size)
			for off := int64(0); off < size; off += sector {
				copy(want[off:off+sector], models[tc.owner(off)][off:])
			}
			checkView(t, o, want, false)
		})
	}
}

// TestCreateRefuses checks Create's argument checks.
func TestCreateRefuses(t *testing.T) {
	dir := t.TempDir()
	base := bytes.NewReader(make([]byte, 64<<10))
	for _, bs := range []int{-1, 1024, 3000, 48 << 10, 32 << 20} {
		if o, err := Create(filepath.Join(dir, fmt.Sprint(bs)), base, CreateOptions{BlockSize: bs}); err == nil {
			o.Close()
			t.Errorf("Create with block size %d succeeded", bs)
		}
	}
	path := filepath.Join(dir, "o.ovl")
	o, err := Create(path, base, CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if o2, err := Create(path, base, CreateOptions{}); err == nil {
		o2.Close()
		t.Error("Create over an existing file succeeded")
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("a refused Create removed the existing file: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("refused Creates left %d files behind", len(entries)-1)
	}
}

// TestCopyUpRace has every worker write its own sector of each block, all
// sweeping the blocks in the same order from a common start, so that they
// reach each unallocated block together: a copy-up that is not serialised
// loses the other workers' sectors.
func TestCopyUpRace(t *testing.T) {
	const (
		workers = 6
		bs      = 4096
		size    = 256 << 10
		sector  = 512
	)
	orig := pattern(size, 17)
	for round := range 4 {
		base := bytes.NewReader(bytes.Clone(orig))
		o, err := Create(filepath.Join(t.TempDir(), "o.ovl"), base, CreateOptions{BlockSize: bs})
		if err != nil {
			t.Fatal(err)
		}
		want := bytes.Clone(orig)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for g := range workers {
			p := bytes.Repeat([]byte{byte(0x10*round + g + 1)}, sector)
			for b := int64(0); b < size/bs; b++ {
				copy(want[b*bs+int64(g)*sector:], p)
			}
			wg.Go(func() {
				<-start
				for b := int64(0); b < size/bs; b++ {
					if _, err := o.WriteAt(p, b*bs+int64(g)*sector); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		close(start)
		wg.Wait()
		checkView(t, o, want, false)
		if n := o.Metrics.CopyUps.Load(); n != size/bs {
			t.Errorf("round %d: %d copy-ups for %d blocks", round, n, size/bs)
		}
		if err := o.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
