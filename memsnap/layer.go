package memsnap

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// Layer is one open layer file. Open validates its structure (header,
// index, footer, extents, page numbers); Verify checks the chunk data.
// A Layer's methods may be called from several goroutines; Close must be
// called once, after all other use.
type Layer struct {
	path     string
	f        io.ReaderAt // the file's bytes; f is closed by Close when it is an io.Closer
	hdr      Header
	hdrLen   int64
	ix       *index
	hash     Hash
	fileSize int64
	dataEnd  int64 // the index offset: the data region is [hdrLen, dataEnd)
}

// Open opens and validates the layer file at path: magic, format version
// (ErrVersion names both versions), header, index and footer checksums,
// that chunks tile the data region and lie within the file, and that page
// numbers lie within memory and are sorted and non-overlapping. It reads
// the header, index and footer only; call Verify to check the chunk data.
func Open(path string) (*Layer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("memsnap: open %s: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("memsnap: open %s: %w", path, err)
	}
	l, err := openReader(path, f, st.Size())
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("memsnap: open %s: %w", path, err)
	}
	return l, nil
}

// openReader validates the size bytes of f as a layer; path names it in
// messages.
func openReader(path string, f io.ReaderAt, size int64) (*Layer, error) {
	buf := make([]byte, min(size, headerMaxLen))
	if _, err := f.ReadAt(buf, 0); err != nil {
		return nil, fmt.Errorf("read header: %w", err)
	}
	hdr, hdrLen, err := parseHeader(buf)
	if err != nil {
		return nil, err
	}
	if size < int64(hdrLen)+indexFixedLen+footerLen {
		return nil, fmt.Errorf("file is %d bytes, too short for header (%d), index and footer: %w", size, hdrLen, ErrCorrupt)
	}
	fb := make([]byte, footerLen)
	if _, err := f.ReadAt(fb, size-footerLen); err != nil {
		return nil, fmt.Errorf("read footer: %w", err)
	}
	ft, err := parseFooter(fb, int64(hdrLen), size)
	if err != nil {
		return nil, err
	}
	ixb := make([]byte, ft.indexLen)
	if _, err := f.ReadAt(ixb, ft.indexOff); err != nil {
		return nil, fmt.Errorf("read index: %w", err)
	}
	if got := crc(ixb); got != ft.indexCRC {
		return nil, fmt.Errorf("index: checksum %08x, recorded %08x: %w", got, ft.indexCRC, ErrCorrupt)
	}
	ix, err := parseIndex(ixb, indexLimits{
		kind:      hdr.Kind,
		pageSize:  hdr.PageSize,
		pages:     hdr.Pages(),
		dataStart: int64(hdrLen),
		dataEnd:   ft.indexOff,
	})
	if err != nil {
		return nil, err
	}
	hs := sha256.New()
	hs.Write(buf[:hdrLen])
	hs.Write(ixb)
	hs.Write(fb)
	l := &Layer{path: path, f: f, hdr: hdr, hdrLen: int64(hdrLen), ix: ix, fileSize: size, dataEnd: ft.indexOff}
	hs.Sum(l.hash[:0])
	return l, nil
}

