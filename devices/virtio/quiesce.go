package virtio

// Quiescing a device for a snapshot of a running VM.
//
// The invariant. A device model touches guest memory, its queues (Pop,
// Push, Stage, Publish, EnableNotify, Pending, NeedsInterrupt) and the
// interrupt (Activation.Interrupt, Activation.Broken) only inside a service
// pass: between Activation.Enter and Activation.Leave, on one of its worker
// goroutines. Host-side work (tap reads into the device's own buffer, host
// socket I/O, waiting for a kick) happens outside passes and never touches
// guest memory. Every chain a pass pops is pushed before the pass ends, so
// between passes NextAvail and NextUsed agree with the rings in guest
// memory.
//
// MMIO.Quiesce closes the activation's gate: no new pass starts, and it
// waits for the passes in progress to end. A pass that sees
// Activation.Quiescing ends at its next safe point (after a push, before
// the next pop) rather than draining the whole ring. Once Quiesce returns
// no device goroutine touches guest memory, the queues or the interrupt
// until MMIO.Resume reopens the gate, and the vCPU threads are parked by
// the VMM, so MMIO.Save sees a consistent state and guest memory can be
// copied. Resume kicks every queue, so that work left by a pass cut short,
// or a notification taken by a worker that then waited at the gate, is
// looked at again.

import (
	"context"
	"fmt"
	"sync"
)

// gate holds a device's service passes while a snapshot is taken. The
// zero gate is open. mu guards every field.
type gate struct {
	mu     sync.Mutex
	closed bool
	passes int // passes in progress
	// opened is closed when a closed gate reopens (nil while open).
	opened chan struct{}
	// idle is closed when the last pass leaves a closed gate (nil when
	// nobody waits for that).
	idle chan struct{}
}

// enter begins a pass, waiting while the gate is closed. It reports false,
// without beginning a pass, when stop closes first.
func (g *gate) enter(stop <-chan struct{}) bool {
	for {
		g.mu.Lock()
		if !g.closed {
			g.passes++
			g.mu.Unlock()
			return true
		}
		opened := g.opened
		g.mu.Unlock()
		select {
		case <-opened:
		case <-stop:
			return false
		}
	}
}

// leave ends a pass begun by enter.
func (g *gate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.passes <= 0 {
		panic("virtio: Activation.Leave without Enter")
	}
	g.passes--
	if g.passes == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
}

// isClosed reports whether the gate is closed (or closing).
func (g *gate) isClosed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// shut closes the gate without waiting.
func (g *gate) shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.closed = true
		g.opened = make(chan struct{})
	}
}

// close closes the gate and waits for the passes in progress to end. When
// ctx ends first it reopens the gate and returns ctx's error.
func (g *gate) close(ctx context.Context) error {
	g.mu.Lock()
	if !g.closed {
		g.closed = true
		g.opened = make(chan struct{})
	}
	if g.passes == 0 {
		g.mu.Unlock()
		return nil
	}
	if g.idle == nil {
		g.idle = make(chan struct{})
	}
	idle := g.idle
	g.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		g.open()
		return ctx.Err()
	}
}

// open reopens the gate, releasing the workers waiting in enter.
func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		g.closed = false
		close(g.opened)
		g.opened = nil
		g.idle = nil
	}
}

// Enter begins a service pass of one of the device's workers: it waits
// while the transport is quiesced and reports false, without beginning a
// pass, when stop closes first. Between Enter and Leave the worker may
// touch guest memory, its queues and the interrupt; outside a pass it must
// not. Every chain popped in a pass must be pushed before Leave.
func (a *Activation) Enter(stop <-chan struct{}) bool {
	if a.gate == nil {
		select {
		case <-stop:
			return false
		default:
			return true
		}
	}
	return a.gate.enter(stop)
}

// Leave ends a pass begun by Enter.
func (a *Activation) Leave() {
	if a.gate != nil {
		a.gate.leave()
	}
}

// Quiescing reports whether the transport is waiting for passes to end
// (or is quiesced): a pass draining a ring should stop at its next safe
// point, after pushing the chain in hand and before popping another. The
// work left is picked up after Resume, which kicks every queue.
func (a *Activation) Quiescing() bool {
	return a.gate != nil && a.gate.isClosed()
}

// Quiesce brings the device to a safe point for a snapshot: when it
// returns nil, every chain the device had popped has been pushed, and no
// device goroutine reads or writes guest memory, takes or returns queue
// entries or raises an interrupt until Resume. Host-side I/O may go on
// (bounded, and away from guest memory). The caller keeps the vCPUs
// parked meanwhile, so that the driver does not touch the transport either.
//
// Quiesce on a device that is not activated, or already quiesced, does
// nothing. When ctx ends before the passes in progress do, Quiesce leaves
// the device running and returns ctx's error.
func (t *MMIO) Quiesce(ctx context.Context) error {
	t.qmu.Lock()
	defer t.qmu.Unlock()
	t.mu.Lock()
	t.waitReset()
	if !t.activated || t.quiesced {
		t.mu.Unlock()
		return nil
	}
	g := t.gate
	t.mu.Unlock()
	if err := g.close(ctx); err != nil {
		t.kickAll() // a pass cut short left work behind
		return fmt.Errorf("virtio: quiesce %s: %w", t.name, err)
	}
	t.mu.Lock()
	t.quiesced = true
	// A pass that found a driver fault has started an asynchronous reset
	// and a configuration-change interrupt; let them finish.
	t.waitReset()
	t.mu.Unlock()
	t.signals.Wait()
	return nil
}

// Resume lets a quiesced device work again and kicks every queue, so that
// buffers the driver made available meanwhile, and work a pass left when
// Quiesce cut it short, are served. Resume on a device that is not
// quiesced does nothing.
func (t *MMIO) Resume() error {
	t.qmu.Lock()
	defer t.qmu.Unlock()
	t.mu.Lock()
	if !t.quiesced {
		t.mu.Unlock()
		return nil
	}
	t.quiesced = false
	g := t.gate
	t.mu.Unlock()
	if g != nil {
		g.open()
	}
	t.kickAll()
	return nil
}

// Quiesced reports whether the transport is quiesced (between a
// successful Quiesce of an activated device and Resume).
func (t *MMIO) Quiesced() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.quiesced
}

// kickAll notifies every queue.
func (t *MMIO) kickAll() {
	for i := range t.kicks {
		t.Notify(uint32(i))
	}
}
