package disk

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/bits"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/warrenvm/warren/internal/atomicfile"
	"golang.org/x/sys/unix"
)

// lockStripes is the number of copy-up locks; block i uses i%lockStripes.
const lockStripes = 64

// CreateOptions configure a new overlay.
type CreateOptions struct {
	// BlockSize is the allocation unit: a power of two in [MinBlockSize,
	// MaxBlockSize]; 0 means DefaultBlockSize.
	BlockSize int
	// BasePath is recorded in the header for OpenChain: the base's path,
	// absolute or relative to the overlay's directory. It may be empty
	// (the overlay can then only be opened with Open).
	BasePath string
}

// Options configure Open.
type Options struct {
	// ReadOnly opens the overlay read-only (and takes a shared flock
	// instead of an exclusive one): writes fail. Lower layers of a stack
	// are opened so.
	ReadOnly bool
}

// Metrics are counters an operator reads; updated atomically.
type Metrics struct {
	CopyUps      atomic.Uint64 // blocks allocated by a write
	CopyUpBytes  atomic.Uint64 // bytes read from the base for copy-up
	ZeroedBlocks atomic.Uint64 // whole blocks Discard made allocated-zero
	Syncs        atomic.Uint64 // successful Syncs
}

// Overlay is a copy-on-write disk: the blocks written so far, in a sparse
// file, over a read-only base. It implements Backing, so overlays stack.
//
// Threads: see the package documentation; every method but Close and
// Rebase is safe for concurrent use. The fields set by Create/Open are
// immutable, except those baseMu guards.
type Overlay struct {
	// Metrics count what the overlay did since it was opened.
	Metrics Metrics

	f *os.File
	// baseMu guards base, hdr and closeBase, which Rebase replaces: every
	// read of the base (ReadAt, copy-up) holds it shared, so that the old
	// base is closed only once no read is in flight on it.
	baseMu sync.RWMutex
	hdr    Header
	base   Backing
	// geom is the header as opened, for its immutable layout fields
	// (block size, sizes, bitmap and data offsets), read without baseMu.
	geom Header
	// readOnly refuses writes; set at Open, or by Fork, which freezes a
	// writable overlay (atomic so that a stray writer sees it).
	readOnly atomic.Bool
	bs       int64 // block size
	size     int64 // virtual size
	data     int64 // data offset in f
	// closeBase closes the base when the overlay owns it (OpenChain, and
	// the parent's overlay from Fork).
	closeBase func() error
	// writeSlot, when set, stands in for Rebase's write of a header slot
	// (a test tears it as a crash would).
	writeSlot func(f *os.File, b []byte, off int64) error

	// bitmap is the in-memory allocation bitmap, word i/64 bit i%64 for
	// block i. Bits are set (atomically, never cleared) only after the
	// block's data is in f, under the block's stripe lock.
	bitmap []atomic.Uint64
	// dirty marks the bitmap pages (bitmapPage bytes) with bits not yet
	// written to f; set after the bit.
	dirty []atomic.Bool
	// stripes serialise copy-up (the check of a block's bit, its copy and
	// the setting of the bit) per block.
	stripes [lockStripes]sync.Mutex
	// syncMu serialises Sync (the snapshot and write of the bitmap).
	syncMu sync.Mutex
	// allocated counts set bits.
	allocated atomic.Int64
	// bufs holds block-sized scratch buffers for copy-up.
	bufs sync.Pool
}

// Create makes a new, empty overlay file at path (which must not exist)
// over base, and returns it open for writing. The file is synced before
// Create returns.
func Create(path string, base Backing, opts CreateOptions) (*Overlay, error) {
	bs := opts.BlockSize
	if bs == 0 {
		bs = DefaultBlockSize
	}
	if bs < 0 || bs > MaxBlockSize {
		return nil, fmt.Errorf("create overlay %s: block size %d out of range", path, bs)
	}
	id, err := Identity(base)
	if err != nil {
		return nil, fmt.Errorf("create overlay %s: %w", path, err)
	}
	h := Header{BlockSize: uint32(bs), VirtualSize: uint64(base.Size()), BaseSize: uint64(base.Size()),
		BaseDigest: id, BasePath: opts.BasePath, Version: Version, Generation: 1}
	b, err := h.Marshal()
	if err != nil {
		return nil, fmt.Errorf("create overlay %s: %w", path, err)
	}
	// Header, then a zero bitmap and holes for data.
	f, err := createFile(path, b, int64(h.FileSize()))
	if err != nil {
		return nil, fmt.Errorf("create overlay %s: %w", path, err)
	}
	return newOverlay(f, &h, base, false), nil
}

