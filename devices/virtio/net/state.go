package vnet

import (
	"encoding/json"
	"fmt"
	"net"

	"github.com/warrenvm/warren/devices/virtio"
)

// Metrics are counters an operator reads. Bytes count Ethernet frames
// without the virtio-net header. They survive save/restore (the device's
// state carries them).
type Metrics struct {
	RxPackets virtio.Counter `json:"rx_packets"` // frames delivered to the guest
	RxBytes   virtio.Counter `json:"rx_bytes"`
	RxDrops   virtio.Counter `json:"rx_drops"`   // frames larger than the guest's buffers
	RxErrors  virtio.Counter `json:"rx_errors"`  // failed or short backend reads, driver faults
	TxPackets virtio.Counter `json:"tx_packets"` // frames written to the backend
	TxBytes   virtio.Counter `json:"tx_bytes"`
	TxDrops   virtio.Counter `json:"tx_drops"`  // runt frames, writes cut short by Reset
	TxErrors  virtio.Counter `json:"tx_errors"` // failed backend writes, driver faults
}

// stateVersion versions the device's own saved state.
const stateVersion = 1

// state is the device's saved state: its identity, checked on restore,
// and its counters. Queues are saved by the transport. A frame held by the
// receive goroutine is not saved: a VM that resumes in the same process
// gets it after Resume; one restored elsewhere never does (as on Reset),
// as if the link had dropped it.
type state struct {
	Version int    `json:"version"`
	Tap     string `json:"tap"`
	MAC     string `json:"mac"`
	*Metrics
}

// SaveState implements virtio.Stateful. The device must be quiet:
// quiesced (MMIO.Quiesce), reset or shut down by the transport.
func (d *Device) SaveState() (json.RawMessage, error) {
	return json.Marshal(state{Version: stateVersion, Tap: d.b.Name(), MAC: d.mac.String(), Metrics: &d.Metrics})
}

// RestoreState implements virtio.Stateful. It refuses a state saved for
// another tap or MAC address: the guest's network identity would change
// under it.
func (d *Device) RestoreState(raw json.RawMessage) error {
	s := state{Metrics: new(Metrics)}
	if err := virtio.DecodeState(raw, "virtio-net "+d.b.Name(), &s, &s.Version, stateVersion); err != nil {
		return err
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
	virtio.RestoreCounters(&d.Metrics, s.Metrics)
	return nil
}
