package vnet

import (
	"encoding/json"
	"fmt"
	"net"
	"sync/atomic"
)

// Metrics are counters an operator reads. Bytes count Ethernet frames
// without the virtio-net header.
type Metrics struct {
	RxPackets atomic.Uint64 // frames delivered to the guest
	RxBytes   atomic.Uint64
	RxDrops   atomic.Uint64 // frames larger than the guest's buffers
	RxErrors  atomic.Uint64 // failed or short backend reads, driver faults
	TxPackets atomic.Uint64 // frames written to the backend
	TxBytes   atomic.Uint64
	TxDrops   atomic.Uint64 // runt frames, writes cut short by Reset
	TxErrors  atomic.Uint64 // failed backend writes, driver faults
}

// stateVersion versions the device's own saved state.
const stateVersion = 1

// state is the device's saved state: its identity, checked on restore,
// and its counters. Queues are saved by the transport. A frame held by the
// receive goroutine is not saved: a VM that resumes in the same process
// gets it after Resume; one restored elsewhere never does (as on Reset),
// as if the link had dropped it.
type state struct {
	Version   int    `json:"version"`
	Tap       string `json:"tap"`
	MAC       string `json:"mac"`
	RxPackets uint64 `json:"rx_packets"`
	RxBytes   uint64 `json:"rx_bytes"`
	RxDrops   uint64 `json:"rx_drops"`
	RxErrors  uint64 `json:"rx_errors"`
	TxPackets uint64 `json:"tx_packets"`
	TxBytes   uint64 `json:"tx_bytes"`
	TxDrops   uint64 `json:"tx_drops"`
	TxErrors  uint64 `json:"tx_errors"`
}

// SaveState implements virtio.Stateful. The device must be quiet:
// quiesced (MMIO.Quiesce), reset or shut down by the transport.
func (d *Device) SaveState() (json.RawMessage, error) {
	m := &d.Metrics
	return json.Marshal(state{Version: stateVersion, Tap: d.b.Name(), MAC: d.mac.String(),
		RxPackets: m.RxPackets.Load(), RxBytes: m.RxBytes.Load(), RxDrops: m.RxDrops.Load(), RxErrors: m.RxErrors.Load(),
		TxPackets: m.TxPackets.Load(), TxBytes: m.TxBytes.Load(), TxDrops: m.TxDrops.Load(), TxErrors: m.TxErrors.Load()})
}

// RestoreState implements virtio.Stateful. It refuses a state saved for
// another tap or MAC address: the guest's network identity would change
// under it.
func (d *Device) RestoreState(raw json.RawMessage) error {
	var s state
	if err := json.Unmarshal(raw, &s); err != nil {
		return fmt.Errorf("virtio-net %s state: %w", d.b.Name(), err)
	}
	if s.Version != stateVersion {
		return fmt.Errorf("virtio-net %s state version %d, this build reads %d", d.b.Name(), s.Version, stateVersion)
	}
	if d.newIdentity {
		// A fork child: its own tap and MAC, the parent's counters.
	} else if s.Tap != d.b.Name() {
		return fmt.Errorf("virtio-net state is for tap %q, this device uses tap %q", s.Tap, d.b.Name())
	}
	mac, err := net.ParseMAC(s.MAC)
	if err != nil || (mac.String() != d.mac.String() && !d.newIdentity) {
		return fmt.Errorf("virtio-net %s state is for MAC %q, this device has %s", d.b.Name(), s.MAC, d.mac)
	}
	m := &d.Metrics
	m.RxPackets.Store(s.RxPackets)
	m.RxBytes.Store(s.RxBytes)
	m.RxDrops.Store(s.RxDrops)
	m.RxErrors.Store(s.RxErrors)
	m.TxPackets.Store(s.TxPackets)
	m.TxBytes.Store(s.TxBytes)
	m.TxDrops.Store(s.TxDrops)
	m.TxErrors.Store(s.TxErrors)
	return nil
}
