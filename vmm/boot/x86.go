package boot

import (
	"encoding/binary"

	"github.com/warrenvm/warren/vmm/kvm"
)

// Control-register bits used at entry.
const (
	cr0PE   = 1 << 0
	cr0ET   = 1 << 4
	cr0NE   = 1 << 5
	cr0PG   = 1 << 31
	cr4PAE  = 1 << 5
	eferLME = 1 << 8
	eferLMA = 1 << 10
)

// gdt returns the boot GDT: null, null, code, data, TSS (selectors 0x10,
// 0x18, 0x20). long selects a 64-bit code segment.
func gdt(long bool) []uint64 {
	code := uint64(0x00cf9b000000ffff) // 32-bit, 4 GiB, exec/read
	if long {
		code = 0x00af9b000000ffff // 64-bit
	}
	return []uint64{0, 0, code, 0x00cf93000000ffff, 0x00008b0000000067} // TSS: 32-bit busy, limit 0x67
}

func gdtBytes(long bool) []byte {
	g := gdt(long)
	b := make([]byte, 8*len(g))
	for i, e := range g {
		binary.LittleEndian.PutUint64(b[8*i:], e)
	}
	return b
}

// segment decodes a GDT descriptor into the form KVM_SET_SREGS takes.
func segment(desc uint64, sel uint16) kvm.Segment {
	limit := uint32(desc&0xffff | (desc>>48&0xf)<<16)
	g := uint8(desc >> 55 & 1)
	if g == 1 {
		limit = limit<<12 | 0xfff
	}
	return kvm.Segment{
		Base:     desc>>16&0xffffff | (desc>>56&0xff)<<24,
		Limit:    limit,
		Selector: sel,
		Type:     uint8(desc >> 40 & 0xf),
		S:        uint8(desc >> 44 & 1),
		DPL:      uint8(desc >> 45 & 3),
		Present:  uint8(desc >> 47 & 1),
		AVL:      uint8(desc >> 52 & 1),
		L:        uint8(desc >> 53 & 1),
		DB:       uint8(desc >> 54 & 1),
		G:        g,
	}
}

// pageTables identity-maps the first 4 GiB with 2 MiB pages: a PML4 at
// pml4Addr, a PDPT at pdptAddr and four page directories from pdAddr.
func pageTables() (pml4, pdpt, pd []byte) {
	le := binary.LittleEndian
	pml4 = make([]byte, 4096)
	pdpt = make([]byte, 4096)
	pd = make([]byte, 4*4096)
	le.PutUint64(pml4, pdptAddr|0x3) // present, writable
	for i := 0; i < 4; i++ {
		le.PutUint64(pdpt[8*i:], uint64(pdAddr+4096*i)|0x3)
	}
	for i := 0; i < 4*512; i++ {
		le.PutUint64(pd[8*i:], uint64(i)<<21|0x83) // present, writable, 2 MiB page
	}
	return pml4, pdpt, pd
}

// EntryState is the register state the boot vCPU starts in. Sregs holds only
// the fields the loader decides; Apply merges them into the vCPU's current
// special registers so KVM's defaults (APIC base, ...) stay.
type EntryState struct {
	Regs kvm.Regs
	long bool
}

// Apply sets the loader-decided segment and control registers in s.
func (e EntryState) Apply(s *kvm.Sregs) {
	g := gdt(e.long)
	s.GDT = kvm.DTable{Base: gdtAddr, Limit: uint16(8*len(g) - 1)}
	s.IDT = kvm.DTable{}
	s.CS = segment(g[2], selCode)
	data := segment(g[3], selData)
	s.DS, s.ES, s.FS, s.GS, s.SS = data, data, data, data, data
	s.TR = segment(g[4], selTSS)
	s.CR0 = cr0PE | cr0ET | cr0NE
	s.CR4 = 0
	s.EFER = 0
	if e.long {
		s.CR0 |= cr0PG
		s.CR3 = pml4Addr
		s.CR4 = cr4PAE
		s.EFER = eferLME | eferLMA
	}
}

// Long reports whether the entry is in 64-bit mode (bzImage) rather than
// 32-bit protected mode (PVH).
func (e EntryState) Long() bool { return e.long }
