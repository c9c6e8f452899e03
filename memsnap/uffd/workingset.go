package uffd

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"slices"

	"github.com/warrenvm/warren/internal/atomicfile"
	"github.com/warrenvm/warren/memsnap"
)

// A working set is the pages a restored guest touched first, in the order
// it touched them (Server.TakeWorkingSet), kept beside a snapshot so that
// later restores of it prefetch those pages (Options.Prefetch).
//
// # File format, version 1
//
// All integers little-endian; CRC is CRC-32C (Castagnoli).
//
//	offset  size  field
//	0       8     magic "WSNAPWSS"
//	8       2     format version (1)
//	10      2     reserved, 0
//	12      4     page size, a power of two in [4096, 2 MiB]
//	16      8     memory size in bytes, a positive multiple of page size, <= 1 TiB
//	24      32    content hash of the chain's top layer (memsnap.Hash)
//	56      4     R, number of runs (<= MaxWorkingSetRuns)
//	60      4     reserved, 0
//	64      R*12  runs, in working-set order: first page (8), count (4, >= 1)
//	64+R*12 4     CRC of bytes [0, 64+R*12)
//
// A run is Count consecutive pages First, First+1, ...; runs lie within
// memory and no page appears twice. A file of another top layer, page size
// or memory size is stale (ErrStale): the memory changed, its working set
// with it.

// MaxWorkingSetRuns bounds the runs of a working set file (48 MiB of runs).
const MaxWorkingSetRuns = 1 << 22

// WorkingSetFileLimit is the size in bytes of the largest working set
// file of a memory of pages pages: one run per page, at most
// MaxWorkingSetRuns. A reader of a file another process wrote reads no
// more than this.
func WorkingSetFileLimit(pages uint64) int64 {
	return int64(wsHeaderLen + min(pages, MaxWorkingSetRuns)*wsRunLen + 4)
}

// Errors of ParseWorkingSet and ReadWorkingSet.
var (
	// ErrCorruptWorkingSet: the bytes are not a well-formed working set.
	ErrCorruptWorkingSet = errors.New("corrupt working set")
	// ErrStale: the working set is of other memory (another top layer,
	// page size or memory size).
	ErrStale = errors.New("stale working set")
)

var (
	wsMagic    = [8]byte{'W', 'S', 'N', 'A', 'P', 'W', 'S', 'S'}
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
)

const (
	wsVersion   = 1
	wsHeaderLen = 64
	wsRunLen    = 12
)

// WorkingSet is a working set: the memory it belongs to and its pages in
// order, as runs; no page appears twice.
type WorkingSet struct {
	PageSize uint32
	MemSize  uint64
	Top      memsnap.Hash
	Runs     []Run
}

// Run is Count consecutive pages from First, in a working set's order.
type Run struct {
	First uint64
	Count uint32
}

// AppendPage appends page to runs, extending the last run when page
// follows it.
func AppendPage(runs []Run, page uint64) []Run {
	if n := len(runs); n > 0 && runs[n-1].First+uint64(runs[n-1].Count) == page && runs[n-1].Count < ^uint32(0) {
		runs[n-1].Count++
		return runs
	}
	return append(runs, Run{First: page, Count: 1})
}

// NumPages is the number of pages in w.
func (w *WorkingSet) NumPages() uint64 {
	var n uint64
	for _, r := range w.Runs {
		n += uint64(r.Count)
	}
	return n
}

