package crypt

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
)

// staticProvider serves fixed keys; revoked tenants give a RevokedError.
type staticProvider struct {
	keys    map[string]Key
	revoked map[string]bool
}

func (p *staticProvider) Key(ctx context.Context, tenant string) (Key, error) {
	if p.revoked[tenant] {
		return Key{}, &RevokedError{Tenant: tenant}
	}
	k, ok := p.keys[tenant]
	if !ok {
		return Key{}, fmt.Errorf("tenant %s: %w", tenant, ErrNoKey)
	}
	return k, nil
}

func testKey(t testing.TB, seed byte) Key {
	t.Helper()
	m := make([]byte, KeySize)
	for i := range m {
		m[i] = seed + byte(i)
	}
	k, err := NewKey("", m)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func provider(t testing.TB) (*staticProvider, Key, Key) {
	a, b := testKey(t, 1), testKey(t, 100)
	return &staticProvider{keys: map[string]Key{"acme": a, "other": b}, revoked: map[string]bool{}}, a, b
}

func randBytes(seed uint64, n int) []byte {
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)})
	b := make([]byte, n)
	r.Read(b)
	return b
}

func encrypt(t testing.TB, key Key, data []byte, cs int) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, key, &WriterOptions{ChunkSize: cs})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func open(t testing.TB, enc []byte, p Provider, tenant string, cache int) (*Reader, error) {
	t.Helper()
	return OpenReaderContext(context.Background(), bytes.NewReader(enc), int64(len(enc)), p, tenant,
		&ReaderOptions{Name: "snapshot.wlayer", CacheChunks: cache})
}

// countingReaderAt records every ReadAt.
type countingReaderAt struct {
	r     io.ReaderAt
	mu    sync.Mutex
	reads [][2]int64 // offset, length
}

func (c *countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	c.mu.Lock()
	c.reads = append(c.reads, [2]int64{off, int64(len(p))})
	c.mu.Unlock()
	return c.r.ReadAt(p, off)
}

func (c *countingReaderAt) take() [][2]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.reads
	c.reads = nil
	return r
}
