package vnet

import (
	"encoding/binary"
	"fmt"

	"github.com/warrenvm/warren/devices/virtio"
)

// rxLoop is the receive goroutine. It reads one packet from the backend
// into d.rxBuf, delivers it into the guest's receive buffers, and only then
// reads the next: while the guest has no buffers it holds that one frame
// and waits for a kick on queue 0, leaving further frames in the backend.
// The backend read happens outside service passes (it touches only
// d.rxBuf); the delivery, inside one (a.Enter to a.Leave). So while the
// transport is quiesced the goroutine holds at most the one frame it read,
// and delivers it after Resume.
func (d *Device) rxLoop(a *virtio.Activation, r *run, mergeable bool) {
	q, stop := a.Queues[rxQueue], r.stop
	held := 0 // length of the packet in d.rxBuf; 0 when none
	for {
		if held == 0 {
			n, err := d.b.Read(d.rxBuf)
			if stopped(stop) {
				return
			}
			if err != nil || n < HeaderLen+minFrame {
				d.Metrics.RxErrors.Add(1)
				if err != nil && !pause(stop, errBackoff) {
					return
				}
				continue
			}
			held = n
		}
		if !a.Enter(stop) {
			return
		}
		res, err := d.rxPass(a, q, d.rxBuf[:held], mergeable)
		if err != nil {
			d.Metrics.RxErrors.Add(1)
			d.fault(a, r, r.txExit, fmt.Errorf("receive: %w", err))
		}
		a.Leave()
		if err != nil {
			return
		}
		switch res {
		case rxDone, rxDropped:
			held = 0
		case rxWait:
			select {
			case <-stop:
				return
			case <-a.Kicks[rxQueue]:
			}
		case rxRetry:
		}
	}
}

// rxPass is the service pass of the receive goroutine: it delivers pkt and
// interrupts the driver if it wants to hear about it. Errors are driver
// faults.
func (d *Device) rxPass(a *virtio.Activation, q *virtio.Queue, pkt []byte, mergeable bool) (rxResult, error) {
	res, err := d.deliver(a.Mem, q, pkt, mergeable)
	if err != nil {
		return 0, err
	}
	if res == rxDone {
		if err := a.InterruptIfNeeded(q); err != nil {
			return 0, err
		}
	}
	return res, nil
}

// rxResult is what deliver did with a frame.
type rxResult int

const (
	rxDone    rxResult = iota // delivered
	rxDropped                 // too large for the guest's buffers
	rxWait                    // not enough buffers; a kick will come when there are
	rxRetry                   // not enough buffers, but the driver just added some
)

// deliver copies pkt (a header and a frame) into the guest's receive
// buffers. When there are not enough buffers yet it takes nothing from the
// queue, asks the driver for a kick when it adds more, and returns rxWait
// (or rxRetry when some were added meanwhile). A frame that can never fit
// is dropped and counted. Errors are driver faults.
//
// Without VIRTIO_NET_F_MRG_RXBUF the frame must fit one chain. With it, the
// frame is spread over as many chains as needed and the header's
// num_buffers says how many; each chain must have room for the header.
func (d *Device) deliver(mem virtio.Memory, q *virtio.Queue, pkt []byte, mergeable bool) (rxResult, error) {
	start := q.NextAvail
	var chains []*virtio.Chain
	room := 0
	for room < len(pkt) {
		if !mergeable && len(chains) == 1 || len(chains) == int(q.Size) {
			// The buffers one chain (or the whole ring) holds are too
			// small for this frame: drop it, give the chains back.
			q.NextAvail = start
			d.Metrics.RxDrops.Add(1)
			return rxDropped, nil
		}
		c, err := q.Pop(mem)
		if err != nil {
			return 0, err
		}
		if c == nil {
			return d.waitBuffers(mem, q, start)
		}
		if len(c.Readable) > 0 {
			return 0, fmt.Errorf("%w: receive chain %d has device-readable buffers", virtio.ErrBroken, c.Head)
		}
		n := c.WritableLen()
		if mergeable && n < HeaderLen {
			return 0, fmt.Errorf("%w: receive chain %d of %d bytes cannot hold a header", virtio.ErrBroken, c.Head, n)
		}
		chains = append(chains, c)
		room += n
	}
	// The header: no offloads, so no flags and no GSO; what the tap wrote
	// in those fields is discarded.
	clear(pkt[:HeaderLen])
	binary.LittleEndian.PutUint16(pkt[10:], uint16(len(chains)))
	rest := pkt
	for i, c := range chains {
		written := 0
		for _, b := range c.Writable {
			k := copy(b, rest)
			rest = rest[k:]
			written += k
		}
		// A frame spread over several chains becomes visible to the
		// driver all at once: Linux misreads a merged frame whose later
		// buffers it cannot see yet.
		push := q.Push
		if i < len(chains)-1 {
			push = q.Stage
		}
		if err := push(mem, c.Head, uint32(written)); err != nil {
			return 0, err
		}
	}
	d.Metrics.RxPackets.Add(1)
	d.Metrics.RxBytes.Add(uint64(len(pkt) - HeaderLen))
	return rxDone, nil
}

// waitBuffers is deliver running out of buffers with the ring consumed up
// to the driver's available index and start the first chain this frame
// took. With event-idx the kick request must name that index, not start:
// the driver kicks only when its index crosses the one requested, and it
// is already past start. Then the taken chains are given back.
func (d *Device) waitBuffers(mem virtio.Memory, q *virtio.Queue, start uint16) (rxResult, error) {
	if err := q.EnableNotify(mem); err != nil {
		return 0, err
	}
	more, err := q.Pending(mem) // added before the driver saw the request?
	q.NextAvail = start
	if err != nil {
		return 0, err
	}
	if more {
		return rxRetry, nil
	}
	return rxWait, nil
}
