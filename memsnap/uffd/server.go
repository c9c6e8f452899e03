package uffd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/memsnap"
)

// DefaultCacheChunks is how many decoded chunks a Server keeps by default
// (256 KiB each with memsnap's default chunk size: 8 MiB in all).
const DefaultCacheChunks = 32

// DefaultZeroBatch is the default Options.ZeroBatch: 64 pages (256 KiB).
const DefaultZeroBatch = 64

// Options configure a Server.
type Options struct {
	// Prefetch is a working set's runs (WorkingSet.Runs, checked against
	// the chain by ReadWorkingSet): pages in the order to install them, by
	// a prefetch goroutine started with the server. Pages outside memory
	// are skipped.
	Prefetch []Run
	// Record records the pages served on demand, in first-fault order,
	// until TakeWorkingSet.
	Record bool
	// CacheChunks is the number of decoded chunks kept (DefaultCacheChunks
	// when 0).
	CacheChunks int
	// ZeroBatch is the window, in pages (a power of two; DefaultZeroBatch
	// when 0, 1 for single pages), in which a fault on a page the chain
	// holds as zero installs every such page not populated yet.
	ZeroBatch int
	// Log, when set, receives the server's errors (nil: slog.Default).
	Log *slog.Logger
	// OnError, when set, is called (once, from the goroutine that met it)
	// with the first error serving a fault or an Ensure: a page the server
	// could not install, whose faulting thread stays blocked. vmmproc
	// stops the VM.
	OnError func(error)

	// noHandler, for tests only, starts no handler goroutine: nothing
	// serves faults, so a test proves that an access did not fault by
	// not hanging. Close still releases a thread left waiting (closing
	// the userfaultfd wakes it).
	noHandler bool
	// beforeDecode, for tests only, is called by installChunk (the
	// prefetcher, Complete) with the chunk it is about to decode outside
	// the lock, once the decode is registered in Server.decoding.
	beforeDecode func(chunk int)
}

// Stats are a Server's counters. Pages installed are counted once, by
// whoever installed them; Faults counts fault messages, duplicates of a
// page included.
type Stats struct {
	// Faults is the page-fault messages served (demand faults).
	Faults uint64 `json:"faults"`
	// EnsuredPages is the pages VMM code (a virtio device, through
	// guestmem's accessors) was about to touch and found not populated,
	// which Ensure installed for it: each would have been a fault taken
	// in Go code (see the package documentation).
	EnsuredPages uint64 `json:"ensured_pages"`
	// PagesCopied is the pages installed with UFFDIO_COPY (by faults,
	// the prefetcher and Complete); ZeroPages those installed as zero.
	PagesCopied uint64 `json:"pages_copied"`
	ZeroPages   uint64 `json:"zero_pages"`
	// PrefetchedPages is the pages the prefetcher installed (copied or
	// zero); CompletedPages those Complete installed.
	PrefetchedPages uint64 `json:"prefetched_pages"`
	CompletedPages  uint64 `json:"completed_pages"`
	// BytesDecompressed and ChunksDecoded count chunk decodes (a chunk
	// evicted from the cache and needed again is decoded again; a demand
	// for a chunk the prefetcher is decoding waits for that decode).
	BytesDecompressed uint64 `json:"bytes_decompressed"`
	ChunksDecoded     uint64 `json:"chunks_decoded"`
	// Errors is the faults or prefetches that failed.
	Errors uint64 `json:"errors"`
	// Recorded is the pages in the working-set record; Recording whether
	// it still grows; Completed whether Complete has run.
	Recorded  int  `json:"recorded"`
	Recording bool `json:"recording"`
	Completed bool `json:"completed"`
}

