package disk

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// stack is a test disk: a raw base and frozen overlays over it, all in
// dir, each written at random (with discards), and a live top over them.
type stack struct {
	dir    string
	base   *Raw
	layers []*Overlay // frozen, bottom first
	top    *Overlay   // live
	model  []byte     // the top's view
}

// buildStack makes a base of size bytes and n frozen layers (block sizes
// from bss, cycled) with a live top, freezing each layer as a snapshot
// does (Fork with no child).
func buildStack(t *testing.T, size int64, n int, bss []int, seed uint64) *stack {
	t.Helper()
	s := &stack{dir: t.TempDir(), model: pattern(size, seed)}
	var err error
	if s.base, err = OpenRaw(writeBase(t, s.dir, "disk.img", s.model), true); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, 3))
	var cur Backing = s.base
	for i := range n + 2 {
		if i > 0 {
			// Freeze cur under a new live top (the first freeze is the
			// raw image's, the others overlays').
			bs := bss[(i-1)%len(bss)]
			o, err := Create(NewLayerPath(s.dir, "disk.img"), cur, CreateOptions{BlockSize: bs, BasePath: filepath.Base(pathOfLayer(cur))})
			if err != nil {
				t.Fatal(err)
			}
			freeze(t, cur.(frozen))
			if co, ok := cur.(*Overlay); ok {
				s.layers = append(s.layers, co)
			}
			o.closeBase = cur.(frozen).Close
			cur = o
		}
		w := cur.(interface {
			WriteAt([]byte, int64) (int, error)
			Discard(int64, int64) error
		})
		for range 40 {
			off, m := randSpan(r, size, 16<<10)
			if r.IntN(5) == 0 {
				if err := w.Discard(off, m); err != nil {
					t.Fatal(err)
				}
				clear(s.model[off : off+m])
				continue
			}
			p := bytes.Repeat([]byte{byte(i + 1)}, int(m))
			p[0] = byte(r.Uint32())
			if _, err := w.WriteAt(p, off); err != nil {
				t.Fatal(err)
			}
			copy(s.model[off:], p)
		}
	}
	s.top = cur.(*Overlay)
	t.Cleanup(func() { s.top.Close() })
	return s
}

// freeze freezes a layer as Fork does: synced, read-only, locked shared.
func freeze(t testing.TB, f frozen) {
	t.Helper()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.setReadOnly(true)
	if err := flock(f.file(), unix.LOCK_SH); err != nil {
		t.Fatal(err)
	}
}

// mergeFrozen merges the frozen layers under s's live top that s's
// directory owns into a new layer, as a rebase does, and returns its path.
func (s *stack) mergeFrozen(t *testing.T) string {
	t.Helper()
	run, rest := Owned(s.layers[len(s.layers)-1], s.dir)
	mp := NewLayerPath(s.dir, "disk.img")
	if _, err := Merge(mp, run, rest, "disk.img"); err != nil {
		t.Fatal(err)
	}
	return mp
}

