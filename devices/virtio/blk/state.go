package blk

import (
	"encoding/json"
	"fmt"

	"github.com/warrenvm/warren/devices/virtio"
)

// Metrics are counters an operator reads; the worker updates them
// atomically. They survive save/restore (the device's state carries them).
type Metrics struct {
	Reads      virtio.Counter `json:"reads"`       // successful IN requests
	Writes     virtio.Counter `json:"writes"`      // successful OUT requests
	ReadBytes  virtio.Counter `json:"read_bytes"`  // bytes read from the image
	WriteBytes virtio.Counter `json:"write_bytes"` // bytes written to the image
	Flushes    virtio.Counter `json:"flushes"`     // successful FLUSH requests
	Discards   virtio.Counter `json:"discards"`    // successful DISCARD requests
	// Errors counts requests completed with a status other than OK (or
	// without room for one) and queue faults.
	Errors virtio.Counter `json:"errors"`
}

// stateVersion versions the device's own saved state.
const stateVersion = 1

// state is the device's part of a snapshot: the identity of its backend,
// which a restore must match, and the counters.
type state struct {
	Version  int    `json:"version"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only"`
	Capacity uint64 `json:"capacity_sectors"`
	ID       string `json:"id"`
	*Metrics
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
	return json.Marshal(state{Version: stateVersion, Path: d.path, ReadOnly: d.readOnly, Capacity: d.capacity,
		ID: string(d.id[:d.idLen]), Metrics: &d.Metrics})
}

// RestoreState implements virtio.Stateful. It refuses a state saved for
// another image (path), size, read-only mode or ID, before changing
// anything: the guest has that disk's geometry and contents cached.
func (d *Device) RestoreState(raw json.RawMessage) error {
	s := state{Metrics: new(Metrics)}
	if err := virtio.DecodeState(raw, "virtio-blk", &s, &s.Version, stateVersion); err != nil {
		return err
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
	virtio.RestoreCounters(&d.Metrics, s.Metrics)
	return nil
}
