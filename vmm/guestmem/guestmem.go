// Package guestmem is a VM's guest RAM: one memfd, mapped once into the VMM,
// exposed to KVM as one or two memory slots (below and above the 32-bit
// MMIO hole).
//
// Ownership: the VM that created a Memory owns it and closes it after all
// vCPUs have stopped. The guest writes it concurrently through KVM; the VMM
// reads and writes it only through bounds-checked accessors (Slice, ReadAt,
// WriteAt), never by raw pointer arithmetic on guest-supplied addresses.
// The memfd is the unit that later snapshots and forks share.
//
// Pager: memory filled on demand (a userfaultfd restore, memsnap/uffd) may
// have pages nobody has installed yet. A Go goroutine must not fault on
// such a page (see memsnap/uffd's package documentation), so every
// accessor that hands guest memory to VMM code (Slice, ReadAt, WriteAt)
// first asks the Memory's Pager, when one is set (SetPager), to make the
// flat range it is about to return present. Flat and Host do not: they
// hand out the whole mapping, to KVM (Host) and to snapshot code that
// reads pages known to be present or that completes the memory first
// (memsnap/uffd's documentation lists each use).
package guestmem

import (
	"errors"
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// PageSize is the guest and host page size.
const PageSize = 4096

// MMIOHoleStart and MMIOHoleEnd bound the 32-bit hole left for the LAPIC,
// IOAPIC and MMIO devices. RAM beyond MMIOHoleStart continues at 4 GiB.
const (
	MMIOHoleStart = 0xC000_0000
	MMIOHoleEnd   = 0x1_0000_0000
)

// Region maps guest physical addresses [GPA, GPA+Size) to memfd offsets
// [Offset, Offset+Size).
type Region struct {
	GPA    uint64
	Size   uint64
	Offset uint64
}

// End returns the first guest physical address after the region.
func (r Region) End() uint64 { return r.GPA + r.Size }

// Memory is guest RAM backed by a memfd.
type Memory struct {
	fd      int
	mem     []byte // MAP_SHARED mapping of the whole memfd (MAP_PRIVATE of layers: see private)
	private bool   // mem is a private copy-on-write mapping of layers (NewPrivateFile, NewFromBase, Fork)
	regions []Region
	// layers is the copy-on-write stack mem maps once it is private
	// (NewPrivateFile, NewFromBase, Fork), bottom first; see fork.go. The
	// Memory owns every descriptor in it, and layers[0].fd == fd. It is
	// nil for a MAP_SHARED memfd that was never forked. Fork changes it,
	// with the VM paused.
	layers []memLayer
	// written has one bit per page of the memfd (flat offset / PageSize)
	// that the VMM wrote since the last TakeWritten of any reader; see
	// MarkWritten. writtenLedger keeps each reader's share (track.go).
	written       []atomic.Uint64
	writtenLedger Ledger
	// pager, when set (SetPager), makes flat ranges present before the
	// accessors hand them out; nil for memory that is all present, the
	// normal case, which then costs one atomic load per access.
	pager atomic.Pointer[pagerRef]
}

// Pager makes pages of a Memory present before VMM code touches them:
// memory whose pages are installed on demand (by userfaultfd: a
// memsnap/uffd Server) sets one, so that a goroutine never takes a page
// fault that only another goroutine could serve.
type Pager interface {
	// Ensure makes every page of flat image [off, off+n) (memfd offsets,
	// inside the memory, n > 0) present, installing those not yet
	// installed, in the calling goroutine and without touching them. It
	// returns once they are, or with an error when one could not be
	// installed; Slice, ReadAt and WriteAt then fail rather than fault.
	// Safe for concurrent use; called on every access, so a range already
	// present must cost little.
	Ensure(off, n uint64) error
}

// Forgetter is implemented by a Pager that must learn of pages made
// absent again: Discard calls Forget with the flat range of whole pages it
// discarded, after discarding them, so that the next Ensure of any of
// them installs it again.
type Forgetter interface {
	// Forget marks the whole pages of flat image [off, off+n) as not
	// present. Safe for concurrent use.
	Forget(off, n uint64)
}

// pagerRef boxes a Pager for the atomic pointer.
type pagerRef struct{ p Pager }

// SetPager makes p the Memory's Pager (nil: none, the normal case). Set
// it before any vCPU or device touches the memory, and keep it until the
// memory is closed or every page is present for good (a Pager that has
// nothing left to install may keep answering at once); a Pager must not
// outlive a Fork, which remaps the memory: the caller completes it first.
func (m *Memory) SetPager(p Pager) {
	if p == nil {
		m.pager.Store(nil)
		return
	}
	m.pager.Store(&pagerRef{p})
}

// ensure asks the Pager, if any, to make flat [off, off+n) present.
func (m *Memory) ensure(off, n uint64) error {
	pr := m.pager.Load()
	if pr == nil || n == 0 {
		return nil
	}
	return pr.p.Ensure(off, n)
}

// forget tells the Pager, if it is a Forgetter, that flat [off, off+n)
// was discarded.
func (m *Memory) forget(off, n uint64) {
	if pr := m.pager.Load(); pr != nil {
		if f, ok := pr.p.(Forgetter); ok {
			f.Forget(off, n)
		}
	}
}

// ErrOutOfRange is wrapped by accessors given an address outside RAM.
var ErrOutOfRange = errors.New("guest address outside RAM")

// Layout returns the regions for size bytes of RAM: one region from 0, or
// two when RAM would reach into the MMIO hole.
func Layout(size uint64) []Region {
	if size <= MMIOHoleStart {
		return []Region{{GPA: 0, Size: size}}
	}
	return []Region{
		{GPA: 0, Size: MMIOHoleStart},
		{GPA: MMIOHoleEnd, Size: size - MMIOHoleStart, Offset: MMIOHoleStart},
	}
}

// New creates size bytes (a multiple of PageSize, > 0) of zeroed guest RAM.
func New(size uint64) (*Memory, error) {
	if size == 0 || size%PageSize != 0 {
		return nil, fmt.Errorf("guestmem: size %d is not a positive multiple of %d", size, PageSize)
	}
	fd, err := unix.MemfdCreate("warren-guest-ram", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("guestmem: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("guestmem: ftruncate %d bytes: %w", size, err)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_NORESERVE)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("guestmem: mmap %d bytes: %w", size, err)
	}
	return &Memory{fd: fd, mem: mem, regions: Layout(size),
		written: make([]atomic.Uint64, (size/PageSize+63)/64)}, nil
}

// NewPrivateFile maps size bytes of the file at path (a raw image of guest
// RAM, e.g. a flattened snapshot) copy-on-write as guest RAM: pages are read
// from the file when first touched and the guest's and VMM's writes stay
// private to this Memory. The file must be at least size bytes and must not
// change while the Memory lives (a changed page not yet written would show
// through). FD then returns the file's descriptor, opened read-only.
func NewPrivateFile(path string, size uint64) (*Memory, error) {
	if size == 0 || size%PageSize != 0 {
		return nil, fmt.Errorf("guestmem: size %d is not a positive multiple of %d", size, PageSize)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("guestmem: open %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("guestmem: stat %s: %w", path, err)
	}
	if uint64(st.Size) < size {
		unix.Close(fd)
		return nil, fmt.Errorf("guestmem: %s is %d bytes, guest RAM is %d", path, st.Size, size)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_NORESERVE)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("guestmem: mmap %s (%d bytes, private): %w", path, size, err)
	}
	return &Memory{fd: fd, mem: mem, private: true, regions: Layout(size),
		layers:  []memLayer{{fd: fd}},
		written: make([]atomic.Uint64, (size/PageSize+63)/64)}, nil
}

// FD returns the memfd (for NewPrivateFile, the read-only image file: it
// does not hold the guest's writes). For a private Memory (NewPrivateFile,
// NewFromBase, or any Memory after Fork) it is the bottom layer's file,
// which holds neither the guest's writes nor the upper layers, and which a
// flattening Fork replaces: do not cache it across a Fork. The Memory owns
// it; do not close it.
func (m *Memory) FD() int { return m.fd }

// Private reports whether the memory is a private copy-on-write mapping of
// files (NewPrivateFile, NewFromBase, or any Memory after Fork), whose
// content is only in Flat, not in FD.
func (m *Memory) Private() bool { return m.private }

// Populated returns a bitmap of the pages (flat memfd offset / PageSize,
// bit p%64 of word p/64) that may hold non-zero bytes, so that a full
// snapshot or a rollback need not read, and thereby allocate, pages the
// guest never touched: for a memfd, the pages that are not holes
// (SEEK_DATA/SEEK_HOLE); for a private mapping of layers, the data of its
// bottom file (SEEK_DATA again: a flattened image keeps zero pages as
// holes), the runs of its upper layers, and the pages it holds privately
// (/proc/self/pagemap). Call it with the VM paused.
func (m *Memory) Populated() ([]uint64, error) {
	pages := m.Size() / PageSize
	bm := make([]uint64, (pages+63)/64)
	set := func(first, last uint64) { // pages [first, last)
		for p := first; p < min(last, pages); p++ {
			bm[p/64] |= 1 << (p % 64)
		}
	}
	if err := seekData(m.fd, int64(m.Size()), set); err != nil {
		return nil, err
	}
	if m.private {
		for _, l := range m.layers[min(1, len(m.layers)):] {
			for _, r := range l.runs {
				set(r.First, r.End())
			}
		}
		runs, err := privateRuns(m.mem)
		if err != nil {
			return nil, err
		}
		for _, r := range runs {
			set(r.First, r.End())
		}
	}
	return bm, nil
}

// seekData calls set(first, last) for the page ranges of fd's first size
// bytes that hold data (not holes).
func seekData(fd int, size int64, set func(first, last uint64)) error {
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // no data beyond off
		}
		if err != nil {
			return fmt.Errorf("guestmem: SEEK_DATA: %w", err)
		}
		if data >= size {
			return nil
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("guestmem: SEEK_HOLE: %w", err)
		}
		hole = min(hole, size)
		set(uint64(data)/PageSize, (uint64(hole)+PageSize-1)/PageSize)
		off = hole
	}
	return nil
}

