package vsock

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"

	"github.com/warrenvm/warren/devices/virtio"
)

// Queue indices (virtio 1.2, 5.10.2).
const (
	queueRx    = 0
	queueTx    = 1
	queueEvent = 2
)

// DefaultBufAlloc is the receive buffer each connection advertises to the
// guest when Device.BufAlloc is zero: the most guest data buffered per
// connection before the guest runs out of credit.
const DefaultBufAlloc = 256 << 10

// maxStrayRst bounds the RSTs queued for guest packets that belong to no
// connection; beyond it they are dropped (the guest times out instead), so
// a guest spraying packets cannot make the device allocate.
const maxStrayRst = 64

// Metrics are counters an operator reads.
type Metrics struct {
	// TxPackets counts packets taken from the guest's tx queue.
	TxPackets atomic.Uint64
	// RxPackets counts packets put on the guest's rx queue.
	RxPackets atomic.Uint64
	// Dropped counts guest packets dropped as malformed or misaddressed.
	Dropped atomic.Uint64
	// Resets counts RSTs sent to the guest.
	Resets atomic.Uint64
}

// Device is a userspace virtio-vsock device (ID 19). It parses the
// guest's tx packets, routes them to connections keyed by (host port,
// guest port), and delivers the connections' packets on the rx queue.
// The event queue is offered but unused (it only matters for
// TRANSPORT_RESET after a restore, not yet implemented).
//
// Threads: the fields below are configuration, set before the device is
// attached and not changed after. Per activation, one worker goroutine
// owns the three queues and every connection (a session); Reset stops it
// and waits, dropping all connections, as a device reset does.
//
// Not done yet: the host side. Accept decides guest REQUESTs; guest data
// stays buffered in its Conn (bounded by BufAlloc, after which the guest
// runs out of credit), and no host data is sent to the guest.
type Device struct {
	// CID is the guest's context ID (config space guest_cid); at least 3.
	CID uint64
	// BufAlloc is the receive buffer advertised per connection;
	// DefaultBufAlloc when zero.
	BufAlloc uint32
	// Accept decides whether a guest REQUEST to host port k.HostPort is
	// served; nil refuses every one. It runs on the worker goroutine.
	Accept func(k Key) bool
	// Metrics counts what the device did.
	Metrics Metrics

	workers virtio.Workers
}

// Type implements virtio.Device.
func (d *Device) Type() uint32 { return virtio.TypeVsock }

// Features implements virtio.Device.
func (d *Device) Features() uint64 { return virtio.FeatureIndirectDesc | virtio.FeatureEventIdx }

// QueueSizes implements virtio.Device: rx, tx and event.
func (d *Device) QueueSizes() []uint16 {
	return []uint16{virtio.MaxQueueSize, virtio.MaxQueueSize, virtio.MaxQueueSize}
}

// ReadConfig implements virtio.Device: the configuration is guest_cid, a
// little-endian 64-bit value; bytes beyond it read as zero.
func (d *Device) ReadConfig(off uint64, data []byte) {
	var cfg [8]byte
	binary.LittleEndian.PutUint64(cfg[:], d.CID)
	for i := range data {
		data[i] = 0
		if off < uint64(len(cfg)) && uint64(i) < uint64(len(cfg))-off {
			data[i] = cfg[off+uint64(i)]
		}
	}
}

// WriteConfig implements virtio.Device: the configuration is read-only.
func (d *Device) WriteConfig(off uint64, data []byte) {}

// Activate implements virtio.Device.
func (d *Device) Activate(a *virtio.Activation) error {
	if len(a.Queues) != 3 || !a.Queues[queueRx].Ready || !a.Queues[queueTx].Ready {
		return fmt.Errorf("%w: virtio-vsock needs its rx and tx queues", virtio.ErrBroken)
	}
	if d.CID < 3 || d.CID >= 0xffffffff {
		return fmt.Errorf("vsock: guest CID %d, want 3 to 2^32-2", d.CID)
	}
	s := &session{dev: d, a: a, conns: map[Key]*Conn{}}
	return d.workers.Start(s.run)
}

// Reset implements virtio.Device.
func (d *Device) Reset() { d.workers.Stop() }

func (d *Device) bufAlloc() uint32 {
	if d.BufAlloc == 0 {
		return DefaultBufAlloc
	}
	return d.BufAlloc
}

// session is one activation's state, owned by its worker goroutine.
type session struct {
	dev   *Device
	a     *virtio.Activation
	conns map[Key]*Conn
	// stray are RSTs for packets of no connection, at most maxStrayRst.
	stray []Header
}

