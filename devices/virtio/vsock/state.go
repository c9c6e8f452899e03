package vsock

import (
	"encoding/json"

	"github.com/warrenvm/warren/devices/virtio"
)

// stateVersion versions the device's own saved state.
const stateVersion = 1

// state is the device's saved state: the guest's CID and the counters.
// Queues are saved by the transport. Connections are not saved: a
// snapshot cannot carry the host sockets, so on restore every connection
// is gone, and the restorer calls TransportReset once the transport is
// restored so the guest driver drops its side of them too (and re-reads
// guest_cid).
type state struct {
	Version int    `json:"version"`
	CID     uint64 `json:"cid"`
	*Metrics
	// PortsUsed is Device.portsUsed: a restored device goes on from it.
	PortsUsed uint32 `json:"ports_used,omitempty"`
}

// SaveState implements virtio.Stateful: the CID and the counters. The
// device should be quiet (the VM paused and the transport quiesced, or
// shut down); open connections are not part of the state.
func (d *Device) SaveState() (json.RawMessage, error) {
	return json.Marshal(state{Version: stateVersion, CID: d.CID, Metrics: &d.Metrics, PortsUsed: d.portsUsed.Load()})
}

// RestoreState implements virtio.Stateful. It refuses a state of another
// version before changing anything. The saved CID is taken only when the
// device has none configured (CID zero): a device given a CID keeps it,
// which is how a forked child gets a CID of its own; the guest learns it
// on the TransportReset the restorer sends. Connections of a running
// activation, if any, are dropped; a state carries none.
func (d *Device) RestoreState(raw json.RawMessage) error {
	s := state{Metrics: new(Metrics)}
	if err := virtio.DecodeState(raw, "virtio-vsock", &s, &s.Version, stateVersion); err != nil {
		return err
	}
	if d.CID == 0 {
		d.CID = s.CID
	}
	// Host ports go on after the saved guest's, never reusing one its
	// memory may still hold a socket for.
	d.portsUsed.Store(s.PortsUsed)
	virtio.RestoreCounters(&d.Metrics, s.Metrics)
	d.post(event{kind: evForget})
	return nil
}
