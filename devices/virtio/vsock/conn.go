package vsock

import "fmt"

// State is where a connection stands in its life (virtio 1.2, 5.10.6.6).
type State int

// Connection states.
const (
	// StateConnecting: the host asked for the connection; a REQUEST is
	// queued or sent and the guest has not answered yet.
	StateConnecting State = iota
	// StateEstablished: data may flow both ways (subject to credit and to
	// half-closes recorded in the shutdown flags).
	StateEstablished
	// StateLocalClosed: the host side shut down both directions; a
	// SHUTDOWN is queued or sent and we wait for the guest's RST. The
	// device bounds that wait with a timer of its own and calls Reset.
	StateLocalClosed
	// StatePeerClosed: the guest shut down both directions. Data already
	// buffered for the host side is still delivered; once it is, an RST is
	// sent and the connection closes.
	StatePeerClosed
	// StateClosed: finished. Pending packets (an RST) may still have to be
	// delivered; after that the device forgets the connection (see Done).
	StateClosed
)

// String names the state, for logs.
func (s State) String() string {
	switch s {
	case StateConnecting:
		return "connecting"
	case StateEstablished:
		return "established"
	case StateLocalClosed:
		return "local-closed"
	case StatePeerClosed:
		return "peer-closed"
	case StateClosed:
		return "closed"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Pending control packets, in the order Next hands them out.
const (
	pendRst = 1 << iota
	pendRequest
	pendResponse
	pendShutdown
	pendCreditUpdate
	pendCreditRequest
)

// Conn is the state machine of one stream connection between a host port
// and a guest port, kept apart from the queue plumbing (as Firecracker's
// vsock/csm is). It does no I/O: the device feeds it the guest's packets
// (HandleGuest) and the host side's progress (Consume, Shutdown, Reset),
// and pulls from it the packets to put on the guest's rx queue (Next for
// control packets, SendWindow and RWHeader for data).
//
// Control packets are not queued: a connection holds at most one of each
// kind as a pending flag, so its memory does not grow however fast the
// guest talks, and headers are stamped with credit figures when they are
// taken, not when they were decided on.
//
// Data from the guest is buffered until the host side consumes it, never
// more than the buf_alloc we advertise (Credit.Received enforces it; a
// guest that overruns its credit is reset). When the host side stops
// reading, fwd_cnt stops moving, so the guest runs out of credit and stops
// sending: flow control, not buffering, absorbs a slow reader.
//
// A Conn is owned by the one goroutine that runs its device's queues; it is
// not safe for concurrent use.
type Conn struct {
	guestCID  uint64
	hostPort  uint32 // local port, on CIDHost
	guestPort uint32 // peer port, on guestCID

	state   State
	credit  *Credit
	pending uint32 // pend* flags
	// creditAsked is set once a CREDIT_REQUEST is queued and cleared when
	// the guest's figures give us credit again, so a stalled sender asks
	// once: a guest answering with the same (still full) figures does not
	// start a request/update ping-pong; it sends an update of its own once
	// it has read.
	creditAsked bool

	// localShut and peerShut accumulate SHUTDOWN flags sent and received.
	localShut uint32
	peerShut  uint32

	// rx holds guest data not yet consumed by the host side;
	// len(rx) == credit.rxQueued <= buf_alloc.
	rx []byte
	// spare is an empty buffer of at most maxSpare bytes' capacity that rx
	// starts from when it is empty, so that a connection passing small
	// messages does not allocate per packet.
	spare []byte
}

// maxSpare bounds the buffer a Conn keeps for its next packets while it
// holds no data (Conn.spare): an idle connection pins no more.
const maxSpare = 16 << 10

// Key identifies a connection on one device: the host (local) port and
// the guest (peer) port.
type Key struct {
	HostPort  uint32
	GuestPort uint32
}

// Connect starts a host-initiated connection from hostPort to guestPort of
// the guest at guestCID, buffering at most bufAlloc bytes from the guest.
// A REQUEST is pending.
func Connect(guestCID uint64, hostPort, guestPort, bufAlloc uint32) *Conn {
	return &Conn{guestCID: guestCID, hostPort: hostPort, guestPort: guestPort,
		state: StateConnecting, credit: NewCredit(bufAlloc), pending: pendRequest}
}

// Accept takes a guest's REQUEST (already validated, addressed to CIDHost)
// that the host side agreed to serve, buffering at most bufAlloc bytes
// from the guest. The connection is established and a RESPONSE pending.
// A REQUEST nobody serves is answered with ResetFor instead.
func Accept(req Header, bufAlloc uint32) *Conn {
	c := &Conn{guestCID: req.SrcCID, hostPort: req.DstPort, guestPort: req.SrcPort,
		state: StateEstablished, credit: NewCredit(bufAlloc), pending: pendResponse}
	c.credit.Update(req)
	return c
}

// ResetFor is the RST answering a guest packet that belongs to no
// connection. A packet that is itself an RST must not be answered; the
// caller checks.
func ResetFor(h Header) Header {
	return Header{SrcCID: h.DstCID, DstCID: h.SrcCID, SrcPort: h.DstPort, DstPort: h.SrcPort,
		Type: TypeStream, Op: OpRst}
}

// Key returns the connection's key.
func (c *Conn) Key() Key { return Key{HostPort: c.hostPort, GuestPort: c.guestPort} }

// State returns the connection's state.
func (c *Conn) State() State { return c.state }

// Done reports whether the connection is closed and has nothing left to
// send, so the device can forget it.
func (c *Conn) Done() bool { return c.state == StateClosed && c.pending == 0 }

// PeerShutdown returns the SHUTDOWN flags the guest has sent.
func (c *Conn) PeerShutdown() uint32 { return c.peerShut }

// HostEOF reports whether the host side has read everything the guest
// will ever send: the guest shut down its sending side (or closed) and the
// buffer is empty. The host side should then see end of file.
func (c *Conn) HostEOF() bool {
	return len(c.rx) == 0 && (c.peerShut&ShutdownSend != 0 || c.state == StateClosed)
}

// reset drops buffered data and queues an RST as the only packet left.
func (c *Conn) reset() {
	c.state = StateClosed
	c.pending = pendRst
	c.rx, c.spare = nil, nil
}

// closed closes without telling the guest (it reset us).
func (c *Conn) closed() {
	c.state = StateClosed
	c.pending = 0
	c.rx, c.spare = nil, nil
}

// HandleGuest applies one packet from the guest, already validated by
// ParseHeader and routed here by its ports. payload is the RW data (len
// h.Len); it is copied, so the caller may give the descriptor back at once.
// Protocol violations reset the connection (an RST becomes pending).
func (c *Conn) HandleGuest(h Header, payload []byte) {
	if c.state == StateClosed {
		return
	}
	if h.Op == OpRst {
		c.closed()
		return
	}
	if c.state == StateConnecting {
		if h.Op != OpResponse {
			c.reset()
			return
		}
		c.credit.Update(h)
		c.state = StateEstablished
		c.pending &^= pendRequest
		return
	}
	c.credit.Update(h)
	if c.credit.PeerFree() > 0 {
		c.creditAsked = false
	}
	switch h.Op {
	case OpRW:
		if c.peerShut&ShutdownSend != 0 || c.state == StatePeerClosed {
			c.reset() // data after the guest said it would send none
			return
		}
		if !c.credit.Received(uint32(len(payload))) {
			c.reset() // the guest ignored our credit
			return
		}
		if c.localShut&ShutdownRecv != 0 || c.state == StateLocalClosed {
			// The host side reads no more: drop the data but free its
			// credit, as a socket shut for reading does.
			c.credit.Consumed(uint32(len(payload)))
			c.updateIfNeeded()
			return
		}
		c.buffer(payload)
	case OpCreditUpdate:
		// Credit figures taken above; the device may send more now.
	case OpCreditRequest:
		c.pending |= pendCreditUpdate
	case OpShutdown:
		c.peerShut |= h.Flags
		if c.peerShut != ShutdownRecv|ShutdownSend {
			return
		}
		if c.state == StateLocalClosed || len(c.rx) == 0 {
			c.reset() // both sides done: RST ends it (Linux does the same)
			return
		}
		c.state = StatePeerClosed
	default: // REQUEST or RESPONSE on an existing connection
		c.reset()
	}
}

// buffer appends guest data to rx, starting from spare when rx is empty
// and keeping a new small buffer as the next spare.
func (c *Conn) buffer(p []byte) {
	if len(c.rx) > 0 {
		c.rx = append(c.rx, p...)
		return
	}
	c.rx = append(c.spare[:0], p...)
	if cap(c.rx) <= maxSpare {
		c.spare = c.rx[:0]
	}
}

// Peek returns the guest data waiting for the host side. The slice is
// valid until the next call on c.
func (c *Conn) Peek() []byte { return c.rx }

// Consume records that the host side took the first n bytes of Peek,
// freeing credit; a CREDIT_UPDATE becomes pending when the guest has not
// heard of half the buffer being freed. In StatePeerClosed, consuming the
// last byte ends the connection with an RST.
func (c *Conn) Consume(n int) {
	if n <= 0 || c.state == StateClosed {
		return
	}
	n = min(n, len(c.rx))
	c.rx = c.rx[n:]
	if len(c.rx) == 0 {
		c.rx = nil // do not pin an idle connection's buffer (but spare)
	}
	c.credit.Consumed(uint32(n))
	if c.state == StatePeerClosed && len(c.rx) == 0 {
		c.reset()
		return
	}
	c.updateIfNeeded()
}

func (c *Conn) updateIfNeeded() {
	if c.credit.NeedUpdate() {
		c.pending |= pendCreditUpdate
	}
}

// SendWindow is how many payload bytes one RW packet to the guest may
// carry now: zero unless established with neither side having shut that
// direction, and never more than the guest's free credit or MaxPayload.
// The device further limits it to the rx buffer it has.
func (c *Conn) SendWindow() uint32 {
	if c.state != StateEstablished || c.localShut&ShutdownSend != 0 || c.peerShut&ShutdownRecv != 0 {
		return 0
	}
	return min(c.credit.PeerFree(), MaxPayload)
}

// RequestCredit queues a CREDIT_REQUEST when the host side has data but
// SendWindow is zero for lack of credit; it asks once until the guest's
// figures give credit again.
func (c *Conn) RequestCredit() {
	if c.state == StateEstablished && c.credit.PeerFree() == 0 && !c.creditAsked {
		c.creditAsked = true
		c.pending |= pendCreditRequest
	}
}

// RWHeader returns the header of an RW packet carrying n bytes of host
// data to the guest and charges them to the guest's credit. The caller
// must keep n within SendWindow (and above zero); anything else is a bug
// in the device and panics.
func (c *Conn) RWHeader(n uint32) Header {
	if n == 0 || n > c.SendWindow() {
		panic(fmt.Sprintf("vsock: RW of %d bytes with a window of %d", n, c.SendWindow()))
	}
	c.credit.Sent(n)
	h := c.header(OpRW, 0)
	h.Len = n
	return h
}

// Shutdown records that the host side will send (ShutdownSend) and/or
// receive (ShutdownRecv) no more, and queues a SHUTDOWN telling the guest.
// Once both directions are shut the connection waits for the guest's RST
// (StateLocalClosed), or closes at once if the guest had closed too. A
// connection still connecting is reset instead.
func (c *Conn) Shutdown(flags uint32) {
	flags &= ShutdownRecv | ShutdownSend
	switch c.state {
	case StateClosed:
		return
	case StateConnecting:
		c.reset()
		return
	case StatePeerClosed:
		// The guest is gone both ways; a host that stops sending may still
		// read what is buffered, one that stops reading ends it.
		c.localShut |= flags
		if flags&ShutdownRecv != 0 {
			c.reset()
		}
		return
	}
	if flags&^c.localShut == 0 {
		return
	}
	c.localShut |= flags
	c.pending |= pendShutdown
	if flags&ShutdownRecv != 0 {
		// Data the host side will never read: free it and its credit.
		n := len(c.rx)
		c.rx = nil
		c.credit.Consumed(uint32(n))
	}
	if c.localShut == ShutdownRecv|ShutdownSend {
		if c.peerShut == ShutdownRecv|ShutdownSend {
			c.reset()
			return
		}
		c.state = StateLocalClosed
	}
}

// Reset ends the connection from the host side (its socket failed, or the
// guest did not answer a shutdown in time): buffered data is dropped and
// an RST is the only packet left to send.
func (c *Conn) Reset() {
	if c.state != StateClosed {
		c.reset()
	}
}

// Next takes the next pending control packet, stamped with current credit
// figures, or reports false when none is pending. An RST is always the
// last packet of a connection.
func (c *Conn) Next() (Header, bool) {
	for _, p := range []struct {
		flag uint32
		op   uint16
	}{
		{pendRst, OpRst}, {pendRequest, OpRequest}, {pendResponse, OpResponse},
		{pendShutdown, OpShutdown}, {pendCreditUpdate, OpCreditUpdate}, {pendCreditRequest, OpCreditRequest},
	} {
		if c.pending&p.flag == 0 {
			continue
		}
		c.pending &^= p.flag
		var flags uint32
		if p.op == OpShutdown {
			flags = c.localShut
		}
		if p.op == OpRst {
			c.pending = 0
		}
		return c.header(p.op, flags), true
	}
	return Header{}, false
}

// header builds a packet from the host port to the guest port, stamped
// with our credit.
func (c *Conn) header(op uint16, flags uint32) Header {
	h := Header{SrcCID: CIDHost, DstCID: c.guestCID, SrcPort: c.hostPort, DstPort: c.guestPort,
		Type: TypeStream, Op: op, Flags: flags}
	c.credit.Stamp(&h)
	return h
}
