package virtio

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Workers runs a device's goroutines for one activation. Start launches
// them with a stop channel; Stop closes it and waits for every one to
// return. mu guards stop across Start/Stop, which the transport may call
// from different goroutines.
type Workers struct {
	mu   sync.Mutex
	stop chan struct{}
	wg   sync.WaitGroup
}

// Start runs each fn on its own goroutine until stop is closed. It fails if
// workers are already running.
func (w *Workers) Start(fns ...func(stop <-chan struct{})) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stop != nil {
		return errors.New("virtio: device activated twice")
	}
	stop := make(chan struct{})
	w.stop = stop
	for _, fn := range fns {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			fn(stop)
		}()
	}
	return nil
}

// Stop closes the stop channel and waits for the workers to return. Safe to
// call when none are running.
func (w *Workers) Stop() {
	w.mu.Lock()
	if w.stop != nil {
		close(w.stop)
		w.stop = nil
	}
	w.mu.Unlock()
	w.wg.Wait()
}

// InterruptIfNeeded interrupts the driver when it asked to hear about the
// used entries pushed on q since the last interrupt.
func (a *Activation) InterruptIfNeeded(q *Queue) error {
	need, err := q.NeedsInterrupt(a.Mem)
	if err != nil {
		return err
	}
	if need {
		a.Interrupt()
	}
	return nil
}

// ServeOne activates a device that has one queue, served by one worker:
// it checks that a holds that queue, ready (else ErrBroken, naming dev),
// and starts the worker. Until Stop, the worker drains the queue in one
// service pass (a.Enter to a.Leave) and then sleeps until the driver kicks
// it. Draining serves the available chains one at a time (serve fills one
// and returns how many bytes it wrote; the chain is pushed before the
// next is popped) until the ring is empty, or until a.Quiescing (Resume
// kicks the queue for the rest), then interrupts the driver if it asks to
// hear about them. (With event-idx, Pop's finding the ring empty also asks
// the driver for a kick on its next buffer, and looks again after that, so
// no chain is left waiting for a kick that will not come.) A queue error
// is a driver fault: it counts in errs (when not nil), is reported inside
// the pass (a.Broken), and ends the worker.
func (w *Workers) ServeOne(a *Activation, dev string, errs *atomic.Uint64, serve func(c *Chain) uint32) error {
	if len(a.Queues) != 1 || !a.Queues[0].Ready {
		return fmt.Errorf("%w: %s needs its request queue", ErrBroken, dev)
	}
	return w.Start(func(stop <-chan struct{}) {
		q := a.Queues[0]
		for {
			if !a.Enter(stop) {
				return
			}
			err := a.drain(q, serve)
			if err != nil {
				if errs != nil {
					errs.Add(1)
				}
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
	})
}

// drain is one of ServeOne's service passes.
func (a *Activation) drain(q *Queue, serve func(c *Chain) uint32) error {
	for !a.Quiescing() {
		c, err := q.Pop(a.Mem)
		if err != nil {
			return err
		}
		if c == nil {
			break
		}
		if err := q.Push(a.Mem, c.Head, serve(c)); err != nil {
			return err
		}
	}
	return a.InterruptIfNeeded(q)
}
