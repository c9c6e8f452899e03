package memsnap

import (
	"bytes"
	"path/filepath"
	"testing"
)

// TestChunksAligned checks that writers never put pages of two aligned
// blocks in one chunk, and that an unchanged block yields the same chunk
// (same SHA-256) in a base layer and in an incremental layer written on a
// different chain: what lets a content-addressed store keep it once.
func TestChunksAligned(t *testing.T) {
	const ps, chunkPages, pages = 4096, 16, 256
	mem := make([]byte, ps*pages)
	for p := range pages {
		if p%7 == 3 {
			continue // zero pages shift unaligned chunk boundaries
		}
		pg := mem[p*ps : (p+1)*ps]
		for i := range pg {
			pg[i] = byte(p*31 + i%13)
		}
	}
	dir := t.TempDir()
	opts := Options{ChunkPages: chunkPages}
	a, err := WriteBase(filepath.Join(dir, "a.wsnap"), bytes.NewReader(mem), uint64(len(mem)), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	checkAligned(t, a, chunkPages)

	// A second base whose memory differs in block 2 only, and an
	// incremental on it dirtying, unchanged, the end of block 3 and
	// blocks 4 and 5 whole.
	mem2 := bytes.Clone(mem)
	mem2[2*chunkPages*ps] ^= 0xff
	b, err := WriteBase(filepath.Join(dir, "b.wsnap"), bytes.NewReader(mem2), uint64(len(mem2)), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	dirty := make([]uint64, pages/64)
	for p := 3*chunkPages + 5; p < 6*chunkPages; p++ {
		dirty[p/64] |= 1 << (p % 64)
	}
	inc, err := WriteIncremental(filepath.Join(dir, "c.wsnap"), bytes.NewReader(mem2), uint64(len(mem2)), dirty, b, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer inc.Close()
	checkAligned(t, inc, chunkPages)

	sums := map[[32]byte]bool{}
	for _, c := range a.ChunkRefs() {
		sums[c.Sum] = true
	}
	shared := 0
	for i, c := range b.ChunkRefs() {
		if sums[c.Sum] != (i != 2) {
			t.Errorf("base b chunk %d (block %d): shared with a = %v, want %v", i, i, sums[c.Sum], i != 2)
		}
	}
	for _, c := range inc.ChunkRefs() {
		if sums[c.Sum] {
			shared++
		}
	}
	if shared != 2 { // blocks 4 and 5, stored whole; block 3 only in part
		t.Errorf("incremental shares %d chunks with the base, want 2 (blocks 4 and 5)", shared)
	}
	start, end := a.DataRange()
	refs := a.ChunkRefs()
	if refs[0].Offset != start || refs[len(refs)-1].Offset+int64(refs[len(refs)-1].Length) != end {
		t.Errorf("chunks [%d, %d) do not tile the data range [%d, %d)", refs[0].Offset, refs[len(refs)-1].Offset+int64(refs[len(refs)-1].Length), start, end)
	}
}

func checkAligned(t *testing.T, l *Layer, chunkPages uint64) {
	t.Helper()
	for i, c := range l.ix.chunks {
		blk := c.runs[0].first / chunkPages
		last := c.runs[len(c.runs)-1]
		if (last.end()-1)/chunkPages != blk {
			t.Errorf("%s: chunk %d spans blocks %d..%d", l.Path(), i, blk, (last.end()-1)/chunkPages)
		}
	}
}
