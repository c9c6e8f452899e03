package crypt

import (
	"container/list"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
)

// ChunkError is an authentication failure of one chunk.
// errors.Is(err, ErrAuth) holds.
type ChunkError struct {
	File  string
	Chunk int64
}

func (e *ChunkError) Error() string {
	return fmt.Sprintf("%s: chunk %d fails authentication: corrupt, truncated or not this tenant's", e.File, e.Chunk)
}

// Is makes errors.Is(err, ErrAuth) true.
func (e *ChunkError) Is(target error) bool { return target == ErrAuth }

// ReaderOptions tune OpenReaderContext; nil means the defaults.
type ReaderOptions struct {
	// Name names the file in errors; by default the base name of r's
	// Name() if it has one (an *os.File does), else "encrypted file".
	Name string
	// CacheChunks is how many decrypted chunks to keep (LRU); 0 means
	// DefaultCacheChunks, negative means none.
	CacheChunks int
}

// DefaultCacheChunks is the default size of a Reader's chunk cache.
const DefaultCacheChunks = 16

// Reader decrypts an encrypted file with random access: ReadAt decrypts
// (and reads) only the chunks covering the requested range, keeping the
// last few decrypted chunks in an LRU cache. It also implements io.Reader
// and io.Seeker on an internal offset. ReadAt may be called from several
// goroutines at once; Read and Seek share one offset and should not.
//
// A chunk that fails authentication gives a *ChunkError and none of its
// bytes; the bytes of earlier chunks in the same ReadAt are in p, as
// io.ReaderAt allows, and the returned n counts them.
type Reader struct {
	r     io.ReaderAt
	name  string
	lay   layout
	keys  *fileKeys
	hhash [32]byte
	owned io.Closer

	mu    sync.Mutex
	cache map[int64]*list.Element
	lru   list.List // of *cached, most recent first
	max   int
	off   int64     // for Read and Seek
	pool  sync.Pool // of *[]byte chunk buffers, when the cache is off
}

type cached struct {
	index int64
	data  []byte
}

// OpenReader is OpenReaderContext with context.Background and default
// options.
func OpenReader(r io.ReaderAt, size int64, p Provider, tenant string) (*Reader, error) {
	return OpenReaderContext(context.Background(), r, size, p, tenant, nil)
}

// OpenReaderContext checks the header, fetches the tenant's key from p
// (a revoked key gives an error wrapping ErrRevoked, prefixed with the
// file name), checks that the file is encrypted under that key
// (ErrWrongKey), authenticates the header (ErrAuth) and the final chunk,
// which proves the file is neither truncated nor extended and fixes
// Size, and returns a Reader. size is the encrypted file's size.
func OpenReaderContext(ctx context.Context, r io.ReaderAt, size int64, p Provider, tenant string, opts *ReaderOptions) (*Reader, error) {
	var o ReaderOptions
	if opts != nil {
		o = *opts
	}
	name := o.Name
	if name == "" {
		name = "encrypted file"
		if n, ok := r.(interface{ Name() string }); ok {
			name = filepath.Base(n.Name())
		}
	}
	if o.CacheChunks == 0 {
		o.CacheChunks = DefaultCacheChunks
	}
	if size < HeaderSize {
		return nil, fmt.Errorf("%s: %w: %d bytes, shorter than the %d-byte header", name, ErrFormat, size, HeaderSize)
	}
	hdr := make([]byte, HeaderSize)
	if k, err := r.ReadAt(hdr, 0); err != nil && k < len(hdr) {
		return nil, fmt.Errorf("%s: reading header: %w", name, err)
	}
	h, err := parseHeader(hdr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	lay, err := layoutFor(size, h.chunkSize)
	if err != nil {
		return nil, fmt.Errorf("%s: %v (truncated or extended): %w", name, err, ErrAuth)
	}
	key, err := p.Key(ctx, tenant)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if key.ID() != h.keyID {
		return nil, fmt.Errorf("%s: %w: file key %s, tenant %s's key is %s (another tenant's file, or written under a key since revoked or replaced)",
			name, ErrWrongKey, h.keyID, tenant, key.ID())
	}
	keys, err := deriveKeys(key, h.salt[:])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if !hmac.Equal(keys.headerMAC(hdr), hdr[macOffset:]) {
		return nil, fmt.Errorf("%s: header %w: corrupt or not this tenant's", name, ErrAuth)
	}
	rd := &Reader{
		r:     r,
		name:  name,
		lay:   lay,
		keys:  keys,
		hhash: sha256.Sum256(hdr),
		cache: map[int64]*list.Element{},
		max:   max(0, o.CacheChunks),
	}
	// The final chunk's AAD carries the final flag and the length: its
	// authenticity proves the file ends where it should.
	_, buf, err := rd.chunk(lay.chunks - 1)
	if err != nil {
		return nil, err
	}
	if buf != nil {
		rd.putBuf(buf)
	}
	return rd, nil
}

// Open opens an encrypted file by path; the Reader owns the file and
// Close closes it.
func Open(ctx context.Context, path string, p Provider, tenant string) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	r, err := OpenReaderContext(ctx, f, fi.Size(), p, tenant, nil)
	if err != nil {
		f.Close()
		return nil, err
	}
	r.owned = f
	return r, nil
}

// Close drops the cache and closes the file if Open opened it.
func (r *Reader) Close() error {
	r.mu.Lock()
	for e := r.lru.Front(); e != nil; e = e.Next() {
		clear(e.Value.(*cached).data)
	}
	r.lru.Init()
	clear(r.cache)
	r.mu.Unlock()
	if r.owned != nil {
		return r.owned.Close()
	}
	return nil
}

