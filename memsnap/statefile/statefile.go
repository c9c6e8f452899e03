// Package statefile is the on-disk form of a snapshot's non-memory state:
// the VM configuration, vCPU and irqchip state, each device's saved state,
// and the reference to the memory layer, as named sections, each with its
// own checksum, behind a versioned header that carries the host
// fingerprint. Memory itself lives in memsnap layers.
//
// Layout (little-endian):
//
//	offset  size  field
//	0       8     magic "WARRENST"
//	8       2     format version (Version)
//	10      2     number of sections N (at most MaxSections)
//	12      4     fingerprint length F (at most MaxFingerprint)
//	16      F     fingerprint: host profile and CPU features, opaque here
//	        N x   section table entry:
//	              2   name length L (1..MaxName), L bytes name,
//	              8   data length (at most MaxSection),
//	              32  SHA-256 of the data
//	        4     CRC-32C of everything above
//	        ...   section data, in table order, back to back
//	        8     magic "WSTATEND"
//
// The file must end exactly after the trailing magic: a truncated or
// extended file is refused, as is any flipped byte (the header CRC covers
// the header and table, each section's SHA-256 its data). Read checks
// everything before returning any section, so a restore refuses a damaged
// file before it creates a VM.
//
// Write puts the file in place atomically: a temporary file in the same
// directory, fsync, rename over the target, fsync of the directory. A crash
// at any point leaves either the old file or the new one.
package statefile

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"github.com/warrenvm/warren/internal/atomicfile"
)

// Version is the format version this package writes and reads.
const Version = 1

// Limits on what Read accepts, so a hostile file cannot make it allocate
// without bound.
const (
	MaxSections    = 64
	MaxName        = 64
	MaxFingerprint = 4096
	MaxSection     = 64 << 20
)

const (
	magic    = "WARRENST"
	endMagic = "WSTATEND"
)

