package memsnap

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/warrenvm/warren/internal/atomicfile"
)

// Resolver finds the file of a parent layer. hint is the parent's file base
// name recorded in the child when it was written; it may be empty or stale
// and comes from disk, so it must not be trusted as a path. OpenChain
// verifies the returned file's content hash, so a Resolver may guess.
type Resolver interface {
	Resolve(parent Hash, hint string) (path string, err error)
}

// Dir resolves parents within one directory: first the hinted name, if it
// is a plain file name whose layer has the wanted hash, then every file
// named *.wsnap in the directory.
type Dir string

// Resolve implements Resolver. Errors wrap ErrMissingParent.
func (d Dir) Resolve(parent Hash, hint string) (string, error) {
	dir := string(d)
	if hint != "" && hint == filepath.Base(hint) && hint != "." && hint != ".." && !strings.ContainsRune(hint, os.PathSeparator) {
		p := filepath.Join(dir, hint)
		if hashOf(p) == parent {
			return p, nil
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("memsnap: find parent %s in %s: %v: %w", parent.Short(), dir, err, ErrMissingParent)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), Ext) || e.Name() == hint {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if hashOf(p) == parent {
			return p, nil
		}
	}
	return "", fmt.Errorf("memsnap: no layer with hash %s in %s (hint %q): %w", parent.Short(), dir, hint, ErrMissingParent)
}

// hashOf returns the content hash of the layer at p, or zero if it does not
// open.
func hashOf(p string) Hash {
	l, err := Open(p)
	if err != nil {
		return Hash{}
	}
	defer l.Close()
	return l.hash
}

// Chain is a base layer and the incremental layers on top of it, in order.
// Its methods may be called from several goroutines; Close must be called
// once, after all other use.
type Chain struct {
	layers []*Layer // layers[0] is the base, the last is the top
}

// OpenChain opens the layer at top and follows parent hashes down to a
// base, finding each parent with r (Dir of top's directory when r is nil).
// It refuses a parent that cannot be found or whose content hash differs
// (ErrMissingParent), a file met twice (ErrCycle), and layers that disagree
// on page size, memory size or Fingerprint (ErrIncompatible). Like Open it
// does not read chunk data; call Verify for that.
func OpenChain(top string, r Resolver) (_ *Chain, err error) {
	if r == nil {
		r = Dir(filepath.Dir(top))
	}
	c := &Chain{}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	seen := map[string]bool{}
	path := top
	var want Hash
	for depth := 0; ; depth++ {
		if depth >= MaxChainDepth {
			return nil, fmt.Errorf("memsnap: open chain %s: more than %d layers: %w", top, MaxChainDepth, ErrCycle)
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			return nil, fmt.Errorf("memsnap: open chain %s: %w", top, err)
		}
		if seen[abs] {
			return nil, fmt.Errorf("memsnap: open chain %s: layer %s appears twice: %w", top, path, ErrCycle)
		}
		seen[abs] = true
		l, err := Open(path)
		if err != nil {
			if depth > 0 && errors.Is(err, fs.ErrNotExist) {
				err = fmt.Errorf("%w: %w", err, ErrMissingParent)
			}
			return nil, fmt.Errorf("memsnap: open chain %s: %w", top, err)
		}
		c.layers = append(c.layers, l)
		if depth > 0 {
			child := c.layers[depth-1]
			if l.hash != want {
				return nil, fmt.Errorf("memsnap: open chain %s: parent of %s should have hash %s, %s has %s: %w", top, child.path, want.Short(), path, l.hash.Short(), ErrMissingParent)
			}
			if err := compatible(child, l); err != nil {
				return nil, fmt.Errorf("memsnap: open chain %s: %w", top, err)
			}
		}
		if l.hdr.Kind == KindBase {
			break
		}
		want = l.hdr.Parent
		path, err = r.Resolve(want, l.hdr.ParentName)
		if err != nil {
			if !errors.Is(err, ErrMissingParent) {
				err = fmt.Errorf("%w: %w", err, ErrMissingParent)
			}
			return nil, fmt.Errorf("memsnap: open chain %s: parent of %s: %w", top, l.path, err)
		}
	}
	slices.Reverse(c.layers)
	return c, nil
}

