package vmm

import (
	"fmt"
	"slices"

	"github.com/warrenvm/warren/vmm/guestmem"
	"github.com/warrenvm/warren/vmm/kvm"
)

// SaveState reads the machine state of a paused VM (see Pause): each
// vCPU's state is read on that vCPU's own thread, the irqchip, PIT and
// kvmclock through the VM fd, COM1 from its emulation. Guest memory is not
// included: copy Memory() while the VM is still paused.
func (v *VM) SaveState() (*State, error) {
	p := &v.pause
	p.ctl.Lock()
	defer p.ctl.Unlock()
	if !p.paused {
		return nil, fmt.Errorf("vmm: save state: the VM is not paused")
	}
	if v.stopping.Load() {
		return nil, ErrStopped
	}
	st := &State{
		Version: StateVersion,
		Machine: MachineState{MemBytes: v.cfg.MemBytes, CPUs: v.cfg.CPUs, Cmdline: v.cmdline, Profile: v.cfg.Profile},
		VCPUs:   make([]VCPUState, v.cfg.CPUs),
	}
	for _, d := range v.cfg.Virtio {
		st.Machine.Virtio = append(st.Machine.Virtio, d.Name)
	}
	msrs, err := v.msrList()
	if err != nil {
		return nil, err
	}
	if err := v.onEveryVCPU(func(c *kvm.VCPU) error {
		return v.saveVCPU(c, msrs, &st.VCPUs[c.ID()])
	}); err != nil {
		return nil, fmt.Errorf("vmm: save state: %w", err)
	}
	for _, c := range []struct {
		id  uint32
		dst *[]byte
	}{{kvm.IRQChipPICMaster, &st.PICMaster}, {kvm.IRQChipPICSlave, &st.PICSlave}, {kvm.IRQChipIOAPIC, &st.IOAPIC}} {
		chip, err := v.vm.GetIRQChip(c.id)
		if err != nil {
			return nil, fmt.Errorf("vmm: save state: %w", err)
		}
		*c.dst = append([]byte(nil), chip.Chip[:]...)
	}
	if st.PIT, err = kvm.Get(v.vm, kvm.StatePIT2); err != nil {
		return nil, fmt.Errorf("vmm: save state: %w", err)
	}
	if st.Clock, err = kvm.Get(v.vm, kvm.StateClock); err != nil {
		return nil, fmt.Errorf("vmm: save state: %w", err)
	}
	st.UART = v.uart.State()
	return st, nil
}

// msrList is the MSRs to save: KVM's index list followed by the essential
// ones it may lack, without repeats; kvm.MSRIA32TSCDeadline goes last.
func (v *VM) msrList() ([]uint32, error) {
	list, err := v.sys.MSRIndexList()
	if err != nil {
		return nil, fmt.Errorf("vmm: save state: %w", err)
	}
	seen := map[uint32]bool{}
	var out []uint32
	for _, i := range append(list, kvm.EssentialMSRs...) {
		if !seen[i] && i != kvm.MSRIA32TSCDeadline {
			seen[i] = true
			out = append(out, i)
		}
	}
	// The TSC first: KVM derives other timer state from it.
	if j := slices.Index(out, kvm.MSRIA32TSC); j > 0 {
		out = append(append([]uint32{kvm.MSRIA32TSC}, out[:j]...), out[j+1:]...)
	}
	return append(out, kvm.MSRIA32TSCDeadline), nil
}