// ErrCorrupt is wrapped by every refusal of a damaged file; ErrVersion by
// a file of another format version.
var (
	ErrCorrupt = errors.New("statefile: corrupt")
	ErrVersion = errors.New("statefile: unsupported version")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Section is one named blob of state.
type Section struct {
	Name string
	Data []byte
}

// File is a state file's contents.
type File struct {
	// Fingerprint identifies the host and CPU the state was taken on;
	// the restorer compares it with its own before using anything.
	Fingerprint []byte
	// Sections in file order; names are unique.
	Sections []Section
}

// Section returns the data of the named section, or false.
func (f *File) Section(name string) ([]byte, bool) {
	for _, s := range f.Sections {
		if s.Name == name {
			return s.Data, true
		}
	}
	return nil, false
}

// Encode returns f in the on-disk format.
func (f *File) Encode() ([]byte, error) {
	if len(f.Sections) > MaxSections {
		return nil, fmt.Errorf("statefile: %d sections, at most %d", len(f.Sections), MaxSections)
	}
	if len(f.Fingerprint) > MaxFingerprint {
		return nil, fmt.Errorf("statefile: fingerprint of %d bytes, at most %d", len(f.Fingerprint), MaxFingerprint)
	}
	var b bytes.Buffer
	le := binary.LittleEndian
	b.WriteString(magic)
	b.Write(le.AppendUint16(nil, Version))
	b.Write(le.AppendUint16(nil, uint16(len(f.Sections))))
	b.Write(le.AppendUint32(nil, uint32(len(f.Fingerprint))))
	b.Write(f.Fingerprint)
	seen := map[string]bool{}
	for _, s := range f.Sections {
		if len(s.Name) == 0 || len(s.Name) > MaxName || seen[s.Name] {
			return nil, fmt.Errorf("statefile: bad or repeated section name %q", s.Name)
		}
		if len(s.Data) > MaxSection {
			return nil, fmt.Errorf("statefile: section %s of %d bytes, at most %d", s.Name, len(s.Data), MaxSection)
		}
		seen[s.Name] = true
		b.Write(le.AppendUint16(nil, uint16(len(s.Name))))
		b.WriteString(s.Name)
		b.Write(le.AppendUint64(nil, uint64(len(s.Data))))
		sum := sha256.Sum256(s.Data)
		b.Write(sum[:])
	}
	b.Write(le.AppendUint32(nil, crc32.Checksum(b.Bytes(), castagnoli)))
	for _, s := range f.Sections {
		b.Write(s.Data)
	}
	b.WriteString(endMagic)
	return b.Bytes(), nil
}

// Decode parses and verifies a whole state file.
func Decode(data []byte) (*File, error) {
	r := &reader{b: data}
	if string(r.next(8)) != magic {
		return nil, fmt.Errorf("%w: not a Warren state file (bad magic)", ErrCorrupt)
	}
	ver := r.u16()
	if r.err == nil && ver != Version {
		return nil, fmt.Errorf("%w: format version %d, this build reads version %d", ErrVersion, ver, Version)
	}
	n := int(r.u16())
	fpLen := int(r.u32())
	if r.err != nil {
		return nil, r.err
	}
	if n > MaxSections || fpLen > MaxFingerprint {
		return nil, fmt.Errorf("%w: %d sections, %d-byte fingerprint", ErrCorrupt, n, fpLen)
	}
	f := &File{Fingerprint: bytes.Clone(r.next(fpLen))}
	type entry struct {
		name string
		size uint64
		sum  []byte
	}
	entries := make([]entry, 0, n)
	var total uint64
	for range n {
		l := int(r.u16())
		if r.err == nil && (l == 0 || l > MaxName) {
			return nil, fmt.Errorf("%w: section name of %d bytes", ErrCorrupt, l)
		}
		e := entry{name: string(r.next(l)), size: r.u64(), sum: r.next(32)}
		if r.err != nil {
			return nil, r.err
		}
		if e.size > MaxSection {
			return nil, fmt.Errorf("%w: section %q of %d bytes", ErrCorrupt, e.name, e.size)
		}
		total += e.size
		entries = append(entries, e)
	}
	headerEnd := r.off
	crc := r.u32()
	if r.err != nil {
		return nil, r.err
	}
	if got := crc32.Checksum(data[:headerEnd], castagnoli); got != crc {
		return nil, fmt.Errorf("%w: header checksum %#08x, computed %#08x", ErrCorrupt, crc, got)
	}
	if want := uint64(r.off) + total + uint64(len(endMagic)); uint64(len(data)) != want {
		return nil, fmt.Errorf("%w: %d bytes, the header describes %d (truncated or extended)", ErrCorrupt, len(data), want)
	}
	seen := map[string]bool{}
	for _, e := range entries {
		d := r.next(int(e.size))
		if sum := sha256.Sum256(d); !bytes.Equal(sum[:], e.sum) {
			return nil, fmt.Errorf("%w: section %q fails its checksum", ErrCorrupt, e.name)
		}
		if seen[e.name] {
			return nil, fmt.Errorf("%w: section %q twice", ErrCorrupt, e.name)
		}
		seen[e.name] = true
		f.Sections = append(f.Sections, Section{Name: e.name, Data: bytes.Clone(d)})
	}
	if string(r.next(len(endMagic))) != endMagic || r.err != nil {
		return nil, fmt.Errorf("%w: bad trailing magic", ErrCorrupt)
	}
	return f, nil
}

// reader consumes a byte slice, remembering the first overrun.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) next(n int) []byte {
	if r.err != nil || n < 0 || n > len(r.b)-r.off {
		if r.err == nil {
			r.err = fmt.Errorf("%w: truncated at byte %d", ErrCorrupt, r.off)
		}
		return nil
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s
}

func (r *reader) u16() uint16 {
	if b := r.next(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if b := r.next(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if b := r.next(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// maxFile bounds what Read loads.
const maxFile = MaxSections*(MaxSection+2+MaxName+8+32) + MaxFingerprint + 64

// Read reads and verifies the state file at path.
func Read(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, maxFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	f, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Write stores f at path atomically (temporary file, fsync, rename, fsync
// of the directory).
func Write(path string, f *File) error {
	data, err := f.Encode()
	if err != nil {
		return err
	}
	return WriteAtomic(path, data)
}

// WriteAtomic puts data at path so that a crash leaves either the old file
// or the complete new one.
func WriteAtomic(path string, data []byte) error {
	return atomicfile.Write(path, data, 0o600)
}
