package disk

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Backing is what an overlay reads unallocated blocks from: a raw image
// (Raw) or another Overlay. It must not change while overlays depend on it,
// and its ReadAt must be safe for concurrent use.
type Backing interface {
	io.ReaderAt
	// Size is the disk size in bytes; it does not change.
	Size() int64
}

// Raw is a raw image file: the disk's bytes, one to one. It is safe for
// concurrent use, except Close.
type Raw struct {
	f    *os.File
	size int64
	// readOnly refuses writes; set at OpenRaw, or by Fork, which freezes a
	// writable image (atomic so that a stray writer sees it).
	readOnly atomic.Bool
}

// OpenRaw opens the raw image at path, read-only unless writable, and
// takes a flock on it: shared when read-only, so that a base can be shared
// by many readers but not opened for writing meanwhile, exclusive when
// writable.
func OpenRaw(path string, writable bool) (*Raw, error) {
	flag, lock := os.O_RDONLY, unix.LOCK_SH
	if writable {
		flag, lock = os.O_RDWR, unix.LOCK_EX
	}
	f, err := os.OpenFile(path, flag|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open raw image: %w", err)
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%s is not a regular file (%s)", path, fi.Mode().Type())
	}
	if err == nil {
		err = flock(f, lock)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open raw image: %w", err)
	}
	r := &Raw{f: f, size: fi.Size()}
	r.readOnly.Store(!writable)
	return r, nil
}

// ReadAt implements io.ReaderAt.
func (r *Raw) ReadAt(p []byte, off int64) (int, error) { return r.f.ReadAt(p, off) }

// WriteAt implements io.WriterAt within the image's size; the image is
// never grown.
func (r *Raw) WriteAt(p []byte, off int64) (int, error) {
	if r.readOnly.Load() {
		return 0, fmt.Errorf("write %s: read-only", r.f.Name())
	}
	if off < 0 || off > r.size || int64(len(p)) > r.size-off {
		return 0, fmt.Errorf("write %s: %d bytes at %d: outside the %d-byte image", r.f.Name(), len(p), off, r.size)
	}
	return r.f.WriteAt(p, off)
}

// Size is the image size in bytes, as it was at OpenRaw.
func (r *Raw) Size() int64 { return r.size }

// Discard makes n bytes at off read as zero (virtio-blk DISCARD): it
// punches a hole, or writes zeros where the file system cannot punch.
func (r *Raw) Discard(off, n int64) error {
	if r.readOnly.Load() {
		return fmt.Errorf("discard %s: read-only", r.f.Name())
	}
	if off < 0 || n < 0 || off > r.size || n > r.size-off {
		return fmt.Errorf("discard %s: %d bytes at %d: outside the %d-byte image", r.f.Name(), n, off, r.size)
	}
	if n == 0 {
		return nil
	}
	if err := punchHole(r.f, off, n); err != nil {
		return fmt.Errorf("discard %s at %d: %w", r.f.Name(), off, err)
	}
	return nil
}

// Sync makes the writes so far durable (fdatasync); a no-op on a
// read-only image.
func (r *Raw) Sync() error {
	if r.readOnly.Load() {
		return nil
	}
	return fdatasync(r.f)
}

// Close closes the file and releases the lock.
func (r *Raw) Close() error { return r.f.Close() }

// Path is the path the image was opened with.
func (r *Raw) Path() string { return r.f.Name() }

// flock takes lock (LOCK_SH or LOCK_EX) on f without waiting.
func flock(f *os.File, lock int) error {
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var lerr error
	if err := raw.Control(func(fd uintptr) { lerr = unix.Flock(int(fd), lock|unix.LOCK_NB) }); err != nil {
		return err
	}
	if errors.Is(lerr, unix.EWOULDBLOCK) {
		return fmt.Errorf("%s is in use (locked by another process or disk)", f.Name())
	}
	if lerr != nil {
		return fmt.Errorf("flock %s: %w", f.Name(), lerr)
	}
	return nil
}

// punchHole makes the n bytes of f at off zero and, where the file system
// can punch holes, unallocated; elsewhere it writes zeros.
func punchHole(f *os.File, off, n int64) error {
	err := control(f, func(fd int) error {
		return unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	})
	if errors.Is(err, unix.EOPNOTSUPP) {
		err = nil
		for at := int64(0); at < n && err == nil; at += int64(len(zeros)) {
			_, err = f.WriteAt(zeros[:min(n-at, int64(len(zeros)))], off+at)
		}
	}
	return err
}

// control runs fn on f's descriptor.
func control(f *os.File, fn func(fd int) error) error {
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := raw.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

func fdatasync(f *os.File) error {
	err := control(f, func(fd int) error {
		for {
			if err := unix.Fdatasync(fd); err != unix.EINTR {
				return err
			}
		}
	})
	if err != nil {
		return fmt.Errorf("fdatasync %s: %w", f.Name(), err)
	}
	return nil
}
