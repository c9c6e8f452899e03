package blk

import (
	"fmt"
	"io"

	"golang.org/x/sys/unix"
)

// iovMax is the most buffers one preadv/pwritev takes (Linux's UIO_MAXIOV).
const iovMax = 1024

// control runs fn on the image's file descriptor, which stays open while
// fn runs even if Close races with it.
func (d *Device) control(fn func(fd int) error) error {
	var err error
	if cerr := d.raw.Control(func(fd uintptr) { err = fn(int(fd)) }); cerr != nil {
		return cerr
	}
	return err
}

// transfer reads the image into bufs (or writes bufs to it) from byte off
// on, in as few system calls as the kernel allows. bufs must hold no empty
// buffer; it is consumed (its first buffers may be resliced).
func (d *Device) transfer(bufs [][]byte, off int64, write bool) error {
	return d.control(func(fd int) error { return vecIO(fd, bufs, off, write) })
}

// vecIO is transfer on a file descriptor. Short transfers are resumed; a
// read that hits the end of the file (the image shrank under us) fails.
func vecIO(fd int, bufs [][]byte, off int64, write bool) error {
	for len(bufs) > 0 {
		chunk := bufs[:min(len(bufs), iovMax)]
		var n int
		var err error
		if write {
			n, err = unix.Pwritev(fd, chunk, off)
		} else {
			n, err = unix.Preadv(fd, chunk, off)
		}
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return fmt.Errorf("at offset %d: %w", off, err)
		case n == 0 && write:
			return fmt.Errorf("at offset %d: %w", off, io.ErrShortWrite)
		case n == 0:
			return fmt.Errorf("at offset %d: %w", off, io.ErrUnexpectedEOF)
		}
		off += int64(n)
		for n > 0 {
			if n >= len(bufs[0]) {
				n -= len(bufs[0])
				bufs = bufs[1:]
			} else {
				bufs[0] = bufs[0][n:]
				n = 0
			}
		}
	}
	return nil
}
