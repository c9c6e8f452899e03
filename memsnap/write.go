package memsnap

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/warrenvm/warren/internal/atomicfile"
)

// Options tune how a layer is written. The zero value is usable.
type Options struct {
	// Fingerprint is opaque caller data (host profile, CPU features)
	// stored in the header and compared across a chain and, by the caller,
	// against the restoring host (Layer.CheckFingerprint). At most
	// MaxFingerprintLen bytes. An incremental layer must carry its
	// parent's Fingerprint.
	Fingerprint []byte
	// Created is the recorded creation time; zero means time.Now().
	Created time.Time
	// PageSize is bytes per page, a power of two in [MinPageSize,
	// MaxPageSize]; zero means DefaultPageSize. An incremental layer
	// takes its parent's and rejects a different non-zero value.
	PageSize uint32
	// ChunkPages is the most pages per compressed chunk; zero means
	// DefaultChunkPages. ChunkPages*PageSize must not exceed MaxChunkBytes.
	ChunkPages int
	// Level is the zstd level (1 fastest .. 22 best, mapped onto the
	// encoder's speed classes); zero means 1.
	Level int
	// Workers is how many goroutines compress chunks; zero means
	// GOMAXPROCS. The output does not depend on it.
	Workers int
}

func (o *Options) fill() error {
	if o.PageSize == 0 {
		o.PageSize = DefaultPageSize
	}
	if o.ChunkPages == 0 {
		o.ChunkPages = DefaultChunkPages
	}
	if o.Level == 0 {
		o.Level = 1
	}
	if o.Workers <= 0 {
		o.Workers = runtime.GOMAXPROCS(0)
	}
	if o.Created.IsZero() {
		o.Created = time.Now()
	}
	if len(o.Fingerprint) > MaxFingerprintLen {
		return fmt.Errorf("fingerprint is %d bytes, more than %d", len(o.Fingerprint), MaxFingerprintLen)
	}
	if o.ChunkPages < 1 || uint64(o.ChunkPages)*uint64(o.PageSize) > MaxChunkBytes {
		return fmt.Errorf("chunk of %d pages of %d bytes exceeds %d bytes", o.ChunkPages, o.PageSize, MaxChunkBytes)
	}
	return nil
}

// WriteBase writes a base layer of the size bytes of mem (offset 0 is the
// first byte of the memfd) to path, storing every non-zero page; zero pages
// are implied. It returns the new layer, opened; the caller closes it.
//
// The file is written under a temporary name in path's directory, synced,
// renamed over path and the directory synced (internal/atomicfile), so a
// crash or error leaves any previous file at path intact (a stale
// temporary file, ".NAME" and digits, may remain after a crash). mem must not change while WriteBase runs (pause the vCPUs).
func WriteBase(path string, mem io.ReaderAt, size uint64, opts Options) (*Layer, error) {
	if err := opts.fill(); err != nil {
		return nil, fmt.Errorf("memsnap: write %s: %w", path, err)
	}
	h := Header{
		Version:     Version,
		Kind:        KindBase,
		PageSize:    opts.PageSize,
		MemSize:     size,
		Fingerprint: opts.Fingerprint,
		Created:     opts.Created,
	}
	if err := h.validate(); err != nil {
		return nil, fmt.Errorf("memsnap: write %s: %w", path, err)
	}
	ps := uint64(opts.PageSize)
	pages := h.Pages()
	produce := func(b *chunkBuilder) error {
		block := make([]byte, uint64(opts.ChunkPages)*ps)
		for first := uint64(0); first < pages; first += uint64(opts.ChunkPages) {
			n := min(uint64(opts.ChunkPages), pages-first)
			buf := block[:n*ps]
			if err := readFull(mem, buf, first*ps); err != nil {
				return err
			}
			for i := range n {
				pg := buf[i*ps : (i+1)*ps]
				if isZero(pg) {
					continue
				}
				if !b.add(first+i, pg) {
					return errStopped
				}
			}
		}
		return nil
	}
	return writeLayer(path, &h, &opts, produce)
}