// Server serves one guest memory's missing pages from a memsnap chain; see
// the package documentation for who owns and touches what.
type Server struct {
	fd    int     // the userfaultfd: read by the handler only, closed by stopAll
	stop  int     // eventfd the handler polls: written to stop it
	base  uintptr // address of page 0 of the registered mapping
	size  uint64  // bytes registered
	ps    uint64
	chain *memsnap.Chain // owned; closed by stopAll
	pages *memsnap.Pages
	top   memsnap.Hash
	log   *slog.Logger
	how   string // where the descriptor came from, for messages

	onError      func(error)
	errorOnce    sync.Once
	beforeDecode func(chunk int) // Options.beforeDecode

	handlerDone  chan struct{} // closed when the handler returns
	quitPrefetch chan struct{} // closed to stop the prefetcher
	prefetchDone chan struct{} // closed when the prefetcher returns (at once without one)
	stopOnce     sync.Once

	// done is set, under mu, with completed: nothing is served any more,
	// and Ensure answers at once without the lock.
	done atomic.Bool

	// populated has bit p%64 of word p/64 set when page p was installed
	// (and not forgotten since: Forget). Its bits change only under mu,
	// with atomic operations, after the ioctl that installed the page
	// returned; so a bit loaded set without the lock (Ensure's fast path)
	// means the page is present, short of a discard racing with it.
	populated []atomic.Uint64

	// mu guards the fields below, and is held by whoever installs pages
	// (UFFDIO_COPY, UFFDIO_ZEROPAGE), changes populated, unregisters or
	// closes the userfaultfd.
	mu       sync.Mutex
	cache    []cached // +checklocks:mu; most recently used first
	cacheMax int
	// decoding holds a channel per chunk that installChunk is decoding
	// outside mu, closed (and removed) once that decode is cached or
	// failed: a demand for the chunk waits for it instead of decoding it
	// a second time.
	decoding   map[int]chan struct{} // +checklocks:mu
	zeroBatch  uint64                // a power of two
	recording  bool                  // +checklocks:mu
	recorded   []Run                 // +checklocks:mu; pages served on demand, first-fault order
	nrecorded  int                   // +checklocks:mu; pages in recorded
	seen       []uint64              // +checklocks:mu; bit p: page p is in recorded
	completed  bool                  // +checklocks:mu; unregistered: nothing is served any more
	noZeropage bool                  // +checklocks:mu; the kernel refused UFFDIO_ZEROPAGE: copy zeros

	faults, ensured, copied, zeros, prefetched, completedPages, decompressed, decoded, errs atomic.Uint64
}

// cached is one decoded chunk in the cache.
type cached struct {
	chunk int
	data  []byte
}

// zeroPage is the source of zero pages when UFFDIO_ZEROPAGE is refused; a
// page is the host's (Start checks), at most 64 KiB on Linux.
var zeroPage [64 << 10]byte

// Start serves mem, the whole MAP_SHARED mapping of a fresh memfd of
// chain.MemSize() bytes (all holes: guestmem.New), from chain: it
// registers mem with a new userfaultfd (errors wrap ErrUnsupported when
// the host cannot), starts the handler goroutine and, with o.Prefetch, the
// prefetch goroutine. Call it before anything touches mem. On success the
// Server owns chain (Complete or Close closes it); on error the caller
// still does. The caller keeps mem mapped until Close.
func Start(chain *memsnap.Chain, mem []byte, o Options) (*Server, error) {
	ps := uint64(chain.PageSize())
	if ps != uint64(os.Getpagesize()) || ps > uint64(len(zeroPage)) {
		return nil, fmt.Errorf("uffd: the chain's pages are %d bytes, the host's %d: %w", ps, os.Getpagesize(), ErrUnsupported)
	}
	if uint64(len(mem)) != chain.MemSize() || len(mem) == 0 {
		return nil, fmt.Errorf("uffd: memory is %d bytes, the chain's %d", len(mem), chain.MemSize())
	}
	zb := o.ZeroBatch
	if zb <= 0 {
		zb = DefaultZeroBatch
	}
	if zb&(zb-1) != 0 {
		return nil, fmt.Errorf("uffd: zero batch %d is not a power of two", zb)
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
	if base%uintptr(ps) != 0 {
		return nil, fmt.Errorf("uffd: memory at %#x is not page-aligned", base)
	}
	fd, how, err := open(base, uint64(len(mem)))
	if err != nil {
		return nil, err
	}
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(fd) // closing unregisters
		return nil, fmt.Errorf("uffd: eventfd: %w", err)
	}
	pages := chain.Pages()
	n := pages.NumPages()
	s := &Server{fd: fd, stop: stop, base: base, size: uint64(len(mem)), ps: ps,
		chain: chain, pages: pages, top: chain.Top().Hash(), log: o.Log, how: how, onError: o.OnError,
		handlerDone: make(chan struct{}), quitPrefetch: make(chan struct{}), prefetchDone: make(chan struct{}),
		populated: make([]atomic.Uint64, (n+63)/64), cacheMax: o.CacheChunks, recording: o.Record,
		decoding: make(map[int]chan struct{}), beforeDecode: o.beforeDecode}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.cacheMax <= 0 {
		s.cacheMax = DefaultCacheChunks
	}
	s.zeroBatch = uint64(zb)
	if o.Record {
		s.seen = make([]uint64, (n+63)/64)
	}
	if o.noHandler {
		close(s.handlerDone)
	} else {
		go s.handle()
	}
	if len(o.Prefetch) > 0 {
		go s.prefetch(o.Prefetch)
	} else {
		close(s.prefetchDone)
	}
	return s, nil
}

