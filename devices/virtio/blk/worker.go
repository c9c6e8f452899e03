package blk

import (
	"fmt"

	"github.com/warrenvm/warren/devices/virtio"
)

// Activate implements virtio.Device: it starts the worker.
func (d *Device) Activate(a *virtio.Activation) error {
	if len(a.Queues) != 1 || !a.Queues[0].Ready {
		return fmt.Errorf("%w: virtio-blk needs its request queue", virtio.ErrBroken)
	}
	return d.workers.Start(func(stop <-chan struct{}) { d.worker(a, stop) })
}

// Reset implements virtio.Device: it stops the worker and waits for it
// (an I/O in progress is finished first).
func (d *Device) Reset() { d.workers.Stop() }

// worker owns a.Queues[0] and the image I/O until stop is closed. It
// serves every available request, in one service pass (a.Enter to
// a.Leave), and sleeps until a kick.
func (d *Device) worker(a *virtio.Activation, stop <-chan struct{}) {
	w := &scratch{dev: d}
	q := a.Queues[0]
	for {
		if !a.Enter(stop) {
			return
		}
		err := d.drain(a, q, w)
		if err != nil {
			d.Metrics.Errors.Add(1)
			a.Broken(err)
		}
		a.Leave()
		if err != nil {
			return
		}
		select {
		case <-stop:
			return
		case <-a.Kicks[0]:
		}
	}
}

// drain serves requests until the ring is empty, or until the transport
// is quiescing (the rest waits for Resume, which kicks the queue), then
// interrupts the driver if it wants to hear about them. (With event-idx,
// Pop's finding the ring empty also asks the driver for a kick on its next
// buffer, and looks again after that, so no request is left waiting for a
// kick that will not come.) Each request is complete, and pushed, before
// the next is popped.
func (d *Device) drain(a *virtio.Activation, q *virtio.Queue, w *scratch) error {
	for !a.Quiescing() {
		c, err := q.Pop(a.Mem)
		if err != nil {
			return err
		}
		if c == nil {
			break
		}
		if d.serveHook != nil {
			d.serveHook()
		}
		n := w.serve(c)
		if err := q.Push(a.Mem, c.Head, n); err != nil {
			return err
		}
	}
	return a.InterruptIfNeeded(q)
}
