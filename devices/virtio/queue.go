// Package virtio is Warren's virtio 1.x core: split virtqueues with strict
// validation of everything the guest controls, the virtio-mmio transport
// (version 2), and the interface devices implement.
//
// Trust: every index, address, length and flag read from guest memory is
// hostile. A malformed ring or chain is reported as an error wrapping
// ErrBroken; the transport then marks the device NEEDS_RESET and stops
// serving it. Nothing the guest writes can make the VMM panic, spin, or
// allocate without bound.
//
// Threads: a Queue is owned by its device's worker goroutines once the
// driver has set DRIVER_OK, and they touch it, and guest memory, only
// inside service passes (Activation.Enter to Leave). The transport touches
// it only while the device is not activated (configuration), after the
// workers have stopped (reset, save), or while the transport is quiesced
// (save): see MMIO.Quiesce for the whole invariant.
package virtio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// Memory is the guest memory a queue reads: guestmem.Memory implements it,
// tests use a fake.
type Memory interface {
	// Slice returns the host bytes backing guest [gpa, gpa+n), or an error
	// when that range is not entirely guest RAM.
	Slice(gpa, n uint64) ([]byte, error)
}

// WriteTracker is implemented by guest memory that records which pages the
// VMM writes (KVM's dirty log sees only the guest's own writes). Queues
// mark every range a device may write through them: each device-writable
// buffer when its chain is popped (whether or not the device fills it, so
// the record errs on the side of more pages), the used ring entries and
// index, and the avail_event field. Incremental snapshots add these pages
// to KVM's dirty log.
type WriteTracker interface {
	MarkWritten(gpa, n uint64)
}

// markWritten records a device write of [gpa, gpa+n) when mem tracks them.
func markWritten(mem Memory, gpa, n uint64) {
	if t, ok := mem.(WriteTracker); ok {
		t.MarkWritten(gpa, n)
	}
}

// ErrBroken marks a fault of the guest driver: the device must be reset.
var ErrBroken = errors.New("virtio: malformed queue")

// Descriptor flags.
const (
	descFNext     = 1
	descFWrite    = 2
	descFIndirect = 4
)

// Ring flags.
const (
	availFNoInterrupt = 1
	usedFNoNotify     = 1
)

// MaxQueueSize is the largest queue Warren offers (a power of two).
const MaxQueueSize = 256

// maxChainBytes bounds the total size of one chain's buffers.
const maxChainBytes = 1 << 30

// Queue is one split virtqueue: its configuration as written by the driver
// through the transport, and the device's progress through it.
type Queue struct {
	// Configuration, written by the driver while the queue is not ready.
	MaxSize uint16
	Size    uint16
	Ready   bool
	Desc    uint64 // descriptor table
	Avail   uint64 // driver area (available ring)
	Used    uint64 // device area (used ring)

	// EventIdx is true when VIRTIO_RING_F_EVENT_IDX was negotiated.
	EventIdx bool

	// Device progress.
	NextAvail uint16 // next available-ring entry to take
	NextUsed  uint16 // next used-ring entry to fill
	// signalledUsed is NextUsed when the driver was last notified.
	signalledUsed uint16
	fence         uint32 // target of the atomic store used as a full memory barrier
}

// Chain is one descriptor chain taken from the available ring: the
// device-readable buffers, then the device-writable ones. The slices alias
// guest memory.
type Chain struct {
	Head     uint16
	Readable [][]byte
	Writable [][]byte
}

// ReadableLen is the total length of the readable buffers.
func (c *Chain) ReadableLen() int { return total(c.Readable) }

// WritableLen is the total length of the writable buffers.
func (c *Chain) WritableLen() int { return total(c.Writable) }

func total(bufs [][]byte) int {
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	return n
}

// Reset returns the queue to its initial state (keeping MaxSize).
func (q *Queue) Reset() {
	*q = Queue{MaxSize: q.MaxSize, Size: q.MaxSize}
}

// Validate checks the driver's configuration when it sets the queue ready:
// a power-of-two size within MaxSize, aligned rings inside guest memory.
func (q *Queue) Validate(mem Memory) error {
	if q.Size == 0 || q.Size > q.MaxSize || q.Size&(q.Size-1) != 0 {
		return fmt.Errorf("%w: queue size %d (max %d, power of two)", ErrBroken, q.Size, q.MaxSize)
	}
	n := uint64(q.Size)
	areas := []struct {
		name       string
		addr, size uint64
		align      uint64
	}{
		{"descriptor table", q.Desc, 16 * n, 16},
		{"available ring", q.Avail, 6 + 2*n, 2},
		{"used ring", q.Used, 6 + 8*n, 4},
	}
	for _, a := range areas {
		if a.addr%a.align != 0 {
			return fmt.Errorf("%w: %s at %#x is not %d-byte aligned", ErrBroken, a.name, a.addr, a.align)
		}
		if _, err := mem.Slice(a.addr, a.size); err != nil {
			return fmt.Errorf("%w: %s [%#x, +%d) is not in guest RAM", ErrBroken, a.name, a.addr, a.size)
		}
	}
	return nil
}

