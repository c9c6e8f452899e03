package vsock

import (
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenvm/warren/devices/virtio"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
	"github.com/warrenvm/warren/internal/kvmtest"
)

// What a fake-guest connection does with the data it receives.
const (
	modeEcho   = iota // send it back; half-close back once the host did
	modeSink          // hash and count it
	modeStall         // keep it unconsumed: the host runs out of credit
	modeIgnore        // (listeners only) never answer a REQUEST
)

// Fake guest geometry: queue sizes, buffer sizes, where buffers live in
// guest memory (above the regions virtiotest's drivers allocate from).
const (
	gQueueSize  = 64
	gTxPayload  = 4096
	gBufAlloc   = 64 << 10
	gRxArea     = 0x200000
	gTxArea     = 0x300000
	gEventArea  = 0x3f0000
	gWaitPeriod = 5 * time.Second
)

// fakeGuest plays the Linux vsock driver against a Device through a real
// MMIO transport: it answers REQUESTs on listening ports, opens
// connections, respects and grants credit, echoes or sinks or hoards data,
// and recycles a fixed set of rx and tx buffers (so megabytes can flow
// through the small fake memory). Its state belongs to its loop
// goroutine; tests reach it through do.
type fakeGuest struct {
	t   *testing.T
	mem vt.Memory
	tr  *virtio.MMIO
	dev *Device

	rx, tx, ev *vt.Driver
	rxLen      int
	txFree     []uint16
	rxHeld     []uint16 // rx buffers not reposted while postRx is false

	listen map[uint32]int // port -> mode
	conns  map[Key]*gconn // Key{HostPort: peer, GuestPort: local}
	events []uint32       // event ids received

	// postRx: the guest keeps giving the device rx buffers.
	postRx atomic.Bool
	cmds   chan func()
	stop   chan struct{}
	done   chan struct{}
}

// gconn is the guest side of one connection.
type gconn struct {
	mode        int
	established bool
	rst         bool
	peerShut    uint32
	shutSent    bool

	fwd, lastFwd uint32 // our consumed count, and what the host last heard
	held         int    // stall mode: bytes received, unconsumed
	recv         int
	sum          hash.Hash
	data         []byte // sink mode: received bytes, when keep is set
	keep         bool

	peerAlloc, peerFwd, txCnt uint32
	out                       []byte
	// closeAfterOut: send SHUTDOWN(send) once out has drained.
	closeAfterOut bool
	creditAsked   bool
}

func (c *gconn) peerFree() uint32 {
	inFlight := c.txCnt - c.peerFwd
	if inFlight > c.peerAlloc {
		return 0
	}
	return c.peerAlloc - inFlight
}

// newGuest attaches dev to a transport and starts a fake guest with rx
// buffers of rxLen bytes. postEvent says whether an event buffer is
// posted at once.
func newGuest(t *testing.T, dev *Device, rxLen int, postEvent bool) *fakeGuest {
	t.Helper()
	if dev.CID == 0 {
		dev.CID = guestCID
	}
	mem := make(vt.Memory, vt.MemSize)
	tr := virtio.NewMMIO("vsock", dev, mem, vt.NewSignals(), nil)
	g := &fakeGuest{t: t, mem: mem, tr: tr, dev: dev, rxLen: rxLen,
		rx: vt.NewDriver(mem, 0, gQueueSize), tx: vt.NewDriver(mem, 1, gQueueSize), ev: vt.NewDriver(mem, 2, 4),
		listen: map[uint32]int{}, conns: map[Key]*gconn{},
		cmds: make(chan func()), stop: make(chan struct{}), done: make(chan struct{})}
	g.postRx.Store(true)
	if st := vt.Bring(tr, devFeatures, g.rx, g.tx, g.ev); st&virtio.StatusDriverOK == 0 || st&virtio.StatusNeedsReset != 0 {
		t.Fatalf("status %#x", st)
	}
	for i := range uint16(gQueueSize) {
		g.postRxBuf(i)
		g.txFree = append(g.txFree, i)
	}
	if postEvent {
		g.postEventBuf()
	}
	tr.Notify(queueRx)
	g.run()
	return g
}

