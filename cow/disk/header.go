package disk

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/bits"
)

// Format constants.
const (
	// Magic opens every overlay file.
	Magic = "WRNCOWD1"
	// Version is the format version this build writes; it reads
	// versions 1 and 2 (see the package documentation).
	Version = 2
	// HeaderSize is the size of the header region; the bitmap follows it.
	HeaderSize = 4096
	// SlotSize is the size of each of a version 2 header's two slots.
	SlotSize = HeaderSize / 2
	// DefaultBlockSize is the allocation unit when Create is given none.
	DefaultBlockSize = 64 << 10
	// MinBlockSize and MaxBlockSize bound the block size (a power of two).
	MinBlockSize = 4 << 10
	MaxBlockSize = 16 << 20
	// MaxVirtualSize bounds the disk size (1 PiB), which keeps all offset
	// arithmetic far from overflow.
	MaxVirtualSize = 1 << 50
	// MaxBasePath is the longest base path a header this build writes
	// holds (a version 1 header, read only, held up to maxBasePathV1).
	MaxBasePath = SlotSize - fixedLen - 4
	// identityWindow is how much of each end of the base Identity hashes.
	identityWindow = 1 << 20
	// bitmapPage is the unit in which the bitmap is padded and written.
	bitmapPage = 4096
)

// The fixed header fields' length, up to the base path: 98 bytes in
// version 1, 106 in version 2 (the generation comes before the path).
const (
	fixedLenV1    = 98
	fixedLen      = 106
	maxBasePathV1 = HeaderSize - fixedLenV1 - 4
)

