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
	evWrote                 // a writer goroutine finished a write the worker handed it (or failed)
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
	buf  *[]byte   // evRead: the read buffer, handed back to the worker
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

// session is one activation's state. Its service passes run one at a time
// under passMu: on the worker goroutine, or on a connection's reader that
// serves the data it read inline (tryService). What the doc comments call
// the worker is whoever holds passMu; it owns every field except where
// noted.
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

	// Scratch space the worker reuses from pass to pass, so that a pass
	// allocates nothing: events is the inbox's other slice (swapped with
	// it under mu), ready the connections deliver takes turns between,
	// payload a copy of a tx payload split over several buffers
	// (MaxPayload bytes once used).
	events  []event
	ready   []*hostConn
	payload []byte

	// passMu serialises service passes (see tryService). It is taken
	// before mu.
	passMu sync.Mutex
	// failed: a pass found the driver broken (a.Broken was called); no
	// pass runs after it and the worker returns.
	failed bool

	// mu guards inbox and dead, the only fields other goroutines touch
	// (through post); wake has one slot and tells the worker to look.
	mu    sync.Mutex
	inbox []event
	dead  bool
	wake  chan struct{}
}

// noWait is a closed channel: Enter(noWait) begins a pass only if the
// gate is open, without waiting.
var noWait = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// tryService runs a service pass on the calling goroutine when no other
// pass is running and the transport is not quiesced, and reports whether
// it did; when it did not, the caller wakes the worker instead (its work
// then waits for the pass in progress to end, or for Resume). This spares
// a goroutine handoff per host read: the connection's reader serves the
// data it read itself. After the pass the worker is woken only for what
// it alone does: re-arm its timer for a deadline, or return after the
// pass failed.
func (s *session) tryService() bool {
	if !s.passMu.TryLock() {
		return false
	}
	s.mu.Lock()
	dead := s.dead
	s.mu.Unlock()
	if dead || s.failed || !s.a.Enter(noWait) {
		s.passMu.Unlock()
		return false
	}
	err := s.service()
	if err != nil {
		s.a.Broken(err)
		s.failed = true
	}
	_, deadline := s.nextDeadline()
	s.passMu.Unlock()
	s.a.Leave()
	if err != nil || deadline {
		s.kickWorker()
	}
	return true
}

// kickWorker wakes the worker goroutine; it never blocks.
func (s *session) kickWorker() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// postInline queues e and serves it on the calling goroutine when it can
// (tryService), else wakes the worker; it never blocks for long (at most
// one pass). After the worker has exited, e is discarded.
func (s *session) postInline(e event) {
	if s.queue(e) && !s.tryService() {
		s.kickWorker()
	}
}

// post queues e for the worker and wakes it; it never blocks. After the
// worker has exited, e is discarded.
func (s *session) post(e event) {
	if s.queue(e) {
		s.kickWorker()
	}
}

// queue adds e to the inbox and reports true, or discards it and reports
// false when the worker has exited.
func (s *session) queue(e event) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		e.discard()
		return false
	}
	s.inbox = append(s.inbox, e)
	return true
}

