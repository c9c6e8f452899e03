package vmm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/vmm/kvm"
)

// Pause and resume of a running VM.
//
// Roles. The controller is whoever calls Pause, Resume or SaveState (any
// goroutine; pauseState.ctl serialises them). The vCPU threads are the
// goroutines started by Run, each locked to its OS thread and the only one
// that ever touches its kvm.VCPU. Device workers are quiesced through the
// hooks registered with AddPauseHook.
//
// The handshake, one round per Pause:
//
//  1. Pause opens a round under pauseState.mu: a fresh gate and allParked
//     channel, parked = 0, requested = true. Then it kicks every vCPU
//     (immediate_exit = 1 in its kvm_run page, and SIGURG to its thread so a
//     thread inside KVM_RUN leaves the guest at once).
//  2. Each vCPU thread reads requested before every KVM_RUN. When it is set
//     the thread parks: it first enters KVM_RUN once more with
//     immediate_exit still 1. KVM completes there an I/O or MMIO instruction
//     whose userspace half was just serviced (the guest's registers are
//     consistent only after that re-entry) and returns EINTR without
//     running guest code. Then, under mu, the thread counts itself parked
//     (the last one closes allParked) and waits for the gate to close. While
//     it waits it runs the closures the controller sends on its calls
//     channel: that is how SaveState reads a vCPU on its owning thread.
//  3. Pause waits for allParked (or the VM stopping, or ctx), then calls the
//     devices' Quiesce hooks, in registration order. The VM is then paused:
//     no guest instruction runs and no device touches guest memory.
//  4. Resume calls the devices' Resume hooks in reverse order, then under mu
//     clears requested and closes the gate. Each thread clears its
//     immediate_exit and only then rereads stopping and requested before its
//     next KVM_RUN, so a kick that lands in between is never lost.
//
// Stop works at any point: parked threads also wait on the VM's done
// channel and leave when it closes.
type pauseState struct {
	// ctl serialises the controller: Pause, Resume, SaveState, AddPauseHook.
	ctl sync.Mutex
	// paused is true between a successful Pause and Resume (ctl).
	paused bool
	// quiesced is how many hooks have been quiesced (ctl).
	quiesced int
	// hooks are the registered device hooks (ctl).
	hooks []PauseHook

	// requested is set while a round is open; vCPU threads read it before
	// each KVM_RUN without locking. Written under mu.
	requested atomic.Bool
	// mu protects gate, allParked and parked.
	mu        sync.Mutex
	gate      chan struct{} // closed to end the round
	allParked chan struct{} // closed when parked reaches n
	parked    int
	n         int // number of vCPUs (fixed)
	// calls[i] carries closures to vCPU i's thread while it is parked.
	calls []chan func(*kvm.VCPU)
}

func (p *pauseState) init(n int, paused bool) {
	p.n = n
	p.calls = make([]chan func(*kvm.VCPU), n)
	for i := range p.calls {
		p.calls[i] = make(chan func(*kvm.VCPU))
	}
	if paused {
		p.open()
	}
}

// open starts a pause round (no-op if one is open).
func (p *pauseState) open() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.requested.Load() {
		return
	}
	p.gate, p.allParked, p.parked = make(chan struct{}), make(chan struct{}), 0
	p.requested.Store(true)
}

// release ends the round and lets parked vCPU threads go.
func (p *pauseState) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.requested.Load() {
		return
	}
	p.requested.Store(false)
	close(p.gate)
}

// round returns the open round's allParked channel, or nil.
func (p *pauseState) round() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.requested.Load() {
		return nil
	}
	return p.allParked
}

// ErrStopped is returned by Pause, Resume and SaveState once the VM has
// stopped (or is stopping).
var ErrStopped = errors.New("vmm: the VM has stopped")

// PauseHook lets a device take part in Pause and Resume. Register it with
// AddPauseHook before Run (or while the VM runs unpaused). Hooks are called
// on the goroutine that called Pause or Resume, with the controller lock
// held: they must not call Pause, Resume or SaveState themselves.
type PauseHook struct {
	// Name identifies the device in errors.
	Name string
	// Quiesce is called by Pause once every vCPU is parked. It must return
	// when the device's workers have finished their in-flight requests and
	// will neither touch guest memory nor signal interrupts until Resume.
	// Nil means the device has nothing to quiesce.
	Quiesce func(ctx context.Context) error
	// Resume is called by Resume before any vCPU runs again; the device may
	// then work again. Nil means nothing to do.
	Resume func() error
}

// AddPauseHook registers h. Pause quiesces devices in registration order,
// Resume resumes them in the reverse order.
func (v *VM) AddPauseHook(h PauseHook) {
	v.pause.ctl.Lock()
	defer v.pause.ctl.Unlock()
	v.pause.hooks = append(v.pause.hooks, h)
}

