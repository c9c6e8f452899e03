package memsnap

import (
	"fmt"
	"sort"
	"sync"
)

// Pages is an index of a chain's effective memory by page, for serving it
// one chunk at a time (a userfaultfd restore, memsnap/uffd): which chunk of
// which layer holds each page's content, and which pages of that chunk are
// visible (a page belongs to the topmost layer that mentions it, as for
// Restore). A page no chunk holds is zero. It adds nothing to the format:
// it is the plan Restore follows, sorted by page.
//
// A Pages is immutable once made and may be used from several goroutines;
// it reads chunks through its Chain, which must stay open while it is used
// (it does not own the Chain).
type Pages struct {
	c      *Chain
	chunks []task    // the chunks with visible pages, in plan order (top layer first)
	segs   []segment // visible runs of every chunk, sorted by page, disjoint
	bufs   sync.Pool // *chunkBufs for Decode's compressed bytes
}

// PageRun is a run of Count visible pages of a decoded chunk: memory pages
// Page..Page+Count-1 are the chunk's pages Src..Src+Count-1 (the decoded
// chunk's bytes [Src*PageSize, (Src+Count)*PageSize)).
type PageRun struct {
	Page  uint64
	Src   uint32
	Count uint32
}

// Pages returns the page index of c's effective memory. It walks the index
// of every layer (no chunk data): O(stored pages + zero pages) time, and
// memory proportional to the number of visible runs.
func (c *Chain) Pages() *Pages {
	tasks, segs := c.segments()
	return &Pages{c: c, chunks: tasks, segs: segs}
}

// PageSize is the chain's page size in bytes.
func (p *Pages) PageSize() uint64 { return uint64(p.c.PageSize()) }

// NumPages is the number of pages of memory.
func (p *Pages) NumPages() uint64 { return p.c.MemSize() / uint64(p.c.PageSize()) }

// NumChunks is the number of chunks with visible pages; chunks are named
// by their index, 0 to NumChunks()-1.
func (p *Pages) NumChunks() int { return len(p.chunks) }

// Find returns the chunk holding page's content, and false when the page
// is zero (or outside memory).
func (p *Pages) Find(page uint64) (chunk int, ok bool) {
	i := sort.Search(len(p.segs), func(i int) bool {
		s := p.segs[i]
		return s.page+uint64(s.count) > page
	})
	if i == len(p.segs) || p.segs[i].page > page {
		return 0, false
	}
	return p.segs[i].task, true
}

// Runs returns the visible runs of chunk, sorted by source page. The
// caller must not modify them.
func (p *Pages) Runs(chunk int) []PageRun {
	cps := p.chunks[chunk].copies
	runs := make([]PageRun, len(cps))
	for i, cp := range cps {
		runs[i] = PageRun{Page: cp.dst, Src: cp.src, Count: cp.count}
	}
	return runs
}

// ChunkBytes is the decoded size of chunk: every page it stores, visible
// or not.
func (p *Pages) ChunkBytes(chunk int) uint64 {
	t := p.chunks[chunk]
	return uint64(p.c.layers[t.layer].ix.chunks[t.chunk].npages) * p.PageSize()
}

// Decode reads chunk, checks its SHA-256 and decompresses it, into dst
// when dst has the capacity (ChunkBytes), else into a new slice; it
// returns the decoded bytes. The chunk's declared length bounds what is
// read and decoded. Errors wrap ErrCorrupt and name the layer and chunk.
// Safe for concurrent use (with distinct dst).
func (p *Pages) Decode(chunk int, dst []byte) ([]byte, error) {
	if chunk < 0 || chunk >= len(p.chunks) {
		return nil, fmt.Errorf("memsnap: decode chunk %d of %d", chunk, len(p.chunks))
	}
	t := p.chunks[chunk]
	b, _ := p.bufs.Get().(*chunkBufs)
	if b == nil {
		b = new(chunkBufs)
	}
	defer p.bufs.Put(b)
	want := p.ChunkBytes(chunk)
	if uint64(cap(dst)) >= want {
		b.raw = dst[:0]
	} else {
		b.raw = nil
	}
	raw, err := p.c.layers[t.layer].readChunk(t.chunk, b)
	b.raw = nil // the decoded bytes are the caller's
	return raw, err
}