// Flat returns the VMM mapping of the whole flat image (memfd offset 0 ..
// Size), for snapshot code that copies pages while the VM is paused. It
// does not consult the Pager: a caller touching pages of memory that has
// one must know them present, or call Ensure first.
func (m *Memory) Flat() []byte { return m.mem }

// Ensure makes flat image [off, off+n) present through the Pager (nil at
// once without one): for code that reads Flat directly. The range must
// lie inside the memory.
func (m *Memory) Ensure(off, n uint64) error {
	if off > m.Size() || n > m.Size()-off {
		return fmt.Errorf("guestmem: flat [%#x, +%#x): %w", off, n, ErrOutOfRange)
	}
	if err := m.ensure(off, n); err != nil {
		return fmt.Errorf("guestmem: flat [%#x, +%#x): %w", off, n, err)
	}
	return nil
}

// EnsurePages is Ensure for the pages set in want (a bitmap over the flat
// image, bit p%64 of word p/64, as TakeWritten's), one call per run: for
// snapshot code about to copy them through Flat. Without a Pager it returns
// at once, without reading want.
func (m *Memory) EnsurePages(want []uint64) error {
	if m.pager.Load() == nil {
		return nil
	}
	for _, r := range bitmapRuns(want, m.Size()/PageSize) {
		if err := m.Ensure(r.First*PageSize, r.Count*PageSize); err != nil {
			return err
		}
	}
	return nil
}

