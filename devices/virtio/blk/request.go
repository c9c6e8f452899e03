package blk

import (
	"encoding/binary"

	"github.com/warrenvm/warren/devices/virtio"
)

// headerLen is the size of struct virtio_blk_req's header: type le32,
// reserved le32, sector le64.
const headerLen = 16

// discardSegLen is the size of struct virtio_blk_discard_write_zeroes:
// sector le64, num_sectors le32, flags le32.
const discardSegLen = 16

// scratch is a worker's reusable state for serving requests, so that the
// request path does not allocate. Owned by one worker goroutine.
type scratch struct {
	dev *Device
	// be is the backend of the request being served, loaded once per
	// request.
	be  *backendRef
	src [][]byte // device-readable data after the header (no empty buffers)
	dst [][]byte // device-writable data before the status byte (no empty buffers)
	// bounce carries the data of a request split over several buffers to
	// and from a backend that is not a raw image file (up to maxBounce).
	bounce []byte
	// hostErrLogged is set once a host I/O error has been logged.
	hostErrLogged bool
}

// serve executes one request chain and writes its status byte. It returns
// the used length. It never fails: guest mistakes and host I/O errors
// become the status.
func (w *scratch) serve(c *virtio.Chain) uint32 {
	status, ok := w.splitWritable(c.Writable)
	if !ok {
		// No writable byte: nowhere to put a status. Hand the chain back
		// untouched; the driver sees a used length of 0.
		w.dev.Metrics.Errors.Add(1)
		return 0
	}
	w.be = w.dev.backend.Load()
	st, n := w.execute(c.Readable)
	w.be = nil
	status[0] = st
	if st != StatusOK {
		w.dev.Metrics.Errors.Add(1)
	}
	return uint32(n) + 1
}

// splitWritable finds the status byte (the last byte of the last non-empty
// writable buffer) and puts the writable bytes before it into w.dst.
func (w *scratch) splitWritable(writable [][]byte) (status []byte, ok bool) {
	last := len(writable) - 1
	for last >= 0 && len(writable[last]) == 0 {
		last--
	}
	if last < 0 {
		return nil, false
	}
	b := writable[last]
	status = b[len(b)-1:]
	w.dst = appendNonEmpty(w.dst[:0], writable[:last])
	w.dst = appendNonEmpty(w.dst, [][]byte{b[:len(b)-1]})
	return status, true
}

// transferAt checks and performs the data part of an IN request (bufs is
// w.dst) or an OUT request (write; bufs is w.src): n bytes at sector,
// whole sectors, with no data (other bytes) the other way. It returns the
// request's status.
func (w *scratch) transferAt(sector uint64, bufs [][]byte, n, other int, write bool) byte {
	d := w.dev
	if other != 0 || n%SectorSize != 0 || (write && d.readOnly) {
		return StatusIOErr
	}
	off, ok := d.span(sector, uint64(n)/SectorSize)
	if !ok {
		return StatusIOErr
	}
	what, count, bytes := "read", &d.Metrics.Reads, &d.Metrics.ReadBytes
	if write {
		what, count, bytes = "write", &d.Metrics.Writes, &d.Metrics.WriteBytes
	}
	if err := w.transfer(w.be, bufs, off, write); err != nil {
		w.hostError(what, off, err)
		return StatusIOErr
	}
	count.Add(1)
	bytes.Add(uint64(n))
	return StatusOK
}