// compatible checks that a child layer and its parent describe the same
// memory on the same kind of host.
func compatible(child, parent *Layer) error {
	ch, ph := &child.hdr, &parent.hdr
	switch {
	case ch.PageSize != ph.PageSize:
		return fmt.Errorf("%s has page size %d, its parent %s %d: %w", child.path, ch.PageSize, parent.path, ph.PageSize, ErrIncompatible)
	case ch.MemSize != ph.MemSize:
		return fmt.Errorf("%s has memory size %d, its parent %s %d: %w", child.path, ch.MemSize, parent.path, ph.MemSize, ErrIncompatible)
	case !bytes.Equal(ch.Fingerprint, ph.Fingerprint):
		return fmt.Errorf("%s has fingerprint %q, its parent %s %q: %w", child.path, ch.Fingerprint, parent.path, ph.Fingerprint, ErrIncompatible)
	}
	return nil
}

// Close closes every layer.
func (c *Chain) Close() error {
	var errs []error
	for _, l := range c.layers {
		errs = append(errs, l.Close())
	}
	return errors.Join(errs...)
}

// Layers returns the layers, base first. The caller must not close them.
func (c *Chain) Layers() []*Layer { return slices.Clone(c.layers) }

// Top returns the topmost layer; its Hash names the chain.
func (c *Chain) Top() *Layer { return c.layers[len(c.layers)-1] }

// PageSize returns the chain's page size.
func (c *Chain) PageSize() uint32 { return c.layers[0].hdr.PageSize }

// MemSize returns the size in bytes of the memory the chain restores.
func (c *Chain) MemSize() uint64 { return c.layers[0].hdr.MemSize }

// Fingerprint returns the Fingerprint all layers share.
func (c *Chain) Fingerprint() []byte { return c.layers[0].Fingerprint() }

// CheckFingerprint returns an error wrapping ErrIncompatible unless want
// equals the chain's Fingerprint.
func (c *Chain) CheckFingerprint(want []byte) error { return c.Top().CheckFingerprint(want) }

// Stats returns each layer's statistics, base first.
func (c *Chain) Stats() []Stats {
	s := make([]Stats, len(c.layers))
	for i, l := range c.layers {
		s[i] = l.Stats()
	}
	return s
}

// Verify verifies every layer's chunk data (Layer.Verify).
func (c *Chain) Verify() error {
	for _, l := range c.layers {
		if err := l.Verify(); err != nil {
			return err
		}
	}
	return nil
}

// copyRun copies count pages from page src of a decoded chunk to page dst
// of memory.
type copyRun struct {
	dst   uint64
	src   uint32
	count uint32
}

// task is the part of one chunk that is visible in the effective memory.
type task struct {
	layer  int
	chunk  int
	copies []copyRun
}

// plan works out, top layer first, which pages of which chunk make up the
// effective memory: a page belongs to the topmost layer that mentions it
// (stored or zero). Zero pages and pages no layer mentions produce no work.
func (c *Chain) plan() []task {
	pages := c.layers[0].hdr.Pages()
	claimed := make([]uint64, (pages+63)/64)
	claim := func(p uint64) bool {
		w, b := p/64, uint64(1)<<(p%64)
		if claimed[w]&b != 0 {
			return false
		}
		claimed[w] |= b
		return true
	}
	var tasks []task
	for li := len(c.layers) - 1; li >= 0; li-- {
		ix := c.layers[li].ix
		for _, z := range ix.zeros {
			for p := z.first; p < z.end(); p++ {
				claim(p)
			}
		}
		for ci := range ix.chunks {
			t := task{layer: li, chunk: ci}
			src := uint32(0)
			for _, r := range ix.chunks[ci].runs {
				for p := r.first; p < r.end(); p, src = p+1, src+1 {
					if !claim(p) {
						continue
					}
					if n := len(t.copies); n > 0 && t.copies[n-1].dst+uint64(t.copies[n-1].count) == p && t.copies[n-1].src+t.copies[n-1].count == src {
						t.copies[n-1].count++
					} else {
						t.copies = append(t.copies, copyRun{dst: p, src: src, count: 1})
					}
				}
			}
			if len(t.copies) > 0 {
				tasks = append(tasks, t)
			}
		}
	}
	return tasks
}

