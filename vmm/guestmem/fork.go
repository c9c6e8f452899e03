package guestmem

// Copy-on-write fork of guest RAM.
//
// Fork turns a Memory's current content into a Base: an immutable stack of
// files (layers) that any number of children map copy-on-write
// (NewFromBase), in this process or another (Descriptor, OpenBase). The
// forked Memory itself becomes a private copy-on-write mapping of the same
// Base, at the same host address, so the KVM memory slots registered on
// it stay valid: the MAP_FIXED remap fires KVM's MMU notifier and the
// guest re-faults its pages from the new mapping.
//
// Layers. The bottom layer covers every page of the flat image (memfd
// offset 0 .. Size); each upper layer is a sparse file holding only its
// runs of pages, each at its own flat offset. A page's content is that of
// the topmost layer whose runs hold it. The flat image is what the
// mapping covers: RAM above the 32-bit MMIO hole is a second KVM region,
// but it is the same one range of the flat mapping (Layout), so forks need
// not know about regions.
//
// Invariants and ownership:
//   - Nobody writes a layer's file once Fork has returned it in a Base:
//     files Fork creates are sealed against writes (F_SEAL_WRITE); the
//     memfd of New, which the first Fork turns into the bottom layer
//     without a copy, is not sealed (other holders of the descriptor may
//     have it mapped), so after a Fork nobody may write it through FD or a
//     shared mapping of it; NewPrivateFile's image file must not change
//     either (as that function already requires).
//   - A Memory owns one descriptor per layer it maps and closes them in
//     Close; a Base owns its Files, distinct descriptors (dups) from the
//     Memory's, and closes them in Close. Either may be closed first:
//     mappings hold their own references to the files.
//   - Fork must be called with every vCPU out of KVM_RUN and no device
//     reading or writing guest memory: it scans and remaps the mapping,
//     and a write racing with it may be lost or land in either side.
//
// Cost. The first Fork of a New memory copies nothing. Later Forks copy
// only the pages written since the mapping was made or last forked: named
// by the caller from the write records it keeps anyway (KVM's dirty log
// and the VMM's own writes: cow passes them, one bit per page), or else
// found by scanning /proc/self/pagemap for the mapping (8 bytes per page). To bound the
// number of layers and of VMAs (vm.max_map_count: every run costs up to
// two), Fork compacts instead when a Memory would stack more than
// maxLayers layers or maxRuns runs: it merges the upper layers and the new
// runs into one upper layer (copying the pages they hold, not the bottom
// layer's), and only when even the merged runs pass maxRuns flattens: it
// copies the whole content (O(guest memory); all-zero pages are skipped
// and stay holes) into one new bottom layer.
//
// Host requirements. Forking a private Memory and PrivatePages read
// /proc/self/pagemap; only its flag bits are used (present, swapped,
// file-or-shared), which any process may read for itself, so no privilege
// is needed, but /proc must be mounted (a sandbox without it fails Fork
// with a clear error; the first Fork of a New memory does not need it).
//
// Semantics of a private mapping that callers must know: discarding a page
// (madvise MADV_DONTNEED, as a balloon might) makes it read back as its
// layer's content, not as zeros; and a read fault on a hole of a memfd
// layer allocates a zero page in that (shared) memfd, once for all who map
// it, as reads of a MAP_SHARED memfd always did.
//
// Pages and hugepages. Everything assumes a 4 KiB host page (checked).
// Copy-on-write of a file mapping breaks at 4 KiB even where the page
// cache uses transparent huge pages, and pagemap reports every 4 KiB page
// (of a huge one too), so THP affects only performance: a private
// mapping's written pages are 4 KiB anonymous pages, never huge.

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"os"
	"slices"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Limits past which Fork flattens. Variables so that tests can lower them.
var (
	maxLayers = 64   // layers of a Base, bottom included
	maxRuns   = 8192 // runs across all layers of a Base
)

// Run is a run of pages [First, First+Count) (page = flat memfd offset /
// PageSize).
type Run struct{ First, Count uint64 }

// End returns the first page after the run.
func (r Run) End() uint64 { return r.First + r.Count }

