package memsnap

import (
	"bytes"
	"math/rand/v2"
	"path/filepath"
	"testing"
)

// TestChunkCuts: a layer cut at its chunks gives a piece per chunk
// (or per aligned group of chunks), between the header's and the
// index's; two layers of memory that differs in one page share every
// piece but that page's chunk, the header and the index, although the
// changed chunk moved the later ones.
func TestChunkCuts(t *testing.T) {
	const size = 4 << 20
	r := rand.New(rand.NewPCG(1, 2))
	mem := make([]byte, size)
	for p := 0; p < size/DefaultPageSize; p++ {
		if p%7 == 3 || (p >= 300 && p < 600) {
			continue // zero pages; 300-599 hold blocks 5-8 (pages 320-575) whole
		}
		pg := mem[p*DefaultPageSize : (p+1)*DefaultPageSize]
		for i := 0; i < len(pg); i += 64 {
			if r.IntN(3) == 0 {
				copy(pg[i:i+64], bytes.Repeat([]byte{byte(p)}, 64))
			} else {
				for j := i; j < i+64; j++ {
					pg[j] = byte(r.Uint32())
				}
			}
		}
	}
	dir := t.TempDir()
	write := func(name string, m []byte) (*Layer, []byte) {
		l, err := WriteBase(filepath.Join(dir, name), bytes.NewReader(m), size, Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		b := make([]byte, l.FileSize())
		if _, err := l.f.ReadAt(b, 0); err != nil {
			t.Fatal(err)
		}
		return l, b
	}
	pieces := func(l *Layer, file []byte, group uint64) [][]byte {
		cuts := l.ChunkCuts(group)
		var out [][]byte
		for i := 0; i+1 < len(cuts); i++ {
			if cuts[i] >= cuts[i+1] {
				t.Fatalf("cuts %v not increasing", cuts)
			}
			out = append(out, file[cuts[i]:cuts[i+1]])
		}
		if cuts[0] != 0 || cuts[len(cuts)-1] != l.FileSize() {
			t.Fatalf("cuts %v do not span the file of %d bytes", cuts, l.FileSize())
		}
		return out
	}
	a, fa := write("a.wsnap", mem)
	refs := a.ChunkRefs()
	if len(refs) != size/DefaultPageSize/DefaultChunkPages-4 {
		t.Fatalf("%d chunks", len(refs))
	}
	pa := pieces(a, fa, DefaultChunkPages*DefaultPageSize)
	if len(pa) != len(refs)+2 {
		t.Fatalf("%d pieces for %d chunks", len(pa), len(refs))
	}
	for i, c := range refs {
		if !bytes.Equal(pa[i+1], fa[c.Offset:c.Offset+int64(c.Length)]) {
			t.Fatalf("piece %d is not chunk %d", i+1, i)
		}
	}
	// Groups of four blocks (1 MiB): four, holding 4, 1, 3 and 4 chunks.
	if pg := pieces(a, fa, 4*DefaultChunkPages*DefaultPageSize); len(pg) != 4+2 {
		t.Fatalf("%d pieces in groups of 1 MiB", len(pg))
	}
	// A page's change is one piece's.
	m2 := bytes.Clone(mem)
	copy(m2[100*DefaultPageSize+17:], "changed")
	for i := 100 * DefaultPageSize; i < 101*DefaultPageSize; i += 2 {
		m2[i] = 0 // compresses to another length: later chunks move
	}
	b, fb := write("b.wsnap", m2)
	pb := pieces(b, fb, DefaultChunkPages*DefaultPageSize)
	if b.ChunkRefs()[2].Offset == refs[2].Offset {
		t.Fatal("the changed chunk kept its length: later chunks did not move")
	}
	var differ []int
	for i := range pa {
		if !bytes.Equal(pa[i], pb[i]) {
			differ = append(differ, i)
		}
	}
	if len(differ) != 3 || differ[0] != 0 || differ[1] != 2 || differ[2] != len(pa)-1 {
		t.Fatalf("pieces %v differ, want [0 2 %d]", differ, len(pa)-1)
	}
}
