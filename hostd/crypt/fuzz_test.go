package crypt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// fuzzProvider gives tenant "fuzz" the fixed key testKey(1), the key the
// seed corpus in testdata/fuzz/FuzzOpenReader is encrypted under.
func fuzzProvider(t testing.TB) *staticProvider {
	return &staticProvider{keys: map[string]Key{"fuzz": testKey(t, 1)}}
}

// seedRand makes the seeds' salts reproducible.
type seedRand byte

func (s seedRand) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(s) + byte(i)
	}
	return len(p), nil
}

func fuzzSeeds(t testing.TB) map[string][]byte {
	key := testKey(t, 1)
	enc := func(n int, salt byte) []byte {
		var b bytes.Buffer
		w, err := NewWriter(&b, key, &WriterOptions{ChunkSize: MinChunkSize, Rand: seedRand(salt)})
		if err != nil {
			t.Fatal(err)
		}
		w.Write(randBytes(uint64(n), n))
		w.Close()
		return b.Bytes()
	}
	empty, two := enc(0, 1), enc(MinChunkSize+100, 2)
	return map[string][]byte{
		"empty":          empty,
		"two-chunks":     two,
		"one-full-chunk": enc(MinChunkSize, 3),
		"header-only":    two[:HeaderSize],
		"truncated":      two[:chunkOffset(1, MinChunkSize)],
	}
}

// TestWriteFuzzSeeds regenerates the seed corpus when
// WARREN_CRYPT_WRITE_SEEDS=1, and otherwise checks it is current.
func TestWriteFuzzSeeds(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzOpenReader")
	for name, b := range fuzzSeeds(t) {
		text := fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", b)
		path := filepath.Join(dir, name)
		if os.Getenv("WARREN_CRYPT_WRITE_SEEDS") == "1" {
			if err := os.WriteFile(path, text, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, text) {
			t.Errorf("%s is stale or missing (%v): rerun with WARREN_CRYPT_WRITE_SEEDS=1", path, err)
		}
	}
}

// FuzzOpenReader feeds arbitrary files to OpenReader and reads whatever it
// accepts. It must never panic; an accepted file must read back Size bytes
// or fail with an authentication error, and nothing else.
func FuzzOpenReader(f *testing.F) {
	for _, b := range fuzzSeeds(f) {
		f.Add(b)
	}
	p := fuzzProvider(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := OpenReaderContext(context.Background(), bytes.NewReader(data), int64(len(data)), p, "fuzz", &ReaderOptions{CacheChunks: 2})
		if err != nil {
			if !errors.Is(err, ErrFormat) && !errors.Is(err, ErrAuth) && !errors.Is(err, ErrWrongKey) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		if r.Size() < 0 || EncryptedSize(r.Size(), r.ChunkSize()) != int64(len(data)) {
			t.Fatalf("accepted %d bytes with plaintext size %d", len(data), r.Size())
		}
		got, err := io.ReadAll(r)
		if err != nil {
			if !errors.Is(err, ErrAuth) {
				t.Fatalf("read: %v", err)
			}
			return
		}
		if int64(len(got)) != r.Size() {
			t.Fatalf("read %d bytes of %d", len(got), r.Size())
		}
	})
}
