package blk

import (
	"fmt"
	"io"

	"golang.org/x/sys/unix"
)

// iovMax is the most buffers one preadv/pwritev takes (Linux's UIO_MAXIOV).
const iovMax = 1024

// vecIO is fileBackend.transfer on a file descriptor. Short transfers are
// resumed; a read that hits the end of the file (the image shrank under us)
// fails.
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
		bufs = advance(bufs, n)
	}
	return nil
}
