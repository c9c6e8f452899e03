package boot

import (
	"encoding/binary"
	"fmt"
)

// Addresses of the interrupt controllers the MP table announces (the
// standard x86 locations KVM's in-kernel irqchip emulates).
const (
	LAPICAddr  = 0xfee00000
	IOAPICAddr = 0xfec00000
	// IOAPICPins is the number of IOAPIC inputs of KVM's in-kernel IOAPIC.
	IOAPICPins = 24
	// MaxCPUs is the most vCPUs the MP table (8-bit APIC IDs, one IOAPIC ID
	// after them) can describe here.
	MaxCPUs = 254
)

// MPTable builds an Intel MultiProcessor Specification 1.4 floating pointer
// and configuration table for cpus processors (APIC IDs 0..cpus-1), one ISA
// bus, one IOAPIC and identity-mapped ISA interrupts, to be written at
// MPTableAddr. It is how a kernel without ACPI finds its CPUs.
func MPTable(cpus int) ([]byte, error) {
	if cpus < 1 || cpus > MaxCPUs {
		return nil, fmt.Errorf("boot: %d vCPUs; between 1 and %d are supported", cpus, MaxCPUs)
	}
	le := binary.LittleEndian
	const fpSize, hdrSize = 16, 44
	ioapicID := byte(cpus)
	var entries []byte
	for i := 0; i < cpus; i++ {
		e := make([]byte, 20)
		e[0] = 0 // processor
		e[1] = byte(i)
		e[2] = 0x14 // local APIC version
		e[3] = 0x01 // enabled
		if i == 0 {
			e[3] |= 0x02 // bootstrap processor
		}
		le.PutUint32(e[4:], 0x600) // CPU signature: family 6
		le.PutUint32(e[8:], 0x201) // feature flags: FPU, APIC
		entries = append(entries, e...)
	}
	entries = append(entries, 1, 0, 'I', 'S', 'A', ' ', ' ', ' ') // bus 0: ISA
	io := make([]byte, 8)
	io[0], io[1], io[2], io[3] = 2, ioapicID, 0x11, 0x01 // IOAPIC, version 0x11, usable
	le.PutUint32(io[4:], IOAPICAddr)
	entries = append(entries, io...)
	for irq := 0; irq < 16; irq++ { // ISA IRQ n -> IOAPIC pin n
		entries = append(entries, 3, 0, 0, 0, 0, byte(irq), ioapicID, byte(irq))
	}
	// Local interrupts: LINT0 is ExtINT (the PIC), LINT1 NMI, on all LAPICs.
	entries = append(entries, 4, 3, 0, 0, 0, 0, 0xff, 0)
	entries = append(entries, 4, 1, 0, 0, 0, 0, 0xff, 1)

	n := 1 + cpus + 1 + 16 + 2
	tbl := make([]byte, hdrSize+len(entries))
	copy(tbl, "PCMP")
	le.PutUint16(tbl[4:], uint16(len(tbl)))
	tbl[6] = 4 // spec revision 1.4
	copy(tbl[8:], "WARREN  ")
	copy(tbl[16:], "MICROVM     ")
	le.PutUint16(tbl[34:], uint16(n))
	le.PutUint32(tbl[36:], LAPICAddr)
	copy(tbl[hdrSize:], entries)
	tbl[7] = checksum(tbl)

	fp := make([]byte, fpSize)
	copy(fp, "_MP_")
	le.PutUint32(fp[4:], MPTableAddr+fpSize)
	fp[8] = 1 // length in 16-byte units
	fp[9] = 4
	fp[10] = checksum(fp)
	out := append(fp, tbl...)
	if len(out) > 0xa0000-MPTableAddr {
		return nil, fmt.Errorf("boot: MP table for %d vCPUs is %d bytes, more than the reserved KiB", cpus, len(out))
	}
	return out, nil
}

// checksum returns the byte that makes b sum to zero (b's checksum byte must
// be zero when called).
func checksum(b []byte) byte {
	var s byte
	for _, c := range b {
		s += c
	}
	return -s
}
