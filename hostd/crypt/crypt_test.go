package crypt

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
)

func TestRoundTrip(t *testing.T) {
	p, key, _ := provider(t)
	const cs = DefaultChunkSize
	for _, n := range []int{0, 1, cs - 1, cs, cs + 1, 2 * cs, 3*cs + 5, 5<<20 + 123} {
		data := randBytes(uint64(n), n)
		enc := encrypt(t, key, data, 0)
		if int64(len(enc)) != EncryptedSize(int64(n), 0) {
			t.Errorf("n=%d: encrypted %d bytes, EncryptedSize says %d", n, len(enc), EncryptedSize(int64(n), 0))
		}
		if n >= 16 && bytes.Contains(enc, data[:min(n, 64)]) {
			t.Errorf("n=%d: plaintext visible in ciphertext", n)
		}
		r, err := open(t, enc, p, "acme", 0)
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		if r.Size() != int64(n) {
			t.Fatalf("n=%d: Size %d", n, r.Size())
		}
		got, err := io.ReadAll(r)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("n=%d: ReadAll: %v, equal %v", n, err, bytes.Equal(got, data))
		}
		// ReadAt of everything, and one byte past the end.
		all := make([]byte, n+1)
		k, err := r.ReadAt(all, 0)
		if k != n || err != io.EOF || !bytes.Equal(all[:n], data) {
			t.Fatalf("n=%d: ReadAt past end: %d, %v", n, k, err)
		}
		if n > 0 {
			if err := iotest.TestReader(io.NewSectionReader(r, 0, r.Size()), data); err != nil {
				t.Fatalf("n=%d: %v", n, err)
			}
		}
	}
}

