package vnet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenvm/warren/devices/virtio"
)

// Queue indices.
const (
	rxQueue = 0
	txQueue = 1
)

// virtio-net feature bits (virtio 1.2, 5.1.3).
const (
	FeatureMAC      = 1 << 5  // VIRTIO_NET_F_MAC: config.mac is valid
	FeatureMrgRxbuf = 1 << 15 // VIRTIO_NET_F_MRG_RXBUF: a frame may span rx chains
	FeatureStatus   = 1 << 16 // VIRTIO_NET_F_STATUS: config.status is valid
)

// StatusLinkUp is VIRTIO_NET_S_LINK_UP in config.status.
const StatusLinkUp = 1

// HeaderLen is the size of struct virtio_net_hdr_v1 (with num_buffers),
// which precedes every frame in both directions once VERSION_1 is
// negotiated, and which the tap is configured to use (TUNSETVNETHDRSZ).
const HeaderLen = 12

// MaxFrame is the largest Ethernet frame (without the header) the guest
// may transmit.
const MaxFrame = 65535

// rxBufSize holds the largest packet a tap read can return: the header and
// a 64 KiB frame with its Ethernet and VLAN headers.
const rxBufSize = 65562

// minFrame is an Ethernet header: anything shorter is not a frame.
const minFrame = 14

// errBackoff is how long the receive goroutine waits after a failed tap
// read before trying again, so a broken backend does not spin a core.
const errBackoff = 10 * time.Millisecond

// Backend is the host end of the link: one packet per Read or Write, each a
// HeaderLen-byte virtio_net_hdr_v1 followed by an Ethernet frame. A tap
// opened by OpenTap (an *os.File) is one; tests use a socketpair.
//
// Deadlines unblock the device's goroutines on Reset: a read or write
// pending when its deadline passes must return an error.
type Backend interface {
	// Name identifies the backend (the tap's interface name); it is saved
	// with the device state and checked on restore.
	Name() string
	Read(p []byte) (int, error)
	Write(p []byte) (int, error)
	SetReadDeadline(t time.Time) error
	SetWriteDeadline(t time.Time) error
	Close() error
}

// Options tune a device.
type Options struct {
	// QueueSize is the maximum size of each queue (a power of two; 0 means
	// virtio.MaxQueueSize).
	QueueSize uint16
	// NewIdentity makes RestoreState accept the state of a device with
	// another tap and MAC: the device of a forked child, which keeps its
	// own tap and MAC (the guest learns the MAC from its agent).
	NewIdentity bool
}

// Device is one virtio-net device.
type Device struct {
	// Metrics counts what the device did; safe to read at any time.
	Metrics Metrics

	b      Backend
	mac    net.HardwareAddr
	config [8]byte // mac, status; immutable after New
	qsize  uint16
	// newIdentity is Options.NewIdentity.
	newIdentity bool

	// Owned by the running activation's goroutines (one each); there is at
	// most one activation at a time.
	rxBuf []byte
	txBuf []byte

	mu     sync.Mutex // guards cur and closed
	cur    *run
	closed bool
}

// run is one activation: its two goroutines stop when stop is closed; each
// closes its exit channel when it returns, and done is closed after both.
type run struct {
	stop     chan struct{}
	stopOnce sync.Once
	faulted  atomic.Bool // a goroutine found a driver fault and reports it
	rxExit   chan struct{}
	txExit   chan struct{}
	done     chan struct{}
}

// New opens (creating it if needed) the tap interface tapName and returns a
// device with the given MAC address on it. The caller configures the tap
// on the host side (address, bridge, up).
func New(tapName string, mac net.HardwareAddr, opts Options) (*Device, error) {
	tap, err := OpenTap(tapName)
	if err != nil {
		return nil, err
	}
	d, err := NewBackend(tap, mac, opts)
	if err != nil {
		tap.Close()
		return nil, err
	}
	return d, nil
}

// NewBackend returns a device on an already open backend, which the device
// then owns (Close closes it).
func NewBackend(b Backend, mac net.HardwareAddr, opts Options) (*Device, error) {
	if len(mac) != 6 {
		return nil, fmt.Errorf("virtio-net %s: MAC %q is not 6 bytes", b.Name(), mac)
	}
	if mac[0]&1 != 0 {
		return nil, fmt.Errorf("virtio-net %s: MAC %s is a multicast address", b.Name(), mac)
	}
	qs := opts.QueueSize
	if qs == 0 {
		qs = virtio.MaxQueueSize
	}
	if qs > virtio.MaxQueueSize || qs&(qs-1) != 0 {
		return nil, fmt.Errorf("virtio-net %s: queue size %d (power of two up to %d)", b.Name(), qs, virtio.MaxQueueSize)
	}
	d := &Device{b: b, mac: append(net.HardwareAddr(nil), mac...), qsize: qs, newIdentity: opts.NewIdentity,
		rxBuf: make([]byte, rxBufSize), txBuf: make([]byte, HeaderLen+MaxFrame)}
	copy(d.config[:6], mac)
	binary.LittleEndian.PutUint16(d.config[6:], StatusLinkUp)
	return d, nil
}

