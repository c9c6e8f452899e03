package crypt

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
)

const tcs = MinChunkSize
const stride = tcs + TagSize

// tamperFile is 5 full chunks and a partial sixth.
func tamperFile(t *testing.T) ([]byte, []byte, *staticProvider, Key) {
	p, key, _ := provider(t)
	data := randBytes(5, 5*tcs+1000)
	return data, encrypt(t, key, data, tcs), p, key
}

// readAll opens and reads everything; it returns the first error, and
// checks that a failing ReadAt never hands out bytes of a bad chunk.
func readAll(t *testing.T, enc, data []byte, p Provider) error {
	t.Helper()
	r, err := open(t, enc, p, "acme", 0)
	if err != nil {
		return err
	}
	for i := int64(0); i*tcs < r.Size(); i++ {
		buf := bytes.Repeat([]byte{0xEE}, tcs)
		n, err := r.ReadAt(buf, i*tcs)
		if err != nil && err != io.EOF {
			if n != 0 || !bytes.Equal(buf, bytes.Repeat([]byte{0xEE}, tcs)) {
				t.Fatalf("chunk %d failed (%v) but %d bytes were written to p", i, err, n)
			}
			return err
		}
		if !bytes.Equal(buf[:n], data[i*tcs:i*tcs+int64(n)]) {
			t.Fatalf("chunk %d: wrong plaintext without an error", i)
		}
	}
	if r.Size() != int64(len(data)) {
		return fmt.Errorf("size changed: %d", r.Size())
	}
	return nil
}

func wantChunkErr(t *testing.T, what string, err error, chunk int64) {
	t.Helper()
	var ce *ChunkError
	if !errors.As(err, &ce) || !errors.Is(err, ErrAuth) {
		t.Fatalf("%s: got %v, want a chunk authentication error", what, err)
	}
	if chunk >= 0 && ce.Chunk != chunk {
		t.Fatalf("%s: failing chunk %d, want %d", what, ce.Chunk, chunk)
	}
	want := fmt.Sprintf("snapshot.wlayer: chunk %d fails authentication: corrupt, truncated or not this tenant's", ce.Chunk)
	if err.Error() != want {
		t.Fatalf("%s: message %q, want %q", what, err.Error(), want)
	}
}

func TestTamperHeader(t *testing.T) {
	data, enc, p, _ := tamperFile(t)
	if err := readAll(t, enc, data, p); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < HeaderSize; i++ {
		for _, bit := range []byte{0x01, 0x80} {
			b := bytes.Clone(enc)
			b[i] ^= bit
			err := readAll(t, b, data, p)
			if err == nil {
				t.Fatalf("header byte %d bit %#x flipped: accepted", i, bit)
			}
			if !errors.Is(err, ErrFormat) && !errors.Is(err, ErrAuth) && !errors.Is(err, ErrWrongKey) {
				t.Fatalf("header byte %d: unexpected error %v", i, err)
			}
		}
	}
}

