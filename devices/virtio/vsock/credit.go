package vsock

// Credit is one connection's flow-control state (virtio 1.2, 5.10.6.3): how
// much the peer can still take from us, and what we tell the peer about our
// own receive buffer. Counters are free-running 32-bit values, compared
// with wrap-around arithmetic as the spec requires.
//
// A Credit belongs to one connection and is used by the goroutine that owns
// that connection; it is not safe for concurrent use.
type Credit struct {
	// Peer's view, from the last header the peer sent.
	peerBufAlloc uint32
	peerFwdCnt   uint32
	// txCnt counts payload bytes we have sent to the peer.
	txCnt uint32

	// Our side: bufAlloc is the receive buffer we advertise; fwdCnt counts
	// payload bytes we have consumed (handed on); lastFwdCnt is the fwdCnt
	// the peer last heard from us.
	bufAlloc   uint32
	fwdCnt     uint32
	lastFwdCnt uint32
	// rxQueued counts bytes received and not yet consumed.
	rxQueued uint32
}

// NewCredit returns accounting for a connection that buffers up to bufAlloc
// received bytes.
func NewCredit(bufAlloc uint32) *Credit { return &Credit{bufAlloc: bufAlloc} }

// Update takes the peer's buffer figures from a header it sent.
func (c *Credit) Update(h Header) {
	c.peerBufAlloc = h.BufAlloc
	c.peerFwdCnt = h.FwdCnt
}

// PeerFree is how many payload bytes we may send now without overrunning
// the peer's buffer. A peer that claims to have consumed more than we sent
// gets no credit rather than a huge one.
func (c *Credit) PeerFree() uint32 {
	inFlight := c.txCnt - c.peerFwdCnt // wraps correctly
	if inFlight > c.peerBufAlloc {
		return 0
	}
	return c.peerBufAlloc - inFlight
}

// Sent records n payload bytes sent to the peer (n <= PeerFree()).
func (c *Credit) Sent(n uint32) { c.txCnt += n }

// Received records n payload bytes from the peer. It reports false when
// they exceed the buffer we advertised: a peer that ignores our credit is
// misbehaving, and the connection should be reset.
func (c *Credit) Received(n uint32) bool {
	if n > c.bufAlloc-c.rxQueued {
		return false
	}
	c.rxQueued += n
	return true
}

// Consumed records n received bytes handed on (written to the host socket),
// freeing that much of our buffer.
func (c *Credit) Consumed(n uint32) {
	if n > c.rxQueued {
		n = c.rxQueued
	}
	c.rxQueued -= n
	c.fwdCnt += n
}

// Stamp fills the credit fields of a header we are about to send and
// remembers that the peer now knows our fwdCnt.
func (c *Credit) Stamp(h *Header) {
	h.BufAlloc = c.bufAlloc
	h.FwdCnt = c.fwdCnt
	c.lastFwdCnt = c.fwdCnt
}

// NeedUpdate reports whether the peer should be sent a CREDIT_UPDATE: it
// has not heard of at least half of our buffer being freed, so it may be
// stalled waiting for credit.
func (c *Credit) NeedUpdate() bool {
	return c.fwdCnt-c.lastFwdCnt >= c.bufAlloc/2 && c.fwdCnt != c.lastFwdCnt
}