// apply decodes every planned chunk on GOMAXPROCS goroutines and hands each
// visible run to sink, which may be called concurrently for disjoint pages.
// When direct is not nil, a chunk whose pages are all visible and
// consecutive is decompressed straight into direct(first page, pages)
// instead, and sink is not called for it.
func (c *Chain) apply(tasks []task, direct func(page, n uint64) []byte, sink func(page uint64, data []byte) error) error {
	ps := uint64(c.PageSize())
	return parallel(len(tasks), 0, func() any { return new(chunkBufs) }, func(st any, i int) error {
		t := &tasks[i]
		l := c.layers[t.layer]
		if direct != nil && len(t.copies) == 1 && t.copies[0].src == 0 && t.copies[0].count == l.ix.chunks[t.chunk].npages {
			cp := t.copies[0]
			_, err := l.readChunkInto(t.chunk, st.(*chunkBufs), direct(cp.dst, uint64(cp.count)))
			return err
		}
		raw, err := l.readChunk(t.chunk, st.(*chunkBufs))
		if err != nil {
			return err
		}
		for _, cp := range t.copies {
			if err := sink(cp.dst, raw[uint64(cp.src)*ps:uint64(cp.src+cp.count)*ps]); err != nil {
				return err
			}
		}
		return nil
	})
}

// Restore writes the chain's effective memory into dst, which must be
// MemSize bytes and zero-filled (as a fresh memfd or anonymous mapping is):
// Restore writes only the pages whose effective content is stored, so
// zero pages stay untouched and unallocated. Each page is written once,
// from the topmost layer that mentions it. Chunks are checked against their
// SHA-256 as they are read; a corrupt chunk fails Restore with ErrCorrupt,
// possibly after other pages were written, so call Verify first when dst
// must not be touched on failure.
func (c *Chain) Restore(dst []byte) error {
	if uint64(len(dst)) != c.MemSize() {
		return fmt.Errorf("memsnap: restore %s: destination is %d bytes, memory is %d: %w", c.Top().path, len(dst), c.MemSize(), ErrIncompatible)
	}
	ps := uint64(c.PageSize())
	direct := func(page, n uint64) []byte { return dst[page*ps : (page+n)*ps] }
	err := c.apply(c.plan(), direct, func(page uint64, data []byte) error {
		copy(dst[page*ps:], data)
		return nil
	})
	if err != nil {
		return fmt.Errorf("memsnap: restore %s: %w", c.Top().path, err)
	}
	return nil
}

// Flatten writes the chain's effective memory to path as a raw image of
// MemSize bytes, leaving zero pages as holes, for a lazy MAP_PRIVATE
// restore. The file is written and renamed into place like a layer.
func (c *Chain) Flatten(path string) error {
	ps := uint64(c.PageSize())
	err := atomicfile.WriteFunc(path, 0o600, func(f *os.File) error {
		if err := f.Truncate(int64(c.MemSize())); err != nil {
			return err
		}
		return c.apply(c.plan(), nil, func(page uint64, data []byte) error {
			return writeNonZero(f, ps, page, data)
		})
	})
	if err != nil {
		return fmt.Errorf("memsnap: flatten %s to %s: %w", c.Top().path, path, err)
	}
	return nil
}

