package vsock

// The worker goroutine of one activation (a session): it owns the queues,
// guest memory access and every connection, takes events from the host
// side's goroutines, and never blocks on a host socket.

import (
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/warrenvm/warren/devices/virtio"
)

// Event kinds posted to a session's inbox.
const (
	evRead           = iota // a reader goroutine read a chunk (or failed)
	evWrote                 // a writer goroutine finished a write (or failed)
	evDialed                // a dial for a guest REQUEST finished
	evClient                // a host client asked to CONNECT to a guest port
	evTransportReset        // TransportReset was called
	evResetAll              // Close: reset every connection (RSTs to the guest)
	evForget                // RestoreState: drop every connection silently
)

// event is what host-side goroutines tell the worker.
type event struct {
	kind int
	hc   *hostConn // evRead, evWrote
	n    int       // bytes read or written
	err  error
	// ctl marks an evWrote for a control message (the OK line, a
	// half-close), not guest data.
	ctl bool
	dl  *dial    // evDialed
	c   net.Conn // evDialed, evClient
	// port is the guest port of evClient.
	port uint32
}

// discard releases what an event holds when no worker will take it.
func (e event) discard() {
	if e.c != nil {
		e.c.Close()
	}
}

// dial is a guest REQUEST waiting for its host socket.
type dial struct {
	req Header
}

// session is one activation's state, owned by its worker goroutine except
// where noted.
type session struct {
	dev *Device
	a   *virtio.Activation

	conns map[Key]*Conn
	// hosts are the host sockets of connections in conns; a Conn whose
	// socket was closed stays in conns, without a host, until Done.
	hosts map[Key]*hostConn
	// dialing are guest REQUESTs waiting for a dial (at most maxDialing).
	dialing map[Key]*dial
	// portRefs counts connections per host port, for port allocation.
	portRefs map[uint32]int
	// stray are RSTs for packets of no connection, at most maxStrayRst.
	stray []Header
	// eventPending: a TRANSPORT_RESET waits for an event buffer.
	eventPending bool
	// settleUntil, when set, holds host-initiated connections (held)
	// after a TRANSPORT_RESET until the guest has handled it. The guest
	// handles the reset event and incoming packets on separate work
	// items, so a REQUEST delivered right after the event can be accepted
	// first and then torn down by the reset (the guest resets every
	// connected socket without telling the host, and the host's client
	// sees EOF), or be lost in it. A guest-initiated REQUEST after the
	// reset (the agent's re-sync reconnecting) shows the guest is past
	// it and releases the held connections; so does the deadline, for a
	// guest that connects to nothing.
	settleUntil time.Time
	held        []event
	timeouts    timeouts

	// mu guards inbox and dead, the only fields other goroutines touch
	// (through post); wake has one slot and tells the worker to look.
	mu    sync.Mutex
	inbox []event
	dead  bool
	wake  chan struct{}
}

// post queues e for the worker and wakes it; it never blocks. After the
// worker has exited, e is discarded.
func (s *session) post(e event) {
	s.mu.Lock()
	if s.dead {
		s.mu.Unlock()
		e.discard()
		return
	}
	s.inbox = append(s.inbox, e)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// run is the worker goroutine. Each service call is a service pass
// (a.Enter to a.Leave): while the transport is quiesced the worker takes no
// event, touches no queue, guest memory or connection, and host-side
// goroutines can only post events (each connection's reader holds at most
// its one granted chunk, its writer at most the one write it was given).
func (s *session) run(stop <-chan struct{}) {
	defer s.exit()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if !s.a.Enter(stop) {
			return
		}
		err := s.service()
		if err != nil {
			s.a.Broken(err)
		}
		s.a.Leave()
		if err != nil {
			return
		}
		if dl, ok := s.nextDeadline(); ok {
			timer.Reset(time.Until(dl))
		} else {
			timer.Stop()
		}
		select {
		case <-stop:
			return
		case <-s.wake:
		case <-timer.C:
		case <-s.a.Kicks[queueRx]:
		case <-s.a.Kicks[queueTx]:
		case <-s.a.Kicks[queueEvent]:
		}
	}
}