// run starts the guest's loop; at the end of the test it stops it and
// shuts the transport down.
func (g *fakeGuest) run() {
	go g.loop()
	g.t.Cleanup(func() {
		close(g.stop)
		<-g.done
		g.tr.Shutdown()
	})
}

func (g *fakeGuest) postRxBuf(i uint16) {
	g.rx.PutDesc(i, gRxArea+uint64(i)*uint64(g.rxLen), uint32(g.rxLen), 2, 0)
	g.rx.Publish(i)
}

func (g *fakeGuest) postEventBuf() {
	g.ev.PutDesc(0, gEventArea, 8, 2, 0)
	g.ev.Publish(0)
	g.tr.Notify(queueEvent)
}

// do runs f on the guest's loop goroutine and waits for it.
func (g *fakeGuest) do(f func()) {
	done := make(chan struct{})
	select {
	case g.cmds <- func() { f(); close(done) }:
	case <-g.done:
		g.t.Fatal("fake guest stopped")
	}
	<-done
}

// waitFor polls cond on the guest's goroutine until it holds.
func (g *fakeGuest) waitFor(what string, cond func() bool) {
	g.t.Helper()
	kvmtest.WaitFor(g.t, gWaitPeriod, what, func() bool {
		var ok bool
		g.do(func() { ok = cond() })
		return ok
	})
}

// conn returns the guest connection from local port to host port (on
// the loop goroutine only).
func (g *fakeGuest) conn(local, peer uint32) *gconn {
	return g.conns[Key{HostPort: peer, GuestPort: local}]
}

// connect opens a guest connection from local to host port peer.
func (g *fakeGuest) connect(local, peer uint32, mode int) {
	g.do(func() {
		g.conns[Key{HostPort: peer, GuestPort: local}] = &gconn{mode: mode, sum: sha256.New()}
		g.send(Header{SrcPort: local, DstPort: peer, Op: OpRequest}, nil)
	})
}

// sendPacket queues a control packet from the guest.
func (g *fakeGuest) sendPacket(local, peer uint32, op uint16, flags uint32) {
	g.do(func() { g.send(Header{SrcPort: local, DstPort: peer, Op: op, Flags: flags}, nil) })
}

// loop is the guest: it takes the device's rx packets, recycles tx
// buffers, sends data within credit, and runs test commands.
func (g *fakeGuest) loop() {
	defer close(g.done)
	idle := time.NewTimer(0)
	for {
		busy := false
		for _, u := range g.rx.Used() {
			busy = true
			i := uint16(u[0])
			a := gRxArea + uint64(i)*uint64(g.rxLen)
			g.handle(g.mem[a:a+uint64(u[1])], u[1])
			if g.postRx.Load() {
				g.postRxBuf(i)
			} else {
				g.rxHeld = append(g.rxHeld, i)
			}
		}
		if g.postRx.Load() && len(g.rxHeld) > 0 {
			for _, i := range g.rxHeld {
				g.postRxBuf(i)
			}
			g.rxHeld = nil
			busy = true
		}
		if busy {
			g.tr.Notify(queueRx)
		}
		for _, u := range g.tx.Used() {
			g.txFree = append(g.txFree, uint16(u[0]))
		}
		for _, u := range g.ev.Used() {
			a := uint64(gEventArea)
			if u[1] >= 4 {
				g.events = append(g.events, binary.LittleEndian.Uint32(g.mem[a:]))
			}
		}
		if g.pump() {
			busy = true
		}
		if busy {
			idle.Reset(0)
		} else {
			idle.Reset(50 * time.Microsecond)
		}
		select {
		case <-g.stop:
			return
		case f := <-g.cmds:
			f()
		case <-idle.C:
		}
	}
}

// send puts one packet on tx, stamped with the connection's credit; it
// reports false when no tx buffer is free.
func (g *fakeGuest) send(h Header, payload []byte) bool {
	if len(g.txFree) == 0 {
		return false
	}
	i := g.txFree[0]
	g.txFree = g.txFree[1:]
	h.SrcCID, h.DstCID, h.Type, h.Len = guestCID, CIDHost, TypeStream, uint32(len(payload))
	h.BufAlloc = gBufAlloc
	if c := g.conns[Key{HostPort: h.DstPort, GuestPort: h.SrcPort}]; c != nil {
		h.FwdCnt = c.fwd
		c.lastFwd = c.fwd
	}
	a := gTxArea + uint64(i)*(HeaderLen+gTxPayload)
	h.Encode(g.mem[a:])
	copy(g.mem[a+HeaderLen:], payload)
	g.tx.PutDesc(i, a, HeaderLen+uint32(len(payload)), 0, 0)
	g.tx.Publish(i)
	g.tr.Notify(queueTx)
	return true
}

