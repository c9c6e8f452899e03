package memsnap

import (
	"bytes"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenvm/warren/vmm/guestmem"
)

const testPS = DefaultPageSize

// sim is simulated guest memory with a dirty bitmap, as KVM would report.
type sim struct {
	mem   []byte
	dirty []uint64
	rng   *rand.Rand
}

// newRandomSim is newSim with writes random page writes done
// (writeRandom).
func newRandomSim(pages int, seed uint64, writes int) *sim {
	s := newSim(pages, seed)
	s.writeRandom(writes)
	return s
}

func newSim(pages int, seed uint64) *sim {
	return &sim{
		mem:   make([]byte, pages*testPS),
		dirty: make([]uint64, (pages+63)/64),
		rng:   rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
	}
}

func (s *sim) pages() int { return len(s.mem) / testPS }

// fillPage writes one page: all zero, incompressible random bytes or
// compressible text-like bytes, chosen at random.
func (s *sim) fillPage(p int) {
	pg := s.mem[p*testPS : (p+1)*testPS]
	switch s.rng.IntN(4) {
	case 0:
		clear(pg)
	case 1:
		for i := range pg {
			pg[i] = byte(s.rng.Uint32())
		}
	default:
		words := []string{"kernel ", "page ", "sandbox ", "0000 ", "\x00\x00\x00\x00", "ffff "}
		for i := 0; i < len(pg); {
			i += copy(pg[i:], words[s.rng.IntN(len(words))])
		}
	}
	s.dirty[p/64] |= 1 << (p % 64)
}

// writeRandom dirties n random pages.
func (s *sim) writeRandom(n int) {
	for range n {
		s.fillPage(s.rng.IntN(s.pages()))
	}
}

func (s *sim) resetDirty() { clear(s.dirty) }

func (s *sim) reader() *bytes.Reader { return bytes.NewReader(s.mem) }

var testFP = []byte("host=test;cpu=avx2,sha")

func testOpts() Options {
	return Options{Fingerprint: testFP, Created: time.Unix(1700000000, 0), ChunkPages: 32}
}

func mustBase(t testing.TB, path string, s *sim) *Layer {
	t.Helper()
	l, err := WriteBase(path, s.reader(), uint64(len(s.mem)), testOpts())
	if err != nil {
		t.Fatalf("WriteBase: %v", err)
	}
	s.resetDirty()
	t.Cleanup(func() { l.Close() })
	return l
}

// writeBaseFile writes a base layer to path (WriteBase) and closes it.
func writeBaseFile(t testing.TB, path string, r io.ReaderAt, size uint64, o Options) {
	t.Helper()
	l, err := WriteBase(path, r, size, o)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
}

func mustIncr(t testing.TB, path string, s *sim, parent *Layer) *Layer {
	t.Helper()
	l, err := WriteIncremental(path, s.reader(), uint64(len(s.mem)), s.dirty, parent, testOpts())
	if err != nil {
		t.Fatalf("WriteIncremental: %v", err)
	}
	s.resetDirty()
	t.Cleanup(func() { l.Close() })
	return l
}

// checkChain opens the chain at top, verifies it and checks that Restore,
// Flatten, Reader and Compact all reproduce want.
func checkChain(t *testing.T, top string, want []byte) {
	t.Helper()
	c, err := OpenChain(top, nil)
	if err != nil {
		t.Fatalf("OpenChain: %v", err)
	}
	defer c.Close()
	if err := c.Verify(); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	got := make([]byte, len(want))
	if err := c.Restore(got); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if i := firstDiff(got, want); i >= 0 {
		t.Fatalf("Restore differs at byte %d (page %d)", i, i/testPS)
	}
	r := c.Reader()
	rng := rand.New(rand.NewPCG(uint64(len(want)), 1))
	for range 200 {
		off := rng.IntN(len(want))
		n := rng.IntN(3 * testPS)
		buf := make([]byte, n)
		got, err := r.ReadAt(buf, int64(off))
		wantN := min(n, len(want)-off)
		if got != wantN || (err != nil) != (wantN < n) || !bytes.Equal(buf[:got], want[off:off+wantN]) {
			t.Fatalf("Reader.ReadAt(%d bytes at %d) = %d, %v; want %d bytes equal to memory", n, off, got, err, wantN)
		}
	}
	flat := filepath.Join(t.TempDir(), "flat.img")
	if err := c.Flatten(flat); err != nil {
		t.Fatalf("Flatten: %v", err)
	}
	img, err := os.ReadFile(flat)
	if err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(img, want); i >= 0 {
		t.Fatalf("Flatten differs at byte %d", i)
	}
	if fi, err := os.Stat(flat); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			nonZero := 0
			for p := 0; p < len(want); p += testPS {
				if !isZero(want[p : p+testPS]) {
					nonZero++
				}
			}
			if alloc := st.Blocks * 512; alloc > int64(nonZero*testPS)+64<<10 {
				t.Fatalf("Flatten allocated %d bytes for %d non-zero pages: zero pages are not holes", alloc, nonZero)
			}
		}
	}
	compact := filepath.Join(t.TempDir(), "compact"+Ext)
	cl, err := Compact(c, compact, Options{Created: time.Unix(1, 0)})
	if err != nil {
		t.Fatalf("Compact: %v", err)
	}
	defer cl.Close()
	if cl.Kind() != KindBase || !bytes.Equal(cl.Fingerprint(), c.Fingerprint()) {
		t.Fatalf("Compact: kind %v fingerprint %q", cl.Kind(), cl.Fingerprint())
	}
	cc, err := OpenChain(compact, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	got2 := make([]byte, len(want))
	if err := cc.Restore(got2); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(got2, want); i >= 0 {
		t.Fatalf("Compact differs at byte %d", i)
	}
}