// TestWriterPaths encrypts through odd write sizes and ReadFrom and gets
// the same plaintext back.
func TestWriterPaths(t *testing.T) {
	p, key, _ := provider(t)
	const cs = MinChunkSize
	for _, n := range []int{0, 1, cs - 1, cs, cs + 1, 4*cs - 3, 4 * cs} {
		data := randBytes(uint64(n)+7, n)
		// Small irregular writes.
		var a bytes.Buffer
		w, err := NewWriter(&a, key, &WriterOptions{ChunkSize: cs})
		if err != nil {
			t.Fatal(err)
		}
		for rest := data; len(rest) > 0; {
			k := min(len(rest), 1+rand.IntN(3000))
			if _, err := w.Write(rest[:k]); err != nil {
				t.Fatal(err)
			}
			rest = rest[k:]
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if w.Written() != int64(n) {
			t.Fatalf("Written %d, want %d", w.Written(), n)
		}
		// ReadFrom through a reader returning one byte at a time at
		// chunk boundaries, and a reader that returns data with EOF.
		for _, src := range []io.Reader{iotest.HalfReader(bytes.NewReader(data)), iotest.DataErrReader(bytes.NewReader(data))} {
			var b bytes.Buffer
			w, err := NewWriter(&b, key, &WriterOptions{ChunkSize: cs})
			if err != nil {
				t.Fatal(err)
			}
			if k, err := io.Copy(w, src); err != nil || k != int64(n) {
				t.Fatalf("copy: %d, %v", k, err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			for _, enc := range [][]byte{a.Bytes(), b.Bytes()} {
				r, err := open(t, enc, p, "acme", 0)
				if err != nil {
					t.Fatalf("n=%d: %v", n, err)
				}
				got, err := io.ReadAll(r)
				if err != nil || !bytes.Equal(got, data) {
					t.Fatalf("n=%d: %v, equal %v", n, err, bytes.Equal(got, data))
				}
			}
		}
	}
	if _, err := NewWriter(io.Discard, key, &WriterOptions{ChunkSize: 5000}); err == nil {
		t.Error("chunk size 5000 accepted")
	}
	if _, err := NewWriter(io.Discard, Key{}, nil); err == nil {
		t.Error("zero key accepted")
	}
	w, _ := NewWriter(io.Discard, key, nil)
	w.Close()
	if _, err := w.Write([]byte("x")); err == nil {
		t.Error("write after Close accepted")
	}
}

// TestRandomAccess reads random ranges and checks both the bytes and that
// only the chunks covering each range were read.
func TestRandomAccess(t *testing.T) {
	p, key, _ := provider(t)
	const cs = MinChunkSize
	data := randBytes(42, 300*cs+1234)
	enc := encrypt(t, key, data, cs)
	cr := &countingReaderAt{r: bytes.NewReader(enc)}
	r, err := OpenReaderContext(context.Background(), cr, int64(len(enc)), p, "acme", &ReaderOptions{CacheChunks: -1})
	if err != nil {
		t.Fatal(err)
	}
	opened := cr.take()
	if len(opened) != 2 || opened[0] != [2]int64{0, HeaderSize} {
		t.Fatalf("open read %v, want the header and the final chunk", opened)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		off := rng.Int64N(int64(len(data)))
		n := 1 + rng.Int64N(min(int64(len(data))-off, 5*cs))
		if rng.IntN(4) == 0 {
			n = min(int64(len(data))-off, 1+rng.Int64N(64))
		}
		got := make([]byte, n)
		if k, err := r.ReadAt(got, off); err != nil || int64(k) != n {
			t.Fatalf("ReadAt(%d, %d): %d, %v", off, n, k, err)
		}
		if !bytes.Equal(got, data[off:off+n]) {
			t.Fatalf("ReadAt(%d, %d): wrong bytes", off, n)
		}
		var want [][2]int64
		for i := off / cs; i <= (off+n-1)/cs; i++ {
			want = append(want, [2]int64{chunkOffset(i, cs), r.chunkLen(i) + TagSize})
		}
		if reads := cr.take(); !slices.Equal(reads, want) {
			t.Fatalf("ReadAt(%d, %d) read %v, want %v", off, n, reads, want)
		}
	}

	// With a cache, a second read of the same chunk does no I/O.
	r, err = OpenReaderContext(context.Background(), cr, int64(len(enc)), p, "acme", nil)
	if err != nil {
		t.Fatal(err)
	}
	cr.take()
	buf := make([]byte, 100)
	r.ReadAt(buf, 7*cs+10)
	if reads := cr.take(); len(reads) != 1 {
		t.Fatalf("first read: %v", reads)
	}
	r.ReadAt(buf, 7*cs+500)
	if reads := cr.take(); len(reads) != 0 {
		t.Fatalf("cached read did I/O: %v", reads)
	}
	// Seek and Read.
	if _, err := r.Seek(-5, io.SeekEnd); err != nil {
		t.Fatal(err)
	}
	tail, err := io.ReadAll(r)
	if err != nil || !bytes.Equal(tail, data[len(data)-5:]) {
		t.Fatalf("tail: %v %x", err, tail)
	}
}

func TestWrongKey(t *testing.T) {
	p, key, other := provider(t)
	enc := encrypt(t, key, randBytes(1, 10000), 0)
	if _, err := open(t, enc, p, "other", 0); !errors.Is(err, ErrWrongKey) {
		t.Fatalf("other tenant: %v", err)
	}
	if _, err := open(t, enc, p, "nobody", 0); !errors.Is(err, ErrNoKey) {
		t.Fatalf("no key: %v", err)
	}
	// A key that claims the file's key ID but is not the key.
	forged, _ := NewKey(key.ID(), other.material())
	p.keys["forger"] = forged
	if _, err := open(t, enc, p, "forger", 0); !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "header fails authentication") {
		t.Fatalf("forged key ID: %v", err)
	}
	p.revoked["acme"] = true
	_, err := open(t, enc, p, "acme", 0)
	if !errors.Is(err, ErrRevoked) || !strings.HasPrefix(err.Error(), "snapshot.wlayer: tenant acme: key revoked") {
		t.Fatalf("revoked: %v", err)
	}
}

func TestFiles(t *testing.T) {
	p, key, _ := provider(t)
	dir := t.TempDir()
	plain := filepath.Join(dir, "mem.wlayer")
	data := randBytes(9, 3*DefaultChunkSize+77)
	if err := os.WriteFile(plain, data, 0o600); err != nil {
		t.Fatal(err)
	}
	enc := filepath.Join(dir, "mem.wlayer.enc")
	if err := EncryptFile(enc, plain, key); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "mem.wlayer.out")
	if err := DecryptFile(out, enc, p, "acme"); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
		t.Fatal("DecryptFile: wrong bytes")
	}
	r, err := Open(context.Background(), enc, p, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if r.Name() != "mem.wlayer.enc" {
		t.Errorf("name %q", r.Name())
	}
	r.Close()

	// A failing source leaves neither dst nor a temporary file.
	if err := EncryptFile(filepath.Join(dir, "x.enc"), dir, key); err == nil {
		t.Fatal("encrypting a directory worked")
	}
	// A chunk failing authentication leaves no dst and no plaintext.
	b, _ := os.ReadFile(enc)
	b[chunkOffset(1, DefaultChunkSize)+5] ^= 1
	os.WriteFile(enc, b, 0o600)
	bad := filepath.Join(dir, "bad.out")
	err = DecryptFile(bad, enc, p, "acme")
	var ce *ChunkError
	if !errors.As(err, &ce) || ce.Chunk != 1 || ce.File != "mem.wlayer.enc" {
		t.Fatalf("tampered DecryptFile: %v", err)
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		switch e.Name() {
		case "mem.wlayer", "mem.wlayer.enc", "mem.wlayer.out":
		default:
			t.Errorf("left behind: %s", e.Name())
		}
	}
}

// A Reader is a cow/disk.Backing (ReadAt and Size) and a plain stream.
var (
	_ interface {
		io.ReaderAt
		Size() int64
	} = (*Reader)(nil)
	_ io.ReadSeeker  = (*Reader)(nil)
	_ io.WriterTo    = (*Reader)(nil)
	_ io.WriteCloser = (*Writer)(nil)
	_ io.ReaderFrom  = (*Writer)(nil)
	_ Provider       = (*LocalProvider)(nil)
)

// TestConcurrentReadAt hammers one Reader with a tiny cache from several
// goroutines (run with -race).
func TestConcurrentReadAt(t *testing.T) {
	p, key, _ := provider(t)
	const cs = MinChunkSize
	data := randBytes(8, 64*cs+99)
	enc := encrypt(t, key, data, cs)
	for _, cache := range []int{-1, 2} {
		r, err := open(t, enc, p, "acme", cache)
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 8)
		for g := range 8 {
			go func() {
				rng := rand.New(rand.NewPCG(uint64(g), 9))
				for range 200 {
					off := rng.Int64N(int64(len(data)))
					n := 1 + rng.Int64N(min(int64(len(data))-off, 3*cs))
					b := make([]byte, n)
					if _, err := r.ReadAt(b, off); err != nil || !bytes.Equal(b, data[off:off+n]) {
						errc <- errors.New("bad concurrent read")
						return
					}
				}
				errc <- nil
			}()
		}
		for range 8 {
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
		}
	}
}