// Layer is one immutable file of a Base. File holds the bytes of the pages
// in Runs at their own flat offsets (offset = page*PageSize); Runs nil
// means every page of the Base, which only the bottom layer has. Runs are
// sorted and do not overlap.
type Layer struct {
	File *os.File
	Runs []Run
}

// Base is an immutable image of guest RAM taken at a fork. Layers are
// bottom first; a page's content is that of the topmost layer whose Runs
// hold it, and the bottom layer covers every page. Nobody writes a Base's
// files after Fork returns. The Base owns its Files: Close releases this
// process's references to them (Memories made from it stay valid).
type Base struct {
	Size   uint64
	Layers []Layer
}

// memLayer is a Memory's own reference to one layer it maps.
type memLayer struct {
	fd   int // owned by the Memory
	runs []Run
}

// Bits of a /proc/self/pagemap entry (Documentation/admin-guide/mm/pagemap.rst).
const (
	pmPresent = 1 << 63
	pmSwapped = 1 << 62
	pmFile    = 1 << 61 // file page or shared anonymous
)

// Close closes the Base's files (each once, should layers share one).
func (b *Base) Close() error {
	var err error
	seen := make(map[*os.File]bool, len(b.Layers))
	for _, l := range b.Layers {
		if l.File == nil || seen[l.File] {
			continue
		}
		seen[l.File] = true
		if cerr := l.File.Close(); err == nil {
			err = cerr
		}
	}
	b.Layers = nil
	return err
}

// Fork makes m's current content an immutable Base for children
// (NewFromBase) to map copy-on-write, and turns m itself into a private
// copy-on-write mapping of that Base at the same host address (so KVM
// memory slots stay valid). Call it with every vCPU out of KVM_RUN and no
// device touching memory. The caller owns the Base and closes it when no
// more children will be made from it.
//
//   - First Fork of a MAP_SHARED memfd (New): the memfd becomes the bottom
//     layer, no copy; m is remapped MAP_PRIVATE of it.
//   - A private Memory (earlier Fork, NewFromBase, NewPrivateFile): the
//     pages m holds privately (written since its mapping was made or last
//     forked) are copied into a new sparse memfd that becomes the top
//     layer over m's layers, and those runs of m are remapped from it,
//     freeing m's anonymous copies, so that the next Fork sees only newer
//     writes. With no private pages the Base is m's current layers.
//     written, when not nil, names those pages: a bitmap over the flat
//     image (bit p%64 of word p/64) of every page written since the
//     mapping was made or last forked, by the guest (KVM's dirty log) or
//     the VMM (TakeWritten(ForForks)); a superset is fine (a page not
//     private is copied as it reads), a missed page is not (the child
//     would see its older content). Then the cost in the caller's pause is
//     one load per 64 pages plus the pages copied. With written nil, the
//     private pages are found in /proc/self/pagemap: 8 bytes read per page
//     of guest RAM.
//   - Past maxLayers layers or maxRuns runs: compact (see the file
//     comment), O(pages of the upper layers); past maxRuns even merged,
//     flatten, O(memory).
//
// MarkWritten's record is untouched. If Fork fails while remapping (which
// needs nothing but free VMAs), m's mapping may be damaged: discard the VM.
func (m *Memory) Fork(written []uint64) (*Base, error) {
	if m.mem == nil {
		return nil, errors.New("guestmem: fork: memory is closed")
	}
	if err := checkHostPage(); err != nil {
		return nil, fmt.Errorf("guestmem: fork: %w", err)
	}
	if !m.private {
		if err := remap(m.mem, m.fd, 0, m.Size()); err != nil {
			return nil, fmt.Errorf("guestmem: fork: %w", err)
		}
		m.private = true
		m.layers = []memLayer{{fd: m.fd}}
		return m.base()
	}
	var runs []Run
	if written != nil {
		if uint64(len(written)) < (m.Size()/PageSize+63)/64 {
			return nil, fmt.Errorf("guestmem: fork: written bitmap of %d words for %d pages", len(written), m.Size()/PageSize)
		}
		runs = bitmapRuns(written, m.Size()/PageSize)
	} else {
		var err error
		if runs, err = privateRuns(m.mem); err != nil {
			return nil, fmt.Errorf("guestmem: fork: %w", err)
		}
	}
	if len(runs) == 0 {
		return m.base()
	}
	total := len(runs)
	for _, l := range m.layers {
		total += len(l.runs)
	}
	if len(m.layers)+1 > maxLayers || total > maxRuns {
		return m.compact(runs)
	}
	fd, err := writeLayer(m.mem, runs)
	if err != nil {
		return nil, fmt.Errorf("guestmem: fork: %w", err)
	}
	// The layer is m's from here on: its content equals m's for its runs,
	// whether or not each run is remapped yet.
	m.layers = append(m.layers, memLayer{fd: fd, runs: runs})
	for _, r := range runs {
		if err := remap(m.mem, fd, r.First*PageSize, r.Count*PageSize); err != nil {
			return nil, fmt.Errorf("guestmem: fork: %w", err)
		}
	}
	return m.base()
}