// Source says where the userfaultfd came from: "userfaultfd(2)" or
// "/dev/userfaultfd".
func (s *Server) Source() string { return s.how }

// Top is the content hash of the chain's top layer, which names the
// memory served (a working set records it).
func (s *Server) Top() memsnap.Hash { return s.top }

// PrefetchDone is closed when the prefetch goroutine has returned: its
// working set installed, or stopped by Complete, Close or an error (at
// once without Options.Prefetch).
func (s *Server) PrefetchDone() <-chan struct{} { return s.prefetchDone }

// Stats returns the counters.
func (s *Server) Stats() Stats {
	st := Stats{Faults: s.faults.Load(), EnsuredPages: s.ensured.Load(), PagesCopied: s.copied.Load(), ZeroPages: s.zeros.Load(),
		PrefetchedPages: s.prefetched.Load(), CompletedPages: s.completedPages.Load(),
		BytesDecompressed: s.decompressed.Load(), ChunksDecoded: s.decoded.Load(), Errors: s.errs.Load()}
	s.mu.Lock()
	st.Recorded, st.Recording, st.Completed = s.nrecorded, s.recording, s.completed
	s.mu.Unlock()
	return st
}

// TakeWorkingSet stops recording and returns the pages served on demand
// so far, in first-fault order, as a WorkingSet of this memory. Without
// Options.Record (or after an earlier call) its page list is what was
// recorded before, possibly none.
func (s *Server) TakeWorkingSet() *WorkingSet {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recording = false
	return &WorkingSet{PageSize: uint32(s.ps), MemSize: s.size, Top: s.top, Runs: slices.Clone(s.recorded)}
}

// handle is the handler goroutine: it polls the userfaultfd and the stop
// eventfd, and serves every page fault read, until stopped.
func (s *Server) handle() {
	defer close(s.handlerDone)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	fds := []unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLIN}, {Fd: int32(s.stop), Events: unix.POLLIN}}
	buf := make([]byte, 64*msgSize)
	for {
		fds[0].Revents, fds[1].Revents = 0, 0
		if _, err := unix.Poll(fds, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			s.fail(fmt.Errorf("uffd: poll: %w", err))
			return
		}
		if fds[1].Revents != 0 {
			return
		}
		if fds[0].Revents&(unix.POLLERR|unix.POLLNVAL) != 0 {
			s.fail(fmt.Errorf("uffd: poll: the userfaultfd reports an error (events %#x)", fds[0].Revents))
			return
		}
		n, err := unix.Read(s.fd, buf)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			s.fail(fmt.Errorf("uffd: read: %w", err))
			return
		}
		for off := 0; off+msgSize <= n; off += msgSize {
			m := buf[off : off+msgSize]
			if m[msgOffEvent] != eventPagefault {
				continue // no other event was asked for
			}
			addr := binary.LittleEndian.Uint64(m[msgOffFaultAddr:])
			if err := s.serve(uintptr(addr)); err != nil {
				s.fail(err)
			}
		}
	}
}

