package memsnap

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/bits"
	"time"
)

// Version is the layer format version this build writes and reads.
const Version = 1

// Ext is the file name extension of a layer file; Dir resolves parents
// among files with it.
const Ext = ".wsnap"

// DefaultPageSize is the page size used when Options.PageSize is zero; it
// equals guestmem.PageSize.
const DefaultPageSize = 4096

// DefaultChunkPages is the number of pages grouped into one compressed
// chunk when Options.ChunkPages is zero (256 KiB of 4 KiB pages). Chunks
// are aligned blocks of memory (see the package documentation), and the
// host's page store (hostd/pagestore) keeps a chunk once however many
// layers hold it: the smaller the block, the more of a guest's memory
// that did not change falls in unchanged chunks (with guest writes in
// runs of 16 pages, 64-page chunks store 16 sandboxes' rolling snapshots
// in about half the bytes 256-page ones do, bench/results/2026-12-05-store),
// for about 1% less compression and a little more per-chunk work.
const DefaultChunkPages = 64

// Limits a reader enforces on disk-supplied values, so that a hostile file
// cannot make it allocate without bound.
const (
	MinPageSize       = 4096     // smallest page size accepted
	MaxPageSize       = 2 << 20  // largest page size accepted
	MaxFingerprintLen = 4096     // longest Fingerprint accepted
	MaxParentNameLen  = 255      // longest parent file name hint accepted
	MaxChunkBytes     = 64 << 20 // largest uncompressed chunk accepted
	MaxIndexBytes     = 1 << 30  // largest index accepted
	MaxChainDepth     = 1 << 12  // most layers in one chain
	MaxMemSize        = 1 << 40  // largest memory size accepted (1 TiB)
)

var (
	headerMagic = [8]byte{'W', 'S', 'N', 'A', 'P', 'M', 'E', 'M'}
	footerMagic = [8]byte{'W', 'S', 'N', 'A', 'P', 'E', 'N', 'D'}
	castagnoli  = crc32.MakeTable(crc32.Castagnoli)
)

// Fixed sizes of the format's parts; see the package documentation.
const (
	headerFixedLen = 72 // header bytes before the parent name
	headerMaxLen   = headerFixedLen + MaxParentNameLen + MaxFingerprintLen + 4
	footerLen      = 32                 // footer bytes at the end of the file
	chunkEntryLen  = 8 + 4 + 4 + 32 + 4 // index bytes per chunk before its runs
	pageRunLen     = 8 + 4              // index bytes per stored-page run
	zeroRunLen     = 8 + 8              // index bytes per zero run
	indexFixedLen  = 8                  // chunk count and zero-run count
)

// Sentinel errors. Every error this package returns for a bad file wraps
// one of them; test with errors.Is.
var (
	// ErrCorrupt: the file is not a well-formed layer (bad magic, checksum
	// mismatch, truncation, out-of-range values).
	ErrCorrupt = errors.New("corrupt snapshot layer")
	// ErrVersion: the file is a layer of a format version this build does
	// not read.
	ErrVersion = errors.New("unsupported snapshot format version")
	// ErrMissingParent: an incremental layer's parent could not be found
	// or the file found does not have the recorded content hash.
	ErrMissingParent = errors.New("missing parent layer")
	// ErrIncompatible: layers, memory or host disagree on page size,
	// memory size or Fingerprint.
	ErrIncompatible = errors.New("incompatible snapshot layer")
	// ErrCycle: following parents came back to a layer already in the
	// chain, or the chain is deeper than MaxChainDepth.
	ErrCycle = errors.New("snapshot chain cycle")
)

// Kind says whether a layer stands alone or applies on top of a parent.
type Kind uint8

const (
	// KindBase is a full image: pages it does not store are zero.
	KindBase Kind = 1
	// KindIncremental stores the pages dirtied since its parent; pages it
	// does not mention are the parent's.
	KindIncremental Kind = 2
)