// compact bounds m's layers before a fork whose new runs would pass
// maxLayers or maxRuns: it merges every upper layer and the new runs into
// one upper layer over the bottom one (copying only the pages those runs
// hold: O(pages written since the bottom layer), not O(memory)), or, when
// even the merged runs pass maxRuns, flattens. The bottom layer, most of a
// guest's memory, stays shared with every child forked before: a parent
// forked child by child (bench/fork's density) copied its whole memory
// every 63 forks before, about 2 MiB a child at 128 MiB.
func (m *Memory) compact(runs []Run) (*Base, error) {
	all := slices.Clone(runs)
	for _, l := range m.layers[1:] {
		all = append(all, l.runs...)
	}
	union := unionRuns(all)
	if len(union) > maxRuns {
		return m.flatten()
	}
	fd, err := writeLayer(m.mem, union)
	if err != nil {
		return nil, fmt.Errorf("guestmem: fork: compact: %w", err)
	}
	// The merged layer equals m's content on its runs from here on.
	old := m.layers[1:]
	m.layers = append(m.layers[:1:1], memLayer{fd: fd, runs: union})
	for _, l := range old {
		unix.Close(l.fd)
	}
	for _, r := range union {
		if err := remap(m.mem, fd, r.First*PageSize, r.Count*PageSize); err != nil {
			return nil, fmt.Errorf("guestmem: fork: compact: %w", err)
		}
	}
	return m.base()
}