// fail counts and logs err, and reports the first one to Options.OnError.
func (s *Server) fail(err error) {
	s.errs.Add(1)
	s.log.Error("uffd: serving guest memory", "err", err)
	s.errorOnce.Do(func() {
		if s.onError != nil {
			s.onError(err)
		}
	})
}

// serve installs the page at addr, a fault's address, and the pages of its
// chunk not yet populated.
func (s *Server) serve(addr uintptr) error {
	if addr < s.base || uint64(addr-s.base) >= s.size {
		return fmt.Errorf("uffd: fault at %#x outside the registered memory", addr)
	}
	page := uint64(addr-s.base) / s.ps
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.completed {
		return nil // unregistered: the fault was woken and sees the memfd
	}
	s.faults.Add(1)
	return s.demandLocked(page)
}

// demandLocked serves a demand for page, a fault's or an Ensure's: it
// records the page in the working set and installs it (even if marked
// populated: it may have been discarded since) with the pages of its
// chunk not yet populated, or as zero with its window. s.mu is held.
func (s *Server) demandLocked(page uint64) error {
	if s.recording && s.seen[page/64]&(1<<(page%64)) == 0 {
		s.seen[page/64] |= 1 << (page % 64)
		s.recorded = AppendPage(s.recorded, page)
		s.nrecorded++
	}
	chunk, ok := s.pages.Find(page)
	if !ok {
		_, err := s.zeroWindowLocked(page)
		return err
	}
	data, err := s.chunkLocked(chunk)
	if err != nil {
		return fmt.Errorf("uffd: fault on page %d: %w", page, err)
	}
	if s.completed {
		return nil // completed while chunkLocked waited: the page is there
	}
	_, err = s.copyChunkLocked(chunk, data, int64(page))
	return err
}

// chunkLocked returns chunk decoded, from the cache or decoded now (and
// cached). When installChunk is decoding it outside the lock, it waits for
// that decode, releasing s.mu meanwhile: the caller must check s.completed
// again after it. s.mu is held.
func (s *Server) chunkLocked(chunk int) ([]byte, error) {
	for s.awaitDecodeLocked(chunk) {
	}
	if d := s.cachedLocked(chunk); d != nil {
		return d, nil
	}
	var reuse []byte
	if len(s.cache) >= s.cacheMax {
		reuse = s.cache[len(s.cache)-1].data
		s.cache = s.cache[:len(s.cache)-1]
	}
	data, err := s.decode(chunk, reuse)
	if err != nil {
		return nil, err
	}
	s.insertLocked(chunk, data)
	return data, nil
}

// awaitDecodeLocked waits for installChunk's decode of chunk when one is
// in flight, releasing s.mu meanwhile, and reports whether it waited: the
// caller then looks again (the chunk is cached, or that decode failed).
// s.mu is held.
func (s *Server) awaitDecodeLocked(chunk int) bool {
	ch := s.decoding[chunk]
	if ch == nil {
		return false
	}
	s.mu.Unlock()
	<-ch
	s.mu.Lock()
	return true
}

// decode decodes chunk into dst's memory when it is large enough, and
// counts it. It takes no lock.
func (s *Server) decode(chunk int, dst []byte) ([]byte, error) {
	data, err := s.pages.Decode(chunk, dst)
	if err != nil {
		return nil, err
	}
	s.decoded.Add(1)
	s.decompressed.Add(uint64(len(data)))
	return data, nil
}

// cachedLocked returns chunk's decoded bytes if cached (making it the most
// recently used), else nil. s.mu is held.
func (s *Server) cachedLocked(chunk int) []byte {
	for i, c := range s.cache {
		if c.chunk == chunk {
			copy(s.cache[1:i+1], s.cache[:i])
			s.cache[0] = c
			return c.data
		}
	}
	return nil
}