// createFile creates the file path, which must not exist, locked
// exclusively, with head at its start and size bytes long (holes after
// head), and syncs it and its directory. On an error the file is gone.
func createFile(path string, head []byte, size int64) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*os.File, error) {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	if err := flock(f, unix.LOCK_EX); err != nil {
		return fail(err)
	}
	if _, err := f.WriteAt(head, 0); err != nil {
		return fail(err)
	}
	if err := f.Truncate(size); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := atomicfile.SyncDir(filepath.Dir(path)); err != nil {
		return fail(err)
	}
	return f, nil
}

// Open opens the overlay file at path over base, which must be the image it
// was created over: same size (else ErrBaseMismatch) and same Identity
// (else ErrBaseMismatch). A file that is not an overlay, of another
// version, or corrupt is refused (ErrNotOverlay, ErrVersion, ErrCorrupt).
// The overlay does not own base: Close leaves it open.
func Open(path string, base Backing, opts Options) (*Overlay, error) {
	flag, lock := os.O_RDWR, unix.LOCK_EX
	if opts.ReadOnly {
		flag, lock = os.O_RDONLY, unix.LOCK_SH
	}
	f, err := os.OpenFile(path, flag|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open overlay: %w", err)
	}
	o, err := openFile(f, base, opts, lock)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open overlay %s: %w", path, err)
	}
	return o, nil
}

func openFile(f *os.File, base Backing, opts Options, lock int) (*Overlay, error) {
	if err := flock(f, lock); err != nil {
		return nil, err
	}
	h, err := readHeader(f)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if uint64(fi.Size()) != h.FileSize() {
		return nil, fmt.Errorf("%w: file is %d bytes, the header says %d", ErrCorrupt, fi.Size(), h.FileSize())
	}
	if bsz := uint64(base.Size()); bsz != h.BaseSize {
		return nil, fmt.Errorf("%w: base is %d bytes, the overlay was made over %d bytes (base %q)", ErrBaseMismatch, bsz, h.BaseSize, h.BasePath)
	}
	id, err := Identity(base)
	if err != nil {
		return nil, err
	}
	if id != h.BaseDigest {
		return nil, fmt.Errorf("%w: base content differs from the one the overlay was made over (base %q, digest %x, recorded %x)",
			ErrBaseMismatch, h.BasePath, id[:8], h.BaseDigest[:8])
	}
	o := newOverlay(f, h, base, opts.ReadOnly)
	if err := o.loadBitmap(); err != nil {
		return nil, err
	}
	return o, nil
}

// readHeader reads and parses the header at the start of f.
func readHeader(f io.ReaderAt) (*Header, error) {
	b := make([]byte, HeaderSize)
	n, err := f.ReadAt(b, 0)
	if n < HeaderSize && err != nil && err != io.EOF {
		return nil, fmt.Errorf("read header: %w", err)
	}
	return ParseHeader(b[:n])
}

func newOverlay(f *os.File, h *Header, base Backing, readOnly bool) *Overlay {
	o := &Overlay{f: f, hdr: *h, geom: *h, base: base,
		bs: int64(h.BlockSize), size: int64(h.VirtualSize), data: int64(h.DataOffset())}
	o.readOnly.Store(readOnly)
	o.bitmap = make([]atomic.Uint64, (h.Blocks()+63)/64)
	o.dirty = make([]atomic.Bool, h.BitmapSize()/bitmapPage)
	o.bufs.New = func() any { b := make([]byte, o.bs); return &b }
	return o
}

// loadBitmap reads the bitmap from the file and checks that no bit past
// the last block is set.
func (o *Overlay) loadBitmap() error {
	b := make([]byte, o.geom.BitmapSize())
	if _, err := o.f.ReadAt(b, int64(o.geom.BitmapOffset())); err != nil {
		return fmt.Errorf("read bitmap: %w", err)
	}
	nb := o.geom.Blocks()
	var count int64
	for i := range o.bitmap {
		w := binary.LittleEndian.Uint64(b[i*8:])
		if valid := nb - uint64(i)*64; valid < 64 && w&^(1<<valid-1) != 0 {
			return fmt.Errorf("%w: bitmap has bits set past block %d", ErrCorrupt, nb)
		}
		o.bitmap[i].Store(w)
		count += int64(bits.OnesCount64(w))
	}
	if !allZero(b[len(o.bitmap)*8:]) {
		return fmt.Errorf("%w: bitmap has bits set past block %d", ErrCorrupt, nb)
	}
	o.allocated.Store(count)
	return nil
}

// Header is the overlay's header (its active slot).
func (o *Overlay) Header() Header {
	o.baseMu.RLock()
	defer o.baseMu.RUnlock()
	return o.hdr
}

// Size is the virtual disk size in bytes (the base's size).
func (o *Overlay) Size() int64 { return o.size }

// BlockSize is the allocation unit in bytes.
func (o *Overlay) BlockSize() int64 { return o.bs }

