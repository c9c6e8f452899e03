package vmm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/vmm/kvm"
)

// MSRs and LAPIC registers set at vCPU creation.
const (
	msrIA32MiscEnable   = 0x1a0
	miscEnableFastStrng = 1 << 0
	lapicLVT0           = 0x350
	lapicLVT1           = 0x360
	lvtDeliveryExtINT   = 7 << 8
	lvtDeliveryNMI      = 4 << 8
	lvtMasked           = 1 << 16
)

// vcpuThread owns vCPU id for its whole life: it locks itself to an OS
// thread, creates and configures the vCPU (or loads its saved state, for a
// restored VM), reports on ready, waits for start and runs the guest until
// the VM stops. Between two KVM_RUNs it parks while a pause is requested
// (see pause.go). The thread is never unlocked, so it exits with the
// goroutine.
func (v *VM) vcpuThread(id int, ready chan<- error, start <-chan struct{}) {
	runtime.LockOSThread()
	c, err := v.setupVCPU(id)
	if err != nil {
		ready <- fmt.Errorf("vmm: vCPU %d: %w", id, err)
		return
	}
	defer c.Close()
	v.vcpuMu.Lock()
	v.vcpus[id], v.tids[id] = c, unix.Gettid()
	v.vcpuMu.Unlock()
	defer func() {
		v.vcpuMu.Lock()
		delete(v.vcpus, id)
		delete(v.tids, id)
		v.vcpuMu.Unlock()
	}()
	ready <- nil
	<-start
	firstRun := id == 0 && v.cfg.OnFirstRun != nil
	for !v.stopping.Load() {
		if v.pause.requested.Load() {
			if err := v.park(c); err != nil {
				v.Stop(fmt.Errorf("vmm: vCPU %d: %w", id, err))
				return
			}
			continue
		}
		if firstRun {
			firstRun = false
			v.cfg.OnFirstRun()
		}
		if err := c.Run(); err != nil {
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
				continue // a kick, or Go's own preemption signal
			}
			v.Stop(fmt.Errorf("vmm: vCPU %d: %w", id, err))
			return
		}
		if stop, err := v.handleExit(c); stop {
			v.Stop(err)
			return
		}
	}
}

func (v *VM) setupVCPU(id int) (*kvm.VCPU, error) {
	c, err := v.vm.CreateVCPU(id)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*kvm.VCPU, error) { c.Close(); return nil, err }
	if v.restore != nil {
		if err := v.loadVCPU(c, &v.restore.VCPUs[id]); err != nil {
			return fail(err)
		}
		return c, nil
	}
	if err := c.SetCPUID2(vcpuCPUID(v.cpuid, id, v.cfg.CPUs)); err != nil {
		return fail(err)
	}
	if err := c.SetMSRs([]kvm.MSREntry{{Index: msrIA32MiscEnable, Data: miscEnableFastStrng}}); err != nil {
		v.log.Debug("IA32_MISC_ENABLE refused", "vcpu", id, "err", err)
	}
	// LINT0 takes the PIC's ExtINT, LINT1 NMIs, as firmware would set them.
	lapic, err := kvm.Get(c, kvm.StateLAPIC)
	if err != nil {
		return fail(err)
	}
	setLVT := func(off int, mode uint32) {
		r := binary.LittleEndian.Uint32(lapic.Regs[off:])
		r = r&^(lvtMasked|0x700) | mode
		binary.LittleEndian.PutUint32(lapic.Regs[off:], r)
	}
	setLVT(lapicLVT0, lvtDeliveryExtINT)
	setLVT(lapicLVT1, lvtDeliveryNMI)
	if err := kvm.Set(c, kvm.StateLAPIC, lapic); err != nil {
		return fail(err)
	}
	fpu := kvm.FPU{FCW: 0x37f, MXCSR: 0x1f80}
	if err := kvm.Set(c, kvm.StateFPU, fpu); err != nil {
		return fail(err)
	}
	if id != 0 {
		return c, nil // application processors wait for INIT/SIPI in KVM
	}
	sregs, err := kvm.Get(c, kvm.StateSregs)
	if err != nil {
		return fail(err)
	}
	v.entry.Apply(&sregs)
	if err := kvm.Set(c, kvm.StateSregs, sregs); err != nil {
		return fail(err)
	}
	if err := kvm.Set(c, kvm.StateRegs, v.entry.Regs); err != nil {
		return fail(err)
	}
	return c, nil
}

// handleExit services one KVM_RUN exit. stop reports that the VM must stop,
// with err nil for a clean power-off.
func (v *VM) handleExit(c *kvm.VCPU) (stop bool, err error) {
	switch r := c.ExitReason(); r {
	case kvm.ExitIO:
		e, err := c.IO()
		if err != nil {
			return true, err
		}
		size := int(e.Size)
		for i := 0; i < int(e.Count); i++ {
			d := e.Data[i*size : (i+1)*size]
			if e.Direction == kvm.ExitIOOut {
				v.PIO.Write(uint64(e.Port), d)
			} else {
				v.PIO.Read(uint64(e.Port), d)
			}
		}
	case kvm.ExitMMIO:
		m := c.MMIO()
		if m.IsWrite {
			v.MMIO.Write(m.Addr, m.Data)
		} else {
			v.MMIO.Read(m.Addr, m.Data)
		}
	case kvm.ExitIntr, kvm.ExitIRQWindowOpen:
	case kvm.ExitSystemEvent:
		switch t := c.SystemEvent(); t {
		case kvm.SystemEventShutdown, kvm.SystemEventReset:
			return true, nil
		default:
			return true, fmt.Errorf("vmm: vCPU %d: guest system event %d (crash)%s", c.ID(), t, v.where(c))
		}
	case kvm.ExitShutdown:
		return true, fmt.Errorf("vmm: vCPU %d: triple fault (KVM_EXIT_SHUTDOWN)%s", c.ID(), v.where(c))
	case kvm.ExitHLT:
		return true, fmt.Errorf("vmm: vCPU %d: halted with no way to wake (KVM_EXIT_HLT)%s", c.ID(), v.where(c))
	case kvm.ExitInternalError:
		sub, data := c.InternalError()
		return true, fmt.Errorf("vmm: vCPU %d: KVM internal error, suberror %d (1: emulation failure), data %#x%s", c.ID(), sub, data, v.where(c))
	case kvm.ExitFailEntry:
		return true, fmt.Errorf("vmm: vCPU %d: KVM entry failed, hardware reason %#x%s", c.ID(), c.FailEntry(), v.where(c))
	default:
		return true, fmt.Errorf("vmm: vCPU %d: unhandled exit %s%s", c.ID(), kvm.ExitReasonName(r), v.where(c))
	}
	return false, nil
}

// where describes the vCPU's position for an error message.
func (v *VM) where(c *kvm.VCPU) string {
	regs, err := kvm.Get(c, kvm.StateRegs)
	if err != nil {
		return ""
	}
	return fmt.Sprintf(" at rip %#x", regs.RIP)
}