// Size is the total RAM in bytes.
func (m *Memory) Size() uint64 { return uint64(len(m.mem)) }

// Regions returns the guest physical layout (do not modify).
func (m *Memory) Regions() []Region { return m.regions }

// Host returns the VMM mapping of a region, for KVM_SET_USER_MEMORY_REGION.
func (m *Memory) Host(r Region) []byte { return m.mem[r.Offset : r.Offset+r.Size] }

// Slice returns the host bytes backing guest [gpa, gpa+n). The range must lie
// inside one region. With a Pager (SetPager), the pages of the range are
// present when Slice returns them; an error of the Pager's is returned.
func (m *Memory) Slice(gpa, n uint64) ([]byte, error) {
	for _, r := range m.regions {
		if gpa >= r.GPA && gpa < r.End() {
			if n > r.End()-gpa {
				break
			}
			off := r.Offset + (gpa - r.GPA)
			if err := m.ensure(off, n); err != nil {
				return nil, fmt.Errorf("guestmem: [%#x, +%#x): %w", gpa, n, err)
			}
			return m.mem[off : off+n : off+n], nil
		}
	}
	return nil, fmt.Errorf("guestmem: [%#x, +%#x): %w", gpa, n, ErrOutOfRange)
}

// ReadAt copies guest memory at gpa into p.
func (m *Memory) ReadAt(p []byte, gpa int64) (int, error) {
	s, err := m.sliceAt(gpa, len(p))
	if err != nil {
		return 0, err
	}
	return copy(p, s), nil
}

