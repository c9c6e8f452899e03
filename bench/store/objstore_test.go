package main

import (
	"bytes"
	"path/filepath"
	"testing"
	"time"

	"github.com/warrenvm/warren/memsnap"
)

// TestObjectStoreCounts: two bundles whose memory differs in one page
// share every piece cut at the chunks but that page's chunk and the
// layer's index; cut every 4 MiB they share nothing after the change
// once its chunk compressed to another length.
func TestObjectStoreCounts(t *testing.T) {
	cfg := config{MemMiB: 16, Used: 0.6}
	mem := templateMemory(cfg)
	dir := t.TempDir()
	write := func(name string, m []byte) string {
		p := filepath.Join(dir, name+memsnap.Ext)
		l, err := memsnap.WriteBase(p, bytes.NewReader(m), uint64(len(m)), memsnap.Options{Created: time.Unix(1e9, 0)})
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
		return p
	}
	var o objectStore
	o.upload(write("a", mem))
	v1, v2 := o.V1, o.V2
	if v2.Blobs < 40 || v1.Blobs > 4 || v1.Stored != o.Logical {
		t.Fatalf("one bundle: %+v", o)
	}
	m2 := bytes.Clone(mem)
	pg := 0
	for bytes.Count(mem[pg*4096:(pg+1)*4096], []byte{0}) == 4096 {
		pg++
	}
	copy(m2[pg*4096:(pg+1)*4096], bytes.Repeat([]byte{7}, 4096)) // its chunk compresses shorter: the later ones move
	o.upload(write("b", m2))
	if o.Bundles != 2 || o.V2.Blobs-v2.Blobs != 2 {
		t.Fatalf("a page changed added %d blobs cut at the chunks, want 2 (its chunk, the index)", o.V2.Blobs-v2.Blobs)
	}
	if o.V1.Blobs-v1.Blobs != v1.Blobs {
		t.Fatalf("a page changed added %d blobs cut every 4 MiB, want %d (every piece moved)", o.V1.Blobs-v1.Blobs, v1.Blobs)
	}
	// The same bundle again adds nothing.
	before := o
	o.upload(write("b2", m2))
	if o.V2.Blobs != before.V2.Blobs || o.V2.Pieces != before.V2.Pieces*3/2 || o.V1.Blobs != before.V1.Blobs {
		t.Fatalf("the same memory again: %+v after %+v", o, before)
	}
}