// Name is the backend's name (the tap interface).
func (d *Device) Name() string { return d.b.Name() }

// MAC is the guest's MAC address.
func (d *Device) MAC() net.HardwareAddr { return append(net.HardwareAddr(nil), d.mac...) }

// Type implements virtio.Device.
func (d *Device) Type() uint32 { return virtio.TypeNet }

// Features implements virtio.Device.
func (d *Device) Features() uint64 {
	return FeatureMAC | FeatureStatus | FeatureMrgRxbuf | virtio.FeatureIndirectDesc | virtio.FeatureEventIdx
}

// QueueSizes implements virtio.Device: receive queue 0, transmit queue 1.
func (d *Device) QueueSizes() []uint16 { return []uint16{d.qsize, d.qsize} }

// ReadConfig implements virtio.Device: mac (6 bytes) then status (le16).
func (d *Device) ReadConfig(off uint64, data []byte) {
	if off < uint64(len(d.config)) {
		copy(data, d.config[off:])
	}
}

// WriteConfig implements virtio.Device: the configuration is read-only.
func (d *Device) WriteConfig(off uint64, data []byte) {}

// Activate implements virtio.Device: it starts the receive and transmit
// goroutines.
func (d *Device) Activate(a *virtio.Activation) error {
	if len(a.Queues) != 2 || len(a.Kicks) != 2 || !a.Queues[rxQueue].Ready || !a.Queues[txQueue].Ready {
		return fmt.Errorf("%w: virtio-net needs its receive and transmit queues", virtio.ErrBroken)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("virtio-net %s: device closed", d.b.Name())
	}
	if r := d.cur; r != nil { // not reset: stop the old goroutines first
		d.halt(r)
		<-r.done // they never take d.mu
	}
	// Reset left the deadlines in the past to unblock the old goroutines.
	if err := d.setDeadlines(time.Time{}); err != nil {
		return fmt.Errorf("virtio-net %s: %w", d.b.Name(), err)
	}
	r := &run{stop: make(chan struct{}), rxExit: make(chan struct{}), txExit: make(chan struct{}), done: make(chan struct{})}
	d.cur = r
	mergeable := a.Features&FeatureMrgRxbuf != 0
	go func() { defer close(r.rxExit); d.rxLoop(a, r, mergeable) }()
	go func() { defer close(r.txExit); d.txLoop(a, r) }()
	go func() { <-r.rxExit; <-r.txExit; close(r.done) }()
	return nil
}

// halt tells r's goroutines to stop and unblocks their backend I/O. Any
// goroutine may call it, any number of times.
func (d *Device) halt(r *run) {
	r.stopOnce.Do(func() {
		close(r.stop)
		// A deadline in the past makes a pending Read or Write return at
		// once.
		_ = d.setDeadlines(time.Unix(1, 0))
	})
}

// fault is a goroutine of r finding a driver fault. The first to find one
// stops the other and waits for it before reporting, so that once the
// transport marks the device NEEDS_RESET neither touches the queues
// (the transport resets them when the driver resets the device, without
// waiting for our Reset). A second fault is not reported.
func (d *Device) fault(a *virtio.Activation, r *run, sibling <-chan struct{}, err error) {
	if !r.faulted.CompareAndSwap(false, true) {
		return
	}
	d.halt(r)
	<-sibling
	a.Broken(fmt.Errorf("virtio-net %s: %w", d.b.Name(), err))
}

func (d *Device) setDeadlines(t time.Time) error {
	return errors.Join(d.b.SetReadDeadline(t), d.b.SetWriteDeadline(t))
}

// Reset implements virtio.Device: it stops both goroutines and waits for
// them. A frame read from the backend but not yet delivered is dropped.
func (d *Device) Reset() {
	d.mu.Lock()
	r := d.cur
	if r != nil {
		d.halt(r)
	}
	d.mu.Unlock()
	if r != nil {
		<-r.done
	}
}

// Close stops the device and closes its backend (a tap created by OpenTap
// disappears with its last descriptor unless it was made persistent).
func (d *Device) Close() error {
	d.mu.Lock()
	closed := d.closed
	d.closed = true // Activate starts no run from now on
	d.mu.Unlock()
	if closed {
		return nil
	}
	d.Reset()
	if err := d.b.Close(); err != nil {
		return fmt.Errorf("virtio-net %s: close: %w", d.b.Name(), err)
	}
	return nil
}

// stopped reports whether stop is closed.
func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// pause waits for d or stop; it reports false when stopped.
func pause(stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-stop:
		return false
	case <-t.C:
		return true
	}
}
