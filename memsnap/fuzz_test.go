package memsnap

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// FuzzHeader feeds arbitrary bytes to the header parser. It must never
// panic, and whatever it accepts must re-encode to the same bytes.
func FuzzHeader(f *testing.F) {
	f.Add(encodeHeader(&Header{Version: Version, Kind: KindBase, PageSize: 4096, MemSize: 1 << 20}))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, n, err := parseHeader(data)
		if err != nil {
			return
		}
		if n > len(data) || n > headerMaxLen {
			t.Fatalf("header length %d of %d bytes", n, len(data))
		}
		if again := encodeHeader(&h); !bytes.Equal(again, data[:n]) {
			t.Fatalf("accepted header does not re-encode:\n got %x\nwant %x", again, data[:n])
		}
	})
}

// FuzzIndex feeds arbitrary bytes and limits to the index parser. It must
// never panic, and whatever it accepts must satisfy the format's rules and
// re-encode to the same bytes.
func FuzzIndex(f *testing.F) {
	f.Add(encodeIndex(&index{}), uint8(KindBase), uint64(16), int64(80), int64(80))
	f.Fuzz(func(t *testing.T, data []byte, kind uint8, pages uint64, dataStart, dataEnd int64) {
		if pages == 0 || pages > MaxMemSize/4096 || dataStart < 0 || dataEnd < dataStart {
			return
		}
		ix, err := parseIndex(data, indexLimits{kind: Kind(kind), pageSize: 4096, pages: pages, dataStart: dataStart, dataEnd: dataEnd})
		if err != nil {
			return
		}
		if again := encodeIndex(ix); !bytes.Equal(again, data) {
			t.Fatalf("accepted index does not re-encode")
		}
		off, prev := dataStart, uint64(0)
		for _, c := range ix.chunks {
			if c.off != off {
				t.Fatalf("chunk at %d, want %d", c.off, off)
			}
			off += int64(c.clen)
			for _, r := range c.runs {
				if r.first < prev || r.end() > pages || r.count == 0 {
					t.Fatalf("bad run %+v after %d", r, prev)
				}
				prev = r.end()
			}
		}
		if off != dataEnd {
			t.Fatalf("chunks end at %d, want %d", off, dataEnd)
		}
	})
}

// FuzzOpen feeds arbitrary files to Open and Verify. They must never
// panic, and a file they accept must restore without error. Seeds are
// whole layer files, so run it with a short minimization budget, e.g.
// go test -fuzz FuzzOpen -fuzzminimizetime 100x.
func FuzzOpen(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := openReader("fuzz", bytes.NewReader(data), int64(len(data)))
		if err != nil {
			return
		}
		if err := l.Verify(); err != nil {
			return
		}
		if l.Kind() != KindBase || l.hdr.MemSize > 64<<20 {
			return
		}
		c := &Chain{layers: []*Layer{l}}
		if err := c.Restore(make([]byte, l.hdr.MemSize)); err != nil {
			t.Fatalf("verified layer does not restore: %v", err)
		}
	})
}

// TestWriteFuzzSeeds regenerates testdata/fuzz seeds from real layer files
// when MEMSNAP_WRITE_SEEDS=1; otherwise it is skipped.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("MEMSNAP_WRITE_SEEDS") != "1" {
		t.Skip("set MEMSNAP_WRITE_SEEDS=1 to regenerate fuzz seeds")
	}
	base, incr := smallChain(t, t.TempDir())
	for _, p := range []string{base, incr} {
		l, err := Open(p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(p)
		name := filepath.Base(p)
		hdr := b[:l.hdrLen]
		writeSeed(t, "FuzzHeader", name, fmt.Sprintf("[]byte(%q)\n", hdr))
		writeSeed(t, "FuzzHeader", name+"-truncated", fmt.Sprintf("[]byte(%q)\n", hdr[:len(hdr)-1]))
		ft, _ := parseFooter(b[len(b)-footerLen:], l.hdrLen, int64(len(b)))
		ixb := b[ft.indexOff : ft.indexOff+ft.indexLen]
		writeSeed(t, "FuzzIndex", name, fmt.Sprintf("[]byte(%q)\nuint8(%d)\nuint64(%d)\nint64(%d)\nint64(%d)\n",
			ixb, l.hdr.Kind, l.hdr.Pages(), l.hdrLen, ft.indexOff))
		writeSeed(t, "FuzzOpen", name, fmt.Sprintf("[]byte(%q)\n", b))
		l.Close()
	}
}

func writeSeed(t *testing.T, target, name, body string) {
	dir := filepath.Join("testdata", "fuzz", target)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte("go test fuzz v1\n"+body), 0o644); err != nil {
		t.Fatal(err)
	}
}
