package vnet

import (
	"errors"
	"fmt"

	"github.com/warrenvm/warren/devices/virtio"
)

// errShortFrame marks a transmitted frame too short to be Ethernet: it is
// dropped, but the driver is not at fault in virtio terms.
var errShortFrame = errors.New("virtio-net: frame shorter than an Ethernet header")

// gatherTx checks a transmit chain and copies it into buf (of at least
// HeaderLen+MaxFrame bytes) as the packet to hand the backend: a zeroed
// header (no offloads were negotiated, so the guest's header carries
// nothing the host should act on) and the frame. Errors wrapping
// virtio.ErrBroken are driver faults; errShortFrame is a dropped frame.
func gatherTx(buf []byte, c *virtio.Chain) ([]byte, error) {
	if len(c.Writable) > 0 {
		return nil, fmt.Errorf("%w: transmit chain %d has %d device-writable buffers", virtio.ErrBroken, c.Head, len(c.Writable))
	}
	n := c.ReadableLen()
	if n < HeaderLen {
		return nil, fmt.Errorf("%w: transmit chain %d of %d bytes has no virtio-net header", virtio.ErrBroken, c.Head, n)
	}
	if n-HeaderLen > MaxFrame {
		return nil, fmt.Errorf("%w: transmit chain %d carries a %d-byte frame (max %d)", virtio.ErrBroken, c.Head, n-HeaderLen, MaxFrame)
	}
	pkt := buf[:n]
	off := 0
	for _, b := range c.Readable {
		off += copy(pkt[off:], b)
	}
	clear(pkt[:HeaderLen])
	if n-HeaderLen < minFrame {
		return nil, fmt.Errorf("%w: %d bytes", errShortFrame, n-HeaderLen)
	}
	return pkt, nil
}

// transmit sends one chain's frame to the backend. It returns only driver
// faults; dropped frames and backend errors are counted.
func (d *Device) transmit(c *virtio.Chain, stop <-chan struct{}) error {
	pkt, err := gatherTx(d.txBuf, c)
	if errors.Is(err, errShortFrame) {
		d.Metrics.TxDrops.Add(1)
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := d.b.Write(pkt); err != nil {
		if stopped(stop) { // the write was cut short by Reset
			d.Metrics.TxDrops.Add(1)
		} else {
			d.Metrics.TxErrors.Add(1)
		}
		return nil
	}
	d.Metrics.TxPackets.Add(1)
	d.Metrics.TxBytes.Add(uint64(len(pkt) - HeaderLen))
	return nil
}

// txLoop is the transmit goroutine: it drains queue 1 whenever the driver
// kicks it, until stop is closed or the driver breaks the queue. Each
// drain is a service pass (a.Enter to a.Leave): it pops, transmits and
// pushes every chain, and ends early when the transport is quiescing.
func (d *Device) txLoop(a *virtio.Activation, r *run) {
	q, stop := a.Queues[txQueue], r.stop
	for {
		if !a.Enter(stop) {
			return
		}
		more, err := d.txPass(a, q, stop)
		if err != nil {
			d.Metrics.TxErrors.Add(1)
			d.fault(a, r, r.rxExit, fmt.Errorf("transmit: %w", err))
		}
		a.Leave()
		if err != nil || stopped(stop) {
			return
		}
		if more {
			continue
		}
		select {
		case <-stop:
			return
		case <-a.Kicks[txQueue]:
		}
	}
}

// txPass drains the transmit queue, then asks the driver for a kick on its
// next chain. It reports whether a chain may be waiting without a kick
// coming for it (added before the driver saw the request); a pass cut short
// by a quiescing transport reports false: Resume kicks the queue.
func (d *Device) txPass(a *virtio.Activation, q *virtio.Queue, stop <-chan struct{}) (more bool, err error) {
	if err := d.drainTx(a, q, stop); err != nil {
		return false, err
	}
	if stopped(stop) || a.Quiescing() {
		return false, nil
	}
	if err := q.EnableNotify(a.Mem); err != nil {
		return false, err
	}
	// A chain made available before the driver saw EnableNotify raised
	// no kick: look once more before sleeping.
	return q.Pending(a.Mem)
}

// drainTx sends every available chain and returns each to the driver (a
// frame that could not be sent is dropped, as by a NIC), then interrupts the
// driver if it asked for that. It stops early when the transport is
// quiescing, after pushing the chain in hand.
func (d *Device) drainTx(a *virtio.Activation, q *virtio.Queue, stop <-chan struct{}) error {
	for !stopped(stop) && !a.Quiescing() {
		c, err := q.Pop(a.Mem)
		if err != nil {
			return err
		}
		if c == nil {
			break
		}
		if err := d.transmit(c, stop); err != nil {
			return err
		}
		if err := q.Push(a.Mem, c.Head, 0); err != nil {
			return err
		}
	}
	return a.InterruptIfNeeded(q)
}