// insertLocked caches data as chunk's, evicting the least recently used.
// s.mu is held.
func (s *Server) insertLocked(chunk int, data []byte) {
	if d := s.cachedLocked(chunk); d != nil {
		return
	}
	if len(s.cache) >= s.cacheMax {
		s.cache = s.cache[:len(s.cache)-1]
	}
	s.cache = append(s.cache, cached{})
	copy(s.cache[1:], s.cache)
	s.cache[0] = cached{chunk: chunk, data: data}
}

// isPopulated reports whether page p is marked installed; it takes no
// lock (see populated).
func (s *Server) isPopulated(p uint64) bool { return s.populated[p/64].Load()&(1<<(p%64)) != 0 }

// isPopulatedLocked is isPopulated for callers holding s.mu, under which
// the bit cannot change.
func (s *Server) isPopulatedLocked(p uint64) bool { return s.isPopulated(p) }

// markLocked marks pages [first, first+n) installed. s.mu is held.
func (s *Server) markLocked(first, n uint64) {
	for p := first; p < first+n; p++ {
		if w, bit := &s.populated[p/64], uint64(1)<<(p%64); w.Load()&bit == 0 {
			w.Or(bit)
		}
	}
}

// Ensure makes every page of [off, off+n) (byte offsets into the served
// memory, the flat image) present before the caller touches it: it is
// the guestmem.Pager the restored guestmem.Memory is given, so that VMM
// code (virtio devices) never faults on a page the server has not
// installed. A page marked populated costs one atomic load, without the
// lock; the others are served as a demand fault would be (recorded in the
// working set, installed with their chunk's or zero window's missing
// pages), by the calling goroutine itself, under s.mu: the ioctls are
// system calls, so no thread waits in a fault holding a P. After
// Complete or Close it returns at once (the memory is an ordinary memfd).
// An error (a page that could not be installed; a range outside the
// memory) is also reported as serving errors are (Options.OnError).
func (s *Server) Ensure(off, n uint64) error {
	if n == 0 || s.done.Load() {
		return nil
	}
	if off >= s.size || n > s.size-off {
		return fmt.Errorf("uffd: ensure [%#x, +%#x): outside the %d bytes served", off, n, s.size)
	}
	first, last := off/s.ps, (off+n-1)/s.ps
	for ; first <= last; first++ {
		if !s.isPopulated(first) {
			if err := s.ensureSlow(first, last); err != nil {
				s.fail(err) // outside s.mu: OnError stops the VM
				return err
			}
			return nil
		}
	}
	return nil
}

// ensureSlow is Ensure from page first, not populated, to page last.
func (s *Server) ensureSlow(first, last uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p := first; p <= last && !s.completed; p++ {
		if s.isPopulatedLocked(p) {
			continue
		}
		s.ensured.Add(1)
		if err := s.demandLocked(p); err != nil {
			return fmt.Errorf("uffd: ensure page %d: %w", p, err)
		}
	}
	return nil
}

// Forget marks the whole pages of [off, off+n) (flat offsets) not
// populated, so that the next Ensure of any of them installs it again: it
// is the guestmem.Forgetter that guestmem's Discard calls after punching
// the pages out of the memfd, which leaves them missing for userfaultfd
// again. A page forgotten reads, once served again, as the chain holds
// it (not as zeros): the guest held it free, so either will do.
func (s *Server) Forget(off, n uint64) {
	if s.done.Load() || off >= s.size {
		return
	}
	n = min(n, s.size-off)
	first, end := (off+s.ps-1)/s.ps, (off+n)/s.ps
	s.mu.Lock()
	defer s.mu.Unlock()
	for p := first; p < end; {
		w := p / 64
		hi := min((w+1)*64, end)
		mask := ^uint64(0) >> (64 - (hi - p)) << (p % 64)
		if s.populated[w].Load()&mask != 0 {
			s.populated[w].And(^mask)
		}
		p = hi
	}
}

// needsLocked reports whether any visible page of chunk is not populated.
func (s *Server) needsLocked(chunk int) bool {
	for _, r := range s.pages.Runs(chunk) {
		for p := r.Page; p < r.Page+uint64(r.Count); p++ {
			if !s.isPopulatedLocked(p) {
				return true
			}
		}
	}
	return false
}

