package crypt

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/internal/atomicfile"
)

// Sparse files: disk images and cow/disk overlays are mostly holes (an
// overlay's data area is as large as the whole virtual disk, written only
// where the guest wrote), and encrypting the holes would turn a file of a
// few allocated megabytes into one as large as the disk. EncryptSparseFile
// therefore encrypts a packed form instead, and DecryptSparseFile restores
// the file with its holes. The packed form is the plaintext of an
// ordinary file of this package (so it is chunked and authenticated as a
// whole: a hole cannot be added, removed or moved without failing
// authentication), laid out as, big-endian:
//
//	offset  size   field
//	0       8      magic "WSPARSE1"
//	8       8      logical size S of the file
//	16      8      number of extents N, at most MaxSparseExtents
//	24      16*N   extents: offset, length; sorted, not overlapping,
//	               not empty, each within [0, S)
//	24+16N  sum    the extents' bytes, in order
//
// Everything outside the extents reads as zeros. The extents are the
// file's data regions as SEEK_DATA/SEEK_HOLE report them (the whole file
// where the file system cannot tell).

// SparseMagic starts the packed form of a sparse file.
const SparseMagic = "WSPARSE1"

// MaxSparseExtents bounds the extents of a packed sparse file.
const MaxSparseExtents = 1 << 22

// extent is one data region of a sparse file.
type extent struct{ off, len int64 }

// dataExtents lists f's data regions (size bytes long).
func dataExtents(f *os.File, size int64) ([]extent, error) {
	var out []extent
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) { // no data after off
			break
		}
		if err != nil {
			if off == 0 && (errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP)) {
				return []extent{{0, size}}, nil
			}
			return nil, err
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			return nil, err
		}
		end = min(end, size)
		if end <= start {
			break
		}
		out = append(out, extent{start, end - start})
		if len(out) > MaxSparseExtents {
			return nil, fmt.Errorf("more than %d data extents", MaxSparseExtents)
		}
		off = end
	}
	return out, nil
}

// EncryptSparseFile encrypts the file at src, holes left out (see above),
// into dst under key: a temporary file in dst's directory, fsynced and
// renamed over dst, with src's permission bits, owner and group (a
// confined VMM's layers stay its own, readable by its fork family:
// hostd/daemon's jail.go). src may be dst. src must
// not change while it runs.
func EncryptSparseFile(dst, src string, key Key) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("crypt: seal: %w", err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return fmt.Errorf("crypt: seal: %w", err)
	}
	exts, err := dataExtents(in, fi.Size())
	if err != nil {
		return fmt.Errorf("crypt: seal %s: extents: %w", filepath.Base(src), err)
	}
	err = writeAtomicMode(dst, fi, func(f *os.File) error {
		return sealInto(f, key, func(w io.Writer) error {
			return writePacked(w, in, fi.Size(), exts)
		})
	})
	if err != nil {
		return fmt.Errorf("crypt: seal %s: %w", filepath.Base(src), err)
	}
	return nil
}

// writePacked writes the packed form of the file in (size bytes, its
// data in exts) to w: the header, then each extent's bytes.
func writePacked(w io.Writer, in *os.File, size int64, exts []extent) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	hdr := make([]byte, 24, 24+16*len(exts))
	copy(hdr, SparseMagic)
	binary.BigEndian.PutUint64(hdr[8:], uint64(size))
	binary.BigEndian.PutUint64(hdr[16:], uint64(len(exts)))
	for _, e := range exts {
		hdr = binary.BigEndian.AppendUint64(hdr, uint64(e.off))
		hdr = binary.BigEndian.AppendUint64(hdr, uint64(e.len))
	}
	if _, err := bw.Write(hdr); err != nil {
		return err
	}
	for _, e := range exts {
		n, err := io.Copy(bw, io.NewSectionReader(in, e.off, e.len))
		if err != nil {
			return err
		}
		if n != e.len {
			return fmt.Errorf("extent at %d: read %d of %d bytes (the file changed)", e.off, n, e.len)
		}
	}
	return bw.Flush()
}

