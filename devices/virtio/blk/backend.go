package blk

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Backend is what a disk reads and writes: a raw image file (New), or
// anything else with the same shape, such as a copy-on-write overlay
// (cow/disk.Overlay satisfies it).
//
// The device calls ReadAt, WriteAt, Sync and Discard from its worker
// goroutine only, one request at a time, within [0, Size()); Close comes
// from Device.Close. A Backend need not be safe for concurrent use by the
// device, but the caller may read it meanwhile (SaveState, a fork) only if
// the Backend allows that.
type Backend interface {
	io.ReaderAt
	io.WriterAt
	// Size is the disk size in bytes, a multiple of SectorSize; it must
	// not change while the device serves the backend.
	Size() int64
	// Sync makes the writes so far durable (the guest's FLUSH).
	Sync() error
	// Close releases the backend.
	Close() error
}

// Discarder is a Backend that can drop a byte range: after Discard(off, n)
// the range reads as zero. The device uses it, when the backend has it, for
// the guest's DISCARD; without it DISCARD is accepted and does nothing (it
// is a hint).
type Discarder interface {
	Discard(off, n int64) error
}

// backendRef is the backend the worker serves, with what the device found
// out about it once, at NewWithBackend or SwapBackend. It is immutable;
// Device.backend points to the current one.
type backendRef struct {
	b Backend
	// file is b when it is New's raw image file: the worker then does its
	// I/O with preadv/pwritev straight into guest memory.
	file *fileBackend
	// discard is b when it can discard, else nil.
	discard Discarder
}

func newBackendRef(b Backend) *backendRef {
	r := &backendRef{b: b}
	r.file, _ = b.(*fileBackend)
	r.discard, _ = b.(Discarder)
	return r
}

// fileBackend is a raw image file (New): the disk's bytes, one to one.
type fileBackend struct {
	f        *os.File
	raw      syscall.RawConn
	size     int64
	readOnly bool
}

func (fb *fileBackend) ReadAt(p []byte, off int64) (int, error)  { return fb.f.ReadAt(p, off) }
func (fb *fileBackend) WriteAt(p []byte, off int64) (int, error) { return fb.f.WriteAt(p, off) }
func (fb *fileBackend) Size() int64                              { return fb.size }
func (fb *fileBackend) Close() error                             { return fb.f.Close() }

// Sync fdatasyncs the image (a no-op when it is open read-only).
func (fb *fileBackend) Sync() error {
	if fb.readOnly {
		return nil
	}
	return fb.control(func(fd int) error {
		for {
			if err := unix.Fdatasync(fd); err != unix.EINTR {
				return err
			}
		}
	})
}

// Discard punches a hole (the file keeps its size). A host file system
// that cannot punch holes makes it a no-op: discard is only a hint.
func (fb *fileBackend) Discard(off, n int64) error {
	if n == 0 {
		return nil
	}
	err := fb.control(func(fd int) error {
		return unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
	})
	if err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
		return err
	}
	return nil
}

// control runs fn on the image's file descriptor, which stays open while
// fn runs even if Close races with it.
func (fb *fileBackend) control(fn func(fd int) error) error {
	var err error
	if cerr := fb.raw.Control(func(fd uintptr) { err = fn(int(fd)) }); cerr != nil {
		return cerr
	}
	return err
}

// transfer reads the image into bufs (or writes bufs to it) from byte off
// on, in as few system calls as the kernel allows. bufs must hold no empty
// buffer; it is consumed (its first buffers may be resliced).
func (fb *fileBackend) transfer(bufs [][]byte, off int64, write bool) error {
	return fb.control(func(fd int) error { return vecIO(fd, bufs, off, write) })
}

// maxBounce bounds the bounce buffer through which the data of a request
// split over several guest buffers goes to and from a backend other than
// a raw image file, so that the backend sees one call per MiB rather than
// one per guest buffer.
const maxBounce = 1 << 20

// transfer moves the data of one request between bufs (no empty buffer)
// and the backend at byte off: with preadv/pwritev for a raw image file,
// else through ReadAt/WriteAt, a single buffer directly and several
// through w.bounce.
func (w *scratch) transfer(be *backendRef, bufs [][]byte, off int64, write bool) error {
	if be.file != nil {
		return be.file.transfer(bufs, off, write)
	}
	if len(bufs) == 1 {
		return backendIO(be.b, bufs[0], off, write)
	}
	for len(bufs) > 0 {
		n := min(total(bufs), maxBounce)
		if cap(w.bounce) < n {
			w.bounce = make([]byte, n) // grows once or twice per worker, up to maxBounce
		}
		b := w.bounce[:n]
		if write {
			gather(b, bufs, 0)
			if err := backendIO(be.b, b, off, true); err != nil {
				return err
			}
		} else {
			if err := backendIO(be.b, b, off, false); err != nil {
				return err
			}
			scatter(bufs, b)
		}
		bufs = advance(bufs, n)
		off += int64(n)
	}
	return nil
}

// backendIO reads all of p from b at off (or writes it); a short transfer
// is an error.
func backendIO(b Backend, p []byte, off int64, write bool) error {
	if write {
		n, err := b.WriteAt(p, off)
		if err == nil && n < len(p) {
			err = io.ErrShortWrite
		}
		if err != nil {
			return fmt.Errorf("at offset %d: %w", off, err)
		}
		return nil
	}
	n, err := b.ReadAt(p, off)
	if n == len(p) {
		return nil // io.ReaderAt may say io.EOF with a full read at the end
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("at offset %d: %w", off+int64(n), err)
}

// advance drops the first n bytes of bufs (no empty buffer), reslicing its
// first remaining buffer if n ends inside it.
func advance(bufs [][]byte, n int) [][]byte {
	for n > 0 {
		if n >= len(bufs[0]) {
			n -= len(bufs[0])
			bufs = bufs[1:]
		} else {
			bufs[0] = bufs[0][n:]
			n = 0
		}
	}
	return bufs
}
