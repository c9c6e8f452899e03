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
// and starts the worker. Until Stop, the worker runs pass in one service
// pass (a.Enter to a.Leave) and then sleeps until the driver kicks the
// queue. pass serves what the ring holds (stopping early when a.Quiescing:
// Resume kicks the queue for the rest) and interrupts the driver if it
// asks to hear about it. An error from pass is a driver fault: it counts
// in errs (when not nil), is reported inside the pass (a.Broken), and ends
// the worker.
func (w *Workers) ServeOne(a *Activation, dev string, errs *atomic.Uint64, pass func(q *Queue) error) error {
	if len(a.Queues) != 1 || !a.Queues[0].Ready {
		return fmt.Errorf("%w: %s needs its request queue", ErrBroken, dev)
	}
	return w.Start(func(stop <-chan struct{}) {
		q := a.Queues[0]
		for {
			if !a.Enter(stop) {
				return
			}
			err := pass(q)
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
