package vsock

import (
	"encoding/json"
	"fmt"
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
	Version         int    `json:"version"`
	CID             uint64 `json:"cid"`
	TxPackets       uint64 `json:"tx_packets"`
	RxPackets       uint64 `json:"rx_packets"`
	Dropped         uint64 `json:"dropped"`
	Resets          uint64 `json:"resets"`
	ConnsOpened     uint64 `json:"conns_opened"`
	ConnsRefused    uint64 `json:"conns_refused"`
	BytesToHost     uint64 `json:"bytes_to_host"`
	BytesToGuest    uint64 `json:"bytes_to_guest"`
	HostErrors      uint64 `json:"host_errors"`
	TransportResets uint64 `json:"transport_resets"`
	// PortsUsed is Device.portsUsed: a restored device goes on from it.
	PortsUsed uint32 `json:"ports_used,omitempty"`
}

// SaveState implements virtio.Stateful: the CID and the counters. The
// device should be quiet (the VM paused and the transport quiesced, or
// shut down); open connections are not part of the state.
func (d *Device) SaveState() (json.RawMessage, error) {
	m := &d.Metrics
	return json.Marshal(state{Version: stateVersion, CID: d.CID,
		TxPackets: m.TxPackets.Load(), RxPackets: m.RxPackets.Load(), Dropped: m.Dropped.Load(),
		Resets: m.Resets.Load(), ConnsOpened: m.ConnsOpened.Load(), ConnsRefused: m.ConnsRefused.Load(),
		BytesToHost: m.BytesToHost.Load(), BytesToGuest: m.BytesToGuest.Load(),
		HostErrors: m.HostErrors.Load(), TransportResets: m.TransportResets.Load(), PortsUsed: d.portsUsed.Load()})
}

// RestoreState implements virtio.Stateful. It refuses a state of another
// version before changing anything. The saved CID is taken only when the
// device has none configured (CID zero): a device given a CID keeps it,
// which is how a forked child gets a CID of its own; the guest learns it
// on the TransportReset the restorer sends. Connections of a running
// activation, if any, are dropped; a state carries none.
func (d *Device) RestoreState(raw json.RawMessage) error {
	var s state
	if err := json.Unmarshal(raw, &s); err != nil {
		return fmt.Errorf("virtio-vsock state: %w", err)
	}
	if s.Version != stateVersion {
		return fmt.Errorf("virtio-vsock state version %d, this build reads %d", s.Version, stateVersion)
	}
	if d.CID == 0 {
		d.CID = s.CID
	}
	// Host ports go on after the saved guest's, never reusing one its
	// memory may still hold a socket for.
	d.portsUsed.Store(s.PortsUsed)
	m := &d.Metrics
	m.TxPackets.Store(s.TxPackets)
	m.RxPackets.Store(s.RxPackets)
	m.Dropped.Store(s.Dropped)
	m.Resets.Store(s.Resets)
	m.ConnsOpened.Store(s.ConnsOpened)
	m.ConnsRefused.Store(s.ConnsRefused)
	m.BytesToHost.Store(s.BytesToHost)
	m.BytesToGuest.Store(s.BytesToGuest)
	m.HostErrors.Store(s.HostErrors)
	m.TransportResets.Store(s.TransportResets)
	d.post(event{kind: evForget})
	return nil
}