// copyChunkLocked installs the visible pages of chunk (decoded: data) that
// are not populated, one UFFDIO_COPY per contiguous run, and page force
// (-1: none) even if marked populated, its run first. It returns the pages
// installed. s.mu is held.
func (s *Server) copyChunkLocked(chunk int, data []byte, force int64) (uint64, error) {
	type span struct{ page, src, n uint64 }
	var spans []span
	first := -1
	for _, r := range s.pages.Runs(chunk) {
		end := r.Page + uint64(r.Count)
		for p := r.Page; p < end; {
			if s.isPopulatedLocked(p) && int64(p) != force {
				p++
				continue
			}
			q := p + 1
			for q < end && (!s.isPopulatedLocked(q) || int64(q) == force) {
				q++
			}
			if force >= int64(p) && force < int64(q) {
				first = len(spans)
			}
			spans = append(spans, span{p, uint64(r.Src) + (p - r.Page), q - p})
			p = q
		}
	}
	if first > 0 {
		spans[0], spans[first] = spans[first], spans[0]
	}
	var total uint64
	defer func() { s.copied.Add(total) }()
	for _, sp := range spans {
		n, err := s.copyLocked(sp.page, data[sp.src*s.ps:(sp.src+sp.n)*s.ps])
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// copyLocked installs src at page first and the pages after it with
// UFFDIO_COPY, marking them populated: a page found present (EEXIST) is
// marked, woken and skipped, a partial copy (EAGAIN) continued. It returns
// the pages it installed; the caller counts them. s.mu is held.
func (s *Server) copyLocked(first uint64, src []byte) (uint64, error) {
	var total uint64
	for len(src) > 0 {
		c := uffdioCopy{Dst: uint64(s.base) + first*s.ps, Src: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(src)))), Len: uint64(len(src))}
		err := ioctl(s.fd, IoctlCopy, unsafe.Pointer(&c))
		runtime.KeepAlive(src)
		done := uint64(0)
		if c.Copy > 0 {
			done = uint64(c.Copy) / s.ps
		}
		if err == nil {
			done = uint64(len(src)) / s.ps
		}
		s.markLocked(first, done)
		total += done
		first, src = first+done, src[done*s.ps:]
		switch {
		case err == nil:
		case errors.Is(err, unix.EAGAIN):
			if done == 0 {
				runtime.Gosched() // the mapping is changing: try again
			}
		case errors.Is(err, unix.EEXIST):
			s.markLocked(first, 1)
			if err := s.wake(first); err != nil {
				return total, err
			}
			first, src = first+1, src[s.ps:]
		default:
			return total, fmt.Errorf("uffd: UFFDIO_COPY of %d pages at page %d: %w", len(src)/int(s.ps), first, err)
		}
	}
	return total, nil
}

// zeroLocked installs page as zero unless it is populated and not
// forced, and returns the pages installed (0 or 1). s.mu is held.
func (s *Server) zeroLocked(page uint64, force bool) (uint64, error) {
	if !force && s.isPopulatedLocked(page) {
		return 0, nil
	}
	return s.zeroRunLocked(page, 1)
}

// zeroWindowLocked serves a fault on page, which the chain holds as zero:
// it installs as zero the page and the pages around it in its aligned
// window of zeroBatch pages that are zero in the chain and not populated,
// one UFFDIO_ZEROPAGE per contiguous run (a guest that touches one free
// page tends to touch its neighbours: its allocator hands out runs). It
// returns the pages installed. s.mu is held.
func (s *Server) zeroWindowLocked(page uint64) (uint64, error) {
	lo := page &^ (s.zeroBatch - 1)
	hi := min(lo+s.zeroBatch, s.pages.NumPages())
	zero := func(q uint64) bool {
		if q != page && s.isPopulatedLocked(q) {
			return false
		}
		_, ok := s.pages.Find(q)
		return !ok
	}
	var total uint64
	for q := lo; q < hi; {
		if !zero(q) {
			q++
			continue
		}
		r := q + 1
		for r < hi && zero(r) {
			r++
		}
		n, err := s.zeroRunLocked(q, r-q)
		total += n
		if err != nil {
			return total, err
		}
		q = r
	}
	return total, nil
}

