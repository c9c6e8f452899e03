// Package vnet is virtio-net (device type 1) on a host tap device: the
// guest's Ethernet frames go out through the tap, frames the host sends to
// the tap land in the guest's receive buffers.
//
// The device offers VIRTIO_NET_F_MAC, VIRTIO_NET_F_STATUS (link always up),
// VIRTIO_NET_F_MRG_RXBUF, indirect descriptors and event-idx. It offers no
// checksum or segmentation offloads: the tap is configured with no offloads
// (TUNSETOFFLOAD 0) so it hands over complete frames, and the 12-byte
// virtio_net_hdr_v1 in front of every frame is all zeros in both directions
// (except num_buffers on receive). A header the guest sends is never passed
// to the tap: the device writes a zero header of its own.
//
// Threads: each activation runs two goroutines. The transmit goroutine owns
// queue 1 (tx) and the transmit buffer; the receive goroutine owns queue 0
// (rx) and the receive buffer. Both only read the Backend's immutable
// identity and update Metrics atomically. Reset, Activate and Close are
// serialised by Device.mu; Reset returns only after both goroutines have
// stopped touching the queues and guest memory. A goroutine that finds a
// driver fault stops its sibling and waits for it before calling
// Activation.Broken, so the device is already quiet when the transport
// shows NEEDS_RESET. Activate runs under the transport's lock and waits for
// a previous activation's goroutines only if no Reset came between (they
// have then stopped themselves after a fault).
//
// Quiesce: each goroutine touches its queue, guest memory and the
// interrupt only inside service passes (virtio.Activation.Enter/Leave):
// the transmit goroutine's pass pops, sends and pushes chains; the receive
// goroutine's pass delivers the frame it holds. Reading the backend into
// the receive buffer and writing a frame to it (inside the transmit pass,
// from the host copy) touch no guest memory. So while the transport is
// quiesced (MMIO.Quiesce) the receive goroutine may read at most one frame
// from the backend and holds it until Resume; further frames wait in the
// backend. A transmit pass in progress when Quiesce is called finishes its
// chain (the backend write included) before Quiesce returns.
//
// Back-pressure: the receive goroutine holds at most one frame. While the
// guest has posted no receive buffers it stops reading the tap, so frames
// queue in the tap's own (bounded) queue and the kernel drops the excess,
// as a physical NIC with a full ring would.
package vnet
