package vsock

import (
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

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

// Limits on what the guest and host clients can make the device hold.
const (
	// maxStrayRst bounds the RSTs queued for guest packets that belong to
	// no connection; beyond it they are dropped (the guest times out
	// instead), so a guest spraying packets cannot make the device
	// allocate.
	maxStrayRst = 64
	// maxConns bounds the connections of one activation (each holds up to
	// BufAlloc bytes of guest data, two read buffers and a write buffer of
	// MaxPayload bytes, and two goroutines); more are refused.
	maxConns = 1024
	// maxDialing bounds the guest REQUESTs waiting for a host socket dial.
	maxDialing = 64
)

// Default timeouts; tests shorten them through Device.timeouts.
const (
	// defaultConnectTimeout bounds the wait for the guest's answer to a
	// host CONNECT, and a dial of <UDSPath>_<port> for a guest REQUEST.
	// A guest with no listener answers at once with RST; the wait only
	// runs out on a guest that does not answer at all, and a busy guest
	// just restored (catching up on its timers, re-syncing) was seen to
	// take longer than 2 s under emulation, so it is generous.
	defaultConnectTimeout = 10 * time.Second
	// defaultCloseTimeout bounds the wait for the guest's RST after the
	// host side shut both directions (StateLocalClosed).
	defaultCloseTimeout = 2 * time.Second
	// defaultHandshakeTimeout bounds the read of a host client's CONNECT
	// line.
	defaultHandshakeTimeout = 3 * time.Second
	// defaultResetSettle bounds how long host-initiated connections wait
	// after a TRANSPORT_RESET for the guest to have handled it (see
	// session.settleUntil).
	defaultResetSettle = 2 * time.Second
)

// timeouts are a device's timeouts; zero fields take the defaults.
type timeouts struct {
	connect, close, handshake, settle time.Duration
}

func (t timeouts) orDefault() timeouts {
	if t.connect == 0 {
		t.connect = defaultConnectTimeout
	}
	if t.close == 0 {
		t.close = defaultCloseTimeout
	}
	if t.handshake == 0 {
		t.handshake = defaultHandshakeTimeout
	}
	if t.settle == 0 {
		t.settle = defaultResetSettle
	}
	return t
}

// firstEphemeral is where host ports for host-initiated connections are
// allocated from, upward, skipping ports in use.
const firstEphemeral = 1 << 30

// eventTransportReset is VIRTIO_VSOCK_EVENT_TRANSPORT_RESET.
const eventTransportReset = 0

// Device is a userspace virtio-vsock device (ID 19) with Firecracker's
// "hybrid" host side: the host reaches guest ports through one unix socket
// (UDSPath, see Listen and Dial), and guest connections to the host are
// served by in-process Services or by unix sockets named
// <UDSPath>_<port>.
//
// Configuration: the exported fields other than Metrics are set before
// Listen and before the device is attached, and not changed after (CID may
// be set by RestoreState on a device not yet running).
//
// Threads. Per activation, one worker goroutine (a session) owns the three
// queues, guest memory access, every Conn and every connection's host-side
// bookkeeping; nothing else touches them, except a connection's reader
// goroutine running a service pass itself under the session's pass mutex
// (session.tryService) when no other pass runs, so that host data reaches
// the guest without a handoff to the worker. The worker writes to host
// sockets itself, but only without blocking (hostConn.send); all host I/O
// that may block happens on other goroutines, which never touch a Conn:
// the accept loop and one handshake goroutine per client (Listen), one
// dial goroutine per guest REQUEST routed to a unix socket, and per
// connection a reader and a writer goroutine. They talk to the worker by
// posting events to the session's inbox (a mutex-guarded slice plus a
// wakeup channel, so posting never waits for the worker) and the worker
// answers through channels it only sends on when they have room, so the
// worker never blocks on a host socket or a slow host peer. Reset stops
// the worker and waits for it; it closes every host socket on its way
// out, which ends the per-connection goroutines.
type Device struct {
	// CID is the guest's context ID (config space guest_cid); at least 3.
	CID uint64
	// BufAlloc is the receive buffer advertised per connection;
	// DefaultBufAlloc when zero.
	BufAlloc uint32
	// UDSPath is the unix socket host clients connect to (Listen); guest
	// connections to host port P go to the socket UDSPath_P when no
	// service takes P. Empty: no host sockets at all.
	UDSPath string
	// Services serve guest connections to host ports in-process: a guest
	// REQUEST to port P runs Services[P] on its own goroutine with one end
	// of a unix socket pair (a *net.UnixConn, so CloseWrite works) and
	// connects the guest to the other end. The function owns its end and
	// must close it.
	Services map[uint32]func(net.Conn)
	// Metrics counts what the device did.
	Metrics Metrics

	workers virtio.Workers
	// timeouts is configuration too (tests shorten it).
	timeouts timeouts

	// portsUsed counts the host ports handed out since the device was
	// made (or in the VM it was restored from, see RestoreState): the
	// next host-initiated connection takes firstEphemeral+portsUsed,
	// wrapping within the ephemeral range. It carries over driver resets
	// and restores so that a new connection never reuses the port of one
	// the guest may still hold (a socket of the saved guest that the
	// transport reset closed but its owner has not released yet would
	// answer the new connection with RST).
	portsUsed atomic.Uint32
	// mu guards the fields below it.
	mu sync.Mutex
	// sess is the running activation, nil when none.
	sess *session
	// resetPending: TransportReset was called with no activation running;
	// the next one sends the event.
	resetPending bool
	ln           *net.UnixListener
	lnDone       chan struct{} // closed when the accept loop returns
	closed       bool

	// peakBuffered is the most guest data seen buffered in one Conn, for
	// tests of the BufAlloc bound.
	peakBuffered atomic.Uint64
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
	s := &session{dev: d, a: a, conns: map[Key]*Conn{}, hosts: map[Key]*hostConn{},
		dialing: map[Key]*dial{}, portRefs: map[uint32]int{},
		wake: make(chan struct{}, 1), timeouts: d.timeouts.orDefault()}
	d.mu.Lock()
	defer d.mu.Unlock()
	s.eventPending = d.resetPending
	if s.eventPending {
		s.settleUntil = time.Now().Add(s.timeouts.settle)
	}
	if err := d.workers.Start(s.run); err != nil {
		return err
	}
	d.sess = s
	d.resetPending = false
	return nil
}

// Reset implements virtio.Device: the worker stops and every connection
// is dropped, its host socket closed.
func (d *Device) Reset() { d.workers.Stop() }

// TransportReset drops every connection (closing its host socket, sending
// no RST: the guest drops its side on the event) and sends the guest a
// VIRTIO_VSOCK_EVENT_TRANSPORT_RESET on the event queue, with an
// interrupt; when the driver has no event buffer posted, the event waits
// for one. On the event the Linux driver resets its sockets and re-reads
// guest_cid, so a CID changed since a snapshot takes effect. Safe to call
// from any goroutine; typically called right after the transport was
// restored from a snapshot. With no activation running, the next one
// sends the event.
//
// Host CONNECTs that arrive after the reset are held until the guest opens
// a connection of its own (the agent's re-sync does, at once) or 2 s have
// passed: the guest handles the event and incoming packets separately,
// and a connection it accepted just before handling the reset would be
// torn down by it without the host being told.
func (d *Device) TransportReset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.sess == nil {
		d.resetPending = true
		return
	}
	d.sess.post(event{kind: evTransportReset})
}

// post hands e to the running session, if any; an event holding a host
// socket is discarded (the socket closed) when none runs.
func (d *Device) post(e event) {
	d.mu.Lock()
	s := d.sess
	d.mu.Unlock()
	if s == nil {
		e.discard()
		return
	}
	s.post(e)
}

func (d *Device) bufAlloc() uint32 {
	if d.BufAlloc == 0 {
		return DefaultBufAlloc
	}
	return d.BufAlloc
}
