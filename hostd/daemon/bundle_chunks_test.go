package daemon

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/warrenvm/warren/memsnap"
)

// memPiece is one piece of a bundle's memory part.
type memPiece struct {
	off  int64
	data []byte
}

// memoryPieces returns bundle fs's memory pieces, in order, and the
// memory layer they make up (checked to be contiguous: a memsnap layer
// has no all-zero piece).
func memoryPieces(t *testing.T, fs []tarFile) ([]memPiece, []byte) {
	t.Helper()
	var ps []memPiece
	var layer []byte
	for _, x := range fs {
		o, ok := strings.CutPrefix(x.name, "memory/")
		if !ok {
			continue
		}
		off, err := strconv.ParseInt(o, 16, 64)
		if err != nil || off != int64(len(layer)) {
			t.Fatalf("memory piece %s: not at %d", x.name, len(layer))
		}
		ps = append(ps, memPiece{off, x.data})
		layer = append(layer, x.data...)
	}
	return ps, layer
}

// TestBundleMemoryPiecesAreChunks: a bundle cuts its memory layer at the
// layer's chunks, so each piece between the header and the index is one
// chunk, whose SHA-256 is the one the layer's index records (the page
// store's name for it in a plain namespace); a snapshot that changed one
// page has the same pieces but that page's chunk (and the header and
// index that name it), which the object store then keeps once; a bundle
// of version 1 (memory cut every bundleChunk bytes) still imports.
func TestBundleMemoryPiecesAreChunks(t *testing.T) {
	f := newBundleFixture(t)
	first := readTar(t, f.export(t))
	ps, layer := memoryPieces(t, first)
	l, err := memsnap.OpenReaderAt("memory", bytes.NewReader(layer), int64(len(layer)))
	if err != nil {
		t.Fatal(err)
	}
	start, end := l.DataRange()
	refs := l.ChunkRefs()
	l.Close()
	if len(refs) < 8 {
		t.Fatalf("a layer of %d chunks: the fixture should have more", len(refs))
	}
	if len(ps) != len(refs)+2 || ps[0].off != 0 || int64(len(ps[0].data)) != start || ps[len(ps)-1].off != end {
		t.Fatalf("%d memory pieces (first %d bytes, last at %d) for %d chunks between %d and %d", len(ps), len(ps[0].data), ps[len(ps)-1].off, len(refs), start, end)
	}
	for i, c := range refs {
		p := ps[i+1]
		if p.off != c.Offset || int64(len(p.data)) != int64(c.Length) || sha256.Sum256(p.data) != c.Sum {
			t.Fatalf("piece %d (%d bytes at %d) is not chunk %d (%d bytes at %d)", i+1, len(p.data), p.off, i, c.Length, c.Offset)
		}
	}

	// One page changed: one chunk changed.
	page := uint64(len(f.mem)/4096/2 + 3)
	changed := -1
	for i, c := range refs {
		if c.First <= page {
			changed = i
		}
	}
	mem := bytes.Clone(f.mem)
	copy(mem[page*4096:], "a page written since the first export")
	s := f.td.sandbox("alice", f.id)
	s.mu.Lock()
	f.writeSnapshot(t, s, mem)
	s.mu.Unlock()
	second := readTar(t, f.export(t))
	ps2, _ := memoryPieces(t, second)
	if len(ps2) != len(ps) {
		t.Fatalf("%d memory pieces, then %d", len(ps), len(ps2))
	}
	var differ []int
	for i := range ps {
		// (Later pieces may lie at other offsets: the changed chunk
		// compressed to another length. The object store keeps a
		// piece by its bytes, whatever its name.)
		if !bytes.Equal(ps[i].data, ps2[i].data) {
			differ = append(differ, i)
		}
	}
	if want := []int{0, changed + 1, len(ps) - 1}; fmt.Sprint(differ) != fmt.Sprint(want) {
		t.Fatalf("pieces %v differ, want %v (the header, chunk %d holding page %d, the index)", differ, want, changed, page)
	}

	// Version 1: the memory cut every bundleChunk bytes.
	_, lay := memoryPieces(t, second)
	var v1 []tarFile
	for _, x := range cloneTar(second) {
		switch {
		case x.name == "bundle.json":
			var h map[string]any
			json.Unmarshal(x.data, &h)
			h["version"] = 1
			x.data, _ = json.Marshal(h)
		case x.name == fmt.Sprintf("memory/%016x", 0):
			for off := 0; off < len(lay); off += bundleChunk {
				v1 = append(v1, tarFile{fmt.Sprintf("memory/%016x", off), lay[off:min(off+bundleChunk, len(lay))]})
			}
			continue
		case strings.HasPrefix(x.name, "memory/"):
			continue
		}
		v1 = append(v1, x)
	}
	_, _, cB := aliceDaemon(t)
	cB.ok(201, "POST", "/v1/sandboxes/import", writeTar(resignTar(v1)), nil)
}
