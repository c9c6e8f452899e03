package vsock

import "github.com/warrenvm/warren/devices/virtio"

// Metrics are a device's counters, for an operator to read; every field
// is safe to read at any time. They survive save/restore (state.go).
type Metrics struct {
	// TxPackets counts packets taken from the guest's tx queue.
	TxPackets virtio.Counter `json:"tx_packets"`
	// RxPackets counts packets put on the guest's rx queue.
	RxPackets virtio.Counter `json:"rx_packets"`
	// Dropped counts guest packets dropped as malformed or misaddressed.
	Dropped virtio.Counter `json:"dropped"`
	// Resets counts RSTs sent to the guest.
	Resets virtio.Counter `json:"resets"`
	// ConnsOpened counts connections established with a host peer: host
	// CONNECTs the guest accepted, guest REQUESTs a service or socket took.
	ConnsOpened virtio.Counter `json:"conns_opened"`
	// ConnsRefused counts connections that failed to open: host CONNECTs
	// the guest refused or left unanswered, malformed CONNECT lines, guest
	// REQUESTs to a port nothing serves.
	ConnsRefused virtio.Counter `json:"conns_refused"`
	// BytesToHost counts guest data written to host sockets.
	BytesToHost virtio.Counter `json:"bytes_to_host"`
	// BytesToGuest counts host data put on the guest's rx queue.
	BytesToGuest virtio.Counter `json:"bytes_to_guest"`
	// HostErrors counts host sockets that failed (read or write errors),
	// each resetting its connection.
	HostErrors virtio.Counter `json:"host_errors"`
	// TransportResets counts TRANSPORT_RESET events delivered.
	TransportResets virtio.Counter `json:"transport_resets"`
}
