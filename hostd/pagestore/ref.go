package pagestore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/warrenvm/warren/memsnap"
)

// RefVersion is the reference file format version this build writes and
// reads.
const RefVersion = 1

// Limits on what a reference file may declare, so that a hostile or
// corrupt one cannot make a reader allocate without bound.
const (
	MaxChunks    = 1 << 22                    // chunks of one layer (4 TiB of 1 MiB chunks)
	MaxHeaderLen = 72 + 255 + 4096 + 4        // a memsnap header's largest size
	MaxTailLen   = memsnap.MaxIndexBytes + 32 // a memsnap index and footer
	refFixedLen  = 64
	flagKeyed    = 1 // the chunks are in a keyed namespace
	nameLen      = 32
)

var (
	refMagic   = [8]byte{'W', 'P', 'A', 'G', 'E', 'R', 'E', 'F'}
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
)

// Sentinel errors; test with errors.Is.
var (
	// ErrCorrupt: a reference file or a chunk is malformed or fails its
	// checksum.
	ErrCorrupt = errors.New("corrupt page store data")
	// ErrMissing: a chunk a reference file names is not in the store.
	ErrMissing = errors.New("chunk missing from the page store")
	// ErrNotRef: the file is not a reference file (a plain memsnap layer,
	// or a sealed file).
	ErrNotRef = errors.New("not a page store reference file")
)

// Name is a chunk's name in its namespace (see the package documentation).
type Name [nameLen]byte

// String returns n in hexadecimal.
func (n Name) String() string { return fmt.Sprintf("%x", n[:]) }

// Ref is a decoded reference file: a layer without its chunk data.
type Ref struct {
	// Layer is the layer's header, index and footer, opened (it reads
	// no chunk data; Close it).
	Layer *memsnap.Layer
	// Chunks are the layer's chunks, in file order.
	Chunks []memsnap.ChunkRef
	// Names are the chunks' names in the store, in the same order.
	Names []Name
	// Size is the layer file's size.
	Size int64
	// Keyed says the chunks are in a keyed namespace (flag bit 0).
	Keyed bool

	head, tail []byte
}

// IsRef reports whether b starts like a reference file.
func IsRef(b []byte) bool {
	return len(b) >= len(refMagic) && bytes.Equal(b[:len(refMagic)], refMagic[:])
}

// encodeRef returns the reference file for layer l, whose header bytes are
// head and index-and-footer bytes tail, with its chunks' names.
func encodeRef(l *memsnap.Layer, head, tail []byte, names []Name, keyed bool) []byte {
	le := binary.LittleEndian
	b := make([]byte, refFixedLen, refFixedLen+len(head)+len(tail)+len(names)*nameLen+4)
	copy(b, refMagic[:])
	le.PutUint16(b[8:], RefVersion)
	if keyed {
		le.PutUint16(b[10:], flagKeyed)
	}
	le.PutUint32(b[12:], uint32(len(names)))
	le.PutUint64(b[16:], uint64(l.FileSize()))
	h := l.Hash()
	copy(b[24:56], h[:])
	le.PutUint32(b[56:], uint32(len(head)))
	le.PutUint32(b[60:], uint32(len(tail)))
	b = append(b, head...)
	b = append(b, tail...)
	for _, n := range names {
		b = append(b, n[:]...)
	}
	return le.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// ParseRef decodes and validates a reference file; name names it in
// messages. Errors wrap ErrNotRef (wrong magic), ErrCorrupt, or memsnap's
// errors for a malformed layer skeleton.
func ParseRef(name string, b []byte) (*Ref, error) {
	fail := func(format string, args ...any) (*Ref, error) {
		return nil, fmt.Errorf("pagestore: %s: %s: %w", name, fmt.Sprintf(format, args...), ErrCorrupt)
	}
	if !IsRef(b) {
		return nil, fmt.Errorf("pagestore: %s: %w", name, ErrNotRef)
	}
	if len(b) < refFixedLen+4 {
		return fail("%d bytes, shorter than the fixed header", len(b))
	}
	le := binary.LittleEndian
	if v := le.Uint16(b[8:]); v != RefVersion {
		return fail("reference format version %d, this build reads %d", v, RefVersion)
	}
	if got, want := crc32.Checksum(b[:len(b)-4], castagnoli), le.Uint32(b[len(b)-4:]); got != want {
		return fail("checksum %08x, recorded %08x", got, want)
	}
	flags := le.Uint16(b[10:])
	if flags&^flagKeyed != 0 {
		return fail("unknown flags %#x", flags)
	}
	nchunks := uint64(le.Uint32(b[12:]))
	size := le.Uint64(b[16:])
	var hash memsnap.Hash
	copy(hash[:], b[24:56])
	hlen, tlen := uint64(le.Uint32(b[56:])), uint64(le.Uint32(b[60:]))
	if nchunks > MaxChunks || hlen > MaxHeaderLen || tlen > MaxTailLen {
		return fail("%d chunks, header %d bytes, tail %d bytes exceed the limits", nchunks, hlen, tlen)
	}
	if want := refFixedLen + hlen + tlen + nchunks*nameLen + 4; uint64(len(b)) != want {
		return fail("%d bytes, its lengths say %d", len(b), want)
	}
	if size < hlen+tlen || size > memsnap.MaxMemSize*2 {
		return fail("layer size %d out of range", size)
	}
	r := &Ref{Size: int64(size), Keyed: flags&flagKeyed != 0}
	r.head = bytes.Clone(b[refFixedLen : refFixedLen+hlen])
	r.tail = bytes.Clone(b[refFixedLen+hlen : refFixedLen+hlen+tlen])
	l, err := memsnap.OpenReaderAt(name, &skeleton{head: r.head, tail: r.tail, size: int64(size)}, int64(size))
	if err != nil {
		return nil, fmt.Errorf("pagestore: %s: %w", name, err)
	}
	if l.Hash() != hash {
		l.Close()
		return fail("layer hash %s, recorded %s", l.Hash().Short(), hash.Short())
	}
	start, end := l.DataRange()
	if start != int64(hlen) || end != int64(size-tlen) {
		l.Close()
		return fail("header and tail (%d, %d bytes) do not frame the data region [%d, %d)", hlen, tlen, start, end)
	}
	r.Layer, r.Chunks = l, l.ChunkRefs()
	if uint64(len(r.Chunks)) != nchunks {
		l.Close()
		return fail("%d chunk names for %d chunks", nchunks, len(r.Chunks))
	}
	r.Names = make([]Name, nchunks)
	p := b[refFixedLen+hlen+tlen:]
	for i := range r.Names {
		copy(r.Names[i][:], p[i*nameLen:])
	}
	return r, nil
}

// Close closes the layer skeleton.
func (r *Ref) Close() error { return r.Layer.Close() }

// skeleton is a layer file with its data region missing: it reads as
// zeros there (a layer's header read may run into it; chunk reads through
// the skeleton would fail their SHA-256, and nothing makes them).
type skeleton struct {
	head, tail []byte
	size       int64
}

func (s *skeleton) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off > s.size {
		return 0, fmt.Errorf("read at %d outside %d bytes", off, s.size)
	}
	var short error
	if int64(len(p)) > s.size-off {
		p, short = p[:s.size-off], io.EOF
	}
	clear(p)
	if off < int64(len(s.head)) {
		copy(p, s.head[off:])
	}
	tailOff := s.size - int64(len(s.tail))
	if end := off + int64(len(p)); end > tailOff {
		from := max(off, tailOff)
		copy(p[from-off:], s.tail[from-tailOff:])
	}
	return len(p), short
}
