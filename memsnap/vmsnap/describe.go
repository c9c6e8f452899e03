package vmsnap

import (
	"encoding/binary"
	"fmt"
	"io"
	"strings"

	"github.com/warrenvm/warren/vmm"
)

// Describe prints what a snapshot holds of a guest's liveness, for a
// person studying a guest that went silent (a fork child whose agent
// never answered, a restore that hung): per vCPU its RIP and RFLAGS.IF,
// MP state (halted or runnable), pending or injected events, and its local
// APIC's priority, in-service and requested vectors and timer (mode,
// count, TSC deadline against the TSC); the in-kernel PIC and IOAPIC as
// far as a lost device interrupt would show in them; and every ready
// virtqueue's saved indices against the ring indices in the snapshot's
// memory. It reads only what Load verified; s's chain must be open.
func (s *Snapshot) Describe() string {
	mem := s.Chain.Reader()
	return describeState(s.State, mem) + describeQueues(s.Devices, mem)
}

// describeQueues prints each ready virtqueue of devs as the device saved
// it (its next available and used indices, the used index it last
// signalled, the interrupt status) against the rings' indices in guest
// memory (mem: the flat image, which is guest-physical below the MMIO
// hole): a ring whose avail index is ahead of the device's has buffers the
// device never took, one whose used index is ahead of what the driver
// has seen has answers the guest was not told of.
func describeQueues(devs []DeviceState, mem io.ReaderAt) string {
	var b strings.Builder
	idx := func(gpa uint64) string {
		var v [2]byte
		if _, err := mem.ReadAt(v[:], int64(gpa)+2); err != nil {
			return "?"
		}
		return fmt.Sprint(binary.LittleEndian.Uint16(v[:]))
	}
	for _, d := range devs {
		fmt.Fprintf(&b, "device %s: status %#x interrupt status %#x\n", d.Name, d.State.Status, d.State.IntStatus)
		for i, q := range d.State.Queues {
			if !q.Ready {
				continue
			}
			// Both rings start with a 16-bit flags word, then the index.
			fmt.Fprintf(&b, "  queue %d: device next avail %d next used %d signalled %d event-idx %v; ring avail idx %s used idx %s\n",
				i, q.NextAvail, q.NextUsed, q.Signalled, q.EventIdx, idx(q.Avail), idx(q.Used))
		}
	}
	return b.String()
}

// LAPIC register offsets (Intel SDM vol. 3, table 11-1) and the MSRs
// describeState prints.
const (
	apicTPR, apicPPR, apicSVR          = 0x80, 0xa0, 0xf0
	apicISR, apicIRR                   = 0x100, 0x200
	apicLVTTimer, apicTMICT, apicTMCCT = 0x320, 0x380, 0x390
	apicTDCR                           = 0x3e0
	msrTSC, msrTSCDeadline             = 0x10, 0x6e0
)

// describeState prints, per vCPU, what says why a guest went silent: its
// RIP and RFLAGS.IF, its MP state (halted or runnable), pending or
// injected events, CR2 and CR3 and, when an exception is under way, the
// guest's own page-table walk of CR2 and RIP read from mem (a guest
// looping on a page fault its tables do not explain is not the guest's
// doing), and its local APIC's priority, in-service and pending vectors
// and timer (mode, count, TSC deadline against the TSC). mem may be nil.
func describeState(st *vmm.State, mem io.ReaderAt) string {
	var b strings.Builder
	for _, c := range st.VCPUs {
		ifl := c.Regs.RFLAGS&(1<<9) != 0
		fmt.Fprintf(&b, "vcpu %d: rip %#x rflags %#x (IF %v) cs.dpl %d mp_state %d (%s)\n", c.ID, c.Regs.RIP, c.Regs.RFLAGS, ifl,
			c.Sregs.CS.DPL, c.MPState, mpStateName(c.MPState))
		e := c.Events
		fmt.Fprintf(&b, "  events: exception injected %d pending %d nr %d error code %#x; interrupt injected %d nr %#x shadow %d; nmi injected %d pending %d masked %d\n",
			e.Exception.Injected, e.Exception.Pending, e.Exception.Nr, e.Exception.ErrorCode, e.Interrupt.Injected, e.Interrupt.Nr,
			e.Interrupt.Shadow, e.NMI.Injected, e.NMI.Pending, e.NMI.Masked)
		fmt.Fprintf(&b, "  cr0 %#x cr2 %#x cr3 %#x cr4 %#x efer %#x\n", c.Sregs.CR0, c.Sregs.CR2, c.Sregs.CR3, c.Sregs.CR4, c.Sregs.EFER)
		if mem != nil && (e.Exception.Injected != 0 || e.Exception.Pending != 0) {
			for _, va := range []struct {
				what string
				addr uint64
			}{{"cr2", c.Sregs.CR2}, {"rip", c.Regs.RIP}} {
				fmt.Fprintf(&b, "  walk of %s %#x: %s\n", va.what, va.addr, walk(mem, c.Sregs.CR3, c.Sregs.CR4, va.addr))
			}
		}
		var tsc, deadline uint64
		for _, m := range c.MSRs {
			switch m.Index {
			case msrTSC:
				tsc = m.Data
			case msrTSCDeadline:
				deadline = m.Data
			}
		}
		if len(c.LAPIC) < 0x400 {
			fmt.Fprintf(&b, "  lapic: %d bytes (no register page)\n", len(c.LAPIC))
			continue
		}
		reg := func(off int) uint32 { return binary.LittleEndian.Uint32(c.LAPIC[off:]) }
		lvt := reg(apicLVTTimer)
		mode := [4]string{"one-shot", "periodic", "tsc-deadline", "reserved"}[lvt>>17&3]
		fmt.Fprintf(&b, "  lapic: tpr %#x ppr %#x svr %#x (enabled %v) isr %s irr %s\n", reg(apicTPR), reg(apicPPR), reg(apicSVR),
			reg(apicSVR)&(1<<8) != 0, vectors(c.LAPIC, apicISR), vectors(c.LAPIC, apicIRR))
		fmt.Fprintf(&b, "  timer: lvt %#x (vector %#x, %s, masked %v) tmict %d tmcct %d tdcr %#x; tsc %d deadline %d",
			lvt, lvt&0xff, mode, lvt&(1<<16) != 0, reg(apicTMICT), reg(apicTMCCT), reg(apicTDCR), tsc, deadline)
		if deadline != 0 && tsc != 0 {
			fmt.Fprintf(&b, " (deadline - tsc %d)", int64(deadline-tsc))
		}
		b.WriteString("\n")
	}
	b.WriteString(describeChips(st))
	return b.String()
}