// writeNonZero writes data, the pages (of ps bytes) from page on, to f,
// skipping the zero pages inside it so that they stay holes.
func writeNonZero(f *os.File, ps, page uint64, data []byte) error {
	for len(data) > 0 {
		for len(data) > 0 && isZero(data[:ps]) {
			data, page = data[ps:], page+1
		}
		n := uint64(0)
		for n*ps < uint64(len(data)) && !isZero(data[n*ps:(n+1)*ps]) {
			n++
		}
		if n > 0 {
			if _, err := f.WriteAt(data[:n*ps], int64(page*ps)); err != nil {
				return err
			}
			data, page = data[n*ps:], page+n
		}
	}
	return nil
}

// Compact writes a new base layer to path equal to the chain's effective
// memory, so the chain's files can be retired. opts.Fingerprint, when nil,
// is the chain's; opts.PageSize is the chain's.
func Compact(c *Chain, path string, opts Options) (*Layer, error) {
	if opts.Fingerprint == nil {
		opts.Fingerprint = c.Fingerprint()
	}
	opts.PageSize = c.PageSize()
	return WriteBase(path, c.Reader(), c.MemSize(), opts)
}

// segments plans c's decode (plan) and returns the tasks with every
// visible run of pages as a segment, sorted by page: the index Reader and
// Pages look pages up in.
func (c *Chain) segments() ([]task, []segment) {
	tasks := c.plan()
	var segs []segment
	for ti, t := range tasks {
		for _, cp := range t.copies {
			segs = append(segs, segment{page: cp.dst, count: cp.count, task: ti, src: cp.src})
		}
	}
	sort.Slice(segs, func(i, j int) bool { return segs[i].page < segs[j].page })
	return tasks, segs
}

// Reader returns an io.ReaderAt over the chain's effective memory, decoding
// chunks on demand and keeping a few recently decoded ones. It suits
// sequential reads such as Compact's; Restore is faster for whole images.
func (c *Chain) Reader() io.ReaderAt {
	tasks, segs := c.segments()
	// A sequential reader meets chunks of every layer interleaved; keep
	// enough decoded chunks that each layer's current one stays cached.
	return &chainReader{c: c, tasks: tasks, segs: segs, cache: map[int][]byte{}, cacheMax: 2*len(c.layers) + 2}
}

// segment is a run of effective pages held by one task's chunk.
type segment struct {
	page  uint64
	count uint32
	task  int
	src   uint32
}

type chainReader struct {
	c     *Chain
	tasks []task
	segs  []segment // sorted by page, disjoint

	mu       sync.Mutex     // mu protects the fields below
	cache    map[int][]byte // decoded chunk by task
	order    []int          // tasks in cache, oldest first
	cacheMax int
	bufs     chunkBufs
}

// chunk returns the decoded chunk of task ti. r.mu must be held.
func (r *chainReader) chunk(ti int) ([]byte, error) {
	if raw, ok := r.cache[ti]; ok {
		return raw, nil
	}
	var reuse []byte
	if len(r.order) >= r.cacheMax {
		old := r.order[0]
		r.order = r.order[1:]
		reuse = r.cache[old]
		delete(r.cache, old)
	}
	t := &r.tasks[ti]
	r.bufs.raw = reuse
	raw, err := r.c.layers[t.layer].readChunk(t.chunk, &r.bufs)
	if err != nil {
		return nil, err
	}
	r.bufs.raw = nil
	r.cache[ti] = raw
	r.order = append(r.order, ti)
	return raw, nil
}