// WriteAt copies p into guest memory at gpa.
func (m *Memory) WriteAt(p []byte, gpa int64) (int, error) {
	s, err := m.sliceAt(gpa, len(p))
	if err != nil {
		return 0, err
	}
	m.MarkWritten(uint64(gpa), uint64(len(p)))
	return copy(s, p), nil
}

// sliceAt is Slice for ReadAt and WriteAt, which take a signed address.
func (m *Memory) sliceAt(gpa int64, n int) ([]byte, error) {
	if gpa < 0 {
		return nil, fmt.Errorf("guestmem: negative address: %w", ErrOutOfRange)
	}
	return m.Slice(uint64(gpa), uint64(n))
}

// MarkWritten records that the VMM wrote guest [gpa, gpa+n) (devices do,
// through virtio.WriteTracker), so that incremental snapshots include
// those pages: KVM's dirty log sees only the guest's writes. Addresses
// outside RAM are ignored. Safe for concurrent use.
func (m *Memory) MarkWritten(gpa, n uint64) {
	if n == 0 {
		return
	}
	for _, r := range m.regions {
		if gpa >= r.End() || gpa+n <= r.GPA {
			continue
		}
		lo, hi := max(gpa, r.GPA), min(gpa+n, r.End())
		first := (r.Offset + lo - r.GPA) / PageSize
		last := (r.Offset + hi - r.GPA - 1) / PageSize
		for p := first; p <= last; p++ {
			w := &m.written[p/64]
			bit := uint64(1) << (p % 64)
			if w.Load()&bit == 0 {
				w.Or(bit)
			}
		}
	}
}

// Close unmaps the memory and closes every file it holds (the memfd, or
// all its layers). Only after every vCPU has stopped. Bases forked from it
// and Memories made from those stay valid: they hold their own descriptors.
func (m *Memory) Close() error {
	var err error
	if m.mem != nil {
		err = unix.Munmap(m.mem)
		m.mem = nil
	}
	if len(m.layers) == 0 {
		if cerr := unix.Close(m.fd); err == nil {
			err = cerr
		}
	}
	for _, l := range m.layers { // layers[0].fd is m.fd
		if cerr := unix.Close(l.fd); err == nil {
			err = cerr
		}
	}
	m.layers, m.fd = nil, -1
	return err
}