// pump sends what connections have to send: data within credit, credit
// updates, half-closes. It reports whether it sent anything.
func (g *fakeGuest) pump() bool {
	sent := false
	for k, c := range g.conns {
		if !c.established || c.rst {
			continue
		}
		for len(c.out) > 0 && len(g.txFree) > 0 {
			n := min(uint32(len(c.out)), c.peerFree(), gTxPayload)
			if n == 0 {
				if !c.creditAsked {
					c.creditAsked = g.send(Header{SrcPort: k.GuestPort, DstPort: k.HostPort, Op: OpCreditRequest}, nil)
				}
				break
			}
			g.send(Header{SrcPort: k.GuestPort, DstPort: k.HostPort, Op: OpRW}, c.out[:n])
			c.out = c.out[n:]
			c.txCnt += n
			sent = true
		}
		if len(c.out) == 0 && c.closeAfterOut && !c.shutSent && len(g.txFree) > 0 {
			c.shutSent = g.send(Header{SrcPort: k.GuestPort, DstPort: k.HostPort, Op: OpShutdown, Flags: ShutdownSend}, nil)
			sent = true
		}
		if c.fwd-c.lastFwd >= gBufAlloc/4 && len(g.txFree) > 0 {
			g.send(Header{SrcPort: k.GuestPort, DstPort: k.HostPort, Op: OpCreditUpdate}, nil)
			sent = true
		}
	}
	return sent
}

// handle takes one packet the device put on rx.
func (g *fakeGuest) handle(b []byte, used uint32) {
	h, err := ParseHeader(b)
	if err != nil || h.SrcCID != CIDHost || h.DstCID != guestCID || used != HeaderLen+h.Len {
		g.t.Errorf("guest got a bad packet: %+v, %v (used %d)", h, err, used)
		return
	}
	k := Key{HostPort: h.SrcPort, GuestPort: h.DstPort}
	c := g.conns[k]
	if c == nil {
		if h.Op == OpRequest {
			mode, ok := g.listen[h.DstPort]
			switch {
			case ok && mode == modeIgnore:
			case ok:
				c = &gconn{mode: mode, established: true, sum: sha256.New()}
				c.peerAlloc, c.peerFwd = h.BufAlloc, h.FwdCnt
				g.conns[k] = c
				g.send(Header{SrcPort: h.DstPort, DstPort: h.SrcPort, Op: OpResponse}, nil)
			default:
				g.send(Header{SrcPort: h.DstPort, DstPort: h.SrcPort, Op: OpRst}, nil)
			}
		}
		return
	}
	c.peerAlloc, c.peerFwd = h.BufAlloc, h.FwdCnt
	c.creditAsked = false
	switch h.Op {
	case OpResponse:
		c.established = true
	case OpRst:
		c.rst = true
	case OpShutdown:
		c.peerShut |= h.Flags
		if c.mode == modeEcho && h.Flags&ShutdownSend != 0 {
			c.closeAfterOut = true
		}
	case OpCreditRequest:
		g.send(Header{SrcPort: k.GuestPort, DstPort: k.HostPort, Op: OpCreditUpdate}, nil)
	case OpRW:
		p := b[HeaderLen:]
		c.recv += len(p)
		switch c.mode {
		case modeEcho:
			c.out = append(c.out, p...)
			c.fwd += uint32(len(p))
		case modeSink:
			c.sum.Write(p)
			if c.keep {
				c.data = append(c.data, p...)
			}
			c.fwd += uint32(len(p))
		case modeStall:
			c.held += len(p)
		}
		if c.recv-int(c.fwd) > gBufAlloc {
			g.t.Errorf("device overran the guest's credit: %d bytes unconsumed, buf_alloc %d", c.recv-int(c.fwd), gBufAlloc)
		}
	}
}
