package blk

import "github.com/warrenvm/warren/devices/virtio"

// Activate implements virtio.Device: it starts the worker, which owns
// a.Queues[0] and the image I/O until Reset; each of its service passes
// serves every available request (drain).
func (d *Device) Activate(a *virtio.Activation) error {
	w := &scratch{dev: d}
	return d.workers.ServeOne(a, "virtio-blk", &d.Metrics.Errors, func(q *virtio.Queue) error {
		return d.drain(a, q, w)
	})
}

// Reset implements virtio.Device: it stops the worker and waits for it
// (an I/O in progress is finished first).
func (d *Device) Reset() { d.workers.Stop() }

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