// Errors Open and ParseHeader wrap; test with errors.Is.
var (
	// ErrNotOverlay: the file does not start with Magic.
	ErrNotOverlay = errors.New("not a warren overlay (bad magic)")
	// ErrVersion: the format version is not one this build reads (or, for
	// Rebase, writes).
	ErrVersion = errors.New("unsupported overlay format version")
	// ErrCorrupt: the header or bitmap is inconsistent or fails its checksum.
	ErrCorrupt = errors.New("corrupt overlay")
	// ErrBaseMismatch: the base is not the image the overlay was made over.
	ErrBaseMismatch = errors.New("base image does not match the overlay")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Header is the decoded header of an overlay file: for version 2, its
// active slot.
type Header struct {
	BlockSize   uint32
	VirtualSize uint64
	BaseSize    uint64
	BaseDigest  [32]byte // Identity of the base
	BasePath    string   // as given to Create or Rebase; used by OpenChain
	// Version is the file's format version (1 or 2); Marshal writes
	// Version (2) whatever it says.
	Version uint32
	// Generation counts the header's writes (version 2): 1 at Create, one
	// more at each Rebase. The slot with the higher one is the header.
	Generation uint64

	// slot is the active slot of a version 2 header (0 or 1).
	slot int
}

// Blocks is the number of blocks of the virtual disk (the last may be
// short).
func (h Header) Blocks() uint64 {
	return (h.VirtualSize + uint64(h.BlockSize) - 1) / uint64(h.BlockSize)
}

// BitmapOffset is where the bitmap starts in the file.
func (h Header) BitmapOffset() uint64 { return HeaderSize }

// BitmapSize is the bitmap's size in the file: one bit per block, padded to
// whole 4 KiB pages.
func (h Header) BitmapSize() uint64 {
	return roundUp((h.Blocks()+7)/8, bitmapPage)
}

// DataOffset is where block 0's data starts in the file: the bitmap's end
// rounded up to the block size, so that blocks are aligned in the file.
func (h Header) DataOffset() uint64 {
	return roundUp(h.BitmapOffset()+h.BitmapSize(), uint64(h.BlockSize))
}

// FileSize is the length of the overlay file: data offset plus virtual size.
func (h Header) FileSize() uint64 { return h.DataOffset() + h.VirtualSize }

// check validates the fields a caller may set, with maxPath the longest
// base path the version holds; ParseHeader wraps its errors with
// ErrCorrupt.
func (h Header) check(maxPath int) error {
	switch {
	case h.BlockSize < MinBlockSize || h.BlockSize > MaxBlockSize || bits.OnesCount32(h.BlockSize) != 1:
		return fmt.Errorf("block size %d is not a power of two in [%d, %d]", h.BlockSize, MinBlockSize, MaxBlockSize)
	case h.VirtualSize > MaxVirtualSize:
		return fmt.Errorf("virtual size %d is over %d", h.VirtualSize, uint64(MaxVirtualSize))
	case h.BaseSize != h.VirtualSize:
		return fmt.Errorf("base size %d differs from virtual size %d", h.BaseSize, h.VirtualSize)
	case len(h.BasePath) > maxPath:
		return fmt.Errorf("base path is %d bytes, at most %d fit", len(h.BasePath), maxPath)
	case bytes.IndexByte([]byte(h.BasePath), 0) >= 0:
		return errors.New("base path holds a NUL byte")
	}
	return nil
}

// Marshal encodes h as a new file's header region (HeaderSize bytes,
// version 2): h in slot 0 with generation 1 when h.Generation is 0, and an
// empty slot 1.
func (h Header) Marshal() ([]byte, error) {
	if h.Generation == 0 {
		h.Generation = 1
	}
	s, err := h.marshalSlot()
	if err != nil {
		return nil, err
	}
	b := make([]byte, HeaderSize)
	copy(b, s)
	return b, nil
}

// marshalSlot encodes h as one version 2 header slot (SlotSize bytes).
func (h Header) marshalSlot() ([]byte, error) {
	if err := h.check(MaxBasePath); err != nil {
		return nil, err
	}
	b := make([]byte, SlotSize)
	h.putCommon(b, Version)
	binary.LittleEndian.PutUint64(b[96:], h.Generation)
	h.putBasePath(b, fixedLen)
	return b, nil
}

// putCommon writes into b (zeroed) the fields that version 1 and 2 headers
// store alike, at the same offsets (bytes 0 to 96): magic, version, header
// size, block size, flags (zero), virtual size, the layout fields, base
// size and digest.
func (h Header) putCommon(b []byte, version uint32) {
	le := binary.LittleEndian
	copy(b, Magic)
	le.PutUint32(b[8:], version)
	le.PutUint32(b[12:], HeaderSize)
	le.PutUint32(b[16:], h.BlockSize)
	le.PutUint64(b[24:], h.VirtualSize)
	le.PutUint64(b[32:], h.BitmapOffset())
	le.PutUint64(b[40:], h.BitmapSize())
	le.PutUint64(b[48:], h.DataOffset())
	le.PutUint64(b[56:], h.BaseSize)
	copy(b[64:96], h.BaseDigest[:])
}

// putBasePath ends a header record as both versions do: the base path's
// length in the two bytes before fixed (the fixed fields' length), the
// path from fixed, and the checksum of all that.
func (h Header) putBasePath(b []byte, fixed int) {
	le := binary.LittleEndian
	le.PutUint16(b[fixed-2:], uint16(len(h.BasePath)))
	end := fixed + copy(b[fixed:], h.BasePath)
	le.PutUint32(b[end:], crc32.Checksum(b[:end], castagnoli))
}

// ParseHeader decodes and validates the header region at the start of b
// (which comes from disk: every field is checked). A version 1 header is
// one record over the whole region; a version 2 header is two slots, of
// which the valid one with the higher generation is the header (a slot
// torn by a crash fails its checksum and the other one stands). It fails
// with ErrNotOverlay, ErrVersion or ErrCorrupt.
func ParseHeader(b []byte) (*Header, error) {
	if len(b) < len(Magic) || string(b[:len(Magic)]) != Magic {
		return nil, ErrNotOverlay
	}
	if len(b) < 12 {
		return nil, fmt.Errorf("%w: header truncated to %d bytes", ErrCorrupt, len(b))
	}
	v := binary.LittleEndian.Uint32(b[8:])
	if v != 1 && v != 2 {
		return nil, fmt.Errorf("%w: file has version %d, this build reads 1 and 2", ErrVersion, v)
	}
	if len(b) < HeaderSize {
		return nil, fmt.Errorf("%w: header truncated to %d bytes", ErrCorrupt, len(b))
	}
	b = b[:HeaderSize]
	if v == 1 {
		return parseV1(b)
	}
	h0, err0 := parseSlot(b[:SlotSize])
	if err0 != nil {
		err0 = fmt.Errorf("slot 0: %w", err0)
	}
	var h1 *Header
	var err1 error
	if s1 := b[SlotSize:]; !allZero(s1) {
		if h1, err1 = parseSlot(s1); err1 != nil {
			err1 = fmt.Errorf("slot 1: %w", err1)
		} else {
			h1.slot = 1
		}
	}
	switch {
	case h0 == nil && h1 == nil:
		if err1 != nil {
			return nil, fmt.Errorf("%w: %w; %w", ErrCorrupt, err0, err1)
		}
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err0)
	case h1 == nil:
		return h0, nil
	case h0 == nil:
		return h1, nil
	}
	if h0.BlockSize != h1.BlockSize || h0.VirtualSize != h1.VirtualSize || h0.BaseSize != h1.BaseSize {
		return nil, fmt.Errorf("%w: the two header slots describe different disks", ErrCorrupt)
	}
	switch {
	case h0.Generation > h1.Generation:
		return h0, nil
	case h1.Generation > h0.Generation:
		return h1, nil
	}
	return nil, fmt.Errorf("%w: both header slots have generation %d", ErrCorrupt, h0.Generation)
}

