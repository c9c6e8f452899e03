package vmsnap

import (
	"bytes"
	"fmt"
	"io"
	"sort"

	"github.com/warrenvm/warren/vmm/guestmem"
)

const pageSize = guestmem.PageSize

var zeroPage [pageSize]byte

// pageImage is a sparse copy of guest RAM: the non-zero pages captured
// while the VM was paused, back to back in data, in page order. Pages not
// held read as zero. It is an io.ReaderAt over the flat image for memsnap's
// writers, which run after the VM has resumed.
type pageImage struct {
	size  uint64
	pages []uint64 // sorted page numbers; pages[i] is data[i*pageSize:]
	data  []byte
}

// capturePages copies from flat (the whole guest RAM mapping) every page
// whose bit is set in want and that is not all zero.
func capturePages(flat []byte, want []uint64) *pageImage {
	img := &pageImage{size: uint64(len(flat))}
	n := uint64(len(flat)) / pageSize
	count := countBits(want)
	img.data = make([]byte, 0, count*pageSize)
	img.pages = make([]uint64, 0, count)
	for p := uint64(0); p < n; p++ {
		if want[p/64] == 0 {
			p += 63 - p%64
			continue
		}
		if want[p/64]&(1<<(p%64)) == 0 {
			continue
		}
		pg := flat[p*pageSize : (p+1)*pageSize]
		if bytes.Equal(pg, zeroPage[:]) {
			continue
		}
		img.pages = append(img.pages, p)
		img.data = append(img.data, pg...)
	}
	return img
}

// ReadAt implements io.ReaderAt.
func (m *pageImage) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("vmsnap: negative offset")
	}
	if uint64(off) >= m.size {
		return 0, io.EOF
	}
	n := len(p)
	if rest := m.size - uint64(off); uint64(n) > rest {
		n = int(rest)
	}
	pos := uint64(off)
	end := pos + uint64(n)
	i := sort.Search(len(m.pages), func(i int) bool { return m.pages[i] >= pos/pageSize })
	for pos < end {
		page := pos / pageSize
		in := pos % pageSize
		chunk := min(pageSize-in, end-pos)
		dst := p[pos-uint64(off) : pos-uint64(off)+chunk]
		for i < len(m.pages) && m.pages[i] < page {
			i++
		}
		if i < len(m.pages) && m.pages[i] == page {
			copy(dst, m.data[uint64(i)*pageSize+in:])
		} else {
			clear(dst)
		}
		pos += chunk
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// overlay is a full snapshot's memory: the pages set in set are top's (a
// page of set that top does not hold is zero), all others base's.
type overlay struct {
	base, top *pageImage
	set       []uint64
}

// ReadAt implements io.ReaderAt, page by page.
func (o *overlay) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || uint64(off) >= o.top.size {
		return 0, io.EOF
	}
	n := 0
	for n < len(p) && uint64(off)+uint64(n) < o.top.size {
		pos := uint64(off) + uint64(n)
		page := pos / pageSize
		chunk := min(pageSize-pos%pageSize, uint64(len(p)-n), o.top.size-pos)
		src := o.base
		if o.set[page/64]&(1<<(page%64)) != 0 {
			src = o.top
		}
		if _, err := src.ReadAt(p[n:n+int(chunk)], int64(pos)); err != nil {
			return n, err
		}
		n += int(chunk)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// orBits ORs src into dst (the shorter length wins).
func orBits(dst, src []uint64) {
	for i := range min(len(dst), len(src)) {
		dst[i] |= src[i]
	}
}

// countBits returns the number of set bits.
func countBits(b []uint64) uint64 {
	var n uint64
	for _, w := range b {
		for ; w != 0; w &= w - 1 {
			n++
		}
	}
	return n
}
