package blk

import "github.com/warrenvm/warren/devices/virtio"

// Activate implements virtio.Device: it starts the worker, which owns
// a.Queues[0] and the image I/O until Reset; each of its service passes
// serves every available request (virtio.Workers.ServeOne). Each request
// is complete, and pushed, before the next is popped.
func (d *Device) Activate(a *virtio.Activation) error {
	w := &scratch{dev: d}
	return d.workers.ServeOne(a, "virtio-blk", &d.Metrics.Errors.Uint64, func(c *virtio.Chain) uint32 {
		if d.serveHook != nil {
			d.serveHook()
		}
		return w.serve(c)
	})
}

// Reset implements virtio.Device: it stops the worker and waits for it
// (an I/O in progress is finished first).
func (d *Device) Reset() { d.workers.Stop() }
