package daemon

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Admission control of restores. Every VMM the daemon starts on a
// snapshot (a create, a resume from disk) first takes one of
// Config.MaxRestores slots, and keeps it until the guest's agent answers
// or the restore fails: the span in which a restored guest catches up on
// its timers and the host does the restore's work. Past that many, the
// host's CPUs are shared by more restoring guests than they can serve, and
// every one of them slows down (on a host that emulates guest kernel mode,
// a burst of restores on two CPUs livelocked each guest on its own timer
// until all of them timed out). The rest wait in a queue, first come first
// served, and their operations' progress says their place in it; a request
// whose operation is abandoned (the daemon stops) leaves the queue.

// restoreGate is a FIFO counting semaphore. mu guards busy and queue.
type restoreGate struct {
	slots int
	mu    sync.Mutex
	busy  int
	// queue holds the waiters in arrival order; a waiter's channel is
	// closed when the slot is handed to it.
	queue []chan struct{}
}

// newRestoreGate makes a gate with slots slots (at least 1).
func newRestoreGate(slots int) *restoreGate {
	return &restoreGate{slots: max(1, slots)}
}

// acquire takes a slot, waiting in the queue while none is free; while it
// waits it calls report, at once and then every reportEvery, with its
// place (1 is next) and the queue's length. It fails only when ctx ends.
func (g *restoreGate) acquire(ctx context.Context, report func(place, waiting int)) error {
	g.mu.Lock()
	if g.busy < g.slots && len(g.queue) == 0 {
		g.busy++
		g.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	g.queue = append(g.queue, ch)
	g.mu.Unlock()
	tick := time.NewTicker(reportEvery)
	defer tick.Stop()
	for {
		if report != nil {
			if place, n := g.place(ch); place > 0 {
				report(place, n)
			}
		}
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			g.mu.Lock()
			defer g.mu.Unlock()
			select {
			case <-ch: // handed over meanwhile: give it on
				g.releaseLocked()
			default:
				for i, w := range g.queue {
					if w == ch {
						g.queue = append(g.queue[:i], g.queue[i+1:]...)
						break
					}
				}
			}
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// reportEvery is how often a waiter's place is reported.
const reportEvery = 2 * time.Second

// place returns ch's place in the queue (1-based; 0 once it left) and
// the queue's length.
func (g *restoreGate) place(ch chan struct{}) (int, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, w := range g.queue {
		if w == ch {
			return i + 1, len(g.queue)
		}
	}
	return 0, len(g.queue)
}

// release gives the slot back: to the first waiter, if any.
func (g *restoreGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.releaseLocked()
}

func (g *restoreGate) releaseLocked() {
	if len(g.queue) > 0 {
		close(g.queue[0]) // the slot passes on: busy stays
		g.queue = g.queue[1:]
		return
	}
	g.busy--
}

// stats returns the slots in use and the waiters.
func (g *restoreGate) stats() (busy, waiting int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.busy, len(g.queue)
}

// Restores reports the restores holding an admission slot and those
// queued for one (for metrics).
func (d *Daemon) Restores() (running, queued int) { return d.restores.stats() }

// admitRestore takes a restore slot for o's operation, reporting its
// place in the queue as o's progress; the caller releases it with
// d.restores.release().
func (d *Daemon) admitRestore(o *op) error {
	err := d.restores.acquire(d.ctx, func(place, waiting int) {
		o.progress(fmt.Sprintf("queued for a restore slot: %d of %d waiting (%d restores at a time)", place, waiting, d.restores.slots), 5)
	})
	if err != nil {
		return fmt.Errorf("queued for a restore slot: %w", err)
	}
	return nil
}