// Pause stops the guest: every vCPU leaves KVM_RUN, completes any I/O
// instruction in flight and parks on its thread; then the devices' Quiesce
// hooks run, and the console output written so far is flushed. It
// returns nil once the VM is paused (at once if it already
// is); ErrStopped if the VM stopped; ctx's error if ctx ends first, in which
// case the VM keeps running. Called before Run it waits for Run to create
// the vCPUs (see also Config.StartPaused). Safe from any goroutine.
func (v *VM) Pause(ctx context.Context) error {
	p := &v.pause
	p.ctl.Lock()
	defer p.ctl.Unlock()
	if p.paused {
		return nil
	}
	if v.stopping.Load() {
		return ErrStopped
	}
	p.open()
	allParked := p.round()
	v.kick()
	select {
	case <-allParked:
	case <-v.done:
		return ErrStopped
	case <-ctx.Done():
		p.release()
		return fmt.Errorf("vmm: pause: %w", ctx.Err())
	}
	for _, h := range p.hooks {
		if h.Quiesce != nil {
			if err := h.Quiesce(ctx); err != nil {
				v.resumeLocked()
				return fmt.Errorf("vmm: pause: quiesce %s: %w", h.Name, err)
			}
		}
		p.quiesced++
	}
	p.paused = true
	// Console output the guest wrote before the pause goes out now, not
	// after the line buffer's delay while the VM is paused.
	v.conbuf.Flush()
	return nil
}

// Resume lets a paused VM (Pause, or Config.StartPaused) run again: the
// devices' Resume hooks run, then the vCPUs re-enter the guest. Resuming a
// VM that is not paused does nothing.
func (v *VM) Resume() error {
	v.pause.ctl.Lock()
	defer v.pause.ctl.Unlock()
	if v.stopping.Load() {
		return ErrStopped
	}
	return v.resumeLocked()
}

// resumeLocked resumes quiesced hooks, last first, and ends the round. ctl
// is held. The vCPUs are released even when a hook fails.
func (v *VM) resumeLocked() error {
	p := &v.pause
	var errs []error
	for i := p.quiesced - 1; i >= 0; i-- {
		if h := p.hooks[i]; h.Resume != nil {
			if err := h.Resume(); err != nil {
				errs = append(errs, fmt.Errorf("vmm: resume %s: %w", h.Name, err))
			}
		}
	}
	p.quiesced = 0
	p.paused = false
	p.release()
	return errors.Join(errs...)
}

// Paused reports whether the VM is paused (Pause returned nil and Resume
// has not been called since).
func (v *VM) Paused() bool {
	v.pause.ctl.Lock()
	defer v.pause.ctl.Unlock()
	return v.pause.paused
}

// park is called on vCPU c's own thread when a pause is requested. It
// completes the exit in flight, counts the thread as parked and serves
// calls until the round ends or the VM stops. On return c's immediate_exit
// is clear (unless the VM is stopping) and the caller rereads the flags.
func (v *VM) park(c *kvm.VCPU) error {
	p := &v.pause
	// Finish the instruction whose exit we just serviced: with
	// immediate_exit set KVM completes it and returns EINTR before running
	// any further guest code. A completion can exit again (the next chunk
	// of a string I/O); service that too.
	c.SetImmediateExit(true)
	for {
		err := c.Run()
		if err != nil {
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
				break
			}
			return err
		}
		if stop, err := v.handleExit(c); stop {
			v.Stop(err)
			return nil
		}
	}
	p.mu.Lock()
	if !p.requested.Load() { // resumed before we got here
		p.mu.Unlock()
		c.SetImmediateExit(false)
		return nil
	}
	gate := p.gate
	p.parked++
	if p.parked == p.n {
		close(p.allParked)
	}
	p.mu.Unlock()
	calls := p.calls[c.ID()]
	for {
		select {
		case <-gate:
			c.SetImmediateExit(false)
			return nil
		case f := <-calls:
			f(c)
		case <-v.done:
			return nil
		}
	}
}

// onVCPU runs f on vCPU id's own thread, which must be parked (the caller
// holds ctl with the VM paused), and returns f's error.
func (v *VM) onVCPU(id int, f func(*kvm.VCPU) error) error {
	res := make(chan error, 1)
	select {
	case v.pause.calls[id] <- func(c *kvm.VCPU) { res <- f(c) }:
	case <-v.done:
		return ErrStopped
	}
	return <-res
}

// onEveryVCPU runs f on every vCPU's thread, concurrently, and returns the
// first error.
func (v *VM) onEveryVCPU(f func(*kvm.VCPU) error) error {
	errs := make([]error, v.cfg.CPUs)
	var wg sync.WaitGroup
	for id := range v.cfg.CPUs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := v.onVCPU(id, f); err != nil {
				errs[id] = fmt.Errorf("vCPU %d: %w", id, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