// Close closes the file.
func (l *Layer) Close() error {
	if c, ok := l.f.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// Path returns the path the layer was opened from.
func (l *Layer) Path() string { return l.path }

// Hash returns the layer's content hash, its identity.
func (l *Layer) Hash() Hash { return l.hash }

// Header returns a copy of the decoded header.
func (l *Layer) Header() Header {
	h := l.hdr
	h.Fingerprint = bytes.Clone(h.Fingerprint)
	return h
}

// Kind returns whether the layer is a base or an incremental layer.
func (l *Layer) Kind() Kind { return l.hdr.Kind }

// Fingerprint returns a copy of the caller data recorded at write time.
func (l *Layer) Fingerprint() []byte { return bytes.Clone(l.hdr.Fingerprint) }

// CheckFingerprint returns an error wrapping ErrIncompatible unless want
// equals the recorded Fingerprint. Restore calls it with the host's before
// creating a VM.
func (l *Layer) CheckFingerprint(want []byte) error {
	if !bytes.Equal(want, l.hdr.Fingerprint) {
		return fmt.Errorf("memsnap: %s: fingerprint %q does not match host %q: %w", l.path, l.hdr.Fingerprint, want, ErrIncompatible)
	}
	return nil
}

// Stats describes what a layer stores.
type Stats struct {
	Path        string
	Hash        Hash
	Kind        Kind
	StoredPages uint64  // pages with data in chunks
	ZeroPages   uint64  // dirty pages recorded as zero (incremental layers)
	Chunks      int     // compressed chunks
	FileBytes   int64   // size of the file on disk
	DataBytes   int64   // compressed chunk bytes
	RawBytes    uint64  // uncompressed bytes of the stored pages
	Ratio       float64 // RawBytes / DataBytes; 0 when nothing is stored
}

// Stats returns the layer's statistics.
func (l *Layer) Stats() Stats {
	s := Stats{Path: l.path, Hash: l.hash, Kind: l.hdr.Kind, Chunks: len(l.ix.chunks), FileBytes: l.fileSize}
	for _, c := range l.ix.chunks {
		s.StoredPages += uint64(c.npages)
		s.DataBytes += int64(c.clen)
	}
	for _, z := range l.ix.zeros {
		s.ZeroPages += z.count
	}
	s.RawBytes = s.StoredPages * uint64(l.hdr.PageSize)
	if s.DataBytes > 0 {
		s.Ratio = float64(s.RawBytes) / float64(s.DataBytes)
	}
	return s
}

// Verify reads every chunk and checks its SHA-256 and that it decompresses
// to exactly its pages. Restore paths call it (or Chain.Verify) before
// creating a VM. Errors wrap ErrCorrupt and name the chunk.
func (l *Layer) Verify() error {
	return parallel(len(l.ix.chunks), 0, func() any { return new(chunkBufs) }, func(st any, i int) error {
		_, err := l.readChunk(i, st.(*chunkBufs))
		return err
	})
}

// chunkBufs are one goroutine's reusable buffers for reading chunks.
type chunkBufs struct {
	comp []byte
	raw  []byte
}

var decoder = sync.OnceValue(func() *zstd.Decoder {
	d, err := zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(runtime.GOMAXPROCS(0)),
		zstd.WithDecoderMaxMemory(MaxChunkBytes),
		zstd.WithDecodeAllCapLimit(true))
	if err != nil {
		panic(err) // only invalid options fail
	}
	return d
})

// readChunk reads, checks and decompresses chunk i into bufs.raw and returns
// it (npages*PageSize bytes, also left in bufs.raw, valid until the next
// call with bufs).
func (l *Layer) readChunk(i int, bufs *chunkBufs) ([]byte, error) {
	return l.readChunkInto(i, bufs, nil)
}

// readChunkInto is readChunk decompressing into into, when into is not nil
// and has exactly the chunk's uncompressed length; on error into may hold
// part of the chunk.
func (l *Layer) readChunkInto(i int, bufs *chunkBufs, into []byte) ([]byte, error) {
	c := &l.ix.chunks[i]
	if cap(bufs.comp) < int(c.clen) {
		bufs.comp = make([]byte, c.clen)
	}
	comp := bufs.comp[:c.clen]
	if _, err := l.f.ReadAt(comp, c.off); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("memsnap: %s: read chunk %d at offset %d: %w", l.path, i, c.off, err)
	}
	if sha256.Sum256(comp) != c.sum {
		return nil, fmt.Errorf("memsnap: %s: chunk %d at offset %d: checksum mismatch: %w", l.path, i, c.off, ErrCorrupt)
	}
	want := int(c.npages) * int(l.hdr.PageSize)
	dst := into
	if len(into) != want {
		if cap(bufs.raw) < want {
			bufs.raw = make([]byte, 0, want)
		}
		dst = bufs.raw
	}
	raw, err := decoder().DecodeAll(comp, dst[:0:want])
	if err != nil {
		return nil, fmt.Errorf("memsnap: %s: chunk %d at offset %d: decompress: %v: %w", l.path, i, c.off, err, ErrCorrupt)
	}
	if len(into) != want {
		bufs.raw = raw
	} else if len(raw) == want && &raw[0] != &into[0] {
		copy(into, raw) // the decoder did not write in place
	}
	if len(raw) != want {
		return nil, fmt.Errorf("memsnap: %s: chunk %d at offset %d: decompressed to %d bytes, want %d: %w", l.path, i, c.off, len(raw), want, ErrCorrupt)
	}
	return raw, nil
}