// describeChips prints the in-kernel irqchip as far as a lost device
// interrupt would show in it: the master PIC's request, mask, in-service
// and edge/level registers, and the IOAPIC's line states and its unmasked
// redirection entries (vector, trigger mode, remote IRR, delivery
// status). The payloads are struct kvm_pic_state and struct
// kvm_ioapic_state (KVM's uapi, x86).
func describeChips(st *vmm.State) string {
	var b strings.Builder
	if p := st.PICMaster; len(p) >= 16 {
		// last_irr, irr, imr, isr, priority_add, irq_base, ..., elcr at 14.
		fmt.Fprintf(&b, "pic master: irr %#02x imr %#02x isr %#02x elcr %#02x (level-triggered lines)\n", p[1], p[2], p[3], p[14])
	}
	if io := st.IOAPIC; len(io) >= 24+24*8 {
		// base_address u64, ioregsel u32, id u32, irr u32, pad u32, redirtbl[24] u64.
		fmt.Fprintf(&b, "ioapic: irr %#x", binary.LittleEndian.Uint32(io[16:]))
		for pin := range 24 {
			e := binary.LittleEndian.Uint64(io[24+8*pin:])
			if e&(1<<16) != 0 {
				continue // masked
			}
			trig := "edge"
			if e&(1<<15) != 0 {
				trig = "level"
			}
			fmt.Fprintf(&b, "; pin %d vector %#x %s remote-irr %d pending %d", pin, e&0xff, trig, e>>14&1, e>>12&1)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// walk reads the guest's 4-level page-table walk of virtual address va
// under cr3 from mem (guest-physical below the MMIO hole), entry by entry,
// until one is not present or maps a large page.
func walk(mem io.ReaderAt, cr3, cr4, va uint64) string {
	if cr4&(1<<12) != 0 {
		return "5-level paging: not walked"
	}
	const addrMask = 0x000f_ffff_ffff_f000
	table := cr3 & addrMask
	var out []string
	for level, name := range []string{"pml4e", "pdpte", "pde", "pte"} {
		idx := va >> (39 - 9*uint(level)) & 511
		var v [8]byte
		if _, err := mem.ReadAt(v[:], int64(table+idx*8)); err != nil {
			return strings.Join(append(out, fmt.Sprintf("%s at %#x: %v", name, table+idx*8, err)), " ")
		}
		e := binary.LittleEndian.Uint64(v[:])
		out = append(out, fmt.Sprintf("%s %#x", name, e))
		if e&1 == 0 {
			return strings.Join(append(out, "(not present)"), " ")
		}
		if level > 0 && level < 3 && e&(1<<7) != 0 {
			return strings.Join(append(out, "(large page)"), " ")
		}
		table = e & addrMask
	}
	return strings.Join(append(out, "(present)"), " ")
}

// vectors lists the vectors set in the 256-bit LAPIC register array at
// off (ISR, IRR: eight 32-bit words 16 bytes apart).
func vectors(page []byte, off int) string {
	var v []string
	for w := range 8 {
		bits := binary.LittleEndian.Uint32(page[off+16*w:])
		for i := range 32 {
			if bits&(1<<i) != 0 {
				v = append(v, fmt.Sprintf("%#x", w*32+i))
			}
		}
	}
	if len(v) == 0 {
		return "none"
	}
	return strings.Join(v, ",")
}

// mpStateName names KVM's MP states.
func mpStateName(s uint32) string {
	switch s {
	case 0:
		return "runnable"
	case 1:
		return "uninitialized"
	case 2:
		return "init-received"
	case 3:
		return "halted"
	case 4:
		return "sipi-received"
	}
	return "other"
}