func (q *Queue) u16(mem Memory, gpa uint64) (uint16, error) {
	b, err := mem.Slice(gpa, 2)
	if err != nil {
		return 0, fmt.Errorf("%w: read at %#x: %v", ErrBroken, gpa, err)
	}
	return binary.LittleEndian.Uint16(b), nil
}

func (q *Queue) put16(mem Memory, gpa uint64, v uint16) error {
	b, err := mem.Slice(gpa, 2)
	if err != nil {
		return fmt.Errorf("%w: write at %#x: %v", ErrBroken, gpa, err)
	}
	binary.LittleEndian.PutUint16(b, v)
	markWritten(mem, gpa, 2)
	return nil
}

// loadRingHeader reads the (flags, idx) pair at the start of a ring with
// one atomic 32-bit load when the ring is 4-byte aligned (always, for the
// used ring; in practice, for the available ring), which orders the reads of
// the entries the index covers after it.
func loadRingHeader(mem Memory, ring uint64) (flags, idx uint16, err error) {
	b, err := mem.Slice(ring, 4)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: ring header at %#x: %v", ErrBroken, ring, err)
	}
	var v uint32
	if ring%4 == 0 {
		v = atomic.LoadUint32((*uint32)(unsafe.Pointer(&b[0])))
	} else {
		v = binary.LittleEndian.Uint32(b)
	}
	return uint16(v), uint16(v >> 16), nil
}

// storeRingHeader writes (flags, idx) with one atomic 32-bit store, which
// publishes the entries written before it. ring must be 4-byte aligned.
func storeRingHeader(mem Memory, ring uint64, flags, idx uint16) error {
	b, err := mem.Slice(ring, 4)
	if err != nil {
		return fmt.Errorf("%w: ring header at %#x: %v", ErrBroken, ring, err)
	}
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&b[0])), uint32(flags)|uint32(idx)<<16)
	markWritten(mem, ring, 4)
	return nil
}

// descriptor is one decoded descriptor.
type descriptor struct {
	addr  uint64
	len   uint32
	flags uint16
	next  uint16
}

func readDesc(mem Memory, table uint64, i uint16) (descriptor, error) {
	b, err := mem.Slice(table+16*uint64(i), 16)
	if err != nil {
		return descriptor{}, fmt.Errorf("%w: descriptor %d: %v", ErrBroken, i, err)
	}
	le := binary.LittleEndian
	return descriptor{le.Uint64(b), le.Uint32(b[8:]), le.Uint16(b[12:]), le.Uint16(b[14:])}, nil
}

// Pending reports whether the driver has made buffers available.
func (q *Queue) Pending(mem Memory) (bool, error) {
	_, idx, err := loadRingHeader(mem, q.Avail)
	if err != nil {
		return false, err
	}
	return idx != q.NextAvail, nil
}

// Pop takes the next available chain; it returns nil (and no error) when
// the ring is empty.
func (q *Queue) Pop(mem Memory) (*Chain, error) {
	if !q.Ready {
		return nil, fmt.Errorf("%w: queue not ready", ErrBroken)
	}
	_, availIdx, err := loadRingHeader(mem, q.Avail)
	if err != nil {
		return nil, err
	}
	if availIdx == q.NextAvail {
		if !q.EventIdx {
			return nil, nil
		}
		// Ask for a notification on the next buffer, then look again: the
		// driver may have added one before it could see our request.
		if err := q.put16(mem, q.Used+4+8*uint64(q.Size), q.NextAvail); err != nil {
			return nil, err
		}
		atomic.StoreUint32(&q.fence, 0) // full barrier: our store before the next load
		if _, availIdx, err = loadRingHeader(mem, q.Avail); err != nil {
			return nil, err
		}
		if availIdx == q.NextAvail {
			return nil, nil
		}
	}
	if uint16(availIdx-q.NextAvail) > q.Size {
		return nil, fmt.Errorf("%w: available index jumped from %d to %d (queue size %d)", ErrBroken, q.NextAvail, availIdx, q.Size)
	}
	head, err := q.u16(mem, q.Avail+4+2*uint64(q.NextAvail%q.Size))
	if err != nil {
		return nil, err
	}
	c, err := q.walk(mem, head)
	if err != nil {
		return nil, err
	}
	q.NextAvail++
	return c, nil
}