// zeroRunLocked installs n pages from first as zero with UFFDIO_ZEROPAGE
// (or copies of zeros when the kernel refuses it), marking them
// populated: a page found present (EEXIST) is marked, woken and skipped,
// a partial fill (EAGAIN) continued. It returns and counts the pages
// installed. s.mu is held.
func (s *Server) zeroRunLocked(first, n uint64) (uint64, error) {
	var total uint64
	defer func() { s.zeros.Add(total) }()
	for n > 0 && !s.noZeropage {
		z := uffdioZeropage{Range: uffdioRange{Start: uint64(s.base) + first*s.ps, Len: n * s.ps}}
		err := ioctl(s.fd, IoctlZeropage, unsafe.Pointer(&z))
		done := uint64(0)
		if z.Zeropage > 0 {
			done = uint64(z.Zeropage) / s.ps
		}
		if err == nil {
			done = n
		}
		s.markLocked(first, done)
		total += done
		first, n = first+done, n-done
		switch {
		case err == nil:
		case errors.Is(err, unix.EAGAIN):
			if done == 0 {
				runtime.Gosched()
			}
		case errors.Is(err, unix.EEXIST):
			s.markLocked(first, 1)
			if err := s.wake(first); err != nil {
				return total, err
			}
			first, n = first+1, n-1
		case done == 0 && (errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EOPNOTSUPP)):
			s.noZeropage = true // copy zeros instead, below
		default:
			return total, fmt.Errorf("uffd: UFFDIO_ZEROPAGE of %d pages at page %d: %w", n, first, err)
		}
	}
	for ; n > 0; first, n = first+1, n-1 {
		c, err := s.copyLocked(first, zeroPage[:s.ps])
		total += c
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// wake wakes the threads waiting on page (present already).
func (s *Server) wake(page uint64) error {
	r := uffdioRange{Start: uint64(s.base) + page*s.ps, Len: s.ps}
	if err := ioctl(s.fd, IoctlWake, unsafe.Pointer(&r)); err != nil {
		return fmt.Errorf("uffd: UFFDIO_WAKE at page %d: %w", page, err)
	}
	return nil
}

// installChunk installs the pages of chunk not yet populated and returns
// how many it installed. A chunk not cached is decoded outside s.mu, into
// a buffer of its own, so that a demand fault waits at most for one
// chunk's copies; the decode is registered in s.decoding, so that a
// demand (chunkLocked) or another installChunk for the chunk waits for it
// instead of decoding it again. quit, when closed, stops it before that
// decode. Used by the prefetcher and Complete.
func (s *Server) installChunk(chunk int, quit <-chan struct{}) (uint64, error) {
	s.mu.Lock()
	for {
		if s.completed || !s.needsLocked(chunk) {
			s.mu.Unlock()
			return 0, nil
		}
		if data := s.cachedLocked(chunk); data != nil {
			defer s.mu.Unlock()
			return s.copyChunkLocked(chunk, data, -1)
		}
		// Complete while the prefetcher decodes it: wait, then look again.
		if !s.awaitDecodeLocked(chunk) {
			break
		}
	}
	select {
	case <-quit:
		s.mu.Unlock()
		return 0, nil
	default:
	}
	done := make(chan struct{})
	s.decoding[chunk] = done
	s.mu.Unlock()
	if s.beforeDecode != nil {
		s.beforeDecode(chunk)
	}
	data, err := s.decode(chunk, nil)
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.decoding, chunk)
	close(done)
	if err != nil {
		return 0, err
	}
	if s.completed {
		return 0, nil
	}
	s.insertLocked(chunk, data)
	return s.copyChunkLocked(chunk, data, -1)
}

