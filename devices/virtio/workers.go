package virtio

import (
	"errors"
	"sync"
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