// DecryptSparseFile decrypts src, made by EncryptSparseFile for tenant,
// into dst with its holes, the same way (temporary file, fsync, rename)
// and with src's permission bits, owner and group. src may be dst. Every chunk is
// authenticated and the packed form checked before dst is replaced: on
// any error dst is as it was.
func DecryptSparseFile(dst, src string, p Provider, tenant string) error {
	return withReader(src, p, tenant, func(r *Reader) error {
		fi, err := os.Stat(src)
		if err != nil {
			return err
		}
		err = writeAtomicMode(dst, fi, func(f *os.File) error {
			return unpackSparse(f, bufio.NewReaderSize(r, 1<<20), r.Size())
		})
		if err != nil {
			return fmt.Errorf("crypt: open %s: %w", filepath.Base(src), err)
		}
		return nil
	})
}

// ErrSparseFormat is wrapped by the errors of a packed sparse file that
// decrypts (so it is authentic) but is not in the packed form: it was
// sealed by EncryptFile, not EncryptSparseFile.
var ErrSparseFormat = errors.New("not a packed sparse file")

// unpackSparse writes the packed form read from r (total bytes long) into
// f, leaving holes where it has no extent.
func unpackSparse(f *os.File, r io.Reader, total int64) error {
	var hdr [24]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return fmt.Errorf("%w: %v", ErrSparseFormat, err)
	}
	if string(hdr[:8]) != SparseMagic {
		return fmt.Errorf("%w: bad magic", ErrSparseFormat)
	}
	size, n := binary.BigEndian.Uint64(hdr[8:]), binary.BigEndian.Uint64(hdr[16:])
	if size > 1<<62 || n > MaxSparseExtents || 24+16*n > uint64(total) {
		return fmt.Errorf("%w: size %d, %d extents in %d bytes", ErrSparseFormat, size, n, total)
	}
	idx := make([]byte, 16*n)
	if _, err := io.ReadFull(r, idx); err != nil {
		return fmt.Errorf("%w: extents: %v", ErrSparseFormat, err)
	}
	exts := make([]extent, n)
	var end, data uint64
	for i := range exts {
		off, l := binary.BigEndian.Uint64(idx[16*i:]), binary.BigEndian.Uint64(idx[16*i+8:])
		if l == 0 || off < end || off > size || l > size-off {
			return fmt.Errorf("%w: extent %d (%d+%d) is empty, out of order or past the size %d", ErrSparseFormat, i, off, l, size)
		}
		end = off + l
		data += l
		exts[i] = extent{int64(off), int64(l)}
	}
	if 24+16*n+data != uint64(total) {
		return fmt.Errorf("%w: extents hold %d bytes, the file %d", ErrSparseFormat, data, uint64(total)-24-16*n)
	}
	if err := f.Truncate(int64(size)); err != nil {
		return err
	}
	for _, e := range exts {
		if _, err := io.CopyN(io.NewOffsetWriter(f, e.off), r, e.len); err != nil {
			return err
		}
	}
	return nil
}

// writeAtomicMode is writeAtomic with the file's permission bits, owner
// and group set to like's before it is renamed into place (a caller that
// is not root keeps its own).
func writeAtomicMode(path string, like fs.FileInfo, fill func(*os.File) error) error {
	return atomicfile.WriteFunc(path, 0o600, func(f *os.File) error {
		if err := fill(f); err != nil {
			return err
		}
		if st, ok := like.Sys().(*syscall.Stat_t); ok && (int(st.Uid) != os.Geteuid() || int(st.Gid) != os.Getegid()) {
			if err := f.Chown(int(st.Uid), int(st.Gid)); err != nil {
				return err
			}
		}
		return f.Chmod(like.Mode().Perm())
	})
}