// prefetch is the prefetch goroutine: it installs the working set's pages,
// in order, chunk by chunk, until done, Complete or Close.
func (s *Server) prefetch(ws []Run) {
	defer close(s.prefetchDone)
	for p := range pagesOf(ws) {
		select {
		case <-s.quitPrefetch:
			return
		default:
		}
		if p >= s.pages.NumPages() {
			continue
		}
		s.mu.Lock()
		skip := s.completed || s.isPopulatedLocked(p)
		s.mu.Unlock()
		if skip {
			continue
		}
		chunk, ok := s.pages.Find(p)
		var n uint64
		var err error
		if ok {
			n, err = s.installChunk(chunk, s.quitPrefetch)
		} else {
			s.mu.Lock()
			if !s.completed {
				n, err = s.zeroLocked(p, false)
			}
			s.mu.Unlock()
		}
		s.prefetched.Add(n)
		if err != nil {
			// Not fatal: a demand fault will try the page again.
			s.errs.Add(1)
			s.log.Warn("uffd: prefetch stopped", "page", p, "err", err)
			return
		}
	}
}

// pagesOf yields the pages of runs in order.
func pagesOf(runs []Run) iter.Seq[uint64] {
	return func(yield func(uint64) bool) {
		for _, r := range runs {
			for p := r.First; p < r.First+uint64(r.Count); p++ {
				if !yield(p) {
					return
				}
			}
		}
	}
}

// Complete installs every page of the chain that holds data and is not
// populated yet, in page order, then unregisters the memory and stops the
// server's goroutines and closes its userfaultfd and chain (Stats and
// TakeWorkingSet still answer). The memfd is then an ordinary one, its
// holes exactly its zero pages: call Complete before anything else maps
// the memfd or reads its holes (a fork, a full snapshot, a rollback). The
// guest may run meanwhile; faults are served as usual until the
// unregistration, which wakes any still waiting. Calling it again, or
// after Close, does nothing.
func (s *Server) Complete() error {
	s.mu.Lock()
	done := s.completed || s.chain == nil
	s.mu.Unlock()
	if done {
		return nil
	}
	s.stopPrefetch()
	never := make(chan struct{})
	var installed uint64
	seen := make([]bool, s.pages.NumChunks())
	for p := uint64(0); p < s.pages.NumPages(); p++ {
		chunk, ok := s.pages.Find(p)
		if !ok || seen[chunk] {
			continue
		}
		seen[chunk] = true
		n, err := s.installChunk(chunk, never)
		installed += n
		s.completedPages.Add(n)
		if err != nil {
			return fmt.Errorf("uffd: complete: %w", err)
		}
	}
	s.mu.Lock()
	if s.completed {
		s.mu.Unlock()
		return nil
	}
	err := unregister(s.fd, s.base, s.size)
	if err == nil {
		s.completed = true
		s.done.Store(true)
		s.cache = nil
	}
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("uffd: complete: %w", err)
	}
	s.stopAll()
	s.log.Debug("uffd: complete", "pages_installed", installed)
	return nil
}

// stopPrefetch stops the prefetch goroutine and waits for it.
func (s *Server) stopPrefetch() {
	s.mu.Lock()
	select {
	case <-s.quitPrefetch:
	default:
		close(s.quitPrefetch)
	}
	s.mu.Unlock()
	<-s.prefetchDone
}

// stopAll stops both goroutines, waits for them, and closes the
// userfaultfd (which ends any registration), the eventfd and the chain.
func (s *Server) stopAll() {
	s.stopOnce.Do(func() {
		s.stopPrefetch()
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		unix.Write(s.stop, one[:])
		<-s.handlerDone
		// Ensure issues ioctls under s.mu after checking completed: mark
		// it before closing the descriptor, whose number may be reused.
		s.mu.Lock()
		s.completed = true // nothing is served any more
		s.done.Store(true)
		unix.Close(s.fd)
		unix.Close(s.stop)
		s.cache = nil
		c := s.chain
		s.chain = nil
		s.mu.Unlock()
		c.Close()
	})
}

// Close stops the server and releases its descriptors and chain, without
// installing the remaining pages: closing the userfaultfd unregisters the
// memory, so a later touch of a page never served reads zeros. Call it
// when the guest is done with the memory (vCPUs stopped), before
// unmapping it. Safe to call more than once, and after Complete.
func (s *Server) Close() error {
	s.stopAll()
	return nil
}