// WriteIncremental writes an incremental layer on top of parent to path:
// exactly the pages whose bit is set in dirty (bit i%64 of dirty[i/64] for
// page i), read from mem. A dirty page that is now all zero is recorded as
// a zero run, so it reads as zero on restore whatever the parent holds.
// size must equal the parent's memory size and opts.Fingerprint the
// parent's (ErrIncompatible otherwise). Crash safety and ownership are as
// for WriteBase.
func WriteIncremental(path string, mem io.ReaderAt, size uint64, dirty []uint64, parent *Layer, opts Options) (*Layer, error) {
	if parent == nil {
		return nil, fmt.Errorf("memsnap: write %s: no parent layer: %w", path, ErrMissingParent)
	}
	ph := parent.Header()
	if opts.PageSize != 0 && opts.PageSize != ph.PageSize {
		return nil, fmt.Errorf("memsnap: write %s: page size %d, parent %s has %d: %w", path, opts.PageSize, parent.Path(), ph.PageSize, ErrIncompatible)
	}
	opts.PageSize = ph.PageSize
	if err := opts.fill(); err != nil {
		return nil, fmt.Errorf("memsnap: write %s: %w", path, err)
	}
	if size != ph.MemSize {
		return nil, fmt.Errorf("memsnap: write %s: memory size %d, parent %s has %d: %w", path, size, parent.Path(), ph.MemSize, ErrIncompatible)
	}
	if !bytes.Equal(opts.Fingerprint, ph.Fingerprint) {
		return nil, fmt.Errorf("memsnap: write %s: fingerprint differs from parent %s: %w", path, parent.Path(), ErrIncompatible)
	}
	name := filepath.Base(parent.Path())
	if len(name) > MaxParentNameLen {
		name = "" // the hint is optional; resolution falls back to the hash
	}
	h := Header{
		Version:     Version,
		Kind:        KindIncremental,
		PageSize:    ph.PageSize,
		MemSize:     size,
		Parent:      parent.Hash(),
		ParentName:  name,
		Fingerprint: opts.Fingerprint,
		Created:     opts.Created,
	}
	ps := uint64(h.PageSize)
	pages := h.Pages()
	if uint64(len(dirty))*64 < pages {
		return nil, fmt.Errorf("memsnap: write %s: dirty bitmap of %d words covers fewer than %d pages", path, len(dirty), pages)
	}
	for i := pages; i < uint64(len(dirty))*64; i++ {
		if dirty[i/64]&(1<<(i%64)) != 0 {
			return nil, fmt.Errorf("memsnap: write %s: dirty bit set for page %d beyond memory of %d pages", path, i, pages)
		}
	}
	produce := func(b *chunkBuilder) error {
		buf := make([]byte, uint64(opts.ChunkPages)*ps)
		// Walk runs of set bits, reading each run in pieces of at most
		// ChunkPages pages.
		for p := uint64(0); p < pages; {
			if dirty[p/64] == 0 && p%64 == 0 {
				p += 64
				continue
			}
			if dirty[p/64]&(1<<(p%64)) == 0 {
				p++
				continue
			}
			end := p
			for end < pages && end-p < uint64(opts.ChunkPages) && dirty[end/64]&(1<<(end%64)) != 0 {
				end++
			}
			run := buf[:(end-p)*ps]
			if err := readFull(mem, run, p*ps); err != nil {
				return err
			}
			for i := range end - p {
				pg := run[i*ps : (i+1)*ps]
				if isZero(pg) {
					b.zero(p + i)
					continue
				}
				if !b.add(p+i, pg) {
					return errStopped
				}
			}
			p = end
		}
		return nil
	}
	return writeLayer(path, &h, &opts, produce)
}

var errStopped = errors.New("stopped")

// readFull reads len(buf) bytes at off, treating a short read as an error.
func readFull(mem io.ReaderAt, buf []byte, off uint64) error {
	n, err := mem.ReadAt(buf, int64(off))
	if n == len(buf) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("read memory at %#x: %w", off, err)
}

var zeroPage [MaxPageSize]byte

func isZero(b []byte) bool { return bytes.Equal(b, zeroPage[:len(b)]) }

// job is one chunk on its way through compression. The producer fills raw
// and runs; a worker sets out, sum or err and closes done.
type job struct {
	block  uint64 // the aligned block of chunkPages pages all its pages lie in
	raw    []byte
	runs   []pageRun
	npages uint32
	out    []byte
	sum    [32]byte
	done   chan struct{}
}

// chunkBuilder groups pages into chunks in page order and hands full chunks
// to the pipeline; it also collects zero runs.
type chunkBuilder struct {
	chunkPages int
	cur        *job
	zeros      []pageRun
	emit       func(*job) bool
	pool       *sync.Pool
}