// exit runs as the worker returns: no more events are taken, every host
// socket is closed (ending the per-connection goroutines), and the device
// forgets the session.
func (s *session) exit() {
	s.mu.Lock()
	s.dead = true
	pending := s.inbox
	s.inbox = nil
	s.mu.Unlock()
	for _, e := range append(pending, s.held...) {
		e.discard()
	}
	s.held = nil
	for _, hc := range s.hosts {
		s.closeHost(hc)
	}
	d := s.dev
	d.mu.Lock()
	if d.sess == s {
		d.sess = nil
	}
	d.mu.Unlock()
}

// service takes the host side's events and every tx packet, brings each
// connection's host side up to date, then delivers what it can on rx and
// the event queue.
func (s *session) service() error {
	s.mu.Lock()
	events := s.inbox
	s.inbox = nil
	s.mu.Unlock()
	for _, e := range events {
		s.handleEvent(e)
	}
	if !s.settleUntil.IsZero() && !time.Now().Before(s.settleUntil) {
		s.settled()
	}
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
	s.syncAll()
	if err := s.deliver(); err != nil {
		return err
	}
	if err := s.deliverEvent(); err != nil {
		return err
	}
	s.syncAll()
	for k, c := range s.conns {
		if c.Done() {
			s.forget(k)
		}
	}
	return nil
}

// forget drops connection k (closing its host socket, if still open).
func (s *session) forget(k Key) {
	if hc := s.hosts[k]; hc != nil {
		s.closeHost(hc)
	}
	if _, ok := s.conns[k]; ok {
		delete(s.conns, k)
		if s.portRefs[k.HostPort]--; s.portRefs[k.HostPort] <= 0 {
			delete(s.portRefs, k.HostPort)
		}
	}
}

// add registers a new connection and its host socket, starting the
// socket's reader and writer goroutines.
func (s *session) add(c *Conn, sock net.Conn, client bool, hostPort uint32) {
	k := c.Key()
	s.conns[k] = c
	s.portRefs[k.HostPort]++
	hc := newHostConn(s, k, sock, client, hostPort)
	if client {
		hc.connectDeadline = time.Now().Add(s.timeouts.connect)
	}
	s.hosts[k] = hc
}

// handleEvent applies one event from a host-side goroutine.
func (s *session) handleEvent(e event) {
	m := &s.dev.Metrics
	switch e.kind {
	case evRead:
		hc := e.hc
		if hc.closed {
			return
		}
		hc.reading = false
		if e.n > 0 {
			hc.chunk = hc.rbuf[:e.n]
		}
		if e.err != nil {
			hc.readErr = e.err
		}
	case evWrote:
		hc := e.hc
		if hc.closed {
			return
		}
		hc.writing = false
		c := s.conns[hc.key]
		if e.err != nil {
			m.HostErrors.Add(1)
			c.Reset()
			return
		}
		if !e.ctl {
			c.Consume(e.n)
			m.BytesToHost.Add(uint64(e.n))
		}
	case evDialed:
		k := Key{HostPort: e.dl.req.DstPort, GuestPort: e.dl.req.SrcPort}
		if s.dialing[k] != e.dl {
			e.discard() // the guest gave up, or the transport was reset
			return
		}
		delete(s.dialing, k)
		if e.err != nil || s.conns[k] != nil {
			e.discard()
			m.ConnsRefused.Add(1)
			s.queueStray(ResetFor(e.dl.req))
			return
		}
		m.ConnsOpened.Add(1)
		s.add(Accept(e.dl.req, s.dev.bufAlloc()), e.c, false, 0)
	case evClient:
		if !s.settleUntil.IsZero() {
			if len(s.held) >= maxConns {
				m.ConnsRefused.Add(1)
				e.discard()
				return
			}
			s.held = append(s.held, e)
			return
		}
		hp, ok := s.allocPort()
		if !ok || len(s.conns) >= maxConns {
			m.ConnsRefused.Add(1)
			e.discard()
			return
		}
		s.add(Connect(s.dev.CID, hp, e.port, s.dev.bufAlloc()), e.c, true, hp)
	case evTransportReset:
		s.forgetAll()
		s.stray = nil
		s.eventPending = true
		s.settleUntil = time.Now().Add(s.timeouts.settle)
	case evForget:
		s.forgetAll()
		s.stray = nil
	case evResetAll:
		for _, c := range s.conns {
			c.Reset()
		}
		for _, hc := range s.hosts {
			s.closeHost(hc)
		}
	}
}