// String returns "base", "incremental" or "kind(N)".
func (k Kind) String() string {
	switch k {
	case KindBase:
		return "base"
	case KindIncremental:
		return "incremental"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Hash is a layer's identity: the SHA-256 content hash defined in the
// package documentation.
type Hash [32]byte

// IsZero reports whether h is all zero (the parent hash of a base layer).
func (h Hash) IsZero() bool { return h == Hash{} }

// String returns h in hexadecimal.
func (h Hash) String() string { return fmt.Sprintf("%x", h[:]) }

// Short returns the first 12 hex digits of h, for messages.
func (h Hash) Short() string { return fmt.Sprintf("%x", h[:6]) }

// Header is the decoded header of a layer file.
type Header struct {
	Version     uint16    // format version; Version for files this build wrote
	Kind        Kind      // base or incremental
	PageSize    uint32    // bytes per page, a power of two
	MemSize     uint64    // bytes of memory the layer describes, a multiple of PageSize
	Parent      Hash      // parent's content hash; zero for a base
	ParentName  string    // parent's file base name when written: a hint, verified by hash
	Fingerprint []byte    // opaque caller data (host profile, CPU features), compared on restore
	Created     time.Time // when the layer was written
}

// Pages returns the number of pages of memory the header describes.
func (h *Header) Pages() uint64 { return h.MemSize / uint64(h.PageSize) }

func crc(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// encodeHeader returns the header bytes, checksum included.
func encodeHeader(h *Header) []byte {
	b := make([]byte, headerFixedLen, headerFixedLen+len(h.ParentName)+len(h.Fingerprint)+4)
	copy(b[0:8], headerMagic[:])
	le := binary.LittleEndian
	le.PutUint16(b[8:], h.Version)
	b[10] = byte(h.Kind)
	le.PutUint32(b[12:], h.PageSize)
	le.PutUint64(b[16:], h.MemSize)
	copy(b[24:56], h.Parent[:])
	le.PutUint64(b[56:], uint64(h.Created.UnixNano()))
	le.PutUint16(b[64:], uint16(len(h.ParentName)))
	le.PutUint16(b[66:], uint16(len(h.Fingerprint)))
	b = append(b, h.ParentName...)
	b = append(b, h.Fingerprint...)
	return le.AppendUint32(b, crc(b))
}

// parseHeader decodes the header at the start of b and returns it with its
// length in bytes. b may hold more than the header. Errors wrap ErrCorrupt
// or ErrVersion.
func parseHeader(b []byte) (Header, int, error) {
	var h Header
	if len(b) < 10 {
		return h, 0, fmt.Errorf("header: %d bytes, shorter than magic and version: %w", len(b), ErrCorrupt)
	}
	if !bytes.Equal(b[0:8], headerMagic[:]) {
		return h, 0, fmt.Errorf("header: bad magic %q, want %q: %w", b[0:8], headerMagic[:], ErrCorrupt)
	}
	le := binary.LittleEndian
	h.Version = le.Uint16(b[8:])
	if h.Version != Version {
		return h, 0, fmt.Errorf("header: format version %d, this build reads version %d: %w", h.Version, Version, ErrVersion)
	}
	if len(b) < headerFixedLen+4 {
		return h, 0, fmt.Errorf("header: truncated at %d bytes: %w", len(b), ErrCorrupt)
	}
	nameLen := int(le.Uint16(b[64:]))
	fpLen := int(le.Uint16(b[66:]))
	if nameLen > MaxParentNameLen {
		return h, 0, fmt.Errorf("header: parent name length %d exceeds %d: %w", nameLen, MaxParentNameLen, ErrCorrupt)
	}
	if fpLen > MaxFingerprintLen {
		return h, 0, fmt.Errorf("header: fingerprint length %d exceeds %d: %w", fpLen, MaxFingerprintLen, ErrCorrupt)
	}
	n := headerFixedLen + nameLen + fpLen
	if len(b) < n+4 {
		return h, 0, fmt.Errorf("header: truncated: %d bytes, header needs %d: %w", len(b), n+4, ErrCorrupt)
	}
	if got, want := crc(b[:n]), le.Uint32(b[n:]); got != want {
		return h, 0, fmt.Errorf("header: checksum %08x, recorded %08x: %w", got, want, ErrCorrupt)
	}
	h.Kind = Kind(b[10])
	if b[11] != 0 || le.Uint32(b[68:]) != 0 {
		return h, 0, fmt.Errorf("header: reserved bytes not zero: %w", ErrCorrupt)
	}
	h.PageSize = le.Uint32(b[12:])
	h.MemSize = le.Uint64(b[16:])
	copy(h.Parent[:], b[24:56])
	h.Created = time.Unix(0, int64(le.Uint64(b[56:]))).UTC()
	h.ParentName = string(b[headerFixedLen : headerFixedLen+nameLen])
	if fpLen > 0 {
		h.Fingerprint = bytes.Clone(b[headerFixedLen+nameLen : n])
	}
	if err := h.validate(); err != nil {
		return h, 0, fmt.Errorf("header: %w", err)
	}
	return h, n + 4, nil
}

// validate checks the header's fields against each other and the limits.
func (h *Header) validate() error {
	switch h.Kind {
	case KindBase:
		if !h.Parent.IsZero() || h.ParentName != "" {
			return fmt.Errorf("base layer names a parent: %w", ErrCorrupt)
		}
	case KindIncremental:
		if h.Parent.IsZero() {
			return fmt.Errorf("incremental layer has no parent hash: %w", ErrCorrupt)
		}
	default:
		return fmt.Errorf("unknown layer kind %d: %w", uint8(h.Kind), ErrCorrupt)
	}
	if h.PageSize < MinPageSize || h.PageSize > MaxPageSize || bits.OnesCount32(h.PageSize) != 1 {
		return fmt.Errorf("page size %d is not a power of two in [%d, %d]: %w", h.PageSize, MinPageSize, MaxPageSize, ErrCorrupt)
	}
	if h.MemSize == 0 || h.MemSize%uint64(h.PageSize) != 0 || h.MemSize > MaxMemSize {
		return fmt.Errorf("memory size %d is not a positive multiple of page size %d up to %d: %w", h.MemSize, h.PageSize, uint64(MaxMemSize), ErrCorrupt)
	}
	return nil
}

// pageRun is count consecutive pages starting at page first.
type pageRun struct {
	first uint64
	count uint64
}

func (r pageRun) end() uint64 { return r.first + r.count }

// chunk is one compressed group of stored pages, as recorded in the index.
type chunk struct {
	off    int64    // file offset of the compressed bytes
	clen   uint32   // compressed length
	npages uint32   // pages stored, the sum of runs' counts
	sum    [32]byte // SHA-256 of the compressed bytes
	runs   []pageRun
}

// index is the decoded index of a layer.
type index struct {
	chunks []chunk
	zeros  []pageRun
}

// encodeIndex returns the index bytes (without checksum; the footer holds it).
func encodeIndex(ix *index) []byte {
	le := binary.LittleEndian
	n := indexFixedLen + len(ix.zeros)*zeroRunLen
	for _, c := range ix.chunks {
		n += chunkEntryLen + len(c.runs)*pageRunLen
	}
	b := make([]byte, 0, n)
	b = le.AppendUint32(b, uint32(len(ix.chunks)))
	b = le.AppendUint32(b, uint32(len(ix.zeros)))
	for _, c := range ix.chunks {
		b = le.AppendUint64(b, uint64(c.off))
		b = le.AppendUint32(b, c.clen)
		b = le.AppendUint32(b, c.npages)
		b = append(b, c.sum[:]...)
		b = le.AppendUint32(b, uint32(len(c.runs)))
		for _, r := range c.runs {
			b = le.AppendUint64(b, r.first)
			b = le.AppendUint32(b, uint32(r.count))
		}
	}
	for _, r := range ix.zeros {
		b = le.AppendUint64(b, r.first)
		b = le.AppendUint64(b, r.count)
	}
	return b
}

// indexLimits are the facts from the header and footer that the index is
// checked against.
type indexLimits struct {
	kind      Kind
	pageSize  uint32
	pages     uint64 // pages of memory
	dataStart int64  // first byte after the header
	dataEnd   int64  // index offset: chunks must tile [dataStart, dataEnd)
}

// parseIndex decodes and validates an index: chunk extents tile the data
// region exactly, page numbers lie within memory, stored runs and zero runs
// are sorted and do not overlap each other. Errors wrap ErrCorrupt.
func parseIndex(b []byte, lim indexLimits) (*index, error) {
	le := binary.LittleEndian
	if len(b) < indexFixedLen {
		return nil, fmt.Errorf("index: %d bytes, shorter than %d: %w", len(b), indexFixedLen, ErrCorrupt)
	}
	nchunks := uint64(le.Uint32(b[0:]))
	nzeros := uint64(le.Uint32(b[4:]))
	if nchunks*chunkEntryLen+nzeros*zeroRunLen > uint64(len(b)-indexFixedLen) {
		return nil, fmt.Errorf("index: %d chunks and %d zero runs do not fit in %d bytes: %w", nchunks, nzeros, len(b), ErrCorrupt)
	}
	if lim.kind == KindBase && nzeros != 0 {
		return nil, fmt.Errorf("index: base layer has %d zero runs: %w", nzeros, ErrCorrupt)
	}
	maxChunkPages := uint64(MaxChunkBytes / lim.pageSize)
	ix := &index{chunks: make([]chunk, 0, nchunks)}
	p := b[indexFixedLen:]
	off := lim.dataStart
	var prevEnd uint64 // end of the previous stored run, across chunks
	for i := range nchunks {
		if len(p) < chunkEntryLen {
			return nil, fmt.Errorf("index: chunk %d entry truncated: %w", i, ErrCorrupt)
		}
		c := chunk{
			off:    int64(le.Uint64(p[0:])),
			clen:   le.Uint32(p[8:]),
			npages: le.Uint32(p[12:]),
		}
		copy(c.sum[:], p[16:48])
		nruns := uint64(le.Uint32(p[48:]))
		p = p[chunkEntryLen:]
		if c.off != off {
			return nil, fmt.Errorf("index: chunk %d at offset %d, want %d (chunks must be contiguous): %w", i, c.off, off, ErrCorrupt)
		}
		if c.clen == 0 || int64(c.clen) > lim.dataEnd-off {
			return nil, fmt.Errorf("index: chunk %d length %d at offset %d runs past the data region ending at %d: %w", i, c.clen, c.off, lim.dataEnd, ErrCorrupt)
		}
		off += int64(c.clen)
		if c.npages == 0 || uint64(c.npages) > maxChunkPages {
			return nil, fmt.Errorf("index: chunk %d holds %d pages, want 1..%d: %w", i, c.npages, maxChunkPages, ErrCorrupt)
		}
		if nruns == 0 || nruns > uint64(c.npages) || nruns*pageRunLen > uint64(len(p)) {
			return nil, fmt.Errorf("index: chunk %d has %d runs for %d pages in %d remaining bytes: %w", i, nruns, c.npages, len(p), ErrCorrupt)
		}
		c.runs = make([]pageRun, nruns)
		var sum uint64
		for j := range c.runs {
			r := pageRun{first: le.Uint64(p[0:]), count: uint64(le.Uint32(p[8:]))}
			p = p[pageRunLen:]
			if r.count == 0 || r.first >= lim.pages || r.count > lim.pages-r.first {
				return nil, fmt.Errorf("index: chunk %d run %d pages [%d,+%d) outside memory of %d pages: %w", i, j, r.first, r.count, lim.pages, ErrCorrupt)
			}
			if r.first < prevEnd {
				return nil, fmt.Errorf("index: chunk %d run %d at page %d overlaps or precedes page %d: %w", i, j, r.first, prevEnd, ErrCorrupt)
			}
			prevEnd = r.end()
			sum += r.count
			c.runs[j] = r
		}
		if sum != uint64(c.npages) {
			return nil, fmt.Errorf("index: chunk %d runs cover %d pages, entry says %d: %w", i, sum, c.npages, ErrCorrupt)
		}
		ix.chunks = append(ix.chunks, c)
	}
	if off != lim.dataEnd {
		return nil, fmt.Errorf("index: chunks end at %d, index starts at %d: %w", off, lim.dataEnd, ErrCorrupt)
	}
	if uint64(len(p)) != nzeros*zeroRunLen {
		return nil, fmt.Errorf("index: %d bytes left for %d zero runs: %w", len(p), nzeros, ErrCorrupt)
	}
	ix.zeros = make([]pageRun, nzeros)
	prevEnd = 0
	for j := range ix.zeros {
		r := pageRun{first: le.Uint64(p[0:]), count: le.Uint64(p[8:])}
		p = p[zeroRunLen:]
		if r.count == 0 || r.first >= lim.pages || r.count > lim.pages-r.first {
			return nil, fmt.Errorf("index: zero run %d pages [%d,+%d) outside memory of %d pages: %w", j, r.first, r.count, lim.pages, ErrCorrupt)
		}
		if r.first < prevEnd {
			return nil, fmt.Errorf("index: zero run %d at page %d overlaps or precedes page %d: %w", j, r.first, prevEnd, ErrCorrupt)
		}
		prevEnd = r.end()
		ix.zeros[j] = r
	}
	if err := checkDisjoint(ix); err != nil {
		return nil, err
	}
	return ix, nil
}

// checkDisjoint verifies that no zero run overlaps a stored run. Both lists
// are sorted, so one merge pass suffices.
func checkDisjoint(ix *index) error {
	zi := 0
	for ci := range ix.chunks {
		for _, r := range ix.chunks[ci].runs {
			for zi < len(ix.zeros) && ix.zeros[zi].end() <= r.first {
				zi++
			}
			if zi < len(ix.zeros) && ix.zeros[zi].first < r.end() {
				return fmt.Errorf("index: zero run at page %d overlaps pages stored in chunk %d: %w", ix.zeros[zi].first, ci, ErrCorrupt)
			}
		}
	}
	return nil
}

// footer is the fixed-size trailer of a layer file.
type footer struct {
	indexOff int64
	indexLen int64
	indexCRC uint32
}

func encodeFooter(f footer) []byte {
	le := binary.LittleEndian
	b := make([]byte, 0, footerLen)
	b = le.AppendUint64(b, uint64(f.indexOff))
	b = le.AppendUint64(b, uint64(f.indexLen))
	b = le.AppendUint32(b, f.indexCRC)
	b = le.AppendUint32(b, crc(b))
	return append(b, footerMagic[:]...)
}

// parseFooter decodes the footer of a file of fileSize bytes whose header is
// headerLen bytes long. Errors wrap ErrCorrupt.
func parseFooter(b []byte, headerLen, fileSize int64) (footer, error) {
	var f footer
	if len(b) != footerLen {
		return f, fmt.Errorf("footer: %d bytes, want %d: %w", len(b), footerLen, ErrCorrupt)
	}
	if !bytes.Equal(b[24:32], footerMagic[:]) {
		return f, fmt.Errorf("footer: bad magic %q, want %q (truncated file?): %w", b[24:32], footerMagic[:], ErrCorrupt)
	}
	le := binary.LittleEndian
	if got, want := crc(b[:20]), le.Uint32(b[20:]); got != want {
		return f, fmt.Errorf("footer: checksum %08x, recorded %08x: %w", got, want, ErrCorrupt)
	}
	off, n := le.Uint64(b[0:]), le.Uint64(b[8:])
	f.indexCRC = le.Uint32(b[16:])
	end := uint64(fileSize - footerLen)
	if off < uint64(headerLen) || n > MaxIndexBytes || off > end || n != end-off {
		return f, fmt.Errorf("footer: index [%d,+%d) does not end at the footer (offset %d) after the header (%d bytes): %w", off, n, end, headerLen, ErrCorrupt)
	}
	f.indexOff, f.indexLen = int64(off), int64(n)
	return f, nil
}