// reference flattens b into memory.
func reference(t *testing.T, b Backing) []byte {
	t.Helper()
	out := filepath.Join(t.TempDir(), "ref.img")
	if err := Flatten(b, out); err != nil {
		t.Fatal(err)
	}
	ref, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// sameBlocks compares two views block by block (bs bytes at a time).
func sameBlocks(t *testing.T, what string, got Backing, want []byte, bs int64) {
	t.Helper()
	buf := make([]byte, bs)
	for off := int64(0); off < int64(len(want)); off += bs {
		b := buf[:min(bs, int64(len(want))-off)]
		if err := readFull(got, b, off); err != nil {
			t.Fatalf("%s: read block at %d: %v", what, off, err)
		}
		if i := firstDiff(b, want[off:off+int64(len(b))]); i >= 0 {
			t.Fatalf("%s: block at %d differs at +%d: %#x, want %#x", what, off, i, b[i], want[off+int64(i)])
		}
	}
}

// TestMerge merges the frozen layers of stacks of different shapes into
// one overlay over the base, and checks it block by block against a
// flattened reference of the layers' view: same content, only blocks some
// layer held allocated, zero blocks left holes; then rebases the live top
// onto it and checks the top's view and chain.
func TestMerge(t *testing.T) {
	for _, tc := range []struct {
		name   string
		size   int64
		layers int
		bss    []int
	}{
		{"one-layer", 2<<20 + 4096, 1, []int{64 << 10}},
		{"five-layers", 3 << 20, 5, []int{64 << 10}},
		{"mixed-block-sizes", 2<<20 + 512, 4, []int{16 << 10, 64 << 10, 4 << 10}},
		{"ragged-small-disk", 100 << 10, 3, []int{64 << 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := buildStack(t, tc.size, tc.layers, tc.bss, uint64(tc.size))
			frozenTop := s.layers[len(s.layers)-1]
			ref := reference(t, frozenTop)
			run, rest := Owned(frozenTop, s.dir)
			if len(run) != tc.layers || rest != Backing(s.base) {
				t.Fatalf("Owned: %d layers over %T, want %d over the raw base", len(run), rest, tc.layers)
			}
			mp := NewLayerPath(s.dir, frozenTop.Path())
			st, err := Merge(mp, run, rest, "disk.img")
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("merged %d layers: %d blocks, %d bytes written", len(run), st.Blocks, st.Bytes)
			m, err := OpenChain(mp, true)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			sameBlocks(t, "merged", m, ref, m.BlockSize())
			// Allocated exactly where a layer held a byte.
			held := m.heldBy(run)
			var n int64
			for b := int64(0); b < int64(m.Header().Blocks()); b++ {
				want := held[b/64]&(1<<(b%64)) != 0
				if m.isAllocated(b) != want {
					t.Fatalf("merged block %d allocated %v, want %v", b, m.isAllocated(b), want)
				}
				if want {
					n++
				}
			}
			if n != st.Blocks || m.Allocated() != n {
				t.Errorf("merged overlay holds %d blocks (stats %d), want %d", m.Allocated(), st.Blocks, n)
			}
			// Zero blocks are holes: the file holds no more data than written.
			var fst syscallStat
			if err := statFile(mp, &fst); err == nil && fst.blocks*512 > st.Bytes+int64(m.geom.DataOffset())+1<<20 {
				t.Errorf("merged file has %d bytes allocated for %d bytes of data", fst.blocks*512, st.Bytes)
			}

			// The live top moves onto the merged layer and reads the same.
			if err := s.top.Rebase(mp); err != nil {
				t.Fatal(err)
			}
			if got, want := Chain(s.top), []string{mp, absPath(s.base.Path())}; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("chain after the rebase %q, want %q", got, want)
			}
			checkView(t, s.top, s.model, false)
			writeRandom(t, s.top, s.model, s.top.BlockSize(), 20, 9)
			tp := s.top.Path()
			if err := s.top.Close(); err != nil {
				t.Fatal(err)
			}
			s.top, err = OpenChain(tp, false)
			if err != nil {
				t.Fatal(err)
			}
			if h := s.top.Header(); h.BasePath != filepath.Base(mp) || h.Generation != 2 {
				t.Errorf("reopened header: base %q generation %d, want %q and 2", h.BasePath, h.Generation, filepath.Base(mp))
			}
			checkView(t, s.top, s.model, true)
		})
	}
}

// TestRebaseConcurrentReads rebases a live top while readers read it
// without pause (and a writer writes to it): every read sees the model,
// and the old chain is closed only once no read is in flight on it (the
// race detector watches).
func TestRebaseConcurrentReads(t *testing.T) {
	s := buildStack(t, 2<<20, 3, []int{16 << 10}, 5)
	mp := s.mergeFrozen(t)
	want := bytes.Clone(s.model)
	// The writer writes to the second half only; readers read the first.
	half := int64(len(want) / 2)
	var stop atomic.Bool
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for k := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(k), 1))
			buf := make([]byte, 40<<10)
			for !stop.Load() {
				off := r.Int64N(half - int64(len(buf)))
				if _, err := s.top.ReadAt(buf, off); err != nil {
					errc <- err
					return
				}
				if i := firstDiff(buf, want[off:off+int64(len(buf))]); i >= 0 {
					errc <- fmt.Errorf("read at %d differs at +%d", off, i)
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load(); i++ {
			if _, err := s.top.WriteAt([]byte{byte(i)}, half+int64(i*7919)%half); err != nil {
				errc <- err
				return
			}
		}
	}()
	if err := s.top.Rebase(mp); err != nil {
		t.Fatal(err)
	}
	stop.Store(true)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	sameBlocks(t, "top after the rebase", s.top, reference(t, s.top), 64<<10)
}

