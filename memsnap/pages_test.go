package memsnap

import (
	"bytes"
	"path/filepath"
	"testing"
)

// TestPages: for a base and an incremental layer with zero runs, every
// page found in a chunk (Find, Runs, Decode) holds what Restore writes,
// every page not found is zero, and every visible page is in exactly one
// chunk's runs.
func TestPages(t *testing.T) {
	dir := t.TempDir()
	s := newRandomSim(512, 3, 400)
	base := mustBase(t, filepath.Join(dir, "base.wsnap"), s)
	s.writeRandom(100)
	for p := 0; p < 20; p++ { // zero runs over pages the base stores
		clear(s.mem[p*testPS : (p+1)*testPS])
		s.dirty[p/64] |= 1 << (p % 64)
	}
	top := mustIncr(t, filepath.Join(dir, "incr.wsnap"), s, base)
	c, err := OpenChain(top.Path(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	want := make([]byte, len(s.mem))
	if err := c.Restore(want); err != nil {
		t.Fatal(err)
	}
	px := c.Pages()
	if px.NumPages() != 512 || px.PageSize() != testPS {
		t.Fatalf("%d pages of %d", px.NumPages(), px.PageSize())
	}
	owner := make([]int, 512)
	for i := range owner {
		owner[i] = -1
	}
	var buf []byte
	for ch := range px.NumChunks() {
		data, err := px.Decode(ch, buf)
		if err != nil {
			t.Fatal(err)
		}
		if uint64(len(data)) != px.ChunkBytes(ch) {
			t.Fatalf("chunk %d decodes to %d bytes, ChunkBytes says %d", ch, len(data), px.ChunkBytes(ch))
		}
		buf = data
		for _, r := range px.Runs(ch) {
			for i := range uint64(r.Count) {
				p := r.Page + i
				if owner[p] >= 0 {
					t.Fatalf("page %d in chunks %d and %d", p, owner[p], ch)
				}
				owner[p] = ch
				src := (uint64(r.Src) + i) * testPS
				if !bytes.Equal(data[src:src+testPS], want[p*testPS:(p+1)*testPS]) {
					t.Fatalf("page %d from chunk %d differs from Restore's", p, ch)
				}
			}
		}
	}
	zero := make([]byte, testPS)
	for p := range uint64(512) {
		ch, ok := px.Find(p)
		switch {
		case ok && ch != owner[p]:
			t.Fatalf("Find(%d) = chunk %d, its runs are in chunk %d", p, ch, owner[p])
		case !ok && owner[p] >= 0:
			t.Fatalf("Find(%d) found nothing, chunk %d holds it", p, owner[p])
		case !ok && !bytes.Equal(want[p*testPS:(p+1)*testPS], zero):
			t.Fatalf("page %d is in no chunk but not zero", p)
		}
	}
	if _, ok := px.Find(512); ok {
		t.Fatal("a page past memory was found")
	}
	if _, err := px.Decode(px.NumChunks(), nil); err == nil {
		t.Fatal("decoded a chunk past the end")
	}
}
