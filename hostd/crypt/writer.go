package crypt

import (
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
)

// WriterOptions tune a Writer; the zero value (or nil) is the default.
type WriterOptions struct {
	// ChunkSize is the plaintext bytes per chunk: a power of two in
	// [MinChunkSize, MaxChunkSize]; 0 means DefaultChunkSize. It is the
	// unit of random access: a read of one byte decrypts one chunk.
	ChunkSize int
	// Rand is the source of the file salt; nil means crypto/rand.
	Rand io.Reader
}

// Writer encrypts a stream. NewWriter writes the header at once; each
// Write fills chunks, sealing a full chunk only once more data (or Close)
// says whether it is the last; Close seals the final chunk, whose AAD
// carries the final flag and the plaintext length. The header is never
// rewritten, so w may be a pipe or socket. Close does not close w.
//
// A Writer is not safe for concurrent use. After an error every call
// returns it.
type Writer struct {
	w      io.Writer
	keys   *fileKeys
	hhash  [32]byte
	cs     int
	buf    []byte // plaintext of the pending chunk, len <= cs
	out    []byte // ciphertext scratch
	index  uint64
	total  uint64
	err    error
	closed bool
	nonce  [12]byte
	aad    [aadSize]byte
}

var errClosed = errors.New("crypt: write to a closed Writer")

// NewWriter starts an encrypted file on w under key.
func NewWriter(w io.Writer, key Key, opts *WriterOptions) (*Writer, error) {
	var o WriterOptions
	if opts != nil {
		o = *opts
	}
	if o.ChunkSize == 0 {
		o.ChunkSize = DefaultChunkSize
	}
	if err := checkChunkSize(int64(o.ChunkSize)); err != nil {
		return nil, fmt.Errorf("crypt: %w", err)
	}
	if o.Rand == nil {
		o.Rand = rand.Reader
	}
	if !key.Valid() {
		return nil, errors.New("crypt: NewWriter: zero Key")
	}
	h := header{chunkSize: o.ChunkSize, keyID: key.ID()}
	if _, err := io.ReadFull(o.Rand, h.salt[:]); err != nil {
		return nil, fmt.Errorf("crypt: salt: %w", err)
	}
	keys, err := deriveKeys(key, h.salt[:])
	if err != nil {
		return nil, err
	}
	hdr := h.encode()
	copy(hdr[macOffset:], keys.headerMAC(hdr))
	if _, err := w.Write(hdr); err != nil {
		return nil, err
	}
	return &Writer{
		w:     w,
		keys:  keys,
		hhash: sha256.Sum256(hdr),
		cs:    o.ChunkSize,
		buf:   make([]byte, 0, o.ChunkSize),
		out:   make([]byte, 0, o.ChunkSize+TagSize),
	}, nil
}

// Write encrypts p.
func (w *Writer) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	if w.closed {
		return 0, errClosed
	}
	n := 0
	for len(p) > 0 {
		if len(w.buf) == w.cs {
			// More data follows, so the pending full chunk is not final.
			if err := w.seal(false); err != nil {
				return n, err
			}
		}
		k := copy(w.buf[len(w.buf):w.cs], p)
		w.buf = w.buf[:len(w.buf)+k]
		p = p[k:]
		n += k
		w.total += uint64(k)
	}
	return n, nil
}

// ReadFrom lets io.Copy fill chunks directly.
func (w *Writer) ReadFrom(r io.Reader) (int64, error) {
	var n int64
	for {
		if w.err != nil {
			return n, w.err
		}
		if w.closed {
			return n, errClosed
		}
		if len(w.buf) == w.cs {
			// Only seal once we know more data follows.
			var one [1]byte
			k, err := io.ReadFull(r, one[:])
			if k == 1 {
				if err := w.seal(false); err != nil {
					return n, err
				}
				w.buf = append(w.buf, one[0])
				w.total++
				n++
			}
			if err == io.EOF {
				return n, nil
			}
			if err != nil {
				return n, err
			}
			continue
		}
		k, err := r.Read(w.buf[len(w.buf):w.cs])
		w.buf = w.buf[:len(w.buf)+k]
		w.total += uint64(k)
		n += int64(k)
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// seal encrypts and writes the pending chunk.
func (w *Writer) seal(final bool) error {
	nonce := chunkNonce(&w.nonce, w.index)
	aad := chunkAAD(&w.aad, &w.hhash, w.index, final, w.total)
	w.out = w.keys.aead.Seal(w.out[:0], nonce, w.buf, aad)
	clear(w.buf)
	w.buf = w.buf[:0]
	if _, err := w.w.Write(w.out); err != nil {
		w.err = err
		return err
	}
	w.index++
	return nil
}

// Close seals and writes the final chunk (an empty one for an empty
// file). It does not close the underlying writer.
func (w *Writer) Close() error {
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return nil
	}
	w.closed = true
	return w.seal(true)
}

// Written is the number of plaintext bytes accepted so far.
func (w *Writer) Written() int64 { return int64(w.total) }

// EncryptedSize is the size of the encrypted file for a plaintext of n
// bytes in chunks of chunkSize (0: DefaultChunkSize).
func EncryptedSize(n int64, chunkSize int) int64 {
	if chunkSize == 0 {
		chunkSize = DefaultChunkSize
	}
	cs := int64(chunkSize)
	chunks := max(1, (n+cs-1)/cs)
	return HeaderSize + n + chunks*TagSize
}