func firstDiff(a, b []byte) int {
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

func TestRoundTripBase(t *testing.T) {
	dir := t.TempDir()
	s := newRandomSim(1024, 1, 400)
	path := filepath.Join(dir, "base"+Ext)
	l := mustBase(t, path, s)
	st := l.Stats()
	nonZero := 0
	for p := range s.pages() {
		if !isZero(s.mem[p*testPS : (p+1)*testPS]) {
			nonZero++
		}
	}
	if st.StoredPages != uint64(nonZero) || st.ZeroPages != 0 || st.Kind != KindBase {
		t.Fatalf("stats %+v, want %d stored pages", st, nonZero)
	}
	if st.Ratio <= 1 {
		t.Errorf("compression ratio %.2f, want > 1 for text-like pages", st.Ratio)
	}
	h := l.Header()
	if h.MemSize != uint64(len(s.mem)) || h.PageSize != testPS || !bytes.Equal(h.Fingerprint, testFP) || !h.Created.Equal(time.Unix(1700000000, 0)) {
		t.Fatalf("header %+v", h)
	}
	checkChain(t, path, s.mem)

	// An all-zero memory stores nothing and restores to zero.
	z := newSim(64, 2)
	zp := filepath.Join(dir, "zero"+Ext)
	zl := mustBase(t, zp, z)
	if st := zl.Stats(); st.StoredPages != 0 || st.Chunks != 0 {
		t.Fatalf("zero memory stats %+v", st)
	}
	checkChain(t, zp, z.mem)
}

func TestRoundTripChain(t *testing.T) {
	dir := t.TempDir()
	s := newRandomSim(2048, 3, 1500)
	top := mustBase(t, filepath.Join(dir, "l0"+Ext), s)
	checkChain(t, top.Path(), s.mem)
	for i := 1; i <= 3; i++ {
		s.writeRandom(50 * i * i)
		top = mustIncr(t, filepath.Join(dir, "l"+string(rune('0'+i))+Ext), s, top)
		if top.Kind() != KindIncremental {
			t.Fatalf("layer %d kind %v", i, top.Kind())
		}
		checkChain(t, top.Path(), s.mem)
	}
	c, err := OpenChain(top.Path(), Dir(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n := len(c.Layers()); n != 4 {
		t.Fatalf("chain has %d layers, want 4", n)
	}
	for i, st := range c.Stats() {
		t.Logf("layer %d: %s stored=%d zero=%d chunks=%d file=%d ratio=%.2f", i, st.Kind, st.StoredPages, st.ZeroPages, st.Chunks, st.FileBytes, st.Ratio)
	}
}

func TestIncrementalSizeProportional(t *testing.T) {
	dir := t.TempDir()
	s := newSim(4096, 4)
	base := mustBase(t, filepath.Join(dir, "base"+Ext), s)
	incompressible := func(p int) {
		pg := s.mem[p*testPS : (p+1)*testPS]
		for i := range pg {
			pg[i] = byte(s.rng.Uint32()) | 1
		}
		s.dirty[p/64] |= 1 << (p % 64)
	}
	sizes := map[int]Stats{}
	for _, n := range []int{10, 1000} {
		for p := range n {
			incompressible(p * 4)
		}
		l := mustIncr(t, filepath.Join(dir, "incr"+Ext), s, base)
		st := l.Stats()
		if st.StoredPages != uint64(n) {
			t.Fatalf("%d dirty pages: stored %d", n, st.StoredPages)
		}
		sizes[n] = st
	}
	ratio := float64(sizes[1000].FileBytes) / float64(sizes[10].FileBytes)
	t.Logf("10 pages: %d bytes; 1000 pages: %d bytes; ratio %.1f", sizes[10].FileBytes, sizes[1000].FileBytes, ratio)
	if ratio < 80 || ratio > 110 {
		t.Fatalf("file size ratio %.1f for 100x the pages, want about 100", ratio)
	}
	if sizes[10].FileBytes > 10*testPS+4096 {
		t.Fatalf("10-page layer is %d bytes", sizes[10].FileBytes)
	}
}

func TestDirtiedZeroPage(t *testing.T) {
	dir := t.TempDir()
	s := newSim(256, 5)
	for p := range 256 {
		copy(s.mem[p*testPS:], "not zero")
	}
	base := mustBase(t, filepath.Join(dir, "base"+Ext), s)
	// Zero pages 7..9 and 100; write page 8 back as zero (still dirty).
	for _, p := range []int{7, 8, 9, 100} {
		clear(s.mem[p*testPS : (p+1)*testPS])
		s.dirty[p/64] |= 1 << (p % 64)
	}
	copy(s.mem[50*testPS:], "changed")
	s.dirty[0] |= 1 << 50
	incr := mustIncr(t, filepath.Join(dir, "incr"+Ext), s, base)
	st := incr.Stats()
	if st.ZeroPages != 4 || st.StoredPages != 1 {
		t.Fatalf("stats %+v, want 4 zero pages and 1 stored", st)
	}
	if len(incr.ix.zeros) != 2 {
		t.Fatalf("zero runs %v, want [7,+3) and [100,+1)", incr.ix.zeros)
	}
	checkChain(t, incr.Path(), s.mem)
}

func TestDeterministic(t *testing.T) {
	dir := t.TempDir()
	s := newRandomSim(1024, 6, 800)
	var files [][]byte
	for _, w := range []int{1, 2, 7} {
		o := testOpts()
		o.Workers = w
		p := filepath.Join(dir, "w"+Ext)
		writeBaseFile(t, p, s.reader(), uint64(len(s.mem)), o)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, b)
	}
	for i := 1; i < len(files); i++ {
		if !bytes.Equal(files[0], files[i]) {
			t.Fatalf("output with different worker counts differs")
		}
	}
}

func TestHeaderRoundTrip(t *testing.T) {
	for _, h := range []Header{
		{Version: Version, Kind: KindBase, PageSize: 4096, MemSize: 1 << 30, Created: time.Unix(5, 6).UTC()},
		{Version: Version, Kind: KindIncremental, PageSize: 2 << 20, MemSize: 4 << 30, Parent: Hash{1, 2, 3}, ParentName: "p.wsnap", Fingerprint: []byte("fp"), Created: time.Unix(0, 0).UTC()},
		{Version: Version, Kind: KindIncremental, PageSize: 4096, MemSize: 4096, Parent: Hash{31: 9}, ParentName: strings.Repeat("n", MaxParentNameLen), Fingerprint: bytes.Repeat([]byte{7}, MaxFingerprintLen), Created: time.Unix(1e9, 1).UTC()},
	} {
		b := encodeHeader(&h)
		got, n, err := parseHeader(append(b, "trailing"...))
		if err != nil {
			t.Fatalf("parse %+v: %v", h, err)
		}
		if n != len(b) || got.Kind != h.Kind || got.PageSize != h.PageSize || got.MemSize != h.MemSize || got.Parent != h.Parent ||
			got.ParentName != h.ParentName || !bytes.Equal(got.Fingerprint, h.Fingerprint) || !got.Created.Equal(h.Created) {
			t.Fatalf("round trip: got %+v (%d bytes), want %+v (%d bytes)", got, n, h, len(b))
		}
	}
}

// TestGuestmemRoundTrip snapshots and restores a real memfd-backed
// guestmem.Memory through its flat host mapping.
func TestGuestmemRoundTrip(t *testing.T) {
	const size = 8 << 20
	src, err := guestmem.New(size)
	if err != nil {
		t.Skipf("guestmem: %v", err)
	}
	defer src.Close()
	flat := src.Host(guestmem.Region{Size: src.Size()})
	s := newRandomSim(size/testPS, 12, 500)
	copy(flat, s.mem)
	path := filepath.Join(t.TempDir(), "vm"+Ext)
	writeBaseFile(t, path, bytes.NewReader(flat), src.Size(), testOpts())
	dst, err := guestmem.New(size)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	c, err := OpenChain(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Restore(dst.Host(guestmem.Region{Size: dst.Size()})); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst.Host(guestmem.Region{Size: dst.Size()}), flat) {
		t.Fatal("restored memfd differs")
	}
}
