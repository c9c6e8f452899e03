package vmm

import (
	"fmt"

	"github.com/warrenvm/warren/vmm/guestmem"
	"github.com/warrenvm/warren/vmm/kvm"
)

// LoadState puts a paused VM back into a saved state in place, for a
// rollback: the same KVM VM, vCPU threads, memory mapping and devices are
// kept, so nothing is rebuilt and the guest pages fill leaves untouched
// stay mapped.
//
// st must be a state of a machine like this one (vCPU count, memory size,
// virtio devices, host profile: the checks Restore makes). fill rewrites
// guest memory to the saved content; it runs first, with the vCPUs parked
// and the devices quiesced, so nothing else touches memory. Then the
// irqchip, PIT and COM1 are loaded, every vCPU's state on its own thread
// (CPUID excepted: KVM fixes it at the first KVM_RUN, and a state of this
// same machine carries the same table), and finally the kvmclock, so the
// guest's clock continues from the saved value.
//
// The virtio transports are the caller's: restore their states (while
// they are still quiesced) before Resume, then call RaisePending so that
// interrupts the saved devices had raised reach the restored LAPICs.
// On an error the VM stays paused in an undefined state: stop it.
func (v *VM) LoadState(st *State, fill func(*guestmem.Memory) error) error {
	p := &v.pause
	p.ctl.Lock()
	defer p.ctl.Unlock()
	if !p.paused {
		return fmt.Errorf("vmm: load state: the VM is not paused")
	}
	if v.stopping.Load() {
		return ErrStopped
	}
	if err := st.Validate(); err != nil {
		return err
	}
	if err := st.matches(v.cfg); err != nil {
		return err
	}
	if st.Machine.Cmdline != v.cmdline {
		return fmt.Errorf("vmm: load state: the state's guest command line differs from the VM's")
	}
	if fill != nil {
		if err := fill(v.mem); err != nil {
			return fmt.Errorf("vmm: load state: fill guest memory: %w", err)
		}
	}
	if err := v.loadChips(st); err != nil {
		return fmt.Errorf("vmm: load state: %w", err)
	}
	if err := v.onEveryVCPU(func(c *kvm.VCPU) error {
		return v.loadVCPUState(c, &st.VCPUs[c.ID()], false)
	}); err != nil {
		return fmt.Errorf("vmm: load state: %w", err)
	}
	if err := kvm.Set(v.vm, kvm.StateClock, kvm.ClockData{Clock: st.Clock.Clock}); err != nil {
		return fmt.Errorf("vmm: load state: %w", err)
	}
	v.uart.RaisePending()
	return nil
}

// RaisePending re-signals the interrupts that the UART and the virtio
// transports hold pending, for a caller that has just loaded their states
// into a running machine (LoadState): a signal raised before the LAPICs
// were loaded may have been lost.
func (v *VM) RaisePending() {
	v.uart.RaisePending()
	v.raisePendingVirtio()
}