// add appends page to the current chunk, flushing it when full.
// Chunks are address-aligned: a chunk holds stored pages of one aligned
// block of chunkPages pages only (a page of another block flushes the
// current chunk first), so an unchanged block of memory compresses to the
// same bytes, with the same SHA-256, in every layer that stores it; a
// content-addressed store (hostd/pagestore) keeps such chunks once.
func (b *chunkBuilder) add(page uint64, data []byte) bool {
	if b.cur != nil && page/uint64(b.chunkPages) != b.cur.block {
		if !b.flush() {
			return false
		}
	}
	if b.cur == nil {
		raw := b.pool.Get().(*[]byte)
		b.cur = &job{raw: (*raw)[:0], block: page / uint64(b.chunkPages)}
	}
	j := b.cur
	j.raw = append(j.raw, data...)
	j.npages++
	if n := len(j.runs); n > 0 && j.runs[n-1].end() == page {
		j.runs[n-1].count++
	} else {
		j.runs = append(j.runs, pageRun{first: page, count: 1})
	}
	if int(j.npages) == b.chunkPages {
		return b.flush()
	}
	return true
}

func (b *chunkBuilder) zero(page uint64) {
	if n := len(b.zeros); n > 0 && b.zeros[n-1].end() == page {
		b.zeros[n-1].count++
		return
	}
	b.zeros = append(b.zeros, pageRun{first: page, count: 1})
}

func (b *chunkBuilder) flush() bool {
	if b.cur == nil {
		return true
	}
	j := b.cur
	b.cur = nil
	return b.emit(j)
}

// writeLayer runs the write pipeline: produce (one goroutine) reads memory
// and fills chunks in page order; opts.Workers goroutines compress them;
// this goroutine writes them in order, so the file does not depend on
// scheduling.
func writeLayer(path string, h *Header, opts *Options, produce func(*chunkBuilder) error) (l *Layer, err error) {
	fail := func(err error) (*Layer, error) { return nil, fmt.Errorf("memsnap: write %s: %w", path, err) }
	enc, err := zstd.NewWriter(nil,
		zstd.WithEncoderLevel(zstd.EncoderLevelFromZstd(opts.Level)),
		zstd.WithEncoderConcurrency(opts.Workers),
		zstd.WithEncoderCRC(false), // each chunk carries a SHA-256
		zstd.WithLowerEncoderMem(true))
	if err != nil {
		return fail(err)
	}
	defer enc.Close()

	f, err := atomicfile.Create(path, 0o600)
	if err != nil {
		return fail(err)
	}
	defer func() {
		if err != nil {
			f.Abort()
		}
	}()

	hdr := encodeHeader(h)
	if _, err := f.Write(hdr); err != nil {
		return fail(err)
	}

	chunkBytes := opts.ChunkPages * int(h.PageSize)
	pool := &sync.Pool{New: func() any { b := make([]byte, 0, chunkBytes); return &b }}
	jobs := make(chan *job, opts.Workers)
	ordered := make(chan *job, 2*opts.Workers)
	stop := make(chan struct{})
	b := &chunkBuilder{chunkPages: opts.ChunkPages, pool: pool}
	b.emit = func(j *job) bool {
		j.done = make(chan struct{})
		select {
		case ordered <- j:
		case <-stop:
			return false
		}
		select {
		case jobs <- j:
		case <-stop:
			close(j.done)
			return false
		}
		return true
	}
	var prodErr error
	prodDone := make(chan struct{})
	go func() {
		defer close(prodDone)
		defer close(ordered)
		defer close(jobs)
		prodErr = produce(b)
		if prodErr == nil && !b.flush() {
			prodErr = errStopped
		}
	}()
	var workers sync.WaitGroup
	for range opts.Workers {
		workers.Go(func() {
			for j := range jobs {
				j.out = enc.EncodeAll(j.raw, make([]byte, 0, len(j.raw)/2))
				j.sum = sha256.Sum256(j.out)
				raw := j.raw[:0]
				pool.Put(&raw)
				j.raw = nil
				close(j.done)
			}
		})
	}
	ix := &index{}
	off := int64(len(hdr))
	var werr error
	for j := range ordered {
		<-j.done
		if werr != nil {
			continue // drain
		}
		if _, err := f.Write(j.out); err != nil {
			werr = err
			close(stop)
			continue
		}
		ix.chunks = append(ix.chunks, chunk{off: off, clen: uint32(len(j.out)), npages: j.npages, sum: j.sum, runs: j.runs})
		off += int64(len(j.out))
	}
	<-prodDone
	workers.Wait()
	if werr != nil {
		return fail(werr)
	}
	if prodErr != nil {
		return fail(prodErr)
	}
	ix.zeros = b.zeros

	ixb := encodeIndex(ix)
	ft := encodeFooter(footer{indexOff: off, indexLen: int64(len(ixb)), indexCRC: crc(ixb)})
	if _, err := f.Write(append(ixb, ft...)); err != nil {
		return fail(err)
	}
	if err := f.Commit(); err != nil {
		return fail(err)
	}
	l, err = Open(path)
	if err != nil {
		return nil, err
	}
	return l, nil
}