// saveVCPU reads c's state into s. It runs on c's thread.
func (v *VM) saveVCPU(c *kvm.VCPU, msrs []uint32, s *VCPUState) error {
	var err error
	s.ID = c.ID()
	if s.CPUID, err = c.GetCPUID2(); err != nil {
		return err
	}
	if n, _ := v.sys.CheckExtension(kvm.CapGetTSCKHz); n > 0 {
		if s.TSCKHz, err = c.GetTSCKHz(); err != nil {
			return err
		}
	}
	if s.MPState, err = kvm.Get(c, kvm.StateMPState); err != nil {
		return err
	}
	if s.Regs, err = kvm.Get(c, kvm.StateRegs); err != nil {
		return err
	}
	if s.Sregs, err = kvm.Get(c, kvm.StateSregs); err != nil {
		return err
	}
	// A CR3 outside guest RAM would hang the restored guest (checkPaging).
	// Read the registers again to tell a bad read (logged, the good read
	// kept) from a bad vCPU (refused).
	for try := 0; checkPaging(*s, v.cfg.MemBytes) != nil && try < 3; try++ {
		bad := s.Sregs.CR3
		if s.Regs, err = kvm.Get(c, kvm.StateRegs); err != nil {
			return err
		}
		if s.Sregs, err = kvm.Get(c, kvm.StateSregs); err != nil {
			return err
		}
		v.log.Warn("save state: KVM_GET_SREGS gave a CR3 outside guest RAM; read again", "vcpu", c.ID(), "cr3", fmt.Sprintf("%#x", bad),
			"again", fmt.Sprintf("%#x", s.Sregs.CR3), "rip", fmt.Sprintf("%#x", s.Regs.RIP))
	}
	if err := checkPaging(*s, v.cfg.MemBytes); err != nil {
		return fmt.Errorf("vCPU %d: %w", c.ID(), err)
	}
	if s.FPU, err = kvm.Get(c, kvm.StateFPU); err != nil {
		return err
	}
	if n, _ := v.vm.CheckExtension(kvm.CapXSave2); n > 0 {
		if s.Xsave, err = c.GetXsave2(n); err != nil {
			return err
		}
	} else if n, _ := v.sys.CheckExtension(kvm.CapXSave); n > 0 {
		x, err := kvm.Get(c, kvm.StateXsave)
		if err != nil {
			return err
		}
		s.Xsave = xsaveBytes(&x)
	}
	if n, _ := v.sys.CheckExtension(kvm.CapXCRs); n > 0 {
		x, err := kvm.Get(c, kvm.StateXCRs)
		if err != nil {
			return err
		}
		s.XCRs = &x
	}
	lapic, err := kvm.Get(c, kvm.StateLAPIC)
	if err != nil {
		return err
	}
	s.LAPIC = append([]byte(nil), lapic.Regs[:]...)
	entries, err := c.ReadableMSRs(msrs)
	if err != nil {
		return err
	}
	s.MSRs = make([]MSR, len(entries))
	for i, e := range entries {
		s.MSRs[i] = MSR{Index: e.Index, Data: e.Data}
	}
	// Events last: reading the state above does not change them, and they
	// are what the guest sees first when it runs again.
	if s.Events, err = kvm.Get(c, kvm.StateVCPUEvents); err != nil {
		return err
	}
	if s.DebugRegs, err = kvm.Get(c, kvm.StateDebugRegs); err != nil {
		return err
	}
	return nil
}

// Restore creates a VM from a saved state instead of a kernel: it checks
// st (its version, and that cfg's vCPU count, memory size, virtio devices
// and host profile agree) before creating anything, creates guest memory
// and lets fill write it (the saved RAM: e.g. copy a snapshot file in, or
// read it through guestmem's accessors), then creates the KVM VM, the
// devices, and loads the irqchip, PIT and COM1 states. cfg.Kernel,
// Initramfs and Cmdline are ignored (the guest's command line is st's).
//
// Run then creates the vCPUs on their threads, loads each one's state
// there, sets the kvmclock, and resumes the guest where it was saved (or
// parks it first with cfg.StartPaused, so the loaded state can be read back
// with Pause and SaveState). Virtio devices are created afresh through
// cfg.Virtio; restoring their state is their packages' business.
func Restore(cfg Config, st *State, fill func(*guestmem.Memory) error) (*VM, error) {
	if fill == nil {
		return nil, fmt.Errorf("vmm: restore: no memory to fill guest RAM with")
	}
	return restore(cfg, st, func() (*guestmem.Memory, error) {
		mem, err := guestmem.New(cfg.MemBytes)
		if err != nil {
			return nil, err
		}
		if err := fill(mem); err != nil {
			mem.Close()
			return nil, fmt.Errorf("vmm: restore: fill guest memory: %w", err)
		}
		return mem, nil
	})
}

// RestoreMemory is Restore with guest RAM that the caller has already
// made, such as a private mapping of a snapshot image for a lazy restore
// (guestmem.NewPrivateFile): it must be cfg.MemBytes bytes. The VM owns
// mem from the call on, and closes it on error too.
func RestoreMemory(cfg Config, st *State, mem *guestmem.Memory) (*VM, error) {
	if mem == nil {
		return nil, fmt.Errorf("vmm: restore: no guest memory")
	}
	taken := false // the VM owns mem (and closes it on a later error)
	v, err := restore(cfg, st, func() (*guestmem.Memory, error) {
		if mem.Size() != cfg.MemBytes {
			return nil, fmt.Errorf("vmm: restore: guest memory is %d bytes, the config %d", mem.Size(), cfg.MemBytes)
		}
		taken = true
		return mem, nil
	})
	if err != nil && !taken {
		mem.Close()
	}
	return v, err
}

// restore is Restore and RestoreMemory: makeMem returns guest RAM holding
// the saved memory; it runs after st and cfg are checked.
func restore(cfg Config, st *State, makeMem func() (*guestmem.Memory, error)) (_ *VM, err error) {
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	if err := st.Validate(); err != nil {
		return nil, err
	}
	if err := st.matches(cfg); err != nil {
		return nil, err
	}
	v := newVM(cfg)
	v.restore = st
	v.cmdline = st.Machine.Cmdline
	defer func() {
		if err != nil {
			v.Close()
		}
	}()
	if v.mem, err = makeMem(); err != nil {
		return nil, err
	}
	if err := v.createKVM(); err != nil {
		return nil, err
	}
	if err := v.loadChips(st); err != nil {
		return nil, fmt.Errorf("vmm: restore: %w", err)
	}
	return v, nil
}

