package vsock

import "sync/atomic"

// Metrics are a device's counters, for an operator to read; every field
// is safe to read at any time. They survive save/restore (state.go).
type Metrics struct {
	// TxPackets counts packets taken from the guest's tx queue.
	TxPackets atomic.Uint64
	// RxPackets counts packets put on the guest's rx queue.
	RxPackets atomic.Uint64
	// Dropped counts guest packets dropped as malformed or misaddressed.
	Dropped atomic.Uint64
	// Resets counts RSTs sent to the guest.
	Resets atomic.Uint64
	// ConnsOpened counts connections established with a host peer: host
	// CONNECTs the guest accepted, guest REQUESTs a service or socket took.
	ConnsOpened atomic.Uint64
	// ConnsRefused counts connections that failed to open: host CONNECTs
	// the guest refused or left unanswered, malformed CONNECT lines, guest
	// REQUESTs to a port nothing serves.
	ConnsRefused atomic.Uint64
	// BytesToHost counts guest data written to host sockets.
	BytesToHost atomic.Uint64
	// BytesToGuest counts host data put on the guest's rx queue.
	BytesToGuest atomic.Uint64
	// HostErrors counts host sockets that failed (read or write errors),
	// each resetting its connection.
	HostErrors atomic.Uint64
	// TransportResets counts TRANSPORT_RESET events delivered.
	TransportResets atomic.Uint64
}
