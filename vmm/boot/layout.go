// Package boot loads a Linux kernel into guest memory and computes the
// register state its first vCPU starts in. It knows two entry protocols:
//
//   - PVH: an uncompressed vmlinux ELF carrying a XEN_ELFNOTE_PHYS32_ENTRY
//     note. The vCPU starts in 32-bit protected mode with EBX pointing at an
//     hvm_start_info structure (no firmware, no decompression).
//   - The Linux 64-bit boot protocol for a bzImage: the vCPU starts in long
//     mode at startup_64 with RSI pointing at the zero page (boot_params).
//
// It also writes the tables a firmware-less guest needs: the e820 memory map,
// an Intel MultiProcessor table (how the guest finds its CPUs and IOAPIC
// without ACPI), a GDT and, for long mode, identity page tables.
//
// Everything here is pure computation on a guestmem.Memory and is unit-tested
// without KVM. The boot package writes guest memory only before any vCPU runs.
package boot

// Fixed guest-physical addresses of the structures the loader writes. All lie
// in the first MiB, below the MP table, and are outside anything the kernel
// or initramfs occupy.
const (
	gdtAddr       = 0x500
	pvhInfoAddr   = 0x6000 // struct hvm_start_info
	pvhMemmapAddr = 0x6100 // hvm_memmap_table_entry[maxE820]
	pvhModAddr    = 0x6e00 // hvm_modlist_entry (the initramfs)
	zeroPageAddr  = 0x7000 // struct boot_params
	bootStackTop  = 0x8ff0
	pml4Addr      = 0x9000
	pdptAddr      = 0xa000
	pdAddr        = 0xb000 // four page directories: 0xb000..0xefff
	cmdlineAddr   = 0x20000
	// MPTableAddr is where the MP floating pointer and table go: the last KiB
	// of base memory, one of the places Linux scans.
	MPTableAddr = 0x9fc00
	// HighMemStart is where RAM above the legacy hole starts (1 MiB).
	HighMemStart = 0x100000
	// bzImageLoadAddr is where a bzImage's protected-mode part is placed.
	bzImageLoadAddr = HighMemStart
)

// MaxCmdline is the longest kernel command line accepted, including the
// terminating NUL (the x86 kernel's COMMAND_LINE_SIZE).
const MaxCmdline = 2048

// Selectors in the boot GDT (Linux's __BOOT_CS/__BOOT_DS layout).
const (
	selCode = 0x10
	selData = 0x18
	selTSS  = 0x20
)