// MarshalBinary encodes w; it checks what ParseWorkingSet checks.
func (w *WorkingSet) MarshalBinary() ([]byte, error) {
	if err := checkMemory(w.PageSize, w.MemSize); err != nil {
		return nil, err
	}
	if len(w.Runs) > MaxWorkingSetRuns {
		return nil, fmt.Errorf("uffd: working set of %d runs, more than %d: %w", len(w.Runs), MaxWorkingSetRuns, ErrCorruptWorkingSet)
	}
	if err := checkRuns(w.Runs, w.MemSize/uint64(w.PageSize)); err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	b := make([]byte, wsHeaderLen, wsHeaderLen+len(w.Runs)*wsRunLen+4)
	copy(b, wsMagic[:])
	le.PutUint16(b[8:], wsVersion)
	le.PutUint32(b[12:], w.PageSize)
	le.PutUint64(b[16:], w.MemSize)
	copy(b[24:56], w.Top[:])
	le.PutUint32(b[56:], uint32(len(w.Runs)))
	for _, r := range w.Runs {
		b = le.AppendUint64(b, r.First)
		b = le.AppendUint32(b, r.Count)
	}
	return le.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

// checkMemory checks a page size and memory size as memsnap's header does.
func checkMemory(ps uint32, mem uint64) error {
	if ps < memsnap.MinPageSize || ps > memsnap.MaxPageSize || ps&(ps-1) != 0 {
		return fmt.Errorf("uffd: working set: page size %d: %w", ps, ErrCorruptWorkingSet)
	}
	if mem == 0 || mem%uint64(ps) != 0 || mem > memsnap.MaxMemSize {
		return fmt.Errorf("uffd: working set: memory size %d in pages of %d: %w", mem, ps, ErrCorruptWorkingSet)
	}
	return nil
}

// checkRuns checks that runs are not empty, lie below page n and do not
// overlap: O(runs log runs) time and O(runs) memory, whatever n.
func checkRuns(runs []Run, n uint64) error {
	for i, r := range runs {
		if r.Count == 0 || r.First >= n || uint64(r.Count) > n-r.First {
			return fmt.Errorf("uffd: working set: run %d pages [%d,+%d) outside memory of %d pages: %w", i, r.First, r.Count, n, ErrCorruptWorkingSet)
		}
	}
	sorted := slices.Clone(runs)
	slices.SortFunc(sorted, func(a, b Run) int { return cmp.Compare(a.First, b.First) })
	for i := 1; i < len(sorted); i++ {
		if prev := sorted[i-1]; prev.First+uint64(prev.Count) > sorted[i].First {
			return fmt.Errorf("uffd: working set: page %d appears twice: %w", sorted[i].First, ErrCorruptWorkingSet)
		}
	}
	return nil
}

// ParseWorkingSet decodes a working set file's bytes. It refuses anything
// malformed (ErrCorruptWorkingSet): bad magic, version, checksum or
// length, reserved bytes not zero, sizes out of range, a run empty,
// outside memory or overlapping another. What it allocates is bounded by
// len(b).
func ParseWorkingSet(b []byte) (*WorkingSet, error) {
	le := binary.LittleEndian
	if len(b) < wsHeaderLen+4 {
		return nil, fmt.Errorf("uffd: working set: %d bytes, shorter than a header: %w", len(b), ErrCorruptWorkingSet)
	}
	if !bytes.Equal(b[:8], wsMagic[:]) {
		return nil, fmt.Errorf("uffd: working set: bad magic %q: %w", b[:8], ErrCorruptWorkingSet)
	}
	if v := le.Uint16(b[8:]); v != wsVersion {
		return nil, fmt.Errorf("uffd: working set: format version %d, this build reads %d: %w", v, wsVersion, ErrCorruptWorkingSet)
	}
	nruns := uint64(le.Uint32(b[56:]))
	if nruns > MaxWorkingSetRuns || uint64(len(b)) != wsHeaderLen+nruns*wsRunLen+4 {
		return nil, fmt.Errorf("uffd: working set: %d bytes for %d runs: %w", len(b), nruns, ErrCorruptWorkingSet)
	}
	body := b[:len(b)-4]
	if got, want := crc32.Checksum(body, castagnoli), le.Uint32(b[len(b)-4:]); got != want {
		return nil, fmt.Errorf("uffd: working set: checksum %08x, recorded %08x: %w", got, want, ErrCorruptWorkingSet)
	}
	if le.Uint16(b[10:]) != 0 || le.Uint32(b[60:]) != 0 {
		return nil, fmt.Errorf("uffd: working set: reserved bytes not zero: %w", ErrCorruptWorkingSet)
	}
	w := &WorkingSet{PageSize: le.Uint32(b[12:]), MemSize: le.Uint64(b[16:])}
	copy(w.Top[:], b[24:56])
	if err := checkMemory(w.PageSize, w.MemSize); err != nil {
		return nil, err
	}
	w.Runs = make([]Run, nruns)
	for i, p := range w.Runs {
		off := wsHeaderLen + i*wsRunLen
		p.First, p.Count = le.Uint64(body[off:]), le.Uint32(body[off+8:])
		w.Runs[i] = p
	}
	if err := checkRuns(w.Runs, w.MemSize/uint64(w.PageSize)); err != nil {
		return nil, err
	}
	return w, nil
}

// WriteWorkingSet writes w to path atomically (temporary file, fsync,
// rename, directory fsync).
func WriteWorkingSet(path string, w *WorkingSet) error {
	b, err := w.MarshalBinary()
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, b, 0o644); err != nil {
		return fmt.Errorf("uffd: write working set: %w", err)
	}
	return nil
}

// ReadWorkingSet reads the working set at path for chain's memory: it
// refuses a file that does not parse (ErrCorruptWorkingSet, or the file's
// own error) or is of other memory (ErrStale). It reads at most the
// largest well-formed file's size.
func ReadWorkingSet(path string, chain *memsnap.Chain) (*WorkingSet, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("uffd: read working set: %w", err)
	}
	defer f.Close()
	const limit = wsHeaderLen + MaxWorkingSetRuns*wsRunLen + 4
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("uffd: read working set %s: %w", path, err)
	}
	if len(b) > limit {
		return nil, fmt.Errorf("uffd: working set %s: more than %d bytes: %w", path, limit, ErrCorruptWorkingSet)
	}
	w, err := ParseWorkingSet(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if w.Top != chain.Top().Hash() || w.PageSize != chain.PageSize() || w.MemSize != chain.MemSize() {
		return nil, fmt.Errorf("uffd: working set %s is of layer %s (%d bytes in pages of %d), the memory is %s (%d in %d): %w",
			path, w.Top.Short(), w.MemSize, w.PageSize, chain.Top().Hash().Short(), chain.MemSize(), chain.PageSize(), ErrStale)
	}
	return w, nil
}
