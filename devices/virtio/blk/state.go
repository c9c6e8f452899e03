package blk

import (
	"encoding/json"
	"fmt"
	"sync/atomic"
)

// Metrics are counters an operator reads; the worker updates them
// atomically.
type Metrics struct {
	Reads      atomic.Uint64 // successful IN requests
	Writes     atomic.Uint64 // successful OUT requests
	ReadBytes  atomic.Uint64 // bytes read from the image
	WriteBytes atomic.Uint64 // bytes written to the image
	Flushes    atomic.Uint64 // successful FLUSH requests
	Discards   atomic.Uint64 // successful DISCARD requests
	// Errors counts requests completed with a status other than OK (or
	// without room for one) and queue faults.
	Errors atomic.Uint64
}

// stateVersion versions the device's own saved state.
const stateVersion = 1

// state is the device's part of a snapshot: the identity of its backend,
// which a restore must match, and the counters.
type state struct {
	Version    int    `json:"version"`
	Path       string `json:"path"`
	ReadOnly   bool   `json:"read_only"`
	Capacity   uint64 `json:"capacity_sectors"`
	ID         string `json:"id"`
	Reads      uint64 `json:"reads"`
	Writes     uint64 `json:"writes"`
	ReadBytes  uint64 `json:"read_bytes"`
	WriteBytes uint64 `json:"write_bytes"`
	Flushes    uint64 `json:"flushes"`
	Discards   uint64 `json:"discards"`
	Errors     uint64 `json:"errors"`
}

// SaveState implements virtio.Stateful. Requests in flight are not part of
// it: the worker completes each request before taking the next, so a
// quiet device (transport Quiesce or Shutdown) has none. The guest's
// unflushed writes are in the host page cache, that is in the image file,
// which the caller snapshots alongside (a copy, or the same file left
// untouched). Another backend may hold some of them in memory (an overlay
// keeps its allocation bitmap there until Sync): the caller syncs it
// (Backend().Sync()) before copying its files. The saved path is the name
// the device was made with; SwapBackend does not change it.
func (d *Device) SaveState() (json.RawMessage, error) {
	m := &d.Metrics
	return json.Marshal(state{
		Version: stateVersion, Path: d.path, ReadOnly: d.readOnly, Capacity: d.capacity,
		ID: string(d.id[:d.idLen]), Reads: m.Reads.Load(), Writes: m.Writes.Load(),
		ReadBytes: m.ReadBytes.Load(), WriteBytes: m.WriteBytes.Load(),
		Flushes: m.Flushes.Load(), Discards: m.Discards.Load(), Errors: m.Errors.Load(),
	})
}

// RestoreState implements virtio.Stateful. It refuses a state saved for
// another image (path), size, read-only mode or ID, before changing
// anything: the guest has that disk's geometry and contents cached.
func (d *Device) RestoreState(raw json.RawMessage) error {
	var s state
	if err := json.Unmarshal(raw, &s); err != nil {
		return fmt.Errorf("virtio-blk state: %w", err)
	}
	if s.Version != stateVersion {
		return fmt.Errorf("virtio-blk state version %d, this build reads %d", s.Version, stateVersion)
	}
	switch {
	case s.Path != d.path:
		return fmt.Errorf("virtio-blk state is for image %s, device has %s", s.Path, d.path)
	case s.Capacity != d.capacity:
		return fmt.Errorf("virtio-blk state is for %d sectors, %s has %d", s.Capacity, d.path, d.capacity)
	case s.ReadOnly != d.readOnly:
		return fmt.Errorf("virtio-blk state has read-only=%v, device has %v", s.ReadOnly, d.readOnly)
	case s.ID != string(d.id[:d.idLen]):
		return fmt.Errorf("virtio-blk state has ID %q, device has %q", s.ID, string(d.id[:d.idLen]))
	}
	m := &d.Metrics
	m.Reads.Store(s.Reads)
	m.Writes.Store(s.Writes)
	m.ReadBytes.Store(s.ReadBytes)
	m.WriteBytes.Store(s.WriteBytes)
	m.Flushes.Store(s.Flushes)
	m.Discards.Store(s.Discards)
	m.Errors.Store(s.Errors)
	return nil
}
