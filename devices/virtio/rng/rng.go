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
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/devices/virtio"
)

// maxRequest bounds the entropy handed out per request.
const maxRequest = 64 << 10

// Metrics are counters an operator reads.
type Metrics struct {
	Requests atomic.Uint64
	Bytes    atomic.Uint64
	Errors   atomic.Uint64
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
// request (drain).
func (d *Device) Activate(a *virtio.Activation) error {
	return d.workers.ServeOne(a, "virtio-rng", &d.Metrics.Errors, func(q *virtio.Queue) error {
		return d.drain(a, q)
	})
}

// Reset implements virtio.Device.
func (d *Device) Reset() { d.workers.Stop() }

// drain serves every available request, or stops early when the transport
// is quiescing (Resume kicks the queue for the rest). Each request is
// pushed before the next is popped.
func (d *Device) drain(a *virtio.Activation, q *virtio.Queue) error {
	for !a.Quiescing() {
		c, err := q.Pop(a.Mem)
		if err != nil {
			return err
		}
		if c == nil {
			break
		}
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
		if err := q.Push(a.Mem, c.Head, uint32(n)); err != nil {
			return err
		}
		d.Metrics.Requests.Add(1)
		d.Metrics.Bytes.Add(uint64(n))
	}
	return a.InterruptIfNeeded(q)
}

// stateVersion versions the device's own saved state.
const stateVersion = 1

type state struct {
	Version  int    `json:"version"`
	Requests uint64 `json:"requests"`
	Bytes    uint64 `json:"bytes"`
}

// SaveState implements virtio.Stateful: the counters (the device has no
// other state; the queues are saved by the transport).
func (d *Device) SaveState() (json.RawMessage, error) {
	return json.Marshal(state{Version: stateVersion, Requests: d.Metrics.Requests.Load(), Bytes: d.Metrics.Bytes.Load()})
}

// RestoreState implements virtio.Stateful.
func (d *Device) RestoreState(raw json.RawMessage) error {
	var s state
	if err := json.Unmarshal(raw, &s); err != nil {
		return fmt.Errorf("virtio-rng state: %w", err)
	}
	if s.Version != stateVersion {
		return fmt.Errorf("virtio-rng state version %d, this build reads %d", s.Version, stateVersion)
	}
	d.Metrics.Requests.Store(s.Requests)
	d.Metrics.Bytes.Store(s.Bytes)
	return nil
}