// run is the worker goroutine. Each service call is a service pass
// (a.Enter to a.Leave): while the transport is quiesced the worker takes no
// event, touches no queue, guest memory or connection, and host-side
// goroutines can only post events (each connection's reader holds at most
// its one granted chunk, its writer at most the one write it was given).
func (s *session) run(stop <-chan struct{}) {
	defer s.exit()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	armed := false // timer runs
	for {
		if !s.a.Enter(stop) {
			return
		}
		s.passMu.Lock()
		failed := s.failed
		if !failed {
			if err := s.service(); err != nil {
				s.a.Broken(err)
				s.failed, failed = true, true
			}
		}
		dl, ok := s.nextDeadline()
		s.passMu.Unlock()
		s.a.Leave()
		if failed {
			return
		}
		if ok {
			timer.Reset(time.Until(dl))
			armed = true
		} else if armed {
			timer.Stop()
			armed = false
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
	s.passMu.Lock() // an inline pass in progress ends first; none starts after
	defer s.passMu.Unlock()
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
// the event queue. It publishes each queue's used entries once, and
// interrupts the driver at most once, at the end of the pass, when any of
// the queues asks for it (they share the interrupt line).
func (s *session) service() error {
	s.mu.Lock()
	events := s.inbox
	s.inbox = s.events
	s.mu.Unlock()
	for _, e := range events {
		s.handleEvent(e)
	}
	clear(events)
	s.events = events[:0]
	if !s.settleUntil.IsZero() && !time.Now().Before(s.settleUntil) {
		s.settled()
	}
	tx := s.a.Queues[queueTx]
	popped := false
	for {
		c, err := tx.Pop(s.a.Mem)
		if err != nil {
			return err
		}
		if c == nil {
			break
		}
		s.handleTx(c)
		if err := tx.Stage(s.a.Mem, c.Head, 0); err != nil {
			return err
		}
		popped = true
	}
	if popped {
		if err := tx.Publish(s.a.Mem); err != nil {
			return err
		}
	}
	irq, err := tx.NeedsInterrupt(s.a.Mem)
	if err != nil {
		return err
	}
	s.syncAll()
	need, err := s.deliver()
	if err != nil {
		return err
	}
	irq = irq || need
	if need, err = s.deliverEvent(); err != nil {
		return err
	}
	irq = irq || need
	if irq {
		s.a.Interrupt()
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
		switch {
		case hc.closed:
			readBufs.Put(e.buf)
			return
		case e.n > 0:
			hc.chunks = append(hc.chunks, chunk{buf: e.buf, data: (*e.buf)[:e.n]})
		case e.err == nil:
			hc.free <- e.buf
		default:
			readBufs.Put(e.buf) // the reader is done
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
		payload = s.payloadOf(c.Readable, h.Len)
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

// payloadOf returns the n bytes after the header in bufs (the caller
// checked they hold that many): guest memory itself when one buffer holds
// them all (Linux puts the header and the payload in buffers of their
// own), else a copy in s.payload. Either is valid until the next call;
// Conn.HandleGuest copies what it keeps.
func (s *session) payloadOf(bufs [][]byte, n uint32) []byte {
	off := uint64(HeaderLen)
	for _, b := range bufs {
		if off >= uint64(len(b)) {
			off -= uint64(len(b))
			continue
		}
		if uint64(len(b))-off >= uint64(n) {
			return b[off : off+uint64(n)]
		}
		break
	}
	if s.payload == nil {
		s.payload = make([]byte, MaxPayload)
	}
	return s.payload[:gather(bufs, HeaderLen, s.payload[:n])]
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
	var clk clock
	for _, hc := range s.hosts {
		s.sync(hc, &clk)
	}
}

// clock reads the time once per syncAll, and only when a connection has a
// deadline to check.
type clock struct{ t time.Time }

func (c *clock) now() time.Time {
	if c.t.IsZero() {
		c.t = time.Now()
	}
	return c.t
}

// sync does the host I/O a connection is ready for and applies what its
// host socket reported: the OK line to a host client once the guest
// accepted, guest data to the socket (see hostConn.send), a half-close
// once the guest will send no more, EOF and errors to the Conn, and the
// connect and close timeouts. A closed Conn closes its host socket.
func (s *session) sync(hc *hostConn, clk *clock) {
	m := &s.dev.Metrics
	c := s.conns[hc.key]
	if n := uint64(len(c.Peek())); n > s.dev.peakBuffered.Load() {
		s.dev.peakBuffered.Store(n)
	}
	switch c.State() {
	case StateConnecting:
		if clk.now().After(hc.connectDeadline) {
			m.ConnsRefused.Add(1)
			c.Reset()
		}
	case StateLocalClosed:
		if hc.closeDeadline.IsZero() {
			hc.closeDeadline = clk.now().Add(s.timeouts.close)
		} else if clk.now().After(hc.closeDeadline) {
			c.Reset()
		}
	}
	if c.State() == StateClosed {
		if hc.client && !hc.okSent && hc.connectDeadline.After(clk.now()) {
			m.ConnsRefused.Add(1) // the guest refused
		}
		s.closeHost(hc)
		return
	}
	if c.State() == StateConnecting {
		return
	}
	if hc.client && !hc.okSent {
		hc.okSent = true
		m.ConnsOpened.Add(1)
		if _, err := hc.send(fmt.Appendf(nil, "OK %d\n", hc.hostPort), true); err != nil {
			m.HostErrors.Add(1)
			c.Reset()
		}
	}
	if !hc.writing && c.State() != StateClosed {
		if p := c.Peek(); len(p) > 0 {
			n, err := hc.send(p, false)
			if err != nil {
				m.HostErrors.Add(1)
				c.Reset()
			} else if n > 0 {
				c.Consume(n)
				m.BytesToHost.Add(uint64(n))
			}
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
	switch {
	case len(hc.chunks) > 0:
		if c.SendWindow() == 0 {
			c.RequestCredit()
		}
	case hc.readErr != nil && !hc.readDone:
		hc.readDone = true
		if isEOF(hc.readErr) {
			c.Shutdown(ShutdownSend)
		} else {
			m.HostErrors.Add(1)
			c.Reset()
		}
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
// the connections with data in turn. What does not fit stays pending. The
// used entries are published once, at the end; it reports whether the
// driver asked for an interrupt.
func (s *session) deliver() (bool, error) {
	rx := s.a.Queues[queueRx]
	m := &s.dev.Metrics
	ready := s.ready[:0] // connections with host data the guest has credit for
	defer func() {
		clear(ready)
		s.ready = ready[:0]
	}()
	for _, hc := range s.hosts {
		if len(hc.pending()) > 0 && s.conns[hc.key].SendWindow() > 0 {
			ready = append(ready, hc)
		}
	}
	turn, used := 0, false
	for len(s.stray) > 0 || s.anyPending() || len(ready) > 0 {
		ch, err := rx.Pop(s.a.Mem)
		if err != nil {
			return false, err
		}
		if ch == nil {
			break // stays pending until the driver adds rx buffers
		}
		room := ch.WritableLen()
		if room < HeaderLen {
			return false, fmt.Errorf("%w: vsock rx buffer of %d bytes, need %d", virtio.ErrBroken, room, HeaderLen)
		}
		h, ok := s.nextControl()
		if ok {
			s.writeRx(ch, h, nil)
		} else {
			i := turn % len(ready)
			hc := ready[i]
			c := s.conns[hc.key]
			data := hc.pending()
			n := min(uint32(len(data)), c.SendWindow(), uint32(room-HeaderLen))
			if n == 0 {
				// A buffer with room for a header only: tell the guest
				// our credit instead.
				h = c.header(OpCreditUpdate, 0)
				s.writeRx(ch, h, nil)
			} else {
				h = c.RWHeader(n)
				s.writeRx(ch, h, data[:n])
				hc.sent(n) // only now: it may hand the buffer back to the reader
				m.BytesToGuest.Add(uint64(n))
			}
			if len(hc.pending()) == 0 || c.SendWindow() == 0 {
				ready = append(ready[:i], ready[i+1:]...)
			} else {
				turn++
			}
		}
		if err := rx.Stage(s.a.Mem, ch.Head, HeaderLen+h.Len); err != nil {
			return false, err
		}
		used = true
	}
	if used {
		if err := rx.Publish(s.a.Mem); err != nil {
			return false, err
		}
	}
	return rx.NeedsInterrupt(s.a.Mem)
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

// deliverEvent puts a pending TRANSPORT_RESET in the next event buffer;
// it reports whether the driver asked for an interrupt.
func (s *session) deliverEvent() (bool, error) {
	q := s.a.Queues[queueEvent]
	if !s.eventPending || !q.Ready {
		return false, nil
	}
	ch, err := q.Pop(s.a.Mem)
	if err != nil || ch == nil {
		return false, err
	}
	if ch.WritableLen() < 4 {
		return false, fmt.Errorf("%w: vsock event buffer of %d bytes, need 4", virtio.ErrBroken, ch.WritableLen())
	}
	var ev [4]byte
	binary.LittleEndian.PutUint32(ev[:], eventTransportReset)
	scatter(ch.Writable, ev[:], 0)
	if err := q.Push(s.a.Mem, ch.Head, 4); err != nil {
		return false, err
	}
	s.eventPending = false
	s.dev.Metrics.TransportResets.Add(1)
	return q.NeedsInterrupt(s.a.Mem)
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
