package pagestore

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzParseRef feeds ParseRef arbitrary bytes: it must not panic or
// allocate without bound, and whatever it accepts must be consistent.
func FuzzParseRef(f *testing.F) {
	st, _ := Open(f.TempDir())
	ns, _ := st.Plain("acme")
	p := filepath.Join(f.TempDir(), "s.1.wsnap")
	l, err := writeBaseF(p)
	if err != nil {
		f.Fatal(err)
	}
	l.Close()
	if _, err := ns.Ingest(p); err != nil {
		f.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	f.Add(b)
	f.Add(b[:refFixedLen+4])
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRef("fuzz", b)
		if err != nil {
			return
		}
		defer r.Close()
		if len(r.Names) != len(r.Chunks) {
			t.Fatalf("%d names for %d chunks", len(r.Names), len(r.Chunks))
		}
		start, end := r.Layer.DataRange()
		if start != int64(len(r.head)) || end != r.Size-int64(len(r.tail)) {
			t.Fatal("skeleton does not frame the data region")
		}
	})
}
