// Package vsock is Warren's userspace virtio-vsock device (device type 19;
// there is no vhost-vsock on these hosts) with Firecracker's "hybrid" host
// side: host programs reach guest ports through one unix socket, and
// guest connections to the host land on in-process services or on unix
// sockets beside it.
//
// The pieces, one concern per file: packet.go is the header codec (every
// header from the guest is validated where it enters), credit.go the flow
// control accounting of the virtio spec (5.10.6.3), conn.go the
// per-connection state machine (no I/O), device.go the virtio device,
// worker.go its worker goroutine (queues and connections), host.go the
// host sockets (Listen, the CONNECT
// handshake, per-connection reader and writer goroutines), dial.go the
// client side of the handshake (Dial), state.go save/restore, metrics.go
// the counters.
//
// Host → guest: a client connects to Device.UDSPath and writes
// "CONNECT <port>\n"; once the guest accepts it reads "OK <hostport>\n"
// and then the stream. Guest → host: a connection to host port P is
// served by Device.Services[P], else by the unix socket "<UDSPath>_<P>",
// else refused with an RST.
//
// Threads: per activation one worker goroutine owns the queues, guest
// memory and every connection's state, except that a connection's reader
// may run a service pass itself while the worker sleeps (passes are
// serialised, so whoever runs one is "the worker"). The worker writes
// guest data to host sockets itself, without blocking; reads, and the
// rest of a write a socket did not take at once, run on per-connection
// goroutines that exchange events with it, so a slow or stuck host peer
// (or guest) stalls only its own connection. See Device.
//
// Cost per packet: a service pass takes every tx chain and fills every
// rx buffer it has packets for, publishes each queue's used ring once and
// raises at most one interrupt; it allocates nothing per packet (payloads
// are read in place from guest memory, read buffers are pooled, a
// connection keeps a small buffer for the guest's next data). A host
// message costs one goroutine wakeup (its reader, which runs the service
// pass itself when none is running), a guest message two (the queue
// notification's reader, then the worker, which writes it out).
//
// Flow control, not buffering, absorbs slow readers: guest data waiting
// for the host is bounded per connection by the buf_alloc the device
// advertises (BufAlloc), and host data waiting for the guest by two
// chunks of at most MaxPayload each per connection (the reader reads the
// next while the worker delivers one).
//
// Quiesce: the worker serves everything in service passes
// (virtio.Activation.Enter/Leave), each complete (every chain it pops is
// pushed) before Quiesce returns; while quiesced, host goroutines only
// post events, which wait in the inbox (a reader's inline pass finds the
// gate shut and leaves its event there), and per-connection bounds hold
// (at most the reader's two buffers read, one write in flight). Host
// clients may still connect and dials finish; their events wait too.
//
// Snapshots: connections are not saved. After a restore the restorer
// calls Device.TransportReset, and the guest driver drops its sockets
// and re-reads its CID.
package vsock