// unionRuns returns the sorted union of runs, adjacent runs joined.
func unionRuns(runs []Run) []Run {
	slices.SortFunc(runs, func(a, b Run) int { return cmp.Compare(a.First, b.First) })
	var out []Run
	for _, r := range runs {
		if k := len(out); k > 0 && r.First <= out[k-1].End() {
			if r.End() > out[k-1].End() {
				out[k-1].Count = r.End() - out[k-1].First
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

// flatten copies m's whole content into one new sealed memfd, remaps m
// from it and makes it m's only layer.
func (m *Memory) flatten() (*Base, error) {
	all := []Run{{0, m.Size() / PageSize}}
	fd, err := writeLayer(m.mem, all)
	if err != nil {
		return nil, fmt.Errorf("guestmem: fork: flatten: %w", err)
	}
	if err := remap(m.mem, fd, 0, m.Size()); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("guestmem: fork: flatten: %w", err)
	}
	for _, l := range m.layers {
		unix.Close(l.fd)
	}
	m.layers, m.fd = []memLayer{{fd: fd}}, fd
	return m.base()
}

// base returns a Base of m's current layers, with its own descriptors.
func (m *Memory) base() (*Base, error) {
	b := &Base{Size: m.Size(), Layers: make([]Layer, 0, len(m.layers))}
	for i, l := range m.layers {
		fd, err := unix.FcntlInt(uintptr(l.fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			b.Close()
			return nil, fmt.Errorf("guestmem: fork: dup layer %d: %w", i, err)
		}
		f := os.NewFile(uintptr(fd), fmt.Sprintf("guestmem-layer-%d", i))
		b.Layers = append(b.Layers, Layer{File: f, Runs: slices.Clone(l.runs)})
	}
	return b, nil
}

// NewFromBase maps b copy-on-write as a new guest RAM (for a forked child,
// possibly in another process): the bottom layer over the whole range,
// MAP_PRIVATE|MAP_NORESERVE, then each upper layer's runs MAP_FIXED over
// it. The Memory keeps b's layer structure, so that its own Fork stacks on
// top, and holds its own dups of b's files: b may be closed at once.
func NewFromBase(b *Base) (*Memory, error) {
	if err := b.validate(); err != nil {
		return nil, err
	}
	if err := checkHostPage(); err != nil {
		return nil, fmt.Errorf("guestmem: %w", err)
	}
	m := &Memory{fd: -1, private: true, regions: Layout(b.Size),
		written: make([]atomic.Uint64, (b.Size/PageSize+63)/64)}
	for i, l := range b.Layers {
		fd, err := dupFile(l.File)
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("guestmem: dup layer %d: %w", i, err)
		}
		m.layers = append(m.layers, memLayer{fd: fd, runs: slices.Clone(l.Runs)})
	}
	m.fd = m.layers[0].fd
	mem, err := unix.Mmap(m.fd, 0, int(b.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_NORESERVE)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("guestmem: mmap bottom layer (%d bytes, private): %w", b.Size, err)
	}
	m.mem = mem
	for i, l := range m.layers[1:] {
		for _, r := range l.runs {
			if err := remap(m.mem, l.fd, r.First*PageSize, r.Count*PageSize); err != nil {
				m.Close()
				return nil, fmt.Errorf("guestmem: layer %d: %w", i+1, err)
			}
		}
	}
	return m, nil
}

// validate checks b's shape against its files.
func (b *Base) validate() error {
	if b == nil {
		return errors.New("guestmem: nil base")
	}
	if b.Size == 0 || b.Size%PageSize != 0 || b.Size > uint64(maxInt) {
		return fmt.Errorf("guestmem: base size %d is not a positive multiple of %d", b.Size, PageSize)
	}
	if len(b.Layers) == 0 || len(b.Layers) > maxLayers {
		return fmt.Errorf("guestmem: base has %d layers, want 1 to %d", len(b.Layers), maxLayers)
	}
	pages, total := b.Size/PageSize, 0
	for i, l := range b.Layers {
		if l.File == nil {
			return fmt.Errorf("guestmem: base layer %d has no file", i)
		}
		if i == 0 && len(l.Runs) != 0 {
			return fmt.Errorf("guestmem: base layer 0 has runs: the bottom layer must cover every page")
		}
		if i > 0 && len(l.Runs) == 0 {
			return fmt.Errorf("guestmem: base layer %d has no runs: only the bottom layer covers every page", i)
		}
		total += len(l.Runs)
		if total > maxRuns {
			return fmt.Errorf("guestmem: base has more than %d runs", maxRuns)
		}
		end := pages // pages the file must hold
		if i > 0 {
			next := uint64(0) // first page the next run may start at
			for j, r := range l.Runs {
				if r.Count == 0 || r.First >= pages || r.Count > pages-r.First {
					return fmt.Errorf("guestmem: base layer %d run %d (pages %d+%d) is empty or outside %d pages", i, j, r.First, r.Count, pages)
				}
				if r.First < next {
					return fmt.Errorf("guestmem: base layer %d run %d (page %d) is out of order or overlaps the previous run", i, j, r.First)
				}
				next = r.End()
			}
			end = next
		}
		st, err := l.File.Stat()
		if err != nil {
			return fmt.Errorf("guestmem: base layer %d: %w", i, err)
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("guestmem: base layer %d: %s is not a regular file", i, l.File.Name())
		}
		if uint64(st.Size()) < end*PageSize {
			return fmt.Errorf("guestmem: base layer %d: file is %d bytes, its pages need %d", i, st.Size(), end*PageSize)
		}
	}
	return nil
}

// BaseDescriptor describes a Base to another process, which receives the
// files separately (e.g. exec.Cmd.ExtraFiles) and rebuilds it with OpenBase.
type BaseDescriptor struct {
	Size   uint64            `json:"size"`
	Layers []LayerDescriptor `json:"layers"`
}

// LayerDescriptor is one layer of a BaseDescriptor: the index of its file
// among the files passed along, and its runs (none for the bottom layer).
type LayerDescriptor struct {
	File int   `json:"file"`
	Runs []Run `json:"runs,omitempty"`
}

// Descriptor returns a description of b and the files it refers to, each
// once. The files are b's own: the caller passes them on (ExtraFiles dups
// them into the child) and does not close them.
func (b *Base) Descriptor() (BaseDescriptor, []*os.File) {
	d := BaseDescriptor{Size: b.Size, Layers: make([]LayerDescriptor, 0, len(b.Layers))}
	var files []*os.File
	index := make(map[*os.File]int, len(b.Layers))
	for _, l := range b.Layers {
		i, ok := index[l.File]
		if !ok {
			i = len(files)
			index[l.File] = i
			files = append(files, l.File)
		}
		d.Layers = append(d.Layers, LayerDescriptor{File: i, Runs: slices.Clone(l.Runs)})
	}
	return d, files
}

// OpenBase rebuilds a Base from a descriptor and the files it indexes (e.g.
// os.NewFile of inherited descriptors 3, 4, ...), after checking that the
// runs lie inside Size, sorted and apart, that only the bottom layer has
// no runs, that every file index is in range and every file is used, and
// that each file is long enough for its runs. On success the Base owns
// the files; on error the caller still does.
func OpenBase(d BaseDescriptor, files []*os.File) (*Base, error) {
	used := make([]bool, len(files))
	b := &Base{Size: d.Size, Layers: make([]Layer, 0, len(d.Layers))}
	for i, l := range d.Layers {
		if l.File < 0 || l.File >= len(files) {
			return nil, fmt.Errorf("guestmem: base layer %d: file index %d, have %d files", i, l.File, len(files))
		}
		used[l.File] = true
		b.Layers = append(b.Layers, Layer{File: files[l.File], Runs: slices.Clone(l.Runs)})
	}
	for i, u := range used {
		if !u {
			return nil, fmt.Errorf("guestmem: base file %d is used by no layer", i)
		}
	}
	if err := b.validate(); err != nil {
		return nil, err
	}
	return b, nil
}

// PrivatePages returns how many pages m holds privately: pages of a
// private mapping written since it was made (or last forked), found in
// /proc/self/pagemap. For a MAP_SHARED memfd it is 0. For tests and
// metrics; it reads 8 bytes per page of guest RAM.
func (m *Memory) PrivatePages() (uint64, error) {
	if m.mem == nil {
		return 0, errors.New("guestmem: memory is closed")
	}
	if err := checkHostPage(); err != nil {
		return 0, fmt.Errorf("guestmem: %w", err)
	}
	runs, err := privateRuns(m.mem)
	if err != nil {
		return 0, err
	}
	var n uint64
	for _, r := range runs {
		n += r.Count
	}
	return n, nil
}

// keptPagemap is this process's /proc/self/pagemap, opened by
// KeepPagemap (nil until then); reads use ReadAt, safe from any thread.
var keptPagemap atomic.Pointer[os.File]

// KeepPagemap opens /proc/self/pagemap once and keeps it open for the
// process's life, for Fork and PrivatePages. A VMM calls it before it
// leaves root for a jail's uid: that change makes the process
// non-dumpable, and /proc/self/pagemap can then no longer be opened
// (its permission is checked at open, against the process itself).
func KeepPagemap() error {
	if keptPagemap.Load() != nil {
		return nil
	}
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return fmt.Errorf("guestmem: pagemap: %w", err)
	}
	if !keptPagemap.CompareAndSwap(nil, f) {
		f.Close()
	}
	return nil
}

// privateRuns returns the runs of pages of mem (page 0 at mem[0]) that are
// private anonymous pages, present or swapped: in a private file mapping,
// the pages written since it was made.
func privateRuns(mem []byte) ([]Run, error) {
	f := keptPagemap.Load()
	if f == nil {
		var err error
		if f, err = os.Open("/proc/self/pagemap"); err != nil {
			return nil, fmt.Errorf("pagemap: %w", err)
		}
		defer f.Close()
	}
	pages := uint64(len(mem)) / PageSize
	first := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(mem)))) / PageSize
	buf := make([]byte, 8*min(pages, 64<<10))
	var runs []Run
	for p := uint64(0); p < pages; {
		n := min(pages-p, uint64(len(buf)/8))
		if _, err := f.ReadAt(buf[:n*8], int64((first+p)*8)); err != nil {
			return nil, fmt.Errorf("pagemap: read %d entries: %w", n, err)
		}
		for i := range n {
			e := binary.NativeEndian.Uint64(buf[i*8:])
			if e&(pmPresent|pmSwapped) == 0 || e&pmFile != 0 {
				continue
			}
			if k := len(runs); k > 0 && runs[k-1].End() == p+i {
				runs[k-1].Count++
			} else {
				runs = append(runs, Run{p + i, 1})
			}
		}
		p += n
	}
	return runs, nil
}