// loadChips loads st's irqchip (PICs, IOAPIC), PIT and COM1 states into
// the VM: for a restore, and for an in-place LoadState.
func (v *VM) loadChips(st *State) error {
	for _, c := range []struct {
		id  uint32
		src []byte
	}{{kvm.IRQChipPICMaster, st.PICMaster}, {kvm.IRQChipPICSlave, st.PICSlave}, {kvm.IRQChipIOAPIC, st.IOAPIC}} {
		chip := kvm.IRQChip{ChipID: c.id}
		copy(chip.Chip[:], c.src)
		if err := v.vm.SetIRQChip(chip); err != nil {
			return err
		}
	}
	if err := kvm.Set(v.vm, kvm.StatePIT2, st.PIT); err != nil {
		return err
	}
	return v.uart.SetState(st.UART)
}

// loadVCPU writes a saved state into the new vCPU c, on c's thread. The
// order matters: CPUID first (it decides which MSRs and XSAVE features
// exist), the TSC frequency before the TSC, MP state before the registers,
// the special registers (APIC base, EFER, CR4.OSXSAVE) before the general
// ones, XCRs before XSAVE, the LAPIC before the MSRs (TSC_DEADLINE is
// dropped unless the LAPIC timer is in deadline mode), and the pending
// events and debug registers last.
func (v *VM) loadVCPU(c *kvm.VCPU, s *VCPUState) error {
	return v.loadVCPUState(c, s, true)
}

// loadVCPUState is loadVCPU; withCPUID false skips the CPUID table (for a
// vCPU that has run: LoadState).
func (v *VM) loadVCPUState(c *kvm.VCPU, s *VCPUState, withCPUID bool) error {
	if withCPUID {
		if err := c.SetCPUID2(s.CPUID); err != nil {
			return err
		}
	}
	if s.TSCKHz != 0 {
		if cur, err := c.GetTSCKHz(); err == nil && cur != s.TSCKHz {
			if err := c.SetTSCKHz(s.TSCKHz); err != nil {
				// Without TSC scaling the guest's TSC runs at this host's
				// rate: its clock drifts but it runs.
				v.log.Warn("restore: TSC frequency not settable", "vcpu", c.ID(), "saved_khz", s.TSCKHz, "host_khz", cur, "err", err)
			}
		}
	}
	if err := kvm.Set(c, kvm.StateMPState, s.MPState); err != nil {
		return err
	}
	if err := kvm.Set(c, kvm.StateSregs, s.Sregs); err != nil {
		return err
	}
	if err := kvm.Set(c, kvm.StateRegs, s.Regs); err != nil {
		return err
	}
	// Read back what KVM took: a restored vCPU whose CR3 differs from the
	// state's would run on other page tables (see checkPaging).
	if sr, err := kvm.Get(c, kvm.StateSregs); err == nil && sr.CR3 != s.Sregs.CR3 {
		return fmt.Errorf("vCPU %d: KVM_SET_SREGS took CR3 %#x, read back %#x", c.ID(), s.Sregs.CR3, sr.CR3)
	}
	if err := kvm.Set(c, kvm.StateFPU, s.FPU); err != nil {
		return err
	}
	if s.XCRs != nil {
		if err := kvm.Set(c, kvm.StateXCRs, *s.XCRs); err != nil {
			return err
		}
	}
	if len(s.Xsave) > 0 {
		if err := c.SetXsave(s.Xsave); err != nil {
			return err
		}
	}
	var lapic kvm.LAPICState
	copy(lapic.Regs[:], s.LAPIC)
	if err := kvm.Set(c, kvm.StateLAPIC, lapic); err != nil {
		return err
	}
	entries := make([]kvm.MSREntry, len(s.MSRs))
	for i, m := range s.MSRs {
		entries[i] = kvm.MSREntry{Index: m.Index, Data: m.Data}
	}
	if err := c.SetMSRs(entries); err != nil {
		return err
	}
	ev := s.Events
	ev.Flags |= kvm.VCPUEventValidNMIPending | kvm.VCPUEventValidSIPIVector
	if err := kvm.Set(c, kvm.StateVCPUEvents, ev); err != nil {
		return err
	}
	return kvm.Set(c, kvm.StateDebugRegs, s.DebugRegs)
}

// restoreClock sets the saved kvmclock once every vCPU is loaded (Run
// calls it before the first KVM_RUN of a restored VM). The guest's clock
// resumes at the value it had when saved.
func (v *VM) restoreClock() error {
	c := v.restore.Clock
	if err := kvm.Set(v.vm, kvm.StateClock, kvm.ClockData{Clock: c.Clock}); err != nil {
		return fmt.Errorf("vmm: restore: %w", err)
	}
	return nil
}