// Allocated is the number of blocks held in the overlay.
func (o *Overlay) Allocated() int64 { return o.allocated.Load() }

// Base is the image under the overlay.
func (o *Overlay) Base() Backing {
	o.baseMu.RLock()
	defer o.baseMu.RUnlock()
	return o.base
}

// readBase reads len(p) bytes of the base at off, holding baseMu shared.
func (o *Overlay) readBase(p []byte, off int64) error {
	o.baseMu.RLock()
	defer o.baseMu.RUnlock()
	return readFull(o.base, p, off)
}

// ReadOnly reports whether the overlay refuses writes: opened read-only,
// or frozen by Fork.
func (o *Overlay) ReadOnly() bool { return o.readOnly.Load() }

// Path is the overlay file's path.
func (o *Overlay) Path() string { return o.f.Name() }

func (o *Overlay) isAllocated(b int64) bool {
	return o.bitmap[b/64].Load()&(1<<(b%64)) != 0
}

// setAllocated sets block b's bit; the caller holds its stripe lock and
// has put its data in the file.
func (o *Overlay) setAllocated(b int64) {
	o.bitmap[b/64].Or(1 << (b % 64))
	o.allocated.Add(1)
	o.dirty[b/(bitmapPage*8)].Store(true)
}

// ReadAt implements io.ReaderAt: allocated blocks come from the overlay
// file, the others from the base. A read past the end is short, with
// io.EOF.
func (o *Overlay) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read overlay %s: negative offset %d", o.f.Name(), off)
	}
	if off >= o.size {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	var eof error
	if int64(len(p)) > o.size-off {
		p, eof = p[:o.size-off], io.EOF
	}
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		b := pos / o.bs
		alloc := o.isAllocated(b)
		// Extend the run over following blocks in the same state.
		end := (b + 1) * o.bs
		for end < pos+int64(len(p)-done) && o.isAllocated(end/o.bs) == alloc {
			end += o.bs
		}
		n := int(min(end-pos, int64(len(p)-done)))
		var err error
		if alloc {
			err = readFull(o.f, p[done:done+n], o.data+pos)
		} else {
			err = o.readBase(p[done:done+n], pos)
		}
		if err != nil {
			return done, fmt.Errorf("read overlay %s at %d: %w", o.f.Name(), pos, err)
		}
		done += n
	}
	return done, eof
}

// WriteAt implements io.WriterAt within the virtual size (the disk is
// never grown). The first write to a block copies it up from the base.
func (o *Overlay) WriteAt(p []byte, off int64) (int, error) {
	if err := o.checkWrite("write", off, int64(len(p))); err != nil {
		return 0, err
	}
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		b := pos / o.bs
		n := int(min((b+1)*o.bs-pos, int64(len(p)-done)))
		chunk := p[done : done+n]
		written := false
		if !o.isAllocated(b) {
			var err error
			if written, err = o.copyUp(b, pos, chunk); err != nil {
				return done, fmt.Errorf("write overlay %s at %d: %w", o.f.Name(), pos, err)
			}
		}
		if !written {
			if _, err := o.f.WriteAt(chunk, o.data+pos); err != nil {
				return done, fmt.Errorf("write overlay %s at %d: %w", o.f.Name(), pos, err)
			}
		}
		done += n
	}
	return done, nil
}

func (o *Overlay) checkWrite(op string, off, n int64) error {
	if o.readOnly.Load() {
		return fmt.Errorf("%s overlay %s: read-only", op, o.f.Name())
	}
	if off < 0 || n < 0 || off > o.size || n > o.size-off {
		return fmt.Errorf("%s overlay %s: %d bytes at %d: outside the %d-byte disk", op, o.f.Name(), n, off, o.size)
	}
	return nil
}

// blockLen is the length of block b (the last one may be short).
func (o *Overlay) blockLen(b int64) int64 { return min(o.bs, o.size-b*o.bs) }

// copyUp allocates block b, merging chunk (at disk offset pos, within b)
// into it, unless another writer allocated it first: it then reports
// written=false and the caller writes chunk over the allocated block.
func (o *Overlay) copyUp(b, pos int64, chunk []byte) (written bool, err error) {
	mu := &o.stripes[b%lockStripes]
	mu.Lock()
	defer mu.Unlock()
	if o.isAllocated(b) {
		return false, nil
	}
	start, n := b*o.bs, o.blockLen(b)
	if int64(len(chunk)) == n {
		// The write covers the block: nothing to copy.
		if _, err := o.f.WriteAt(chunk, o.data+start); err != nil {
			return false, err
		}
	} else {
		bp := o.bufs.Get().(*[]byte)
		defer o.bufs.Put(bp)
		buf := (*bp)[:n]
		if err := o.readBase(buf, start); err != nil {
			return false, fmt.Errorf("copy up block %d from the base: %w", b, err)
		}
		o.Metrics.CopyUpBytes.Add(uint64(n))
		copy(buf[pos-start:], chunk)
		if _, err := o.f.WriteAt(buf, o.data+start); err != nil {
			return false, err
		}
	}
	o.setAllocated(b)
	o.Metrics.CopyUps.Add(1)
	return true, nil
}