func TestTamperChunks(t *testing.T) {
	data, enc, p, key := tamperFile(t)
	last := int64(5)
	chunk := func(b []byte, i int64) []byte {
		return b[chunkOffset(i, tcs):min(int64(len(b)), chunkOffset(i+1, tcs))]
	}

	// One bit in each region of a chunk: first ciphertext byte, middle,
	// last ciphertext byte, tag. (The nonce is not stored: it is the
	// chunk index.)
	for _, i := range []int64{0, 2, last} {
		n := int64(len(chunk(enc, i)))
		for _, at := range []int64{0, (n - TagSize) / 2, n - TagSize - 1, n - TagSize, n - 1} {
			b := bytes.Clone(enc)
			chunk(b, i)[at] ^= 0x10
			wantChunkErr(t, fmt.Sprintf("chunk %d byte %d", i, at), readAll(t, b, data, p), i)
		}
	}

	// Swap chunks 1 and 2.
	b := bytes.Clone(enc)
	c1, c2 := bytes.Clone(chunk(b, 1)), bytes.Clone(chunk(b, 2))
	copy(chunk(b, 1), c2)
	copy(chunk(b, 2), c1)
	wantChunkErr(t, "swap", readAll(t, b, data, p), 1)

	// Duplicate chunk 1 over chunk 3.
	b = bytes.Clone(enc)
	copy(chunk(b, 3), chunk(b, 1))
	wantChunkErr(t, "duplicate", readAll(t, b, data, p), 3)

	// Insert a copy of chunk 1 (the file grows by one chunk): the final
	// chunk is no longer where it was.
	b = append(append(bytes.Clone(enc[:chunkOffset(2, tcs)]), chunk(enc, 1)...), enc[chunkOffset(2, tcs):]...)
	wantChunkErr(t, "insert", readAll(t, b, data, p), -1)

	// Drop a middle chunk.
	b = append(bytes.Clone(enc[:chunkOffset(2, tcs)]), enc[chunkOffset(3, tcs):]...)
	wantChunkErr(t, "drop", readAll(t, b, data, p), -1)

	// Truncate at each chunk boundary: the new last chunk was not sealed
	// as final.
	for i := int64(1); i <= last; i++ {
		wantChunkErr(t, fmt.Sprintf("truncate at chunk %d", i), readAll(t, enc[:chunkOffset(i, tcs)], data, p), i-1)
	}
	// Truncate inside a chunk, and to less than a chunk.
	for _, n := range []int{len(enc) - 1, len(enc) - 500, int(chunkOffset(3, tcs)) + 7, HeaderSize + 15, HeaderSize} {
		if err := readAll(t, enc[:n], data, p); !errors.Is(err, ErrAuth) {
			t.Fatalf("truncate to %d: %v", n, err)
		}
	}
	// Append garbage: a byte, a tag's worth, a whole chunk.
	for _, n := range []int{1, TagSize, 100, stride, stride + TagSize} {
		b := append(bytes.Clone(enc), randBytes(uint64(n), n)...)
		if err := readAll(t, b, data, p); !errors.Is(err, ErrAuth) {
			t.Fatalf("append %d: %v", n, err)
		}
	}
	// Append a copy of the final chunk.
	b = append(bytes.Clone(enc), chunk(enc, last)...)
	if err := readAll(t, b, data, p); !errors.Is(err, ErrAuth) {
		t.Fatalf("append final chunk copy: %v", err)
	}

	// Splice a chunk from another file of the same tenant and key.
	other := encrypt(t, key, data, tcs)
	b = bytes.Clone(enc)
	copy(chunk(b, 2), chunk(other, 2))
	wantChunkErr(t, "splice", readAll(t, b, data, p), 2)
	// Or another file's header onto these chunks.
	b = bytes.Clone(enc)
	copy(b[:HeaderSize], other[:HeaderSize])
	wantChunkErr(t, "header splice", readAll(t, b, data, p), last)
}

// TestChunkErrorMessage checks the message names the file and chunk.
func TestChunkErrorMessage(t *testing.T) {
	p, key, _ := provider(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "snapshot.wlayer")
	data := randBytes(3, 20*tcs)
	b := encrypt(t, key, data, tcs)
	b[chunkOffset(12, tcs)+100] ^= 4
	os.WriteFile(path, b, 0o600)
	f, _ := os.Open(path)
	defer f.Close()
	r, err := OpenReader(f, int64(len(b)), p, "acme")
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadAll(r)
	const want = "snapshot.wlayer: chunk 12 fails authentication: corrupt, truncated or not this tenant's"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
	// Read stops at the good chunks' end: 12 chunks came back.
	r.Seek(0, io.SeekStart)
	got, _ := io.ReadAll(r)
	if !bytes.Equal(got, data[:12*tcs]) {
		t.Fatalf("read %d good bytes, want %d", len(got), 12*tcs)
	}
}