// parseSlot decodes one version 2 slot; its errors are unwrapped (the
// caller wraps them with ErrCorrupt).
func parseSlot(b []byte) (*Header, error) {
	if string(b[:len(Magic)]) != Magic {
		return nil, errors.New("bad magic")
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != 2 {
		return nil, fmt.Errorf("version %d in a version 2 header", v)
	}
	h, err := parseCommon(b, 2, fixedLen, MaxBasePath)
	if err != nil {
		return nil, err
	}
	h.Generation = binary.LittleEndian.Uint64(b[96:])
	if h.Generation == 0 {
		return nil, errors.New("generation 0")
	}
	if err := checkCommon(b, h, MaxBasePath); err != nil {
		return nil, err
	}
	return h, nil
}

// parseV1 decodes a version 1 header region (read only: this build
// writes version 2).
func parseV1(b []byte) (*Header, error) {
	h, err := parseCommon(b, 1, fixedLenV1, maxBasePathV1)
	if err == nil {
		err = checkCommon(b, h, maxBasePathV1)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return h, nil
}

// parseCommon decodes a header record of version whose fixed fields are
// fixed bytes long, as putCommon and putBasePath wrote it: it checks the
// base path's length (at most maxPath), the checksum and that only zeros
// follow, and decodes the fields both versions store alike. Its errors
// are unwrapped.
func parseCommon(b []byte, version uint32, fixed, maxPath int) (*Header, error) {
	le := binary.LittleEndian
	n := int(le.Uint16(b[fixed-2:]))
	if n > maxPath {
		return nil, fmt.Errorf("base path length %d is over %d", n, maxPath)
	}
	end := fixed + n
	if sum := crc32.Checksum(b[:end], castagnoli); sum != le.Uint32(b[end:]) {
		return nil, fmt.Errorf("header checksum %#08x, computed %#08x", le.Uint32(b[end:]), sum)
	}
	if !allZero(b[end+4:]) {
		return nil, errors.New("junk after the header fields")
	}
	h := &Header{
		Version:     version,
		BlockSize:   le.Uint32(b[16:]),
		VirtualSize: le.Uint64(b[24:]),
		BaseSize:    le.Uint64(b[56:]),
		BasePath:    string(b[fixed:end]),
	}
	copy(h.BaseDigest[:], b[64:96])
	return h, nil
}

// checkCommon checks the fields both versions share: header size, flags,
// the caller-set fields and the derived layout fields.
func checkCommon(b []byte, h *Header, maxPath int) error {
	le := binary.LittleEndian
	if hs := le.Uint32(b[12:]); hs != HeaderSize {
		return fmt.Errorf("header size %d, want %d", hs, HeaderSize)
	}
	if fl := le.Uint32(b[20:]); fl != 0 {
		return fmt.Errorf("unknown flags %#x", fl)
	}
	if err := h.check(maxPath); err != nil {
		return err
	}
	// The layout fields are derived; they are stored so that other tools
	// can find the data without this code, and must agree.
	for _, f := range []struct {
		name      string
		got, want uint64
	}{
		{"bitmap offset", le.Uint64(b[32:]), h.BitmapOffset()},
		{"bitmap size", le.Uint64(b[40:]), h.BitmapSize()},
		{"data offset", le.Uint64(b[48:]), h.DataOffset()},
	} {
		if f.got != f.want {
			return fmt.Errorf("%s is %d, want %d", f.name, f.got, f.want)
		}
	}
	return nil
}

// Identity is the digest a header records for its base: SHA-256 over the
// size (little-endian uint64), the first MiB and the last MiB of the
// content (both clipped to the size; they overlap on a base under 2 MiB).
func Identity(base Backing) ([32]byte, error) {
	size := base.Size()
	h := sha256.New()
	var sz [8]byte
	binary.LittleEndian.PutUint64(sz[:], uint64(size))
	h.Write(sz[:])
	w := min(size, identityWindow)
	buf := make([]byte, w)
	for _, off := range []int64{0, size - w} {
		if err := readFull(base, buf, off); err != nil {
			return [32]byte{}, fmt.Errorf("hash base at %d: %w", off, err)
		}
		h.Write(buf)
	}
	var d [32]byte
	h.Sum(d[:0])
	return d, nil
}

// readFull reads len(p) bytes at off from r; io.EOF with a full read is
// success, as io.ReaderAt allows at the end.
func readFull(r io.ReaderAt, p []byte, off int64) error {
	n, err := r.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return err
}

func roundUp(x, to uint64) uint64 { return (x + to - 1) / to * to }

var zeros [64 << 10]byte

// allZero reports whether b holds only zero bytes.
func allZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeros))
		if !bytes.Equal(b[:n], zeros[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}