func (s *session) run(stop <-chan struct{}) {
	for {
		if err := s.service(); err != nil {
			s.a.Broken(err)
			return
		}
		select {
		case <-stop:
			return
		case <-s.a.Kicks[queueRx]:
		case <-s.a.Kicks[queueTx]:
		case <-s.a.Kicks[queueEvent]:
		}
	}
}

// service takes every tx packet, then delivers what it can on rx.
func (s *session) service() error {
	tx := s.a.Queues[queueTx]
	for {
		c, err := tx.Pop(s.a.Mem)
		if err != nil {
			return err
		}
		if c == nil {
			break
		}
		s.handleTx(c)
		if err := tx.Push(s.a.Mem, c.Head, 0); err != nil {
			return err
		}
	}
	if err := s.a.InterruptIfNeeded(tx); err != nil {
		return err
	}
	if err := s.deliver(); err != nil {
		return err
	}
	for k, c := range s.conns {
		if c.Done() {
			delete(s.conns, k)
		}
	}
	return nil
}

// handleTx parses one tx chain (header, then payload, in any split over
// the readable buffers) and routes it. Malformed or misaddressed packets
// are dropped: they are the guest's problem, not a broken queue.
func (s *session) handleTx(c *virtio.Chain) {
	s.dev.Metrics.TxPackets.Add(1)
	var hb [HeaderLen]byte
	if gather(c.Readable, 0, hb[:]) < HeaderLen {
		s.dev.Metrics.Dropped.Add(1)
		return
	}
	h, err := ParseHeader(hb[:])
	if err != nil || h.SrcCID != s.dev.CID || h.DstCID != CIDHost ||
		uint64(c.ReadableLen()) < HeaderLen+uint64(h.Len) {
		s.dev.Metrics.Dropped.Add(1)
		return
	}
	var payload []byte
	if h.Len > 0 {
		payload = make([]byte, h.Len)
		gather(c.Readable, HeaderLen, payload)
	}
	k := Key{HostPort: h.DstPort, GuestPort: h.SrcPort}
	if conn := s.conns[k]; conn != nil {
		conn.HandleGuest(h, payload)
		return
	}
	switch {
	case h.Op == OpRst:
		// Never answer an RST.
	case h.Op == OpRequest && s.dev.Accept != nil && s.dev.Accept(k):
		s.conns[k] = Accept(h, s.dev.bufAlloc())
	case len(s.stray) < maxStrayRst:
		s.stray = append(s.stray, ResetFor(h))
	default:
		s.dev.Metrics.Dropped.Add(1)
	}
}

// deliver puts pending packets on the rx queue while it has buffers;
// what does not fit stays pending in its connection.
func (s *session) deliver() error {
	rx := s.a.Queues[queueRx]
	next := func() (Header, bool) {
		if len(s.stray) > 0 {
			h := s.stray[0]
			s.stray = s.stray[1:]
			return h, true
		}
		for _, c := range s.conns {
			if h, ok := c.Next(); ok {
				return h, true
			}
		}
		return Header{}, false
	}
	for {
		if len(s.stray) == 0 && !s.anyPending() {
			break
		}
		ch, err := rx.Pop(s.a.Mem)
		if err != nil {
			return err
		}
		if ch == nil {
			break // stays pending until the driver adds rx buffers
		}
		if ch.WritableLen() < HeaderLen {
			return fmt.Errorf("%w: vsock rx buffer of %d bytes, need %d", virtio.ErrBroken, ch.WritableLen(), HeaderLen)
		}
		h, _ := next()
		var hb [HeaderLen]byte
		h.Encode(hb[:])
		scatter(ch.Writable, hb[:])
		if err := rx.Push(s.a.Mem, ch.Head, HeaderLen); err != nil {
			return err
		}
		s.dev.Metrics.RxPackets.Add(1)
		if h.Op == OpRst {
			s.dev.Metrics.Resets.Add(1)
		}
	}
	return s.a.InterruptIfNeeded(rx)
}

func (s *session) anyPending() bool {
	for _, c := range s.conns {
		if c.pending != 0 {
			return true
		}
	}
	return false
}

// gather copies the bytes of bufs, from offset off of their concatenation,
// into dst, and returns how many it copied.
func gather(bufs [][]byte, off uint64, dst []byte) int {
	n := 0
	for _, b := range bufs {
		if n == len(dst) {
			break
		}
		if off >= uint64(len(b)) {
			off -= uint64(len(b))
			continue
		}
		n += copy(dst[n:], b[off:])
		off = 0
	}
	return n
}

// scatter copies src over the concatenation of bufs.
func scatter(bufs [][]byte, src []byte) {
	for _, b := range bufs {
		if len(src) == 0 {
			return
		}
		src = src[copy(b, src):]
	}
}
