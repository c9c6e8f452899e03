//go:build linux

package agent

import (
	"sort"
	"sync"
)

// Output buffers of the process API: the newest output of one process,
// kept for replay (agentwire.MaxProcessOutput bytes).

// Bounds of an outputBuffer besides its byte count.
const (
	// maxChunkBytes bounds one chunk: consecutive reads of the same
	// stream are appended to the newest chunk up to this size, so that a
	// process writing a byte at a time keeps a few chunks, not one per
	// byte. It is also the size of a pump's reads and the most bytes one
	// frame of an output stream carries.
	maxChunkBytes = 32 << 10
	// maxChunks bounds the chunks kept, so that a process alternating
	// tiny writes to stdout and stderr (one chunk each) cannot make the
	// chunks' own bookkeeping grow past about a megabyte; the oldest go
	// first, even under the byte bound.
	maxChunks = 16 << 10
)

// outChunk is a run of output of one stream, at offset off of the
// process's output (stdout and stderr counted together).
type outChunk struct {
	typ  byte // agentwire.FrameStdout or FrameStderr
	off  int64
	data []byte
}

// outputBuffer keeps the newest output of one process, oldest bytes
// dropped first, with each run's stream. The process's pumps write it
// (write) and its monitor closes it once the output has ended (close);
// any number of readers copy from it (next) and wait for more on the
// channel next returns. No reader can hold up a writer: readers copy
// under mu and write to their clients without it.
type outputBuffer struct {
	max       int // bytes kept at most
	maxChunks int // chunks kept at most

	mu sync.Mutex
	// chunks are the runs kept, oldest first, contiguous: each one's off
	// is the previous one's off plus its length.
	chunks []outChunk // +checklocks:mu
	// size is the bytes in chunks.
	size int // +checklocks:mu
	// end is the offset after the newest byte: the output's total size.
	end int64 // +checklocks:mu
	// closed says no more output comes.
	closed bool // +checklocks:mu
	// wake is closed, and replaced, at each write and at close.
	wake chan struct{} // +checklocks:mu
}

// newOutputBuffer returns an empty buffer that keeps max bytes.
func newOutputBuffer(max int) *outputBuffer {
	return &outputBuffer{max: max, maxChunks: maxChunks, wake: make(chan struct{})}
}

// write appends p, read from stream typ, dropping the oldest bytes past
// the bounds.
func (b *outputBuffer) write(typ byte, p []byte) {
	if len(p) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	if n := len(b.chunks); n > 0 && b.chunks[n-1].typ == typ && len(b.chunks[n-1].data)+len(p) <= maxChunkBytes {
		b.chunks[n-1].data = append(b.chunks[n-1].data, p...)
	} else {
		b.chunks = append(b.chunks, outChunk{typ: typ, off: b.end, data: append([]byte(nil), p...)})
	}
	b.end += int64(len(p))
	b.size += len(p)
	for b.size > b.max {
		c := &b.chunks[0]
		excess := b.size - b.max
		if len(c.data) > excess {
			c.data = c.data[excess:]
			c.off += int64(excess)
			b.size -= excess
			break
		}
		b.dropFirst()
	}
	for len(b.chunks) > b.maxChunks {
		b.dropFirst()
	}
	close(b.wake)
	b.wake = make(chan struct{})
}

// dropFirst forgets the oldest chunk.
//
// +checklocks:b.mu
func (b *outputBuffer) dropFirst() {
	b.size -= len(b.chunks[0].data)
	b.chunks[0] = outChunk{} // the array keeps no reference to its bytes
	b.chunks = b.chunks[1:]
}

// close says the output has ended, and wakes the readers.
func (b *outputBuffer) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.closed {
		b.closed = true
		close(b.wake)
	}
}

// bounds returns the offset of the oldest byte kept and the output's
// total size.
func (b *outputBuffer) bounds() (from, end int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.end - int64(b.size), b.end
}

// read is one answer of next.
type read struct {
	// typ is the stream of the n bytes copied, which start at offset at
	// (past pos when the bytes from pos on were dropped).
	typ byte
	at  int64
	n   int
	// end and closed are the buffer's at the time: no bytes at pos when
	// n is 0 and pos >= end, and none to come when closed too.
	end    int64
	closed bool
	// wake is closed when the buffer next changes.
	wake <-chan struct{}
}

// next copies into dst the kept bytes of one stream from offset pos on
// (or from the oldest kept byte after pos, when pos was dropped), up to
// limit (an offset) and len(dst).
func (b *outputBuffer) next(pos, limit int64, dst []byte) read {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := read{end: b.end, closed: b.closed, wake: b.wake}
	// The first chunk that ends after pos.
	i := sort.Search(len(b.chunks), func(i int) bool {
		c := b.chunks[i]
		return c.off+int64(len(c.data)) > pos
	})
	if i == len(b.chunks) {
		return r
	}
	c := b.chunks[i]
	r.typ, r.at = c.typ, max(pos, c.off)
	if r.at >= limit {
		return read{end: r.end, closed: r.closed, wake: r.wake}
	}
	data := c.data[r.at-c.off:]
	if rest := limit - r.at; int64(len(data)) > rest {
		data = data[:rest]
	}
	r.n = copy(dst, data)
	return r
}
