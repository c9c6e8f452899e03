// Package rng is virtio-rng (entropy device): it fills the guest's
// writable buffers from the host's getrandom(2), so the guest's CRNG is
// seeded early in boot.
//
// Threads: one worker goroutine per activation owns the queue and touches
// it and guest memory only inside service passes
// (virtio.Activation.Enter/Leave), so MMIO.Quiesce finds it between
// requests; Reset stops it and waits.
package rng

import (
	"encoding/json"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/devices/virtio"
)

// maxRequest bounds the entropy handed out per request.
const maxRequest = 64 << 10

// Metrics are counters an operator reads. Requests and Bytes survive
// save/restore (the device's state carries them); Errors does not.
type Metrics struct {
	Requests virtio.Counter `json:"requests"`
	Bytes    virtio.Counter `json:"bytes"`
	Errors   atomic.Uint64  `json:"-"`
}

// Device is one virtio-rng device.
type Device struct {
	// Read fills p with random bytes; it defaults to getrandom(2).
	Read func(p []byte) (int, error)
	// Metrics counts what the device did.
	Metrics Metrics

	workers virtio.Workers
}

// New returns a virtio-rng device reading the host's getrandom.
func New() *Device {
	return &Device{Read: func(p []byte) (int, error) { return unix.Getrandom(p, 0) }}
}

// Type implements virtio.Device.
func (d *Device) Type() uint32 { return virtio.TypeRNG }

// Features implements virtio.Device.
func (d *Device) Features() uint64 { return virtio.FeatureIndirectDesc | virtio.FeatureEventIdx }

// QueueSizes implements virtio.Device: one request queue.
func (d *Device) QueueSizes() []uint16 { return []uint16{virtio.MaxQueueSize} }

// ReadConfig implements virtio.Device: virtio-rng has no configuration.
func (d *Device) ReadConfig(off uint64, data []byte) {}

// WriteConfig implements virtio.Device.
func (d *Device) WriteConfig(off uint64, data []byte) {}

// Activate implements virtio.Device: it starts the worker, which owns the
// queue until Reset; each of its service passes serves every available
// request (virtio.Workers.ServeOne).
func (d *Device) Activate(a *virtio.Activation) error {
	return d.workers.ServeOne(a, "virtio-rng", &d.Metrics.Errors, d.fill)
}

// Reset implements virtio.Device.
func (d *Device) Reset() { d.workers.Stop() }

// fill serves one request: it fills the chain's writable buffers, up to
// maxRequest bytes, and returns how many bytes it wrote.
func (d *Device) fill(c *virtio.Chain) uint32 {
	var n int
	for _, b := range c.Writable {
		if n >= maxRequest {
			break
		}
		b = b[:min(len(b), maxRequest-n)]
		got, err := d.Read(b)
		n += got
		if err != nil {
			d.Metrics.Errors.Add(1)
			break
		}
	}
	d.Metrics.Requests.Add(1)
	d.Metrics.Bytes.Add(uint64(n))
	return uint32(n)
}

// stateVersion versions the device's own saved state.
const stateVersion = 1

type state struct {
	Version int `json:"version"`
	*Metrics
}

// SaveState implements virtio.Stateful: the counters (the device has no
// other state; the queues are saved by the transport).
func (d *Device) SaveState() (json.RawMessage, error) {
	return json.Marshal(state{Version: stateVersion, Metrics: &d.Metrics})
}

// RestoreState implements virtio.Stateful.
func (d *Device) RestoreState(raw json.RawMessage) error {
	s := state{Metrics: new(Metrics)}
	if err := virtio.DecodeState(raw, "virtio-rng", &s, &s.Version, stateVersion); err != nil {
		return err
	}
	virtio.RestoreCounters(&d.Metrics, s.Metrics)
	return nil
}