// bitmapRuns returns the runs of set bits among the first pages bits of
// bm (bit p%64 of word p/64). It skips zero words whole, so its cost is
// one load per 64 pages plus the runs found.
func bitmapRuns(bm []uint64, pages uint64) []Run {
	var runs []Run
	for w, word := range bm {
		for word != 0 {
			p := uint64(w)*64 + uint64(bits.TrailingZeros64(word))
			if p >= pages {
				return runs
			}
			word &= word - 1
			if k := len(runs); k > 0 && runs[k-1].End() == p {
				runs[k-1].Count++
			} else {
				runs = append(runs, Run{p, 1})
			}
		}
	}
	return runs
}

// writeLayer creates a sparse memfd of len(mem) bytes holding mem's bytes
// for runs at their own offsets (pages that are all zero stay holes) and
// seals it against any change.
func writeLayer(mem []byte, runs []Run) (int, error) {
	fd, err := unix.MemfdCreate("warren-guest-layer", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(len(mem))); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("ftruncate layer to %d bytes: %w", len(mem), err)
	}
	var zero [PageSize]byte
	for _, r := range runs {
		// Write maximal stretches of non-zero pages.
		for p := r.First; p < r.End(); {
			if bytes.Equal(mem[p*PageSize:(p+1)*PageSize], zero[:]) {
				p++
				continue
			}
			q := p + 1
			for q < r.End() && !bytes.Equal(mem[q*PageSize:(q+1)*PageSize], zero[:]) {
				q++
			}
			if err := pwriteFull(fd, mem[p*PageSize:q*PageSize], int64(p*PageSize)); err != nil {
				unix.Close(fd)
				return -1, fmt.Errorf("write layer pages %d+%d: %w", p, q-p, err)
			}
			p = q
		}
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("seal layer: %w", err)
	}
	return fd, nil
}