// parallel calls fn(state, i) for i in [0, n) on up to workers goroutines
// (GOMAXPROCS when workers <= 0), each with its own state from newState.
// It returns the error of the lowest i that failed, so results do not
// depend on scheduling; after a failure remaining items are skipped.
func parallel(n, workers int, newState func() any, fn func(state any, i int) error) error {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	workers = min(workers, n)
	var (
		mu      sync.Mutex
		next    int
		errAt   = n
		firstEr error
		wg      sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			st := newState()
			for {
				mu.Lock()
				i := next
				next++
				stop := i >= n || i > errAt
				mu.Unlock()
				if stop {
					return
				}
				if err := fn(st, i); err != nil {
					mu.Lock()
					if i < errAt {
						errAt, firstEr = i, err
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return firstEr
}

// ChunkRef is one chunk of a layer file as its index records it: where
// its compressed bytes lie and their SHA-256. A content-addressed store
// (hostd/pagestore) keeps a layer as its bytes outside the data region
// (DataRange) and its chunks by these references, and rebuilds the file
// byte for byte, so that its Hash does not change.
type ChunkRef struct {
	Offset int64    // file offset of the compressed bytes
	Length uint32   // compressed length
	Pages  uint32   // pages stored in it
	First  uint64   // the first page it stores (chunks are in page order)
	Sum    [32]byte // SHA-256 of the compressed bytes
}

// ChunkRefs returns the layer's chunks in file order; they tile DataRange.
func (l *Layer) ChunkRefs() []ChunkRef {
	out := make([]ChunkRef, len(l.ix.chunks))
	for i, c := range l.ix.chunks {
		out[i] = ChunkRef{Offset: c.off, Length: c.clen, Pages: c.npages, First: c.runs[0].first, Sum: c.sum}
	}
	return out
}

// ChunkCuts returns where the layer's file may be cut so that a chunk, or
// an aligned group of them, is a piece of its own: at 0, at the end of
// the header, at the first chunk of each group of group bytes of guest
// memory (aligned to group; at least one page), at the start of the index
// and at the end of the file, increasing. Chunks hold pages of one aligned
// block of memory each, written deterministically, so two layers whose
// memory agrees in a group have equal pieces for it, wherever in the file
// they lie: what a store keeping pieces by content (hostd/daemon's
// bundles in fleet/objstore) keeps once.
func (l *Layer) ChunkCuts(group uint64) []int64 {
	group = max(group, uint64(l.hdr.PageSize))
	cuts := []int64{0, l.hdrLen}
	prev := ^uint64(0)
	for _, c := range l.ix.chunks {
		g := c.runs[0].first * uint64(l.hdr.PageSize) / group
		if g != prev && c.off != cuts[len(cuts)-1] {
			cuts = append(cuts, c.off)
		}
		prev = g
	}
	if l.dataEnd != cuts[len(cuts)-1] {
		cuts = append(cuts, l.dataEnd)
	}
	return append(cuts, l.fileSize)
}

// DataRange returns the file's data region [start, end): the bytes before
// start are the header, those from end on the index and the footer.
func (l *Layer) DataRange() (start, end int64) {
	return l.hdrLen, l.dataEnd
}

// FileSize returns the size of the layer file in bytes.
func (l *Layer) FileSize() int64 { return l.fileSize }

// OpenReaderAt validates the size bytes of r as a layer, as Open does for
// a file (header, index and footer only; chunk data is read when used).
// name names it in messages and is its Path. Close does not close r.
func OpenReaderAt(name string, r io.ReaderAt, size int64) (*Layer, error) {
	l, err := openReader(name, struct{ io.ReaderAt }{r}, size)
	if err != nil {
		return nil, fmt.Errorf("memsnap: open %s: %w", name, err)
	}
	return l, nil
}