// Discard makes n bytes at off read as zero (it serves both virtio-blk
// DISCARD and WRITE_ZEROES). Whole blocks become allocated-zero: holes
// punched in the overlay file (zeros written where the file system cannot
// punch), so discarding frees space; partial blocks are written with zeros.
func (o *Overlay) Discard(off, n int64) error {
	if err := o.checkWrite("discard", off, n); err != nil {
		return err
	}
	for end := off + n; off < end; {
		b := off / o.bs
		start := b * o.bs
		bend := start + o.blockLen(b)
		if off != start || end < bend {
			m := min(bend, end) - off
			if err := o.writeZeros(off, m); err != nil {
				return err
			}
			off += m
			continue
		}
		if err := o.zeroBlock(b); err != nil {
			return fmt.Errorf("discard overlay %s at %d: %w", o.f.Name(), start, err)
		}
		off = bend
	}
	return nil
}

// writeZeros writes n zero bytes at off through WriteAt.
func (o *Overlay) writeZeros(off, n int64) error {
	for n > 0 {
		m := min(n, int64(len(zeros)))
		if _, err := o.WriteAt(zeros[:m], off); err != nil {
			return err
		}
		off, n = off+m, n-m
	}
	return nil
}

// zeroBlock makes block b allocated and zero.
func (o *Overlay) zeroBlock(b int64) error {
	mu := &o.stripes[b%lockStripes]
	mu.Lock()
	defer mu.Unlock()
	start, n := o.data+b*o.bs, o.blockLen(b)
	if err := punchHole(o.f, start, n); err != nil {
		return err
	}
	if !o.isAllocated(b) {
		o.setAllocated(b)
	}
	o.Metrics.ZeroedBlocks.Add(1)
	return nil
}

// Sync makes every write and discard made before it durable: it fdatasyncs
// the data, then writes the bitmap pages that changed and fdatasyncs again
// (see the package documentation for the crash guarantees). A no-op on a
// read-only overlay. After a failed Sync the durability of earlier writes
// is unknown; the pages are written again by the next Sync.
func (o *Overlay) Sync() error {
	if o.readOnly.Load() {
		return nil
	}
	o.syncMu.Lock()
	defer o.syncMu.Unlock()
	// Snapshot the dirty pages before syncing the data: every bit in the
	// snapshot was set after its block's data was written, so the first
	// fdatasync covers it.
	type page struct {
		i   int
		buf []byte
	}
	var pages []page
	for i := range o.dirty {
		if !o.dirty[i].Swap(false) {
			continue
		}
		buf := make([]byte, bitmapPage)
		for w := 0; w < bitmapPage/8; w++ {
			if wi := i*bitmapPage/8 + w; wi < len(o.bitmap) {
				binary.LittleEndian.PutUint64(buf[w*8:], o.bitmap[wi].Load())
			}
		}
		pages = append(pages, page{i, buf})
	}
	redirty := func() {
		for _, p := range pages {
			o.dirty[p.i].Store(true)
		}
	}
	if err := fdatasync(o.f); err != nil {
		redirty()
		return fmt.Errorf("sync overlay data: %w", err)
	}
	if len(pages) == 0 {
		o.Metrics.Syncs.Add(1)
		return nil
	}
	for _, p := range pages {
		if _, err := o.f.WriteAt(p.buf, int64(o.geom.BitmapOffset())+int64(p.i)*bitmapPage); err != nil {
			redirty()
			return fmt.Errorf("sync overlay bitmap: %w", err)
		}
	}
	if err := fdatasync(o.f); err != nil {
		redirty()
		return fmt.Errorf("sync overlay bitmap: %w", err)
	}
	o.Metrics.Syncs.Add(1)
	return nil
}

// Close syncs a writable overlay (Sync), closes the file (releasing its
// lock) and, for an overlay that owns its base (from OpenChain, or the
// parent's overlay from Fork), the base. It must not race with other
// methods.
func (o *Overlay) Close() error {
	var err error
	if !o.readOnly.Load() {
		err = o.Sync()
	}
	if cerr := o.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close overlay: %w", cerr)
	}
	o.baseMu.Lock()
	closeBase := o.closeBase
	o.closeBase = nil
	o.baseMu.Unlock()
	if closeBase != nil {
		if cerr := closeBase(); err == nil && cerr != nil {
			err = cerr
		}
	}
	return err
}