// execute checks and performs the request whose header and data are in
// readable (and whose writable data is in w.dst). It returns the status
// and the number of data bytes written into w.dst.
func (w *scratch) execute(readable [][]byte) (status byte, written int) {
	d := w.dev
	var h [headerLen]byte
	if gather(h[:], readable, 0) < headerLen {
		return StatusIOErr, 0
	}
	typ := binary.LittleEndian.Uint32(h[0:])
	sector := binary.LittleEndian.Uint64(h[8:])
	w.src = skip(w.src[:0], readable, headerLen)
	srcLen, dstLen := total(w.src), total(w.dst)

	switch typ {
	case TypeIn:
		if st := w.transferAt(sector, w.dst, dstLen, srcLen, false); st != StatusOK {
			return st, 0
		}
		return StatusOK, dstLen

	case TypeOut:
		return w.transferAt(sector, w.src, srcLen, dstLen, true), 0

	case TypeFlush:
		if srcLen != 0 || dstLen != 0 {
			return StatusIOErr, 0
		}
		if !d.readOnly {
			if err := w.be.b.Sync(); err != nil {
				w.hostError("flush", 0, err)
				return StatusIOErr, 0
			}
		}
		d.Metrics.Flushes.Add(1)
		return StatusOK, 0

	case TypeGetID:
		if srcLen != 0 || dstLen == 0 {
			return StatusIOErr, 0
		}
		return StatusOK, scatter(w.dst, d.id[:])

	case TypeDiscard:
		if d.readOnly {
			return StatusUnsupp, 0 // not offered
		}
		if dstLen != 0 {
			return StatusIOErr, 0
		}
		return w.discard(srcLen), 0
	}
	return StatusUnsupp, 0
}

// discard checks every segment of a DISCARD request in w.src, then has the
// backend discard them (a raw image punches holes; a host file system that
// cannot makes discard a no-op, as does a backend without Discard: it is
// only a hint).
func (w *scratch) discard(srcLen int) byte {
	d := w.dev
	if srcLen == 0 || srcLen%discardSegLen != 0 || srcLen/discardSegLen > maxDiscardSeg {
		return StatusIOErr
	}
	var seg [discardSegLen]byte
	for pass := 0; pass < 2; pass++ {
		for at := 0; at < srcLen; at += discardSegLen {
			gather(seg[:], w.src, at)
			sector := binary.LittleEndian.Uint64(seg[0:])
			n := binary.LittleEndian.Uint32(seg[8:])
			flags := binary.LittleEndian.Uint32(seg[12:])
			if flags != 0 {
				return StatusUnsupp // unmap must be 0 for discard; the rest is reserved
			}
			off, ok := d.span(sector, uint64(n))
			if !ok || n > maxDiscardSectors {
				return StatusIOErr
			}
			if pass == 0 || n == 0 || w.be.discard == nil {
				continue
			}
			if err := w.be.discard.Discard(off, int64(n)*SectorSize); err != nil {
				w.hostError("discard", off, err)
				return StatusIOErr
			}
		}
	}
	d.Metrics.Discards.Add(1)
	return StatusOK
}

// span checks that n sectors from sector lie within the disk, without
// overflowing, and returns the byte offset of sector.
func (d *Device) span(sector, n uint64) (int64, bool) {
	if sector > d.capacity || n > d.capacity-sector {
		return 0, false
	}
	return int64(sector * SectorSize), true // capacity*512 is the file size
}

// hostError logs the first host I/O error of an activation; the guest sees
// IOERR for every one.
func (w *scratch) hostError(op string, off int64, err error) {
	if w.hostErrLogged {
		return
	}
	w.hostErrLogged = true
	w.dev.log.Warn("virtio-blk: host I/O error (further ones are counted, not logged)",
		"image", w.dev.path, "op", op, "offset", off, "err", err)
}

// gather copies bytes from bufs, starting off bytes in, into dst and
// returns how many it copied.
func gather(dst []byte, bufs [][]byte, off int) int {
	n := 0
	for _, b := range bufs {
		if off >= len(b) {
			off -= len(b)
			continue
		}
		n += copy(dst[n:], b[off:])
		off = 0
		if n == len(dst) {
			break
		}
	}
	return n
}

// scatter copies src into bufs in order and returns how many bytes it
// copied.
func scatter(bufs [][]byte, src []byte) int {
	n := 0
	for _, b := range bufs {
		if n == len(src) {
			break
		}
		n += copy(b, src[n:])
	}
	return n
}

// skip appends to out the non-empty parts of bufs that follow their first
// off bytes.
func skip(out, bufs [][]byte, off int) [][]byte {
	for _, b := range bufs {
		if off >= len(b) {
			off -= len(b)
			continue
		}
		out = append(out, b[off:])
		off = 0
	}
	return out
}

// appendNonEmpty appends the non-empty buffers of bufs to out.
func appendNonEmpty(out, bufs [][]byte) [][]byte {
	for _, b := range bufs {
		if len(b) > 0 {
			out = append(out, b)
		}
	}
	return out
}

func total(bufs [][]byte) int {
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	return n
}