// Size is the plaintext length.
func (r *Reader) Size() int64 { return r.lay.size }

// ChunkSize is the file's plaintext chunk size.
func (r *Reader) ChunkSize() int { return int(r.lay.chunkSize) }

// Name is the name used in errors.
func (r *Reader) Name() string { return r.name }

// chunkLen is the plaintext length of chunk i.
func (r *Reader) chunkLen(i int64) int64 {
	if i == r.lay.chunks-1 {
		return r.lay.lastLen
	}
	return r.lay.chunkSize
}

// chunk returns chunk i's plaintext, from the cache or decrypted. The
// returned slice must not be modified. If buf is not nil, the slice is in
// it and the caller hands buf back with putBuf once done (the cache is
// off).
func (r *Reader) chunk(i int64) (d []byte, buf *[]byte, err error) {
	if r.max == 0 {
		buf = r.getBuf()
		d, err := r.decryptChunk(i, *buf)
		if err != nil {
			r.putBuf(buf)
			return nil, nil, err
		}
		return d, buf, nil
	}
	r.mu.Lock()
	if e, ok := r.cache[i]; ok {
		r.lru.MoveToFront(e)
		d := e.Value.(*cached).data
		r.mu.Unlock()
		return d, nil, nil
	}
	r.mu.Unlock()

	d, err = r.decryptChunk(i, nil)
	if err != nil {
		return nil, nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.cache[i]; ok { // decrypted concurrently
		r.lru.MoveToFront(e)
		return e.Value.(*cached).data, nil, nil
	}
	r.cache[i] = r.lru.PushFront(&cached{index: i, data: d})
	for r.lru.Len() > r.max {
		e := r.lru.Back()
		r.lru.Remove(e)
		delete(r.cache, e.Value.(*cached).index)
	}
	return d, nil, nil
}

func (r *Reader) getBuf() *[]byte {
	if b, ok := r.pool.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, r.lay.chunkSize+TagSize)
	return &b
}

func (r *Reader) putBuf(b *[]byte) {
	clear(*b)
	r.pool.Put(b)
}

// decryptChunk reads chunk i into buf (allocated if too small) and
// decrypts it in place, returning the plaintext, a prefix of buf.
func (r *Reader) decryptChunk(i int64, buf []byte) ([]byte, error) {
	n := r.chunkLen(i) + TagSize
	if int64(cap(buf)) < n {
		buf = make([]byte, n)
	}
	ct := buf[:n]
	if k, err := r.r.ReadAt(ct, chunkOffset(i, int(r.lay.chunkSize))); err != nil && k < len(ct) {
		clear(ct)
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, &ChunkError{File: r.name, Chunk: i}
		}
		return nil, fmt.Errorf("%s: chunk %d: %w", r.name, i, err)
	}
	var nonce [12]byte
	var aad [aadSize]byte
	final := i == r.lay.chunks-1
	pt, err := r.keys.aead.Open(ct[:0], chunkNonce(&nonce, uint64(i)), ct, chunkAAD(&aad, &r.hhash, uint64(i), final, uint64(r.lay.size)))
	if err != nil {
		clear(ct)
		return nil, &ChunkError{File: r.name, Chunk: i}
	}
	return pt, nil
}

// ReadAt reads len(p) plaintext bytes at off, decrypting only the chunks
// that cover them. Like io.ReaderAt, n < len(p) comes with an error:
// io.EOF at the end of the plaintext.
func (r *Reader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("%s: negative offset %d", r.name, off)
	}
	n := 0
	for len(p) > 0 {
		if off >= r.lay.size {
			return n, io.EOF
		}
		i := off / r.lay.chunkSize
		d, buf, err := r.chunk(i)
		if err != nil {
			return n, err
		}
		k := copy(p, d[off-i*r.lay.chunkSize:])
		if buf != nil {
			r.putBuf(buf)
		}
		p = p[k:]
		n += k
		off += int64(k)
	}
	return n, nil
}

// Read reads from the internal offset.
func (r *Reader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r.mu.Lock()
	off := r.off
	r.mu.Unlock()
	if off >= r.lay.size {
		return 0, io.EOF
	}
	// Stop at the chunk's end so a failure in a later chunk does not
	// hide bytes already returned.
	i := off / r.lay.chunkSize
	end := min(r.lay.size, (i+1)*r.lay.chunkSize)
	p = p[:min(int64(len(p)), end-off)]
	n, err := r.ReadAt(p, off)
	r.mu.Lock()
	r.off = off + int64(n)
	r.mu.Unlock()
	if err == io.EOF && n > 0 {
		err = nil
	}
	return n, err
}

// Seek sets the offset for Read.
func (r *Reader) Seek(offset int64, whence int) (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += r.off
	case io.SeekEnd:
		offset += r.lay.size
	default:
		return 0, fmt.Errorf("%s: bad whence %d", r.name, whence)
	}
	if offset < 0 {
		return 0, fmt.Errorf("%s: negative position %d", r.name, offset)
	}
	r.off = offset
	return offset, nil
}

// WriteTo lets io.Copy stream the plaintext chunk by chunk.
func (r *Reader) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		r.mu.Lock()
		off := r.off
		r.mu.Unlock()
		if off >= r.lay.size {
			return total, nil
		}
		i := off / r.lay.chunkSize
		d, buf, err := r.chunk(i)
		if err != nil {
			return total, err
		}
		n, err := w.Write(d[off-i*r.lay.chunkSize:])
		if buf != nil {
			r.putBuf(buf)
		}
		total += int64(n)
		r.mu.Lock()
		r.off = off + int64(n)
		r.mu.Unlock()
		if err != nil {
			return total, err
		}
	}
}