// walk follows a chain from head, descending into at most one indirect
// table, and checks every buffer.
func (q *Queue) walk(mem Memory, head uint16) (*Chain, error) {
	if head >= q.Size {
		return nil, fmt.Errorf("%w: chain head %d out of range (size %d)", ErrBroken, head, q.Size)
	}
	c := &Chain{Head: head}
	var total uint64
	table, tableLen := q.Desc, uint32(q.Size)
	i, seen, indirect := head, uint32(0), false
	for {
		seen++
		if seen > tableLen {
			return nil, fmt.Errorf("%w: descriptor chain from %d loops or exceeds %d entries", ErrBroken, head, tableLen)
		}
		d, err := readDesc(mem, table, i)
		if err != nil {
			return nil, err
		}
		if d.flags&descFIndirect != 0 {
			switch {
			case indirect:
				return nil, fmt.Errorf("%w: nested indirect descriptor", ErrBroken)
			case d.flags&descFNext != 0:
				return nil, fmt.Errorf("%w: indirect descriptor with NEXT set", ErrBroken)
			case d.len == 0 || d.len%16 != 0:
				return nil, fmt.Errorf("%w: indirect table of %d bytes", ErrBroken, d.len)
			case d.len/16 > uint32(q.Size):
				// No chain may be longer than the queue (virtio 1.2,
				// 2.7.5.3.1), which also bounds the work per chain.
				return nil, fmt.Errorf("%w: indirect table of %d descriptors, more than the queue size %d", ErrBroken, d.len/16, q.Size)
			case len(c.Readable)+len(c.Writable) > 0:
				return nil, fmt.Errorf("%w: indirect descriptor after direct buffers", ErrBroken)
			}
			if _, err := mem.Slice(d.addr, uint64(d.len)); err != nil {
				return nil, fmt.Errorf("%w: indirect table [%#x, +%d) outside guest RAM", ErrBroken, d.addr, d.len)
			}
			table, tableLen, i, seen, indirect = d.addr, d.len/16, 0, 0, true
			continue
		}
		buf, err := mem.Slice(d.addr, uint64(d.len))
		if err != nil {
			return nil, fmt.Errorf("%w: buffer [%#x, +%d) outside guest RAM", ErrBroken, d.addr, d.len)
		}
		if total += uint64(d.len); total > maxChainBytes {
			return nil, fmt.Errorf("%w: chain longer than %d bytes", ErrBroken, maxChainBytes)
		}
		if d.flags&descFWrite != 0 {
			c.Writable = append(c.Writable, buf)
			markWritten(mem, d.addr, uint64(d.len))
		} else {
			if len(c.Writable) > 0 {
				return nil, fmt.Errorf("%w: device-readable buffer after a writable one", ErrBroken)
			}
			c.Readable = append(c.Readable, buf)
		}
		if d.flags&descFNext == 0 {
			return c, nil
		}
		if uint32(d.next) >= tableLen {
			return nil, fmt.Errorf("%w: next descriptor %d out of range (%d)", ErrBroken, d.next, tableLen)
		}
		i = d.next
	}
}

// Push returns chain head to the driver with written bytes of the writable
// buffers used, and publishes it.
func (q *Queue) Push(mem Memory, head uint16, written uint32) error {
	if err := q.Stage(mem, head, written); err != nil {
		return err
	}
	return q.Publish(mem)
}

// Stage writes a used entry without making it visible to the driver; the
// next Publish (or Push) publishes all staged entries at once. Devices use
// it for one packet spread over several chains.
func (q *Queue) Stage(mem Memory, head uint16, written uint32) error {
	slot := q.Used + 4 + 8*uint64(q.NextUsed%q.Size)
	b, err := mem.Slice(slot, 8)
	if err != nil {
		return fmt.Errorf("%w: used ring entry: %v", ErrBroken, err)
	}
	binary.LittleEndian.PutUint32(b, uint32(head))
	binary.LittleEndian.PutUint32(b[4:], written)
	markWritten(mem, slot, 8)
	q.NextUsed++
	return nil
}

// Publish makes the staged used entries visible to the driver.
func (q *Queue) Publish(mem Memory) error {
	flags, _, err := loadRingHeader(mem, q.Used)
	if err != nil {
		return err
	}
	return storeRingHeader(mem, q.Used, flags, q.NextUsed)
}

// NeedsInterrupt reports whether the driver wants an interrupt for the
// entries pushed since the last call that returned true (event-idx aware).
func (q *Queue) NeedsInterrupt(mem Memory) (bool, error) {
	old, nw := q.signalledUsed, q.NextUsed
	if old == nw {
		return false, nil
	}
	var need bool
	if q.EventIdx {
		ev, err := q.u16(mem, q.Avail+4+2*uint64(q.Size))
		if err != nil {
			return false, err
		}
		need = uint16(nw-ev-1) < uint16(nw-old)
	} else {
		flags, _, err := loadRingHeader(mem, q.Avail)
		if err != nil {
			return false, err
		}
		need = flags&availFNoInterrupt == 0
	}
	if need {
		q.signalledUsed = nw
	}
	return need, nil
}

// EnableNotify asks the driver to notify the device about new buffers (with
// event-idx: from the next one after those already seen).
func (q *Queue) EnableNotify(mem Memory) error {
	if q.EventIdx {
		return q.put16(mem, q.Used+4+8*uint64(q.Size), q.NextAvail)
	}
	return storeRingHeader(mem, q.Used, 0, q.NextUsed)
}
