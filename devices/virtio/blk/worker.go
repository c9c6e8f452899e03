package blk

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/warrenvm/warren/devices/virtio"
)

// lifecycle starts and stops the worker goroutine. mu guards stop across
// Activate and Reset, which the transport may call from different
// goroutines; wg lets Reset wait until the worker has let go of the queue
// and guest memory.
type lifecycle struct {
	mu   sync.Mutex
	stop chan struct{}
	wg   sync.WaitGroup
}

// Activate implements virtio.Device: it starts the worker.
func (d *Device) Activate(a *virtio.Activation) error {
	if len(a.Queues) != 1 || !a.Queues[0].Ready {
		return fmt.Errorf("%w: virtio-blk needs its request queue", virtio.ErrBroken)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stop != nil {
		return fmt.Errorf("virtio-blk: activated twice")
	}
	d.stop = make(chan struct{})
	d.wg.Add(1)
	go d.worker(a, d.stop)
	return nil
}

// Reset implements virtio.Device: it stops the worker and waits for it
// (an I/O in progress is finished first).
func (d *Device) Reset() {
	d.mu.Lock()
	if d.stop != nil {
		close(d.stop)
		d.stop = nil
	}
	d.mu.Unlock()
	d.wg.Wait()
}

// worker owns a.Queues[0] and the image I/O until stop is closed. It
// serves every available request, asks for the next notification, and
// sleeps until a kick.
func (d *Device) worker(a *virtio.Activation, stop <-chan struct{}) {
	defer d.wg.Done()
	w := &scratch{dev: d}
	q := a.Queues[0]
	for {
		if err := d.drain(a, q, w); err != nil {
			d.Metrics.Errors.Add(1)
			a.Broken(err)
			return
		}
		select {
		case <-stop:
			return
		case <-a.Kicks[0]:
		}
	}
}

// drain serves requests until the ring stays empty after the driver has
// been asked to notify us of the next one, so that no request made
// available meanwhile is left waiting for a kick that will not come.
func (d *Device) drain(a *virtio.Activation, q *virtio.Queue, w *scratch) error {
	for {
		for {
			c, err := q.Pop(a.Mem)
			if err != nil {
				return err
			}
			if c == nil {
				break
			}
			n := w.serve(c)
			if err := q.Push(a.Mem, c.Head, n); err != nil {
				return err
			}
		}
		need, err := q.NeedsInterrupt(a.Mem)
		if err != nil {
			return err
		}
		if need {
			a.Interrupt()
		}
		if err := q.EnableNotify(a.Mem); err != nil {
			return err
		}
		// The driver publishes its index, then reads our avail_event; we
		// write avail_event, then read its index. Both sides need a full
		// barrier between the store and the load, or each may miss the
		// other's update. EnableNotify's event-idx store is a plain one,
		// so fence here (a locked instruction orders it on amd64).
		fence()
		more, err := q.Pending(a.Mem)
		if err != nil {
			return err
		}
		if !more {
			return nil
		}
	}
}

var fenceWord atomic.Uint32

// fence is a full memory barrier: a locked read-modify-write.
func fence() { fenceWord.Add(1) }