// TestRebaseTorn tears the header write of a Rebase at every 64-byte
// boundary and in every combination of its 512-byte sectors, and drops the
// overlay there (a crash): it must reopen, over the old base or (only when
// the whole slot made it) the new one, reading the same either way.
func TestRebaseTorn(t *testing.T) {
	s := buildStack(t, 1<<20, 2, []int{64 << 10}, 11)
	mp := s.mergeFrozen(t)
	tp := s.top.Path()
	if err := s.top.Sync(); err != nil {
		t.Fatal(err)
	}
	model := bytes.Clone(s.model)
	oldBase := s.top.Header().BasePath
	orig, err := os.ReadFile(tp)
	if err != nil {
		t.Fatal(err)
	}
	s.top.Close()
	type tear struct {
		name string
		keep func(i int) bool // which bytes of the new slot reach the disk
	}
	var tears []tear
	for cut := 0; cut <= SlotSize; cut += 64 {
		tears = append(tears, tear{fmt.Sprintf("prefix-%d", cut), func(i int) bool { return i < cut }})
	}
	for mask := 0; mask < 16; mask++ {
		tears = append(tears, tear{fmt.Sprintf("sectors-%04b", mask), func(i int) bool { return mask&(1<<(i/512)) != 0 }})
	}
	errCrash := errors.New("crash")
	for _, tc := range tears {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(tp, orig, 0o600); err != nil {
				t.Fatal(err)
			}
			o, err := OpenChain(tp, false)
			if err != nil {
				t.Fatal(err)
			}
			var slot []byte
			var slotOff int64
			o.writeSlot = func(f *os.File, b []byte, off int64) error {
				slot, slotOff = b, off
				for i := range b {
					if tc.keep(i) {
						if _, err := f.WriteAt(b[i:i+1], off+int64(i)); err != nil {
							return err
						}
					}
				}
				return errCrash
			}
			if err := o.Rebase(mp); !errors.Is(err, errCrash) {
				t.Fatalf("Rebase: %v, want the crash", err)
			}
			o.Close() // the crash: nothing more is written
			o, err = OpenChain(tp, false)
			if err != nil {
				t.Fatalf("the overlay does not reopen after a torn header write: %v", err)
			}
			defer o.Close()
			// The new header is in force exactly when its slot is whole
			// on disk (bytes the tear skipped may already match: zeros).
			onDisk := make([]byte, len(slot))
			fh, err := os.Open(tp)
			if err != nil {
				t.Fatal(err)
			}
			fh.ReadAt(onDisk, slotOff)
			fh.Close()
			wantBase := oldBase
			if bytes.Equal(onDisk, slot) {
				wantBase = filepath.Base(mp)
			}
			if got := o.Header().BasePath; got != wantBase {
				t.Errorf("reopened over %q, want %q", got, wantBase)
			}
			checkView(t, o, model, false)
		})
	}
}

