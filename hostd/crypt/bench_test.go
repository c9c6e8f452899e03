package crypt

import (
	"bytes"
	"io"
	"testing"
)

// benchReader is a Reader, without a cache, of 64 default-size chunks
// encrypted for tenant acme.
func benchReader(b *testing.B) *Reader {
	p, key, _ := provider(b)
	enc := encrypt(b, key, randBytes(1, 64*DefaultChunkSize), DefaultChunkSize)
	r, err := open(b, enc, p, "acme", -1)
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// BenchmarkDecryptChunk is the cost of one lazy-restore miss: read and
// authenticate-decrypt one default-size chunk (no cache).
func BenchmarkDecryptChunk(b *testing.B) {
	r := benchReader(b)
	buf := make([]byte, DefaultChunkSize+TagSize)
	b.SetBytes(DefaultChunkSize)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, err := r.decryptChunk(int64(i%63), buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadAt4K is a guest page fault served through ReadAt with the
// cache missing every time (each 4 KiB read is in a new chunk).
func BenchmarkReadAt4K(b *testing.B) {
	r := benchReader(b)
	page := make([]byte, 4096)
	b.SetBytes(4096)
	for i := 0; b.Loop(); i++ {
		if _, err := r.ReadAt(page, int64(i%64)*DefaultChunkSize+8192); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncrypt is streaming encryption throughput.
func BenchmarkEncrypt(b *testing.B) {
	_, key, _ := provider(b)
	data := randBytes(1, 16*DefaultChunkSize)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		w, _ := NewWriter(io.Discard, key, nil)
		io.Copy(w, bytes.NewReader(data))
		w.Close()
	}
}