// ReadAt implements io.ReaderAt.
func (r *chainReader) ReadAt(p []byte, off int64) (int, error) {
	size := int64(r.c.MemSize())
	if off < 0 {
		return 0, fmt.Errorf("memsnap: read at negative offset %d", off)
	}
	if off >= size {
		return 0, io.EOF
	}
	var short error
	if int64(len(p)) > size-off {
		p, short = p[:size-off], io.EOF
	}
	clear(p)
	ps := uint64(r.c.PageSize())
	start, end := uint64(off), uint64(off)+uint64(len(p))
	i := sort.Search(len(r.segs), func(i int) bool {
		s := r.segs[i]
		return (s.page+uint64(s.count))*ps > start
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	for ; i < len(r.segs) && r.segs[i].page*ps < end; i++ {
		s := r.segs[i]
		raw, err := r.chunk(s.task)
		if err != nil {
			return 0, err
		}
		segStart := s.page * ps
		segEnd := segStart + uint64(s.count)*ps
		lo, hi := max(start, segStart), min(end, segEnd)
		src := uint64(s.src)*ps + (lo - segStart)
		copy(p[lo-start:hi-start], raw[src:src+(hi-lo)])
	}
	return len(p), short
}

// RestoreOver rewrites dst, which holds some other content of the same
// memory (a running VM's RAM, for an in-place rollback), to the chain's
// effective memory, writing only the pages that differ: a page whose bytes
// already match is left alone, so it stays mapped and shared as it was.
// Pages outside candidates (a bitmap over pages, bit p%64 of word p/64;
// nil means every page) are taken to be zero in dst and are not read:
// pass the pages that may hold data (guestmem Populated), so that holes
// are not faulted in. It returns how many pages it wrote with stored
// content and how many it cleared. Chunks are checked as they are read;
// call Verify first when dst must not be touched on failure. changed, when
// not nil, is called with each page written or cleared (concurrently, for
// distinct pages): the caller's record of the pages it changed, which no
// dirty log sees (guestmem's MarkPageWritten).
func (c *Chain) RestoreOver(dst []byte, candidates []uint64, changed func(page uint64)) (written, cleared uint64, err error) {
	if uint64(len(dst)) != c.MemSize() {
		return 0, 0, fmt.Errorf("memsnap: restore %s: destination is %d bytes, memory is %d: %w", c.Top().path, len(dst), c.MemSize(), ErrIncompatible)
	}
	ps := uint64(c.PageSize())
	pages := c.MemSize() / ps
	if candidates != nil && uint64(len(candidates)) < (pages+63)/64 {
		return 0, 0, fmt.Errorf("memsnap: restore %s: candidate bitmap of %d words for %d pages", c.Top().path, len(candidates), pages)
	}
	tasks := c.plan()
	// stored marks the pages the chain gives content to; every other
	// page must end up zero.
	stored := make([]uint64, (pages+63)/64)
	for _, t := range tasks {
		for _, cp := range t.copies {
			for p := cp.dst; p < cp.dst+uint64(cp.count); p++ {
				stored[p/64] |= 1 << (p % 64)
			}
		}
	}
	var nw, nc atomic.Uint64
	err = c.apply(tasks, nil, func(page uint64, data []byte) error {
		for len(data) > 0 {
			d := dst[page*ps : (page+1)*ps]
			if !bytes.Equal(d, data[:ps]) {
				copy(d, data[:ps])
				nw.Add(1)
				if changed != nil {
					changed(page)
				}
			}
			data, page = data[ps:], page+1
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("memsnap: restore %s: %w", c.Top().path, err)
	}
	for w := range stored {
		maybe := ^stored[w]
		if candidates != nil {
			maybe &= candidates[w]
		}
		for ; maybe != 0; maybe &= maybe - 1 {
			p := uint64(w)*64 + uint64(bits.TrailingZeros64(maybe))
			if p >= pages {
				break
			}
			d := dst[p*ps : (p+1)*ps]
			if !isZero(d) {
				clear(d)
				nc.Add(1)
				if changed != nil {
					changed(p)
				}
			}
		}
	}
	return nw.Load(), nc.Load(), nil
}