// TestRebaseRefuses: a base that reads differently, a frozen overlay and
// a version 1 overlay are refused, and the overlay stays on its base.
func TestRebaseRefuses(t *testing.T) {
	s := buildStack(t, 2<<20, 2, []int{64 << 10}, 13)
	other := writeBase(t, s.dir, "other.img", pattern(2<<20, 99))
	if err := s.top.Rebase(other); !errors.Is(err, ErrBaseMismatch) {
		t.Errorf("rebase onto another image: %v, want ErrBaseMismatch", err)
	}
	short := writeBase(t, s.dir, "short.img", pattern(1<<20, 13))
	if err := s.top.Rebase(short); !errors.Is(err, ErrBaseMismatch) {
		t.Errorf("rebase onto a smaller image: %v, want ErrBaseMismatch", err)
	}
	if err := s.layers[0].Rebase(s.base.Path()); err == nil {
		t.Error("a frozen layer was rebased")
	}
	checkView(t, s.top, s.model, false)

	// A version 1 overlay (made by an earlier build) opens and works, but
	// has one header slot: no rebase.
	v1 := filepath.Join(s.dir, "old.ovl")
	o, err := Create(v1, s.base, CreateOptions{BasePath: "disk.img"})
	if err != nil {
		t.Fatal(err)
	}
	h := o.Header()
	o.Close()
	f, err := os.OpenFile(v1, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(marshalV1(h), 0)
	f.Close()
	o, err = OpenChain(v1, false)
	if err != nil {
		t.Fatalf("a version 1 overlay does not open: %v", err)
	}
	defer o.Close()
	if v := o.Header().Version; v != 1 {
		t.Errorf("version %d, want 1", v)
	}
	model := reference(t, s.base)
	writeRandom(t, o, model, o.BlockSize(), 10, 3)
	checkView(t, o, model, false)
	if err := o.Rebase(s.base.Path()); !errors.Is(err, ErrVersion) {
		t.Errorf("rebase of a version 1 overlay: %v, want ErrVersion", err)
	}
}

// TestOwnedStopsAtForeign: the run stops at the first layer outside the
// directory (a template's base, a fork parent's layer) and at a raw image.
func TestOwnedStopsAtForeign(t *testing.T) {
	tpl, sb := t.TempDir(), t.TempDir()
	size := int64(1 << 20)
	base, err := OpenRaw(writeBase(t, tpl, "disk0.base", pattern(size, 1)), false)
	if err != nil {
		t.Fatal(err)
	}
	defer base.Close()
	tplOv, err := Create(filepath.Join(tpl, "disk0.wcow"), base, CreateOptions{BasePath: "disk0.base"})
	if err != nil {
		t.Fatal(err)
	}
	freeze(t, tplOv)
	a, err := Create(filepath.Join(sb, "disk0.overlay"), tplOv, CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	freeze(t, a)
	b, err := Create(NewLayerPath(sb, "disk0.overlay"), a, CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	run, rest := Owned(b, sb)
	if len(run) != 2 || run[0] != b || run[1] != a || rest != Backing(tplOv) {
		t.Errorf("Owned(sandbox) = %d layers over %v", len(run), rest)
	}
	if run, rest := Owned(tplOv, tpl); len(run) != 1 || rest != Backing(base) {
		t.Errorf("Owned(template) = %d layers over %v: the raw base is never owned", len(run), rest)
	}
	if run, _ := Owned(base, tpl); len(run) != 0 {
		t.Errorf("Owned(raw) = %d layers", len(run))
	}
	if got := Chain(b); len(got) != 3 || got[0] != a.Path() || got[2] != base.Path() {
		t.Errorf("Chain = %q", got)
	}
	if !forkName.MatchString(filepath.Base(NewLayerPath(sb, "disk.5f3e1d-0badcafe.wcow"))) {
		t.Errorf("NewLayerPath does not strip an earlier unique part")
	}
	b.Close()
	a.Close()
	tplOv.Close()
}

// BenchmarkMerge measures Merge's throughput over the bytes the layers
// hold (b.SetBytes): 4 frozen layers of random 64 KiB blocks over a
// 256 MiB disk, in the page cache.
func BenchmarkMerge(b *testing.B) {
	dir := b.TempDir()
	const size = 256 << 20
	f, err := os.Create(filepath.Join(dir, "disk.img"))
	if err != nil {
		b.Fatal(err)
	}
	f.Truncate(size)
	f.Close()
	base, err := OpenRaw(filepath.Join(dir, "disk.img"), false)
	if err != nil {
		b.Fatal(err)
	}
	defer base.Close()
	r := rand.New(rand.NewPCG(1, 2))
	var layers []*Overlay
	var cur Backing = base
	blk := make([]byte, DefaultBlockSize)
	for i := range 4 {
		o, err := Create(filepath.Join(dir, fmt.Sprintf("l%d.wcow", i)), cur, CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		for range 256 { // 16 MiB per layer
			for j := range blk {
				blk[j] = byte(r.Uint32())
			}
			if _, err := o.WriteAt(blk, r.Int64N(size/DefaultBlockSize)*DefaultBlockSize); err != nil {
				b.Fatal(err)
			}
		}
		freeze(b, o)
		layers = append([]*Overlay{o}, layers...)
		cur = o
	}
	var held int64
	for _, l := range layers {
		held += l.Allocated()
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p := filepath.Join(dir, fmt.Sprintf("m%d.wcow", i))
		st, err := Merge(p, layers, base, "disk.img")
		if err != nil {
			b.Fatal(err)
		}
		b.SetBytes(st.Blocks * DefaultBlockSize)
		os.Remove(p)
	}
	b.ReportMetric(float64(held), "layer-blocks")
}

// syscallStat is the part of stat(2) the tests read.
type syscallStat struct{ blocks int64 }

func statFile(path string, st *syscallStat) error {
	var s syscall.Stat_t
	if err := syscall.Stat(path, &s); err != nil {
		return err
	}
	st.blocks = s.Blocks
	return nil
}