// forgetAll drops every connection and pending dial without telling the
// guest.
func (s *session) forgetAll() {
	for k := range s.conns {
		s.forget(k)
	}
	clear(s.dialing)
}

// settled ends the hold after a transport reset: the held host
// connections are made now, in the order they came.
func (s *session) settled() {
	if s.settleUntil.IsZero() {
		return
	}
	s.settleUntil = time.Time{}
	held := s.held
	s.held = nil
	for _, e := range held {
		s.handleEvent(e)
	}
}

// allocPort returns a free ephemeral host port.
func (s *session) allocPort() (uint32, bool) {
	for range maxConns + 1 {
		p := firstEphemeral + (s.dev.portsUsed.Add(1)-1)%(1<<32-firstEphemeral)
		if s.portRefs[p] == 0 {
			return p, true
		}
	}
	return 0, false
}

func (s *session) queueStray(h Header) {
	if len(s.stray) < maxStrayRst {
		s.stray = append(s.stray, h)
	} else {
		s.dev.Metrics.Dropped.Add(1)
	}
}

// handleTx parses one tx chain (header, then payload, in any split over
// the readable buffers) and routes it. Malformed or misaddressed packets
// are dropped: they are the guest's problem, not a broken queue.
func (s *session) handleTx(c *virtio.Chain) {
	m := &s.dev.Metrics
	m.TxPackets.Add(1)
	var hb [HeaderLen]byte
	if gather(c.Readable, 0, hb[:]) < HeaderLen {
		m.Dropped.Add(1)
		return
	}
	h, err := ParseHeader(hb[:])
	if err != nil || h.SrcCID != s.dev.CID || h.DstCID != CIDHost ||
		uint64(c.ReadableLen()) < HeaderLen+uint64(h.Len) {
		m.Dropped.Add(1)
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
	if s.dialing[k] != nil {
		if h.Op == OpRst {
			delete(s.dialing, k) // the guest gave up; the dial's socket is closed when it lands
		}
		return // anything else waits for the dial (the guest must not send before RESPONSE)
	}
	switch {
	case h.Op == OpRst:
		// Never answer an RST.
	case h.Op == OpRequest:
		s.settled()
		s.request(h, k)
	default:
		s.queueStray(ResetFor(h))
	}
}

// request routes a guest REQUEST for a new connection: to a service, else
// to the unix socket <UDSPath>_<port>, dialed off this goroutine; else it
// is refused.
func (s *session) request(h Header, k Key) {
	d := s.dev
	if len(s.conns) >= maxConns {
		d.Metrics.ConnsRefused.Add(1)
		s.queueStray(ResetFor(h))
		return
	}
	if svc := d.Services[k.HostPort]; svc != nil {
		ours, theirs, err := socketPair()
		if err != nil {
			d.Metrics.HostErrors.Add(1)
			d.Metrics.ConnsRefused.Add(1)
			s.queueStray(ResetFor(h))
			return
		}
		go svc(theirs)
		d.Metrics.ConnsOpened.Add(1)
		s.add(Accept(h, d.bufAlloc()), ours, false, 0)
		return
	}
	if d.UDSPath == "" || len(s.dialing) >= maxDialing {
		d.Metrics.ConnsRefused.Add(1)
		s.queueStray(ResetFor(h))
		return
	}
	dl := &dial{req: h}
	s.dialing[k] = dl
	path := fmt.Sprintf("%s_%d", d.UDSPath, k.HostPort)
	go func() {
		c, err := net.DialTimeout("unix", path, s.timeouts.connect)
		s.post(event{kind: evDialed, dl: dl, c: c, err: err})
	}()
}

// syncAll brings every connection's host side up to date with its Conn.
func (s *session) syncAll() {
	now := time.Now()
	for _, hc := range s.hosts {
		s.sync(hc, now)
	}
}

// sync starts the host I/O a connection is ready for and applies what
// its host socket reported: the OK line to a host client once the guest
// accepted, guest data to the writer, a half-close once the guest will
// send no more, a read grant when the previous chunk went to the guest,
// EOF and errors to the Conn, and the connect and close timeouts. A
// closed Conn closes its host socket.
func (s *session) sync(hc *hostConn, now time.Time) {
	c := s.conns[hc.key]
	if n := uint64(len(c.Peek())); n > s.dev.peakBuffered.Load() {
		s.dev.peakBuffered.Store(n)
	}
	switch c.State() {
	case StateConnecting:
		if now.After(hc.connectDeadline) {
			s.dev.Metrics.ConnsRefused.Add(1)
			c.Reset()
		}
	case StateLocalClosed:
		if hc.closeDeadline.IsZero() {
			hc.closeDeadline = now.Add(s.timeouts.close)
		} else if now.After(hc.closeDeadline) {
			c.Reset()
		}
	}
	if c.State() == StateClosed {
		if hc.client && !hc.okSent && hc.connectDeadline.After(now) {
			s.dev.Metrics.ConnsRefused.Add(1) // the guest refused
		}
		s.closeHost(hc)
		return
	}
	if c.State() == StateConnecting {
		return
	}
	if hc.client && !hc.okSent {
		hc.okSent = true
		s.dev.Metrics.ConnsOpened.Add(1)
		hc.write(writeMsg{data: fmt.Appendf(nil, "OK %d\n", hc.hostPort), ctl: true})
	}
	if !hc.writing {
		if p := c.Peek(); len(p) > 0 {
			n := copy(hc.wbuf, p)
			hc.write(writeMsg{data: hc.wbuf[:n]})
		} else if c.HostEOF() && !hc.halfClosed {
			hc.halfClosed = true
			hc.write(writeMsg{closeWrite: true, ctl: true})
		}
	}
	if hc.readDone && isEOF(hc.readErr) && hc.halfClosed && !hc.writing && !hc.bothShut {
		// The host side is done both ways: ask the guest to close (Linux
		// answers with an RST), bounded by the close timeout.
		hc.bothShut = true
		c.Shutdown(ShutdownRecv | ShutdownSend)
	}
	if len(hc.chunk) == 0 && !hc.reading {
		switch {
		case hc.readErr != nil:
			if !hc.readDone {
				hc.readDone = true
				if isEOF(hc.readErr) {
					c.Shutdown(ShutdownSend)
				} else {
					s.dev.Metrics.HostErrors.Add(1)
					c.Reset()
				}
			}
		case c.SendWindow() > 0:
			hc.reading = true
			hc.grant <- int(min(c.SendWindow(), MaxPayload))
		default:
			c.RequestCredit()
		}
	} else if len(hc.chunk) > 0 && c.SendWindow() == 0 {
		c.RequestCredit()
	}
	if c.State() == StateClosed {
		s.closeHost(hc)
	}
}

// nextDeadline is the earliest connect or close timeout pending.
func (s *session) nextDeadline() (time.Time, bool) {
	dl := s.settleUntil
	for _, hc := range s.hosts {
		c := s.conns[hc.key]
		var t time.Time
		switch c.State() {
		case StateConnecting:
			t = hc.connectDeadline
		case StateLocalClosed:
			t = hc.closeDeadline
		}
		if !t.IsZero() && (dl.IsZero() || t.Before(dl)) {
			dl = t
		}
	}
	return dl.Add(time.Millisecond), !dl.IsZero()
}

// deliver puts pending packets on the rx queue while it has buffers:
// stray RSTs, then connections' control packets, then host data, taking
// the connections with data in turn. What does not fit stays pending.
func (s *session) deliver() error {
	rx := s.a.Queues[queueRx]
	m := &s.dev.Metrics
	var ready []*hostConn // connections with host data the guest has credit for
	for _, hc := range s.hosts {
		if len(hc.chunk) > 0 && s.conns[hc.key].SendWindow() > 0 {
			ready = append(ready, hc)
		}
	}
	turn := 0
	for len(s.stray) > 0 || s.anyPending() || len(ready) > 0 {
		ch, err := rx.Pop(s.a.Mem)
		if err != nil {
			return err
		}
		if ch == nil {
			break // stays pending until the driver adds rx buffers
		}
		room := ch.WritableLen()
		if room < HeaderLen {
			return fmt.Errorf("%w: vsock rx buffer of %d bytes, need %d", virtio.ErrBroken, room, HeaderLen)
		}
		var payload []byte
		h, ok := s.nextControl()
		if ok {
			s.writeRx(ch, h, nil)
		} else {
			hc := ready[turn%len(ready)]
			c := s.conns[hc.key]
			n := min(uint32(len(hc.chunk)), c.SendWindow(), uint32(room-HeaderLen))
			if n == 0 {
				// A buffer with room for a header only: tell the guest
				// our credit instead.
				h = c.header(OpCreditUpdate, 0)
			} else {
				h = c.RWHeader(n)
				payload = hc.chunk[:n]
				hc.chunk = hc.chunk[n:]
				m.BytesToGuest.Add(uint64(n))
			}
			if len(hc.chunk) == 0 || c.SendWindow() == 0 {
				ready = append(ready[:turn%len(ready)], ready[turn%len(ready)+1:]...)
			} else {
				turn++
			}
			s.writeRx(ch, h, payload)
		}
		if err := rx.Push(s.a.Mem, ch.Head, HeaderLen+h.Len); err != nil {
			return err
		}
	}
	return s.a.InterruptIfNeeded(rx)
}

// writeRx scatters a packet over an rx chain and counts it.
func (s *session) writeRx(ch *virtio.Chain, h Header, payload []byte) {
	var hb [HeaderLen]byte
	h.Encode(hb[:])
	scatter(ch.Writable, hb[:], 0)
	scatter(ch.Writable, payload, HeaderLen)
	s.dev.Metrics.RxPackets.Add(1)
	if h.Op == OpRst {
		s.dev.Metrics.Resets.Add(1)
	}
}

// nextControl takes the next control packet: a stray RST, or one a
// connection has pending.
func (s *session) nextControl() (Header, bool) {
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

func (s *session) anyPending() bool {
	for _, c := range s.conns {
		if c.pending != 0 {
			return true
		}
	}
	return false
}

// deliverEvent puts a pending TRANSPORT_RESET in the next event buffer.
func (s *session) deliverEvent() error {
	q := s.a.Queues[queueEvent]
	if !s.eventPending || !q.Ready {
		return nil
	}
	ch, err := q.Pop(s.a.Mem)
	if err != nil || ch == nil {
		return err
	}
	if ch.WritableLen() < 4 {
		return fmt.Errorf("%w: vsock event buffer of %d bytes, need 4", virtio.ErrBroken, ch.WritableLen())
	}
	var ev [4]byte
	binary.LittleEndian.PutUint32(ev[:], eventTransportReset)
	scatter(ch.Writable, ev[:], 0)
	if err := q.Push(s.a.Mem, ch.Head, 4); err != nil {
		return err
	}
	s.eventPending = false
	s.dev.Metrics.TransportResets.Add(1)
	return s.a.InterruptIfNeeded(q)
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

// scatter copies src over the concatenation of bufs, from offset off.
func scatter(bufs [][]byte, src []byte, off int) {
	for _, b := range bufs {
		if len(src) == 0 {
			return
		}
		if off >= len(b) {
			off -= len(b)
			continue
		}
		src = src[copy(b[off:], src):]
		off = 0
	}
}