func pwriteFull(fd int, p []byte, off int64) error {
	for len(p) > 0 {
		n, err := unix.Pwrite(fd, p, off)
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		p, off = p[n:], off+int64(n)
	}
	return nil
}

// remap maps fd's [off, off+n) over mem's [off, off+n), private and
// copy-on-write, replacing what was mapped there.
func remap(mem []byte, fd int, off, n uint64) error {
	addr := unsafe.Pointer(&mem[off])
	got, err := unix.MmapPtr(fd, int64(off), addr, uintptr(n),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_FIXED|unix.MAP_NORESERVE)
	if err != nil {
		return fmt.Errorf("mmap fixed [%#x, +%#x) private: %w", off, n, err)
	}
	if got != addr {
		return fmt.Errorf("mmap fixed [%#x, +%#x) landed at %p, want %p", off, n, got, addr)
	}
	return nil
}

// dupFile returns a new close-on-exec descriptor for f.
func dupFile(f *os.File) (int, error) {
	sc, err := f.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var dupErr error
	if err := sc.Control(func(raw uintptr) {
		fd, dupErr = unix.FcntlInt(raw, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return -1, err
	}
	return fd, dupErr
}

func checkHostPage() error {
	if ps := os.Getpagesize(); ps != PageSize {
		return fmt.Errorf("host page size %d, want %d", ps, PageSize)
	}
	return nil
}

const maxInt = int(^uint(0) >> 1)
