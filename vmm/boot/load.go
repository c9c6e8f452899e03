package boot

import (
	"fmt"

	"github.com/warrenvm/warren/vmm/guestmem"
)

// Format is the kind of kernel image that was loaded.
type Format int

// Kernel image formats.
const (
	FormatPVH     Format = iota + 1 // ELF vmlinux, PVH entry
	FormatBzImage                   // bzImage, 64-bit boot protocol
)

func (f Format) String() string {
	switch f {
	case FormatPVH:
		return "vmlinux (PVH entry)"
	case FormatBzImage:
		return "bzImage (64-bit boot protocol)"
	}
	return "unknown"
}

// Params says what to boot.
type Params struct {
	Kernel    []byte // an ELF vmlinux with a PVH note, or a bzImage
	Initramfs []byte // optional
	Cmdline   string
	CPUs      int
}

// Load writes the kernel, initramfs, command line and firmware tables into
// mem and returns the boot vCPU's entry state. Nothing is written to mem
// until the inputs have been validated as far as they can be up front.
func Load(mem *guestmem.Memory, p Params) (EntryState, Format, error) {
	regions := mem.Regions()
	e820, err := E820(regions)
	if err != nil {
		return EntryState{}, 0, err
	}
	if len(p.Cmdline)+1 > MaxCmdline {
		return EntryState{}, 0, fmt.Errorf("boot: kernel command line is %d bytes, at most %d", len(p.Cmdline), MaxCmdline-1)
	}
	mp, err := MPTable(p.CPUs)
	if err != nil {
		return EntryState{}, 0, err
	}
	lowEnd := regions[0].End()

	var (
		format    Format
		kernelEnd uint64
		initrdMax = lowEnd
		elfK      *ELFKernel
		bz        *BzImage
	)
	switch {
	case len(p.Kernel) >= 4 && string(p.Kernel[:4]) == "\x7fELF":
		format = FormatPVH
		if elfK, err = ParseELF(p.Kernel); err != nil {
			return EntryState{}, 0, err
		}
		for _, s := range elfK.Segments {
			if s.Addr < HighMemStart || s.End() > lowEnd || s.End() < s.Addr {
				return EntryState{}, 0, fmt.Errorf("boot: kernel segment [%#x, %#x) does not fit in guest RAM [%#x, %#x); give the VM more memory",
					s.Addr, s.End(), HighMemStart, lowEnd)
			}
			kernelEnd = max(kernelEnd, s.End())
		}
	case IsBzImage(p.Kernel):
		format = FormatBzImage
		if bz, err = ParseBzImage(p.Kernel); err != nil {
			return EntryState{}, 0, err
		}
		kernelEnd = bzImageLoadAddr + uint64(bz.InitSize)
		if kernelEnd > lowEnd {
			return EntryState{}, 0, fmt.Errorf("boot: bzImage needs %d MiB from %#x, more than guest RAM; give the VM more memory", bz.InitSize>>20, bzImageLoadAddr)
		}
		if bz.InitrdAddrMax != 0 {
			initrdMax = min(initrdMax, uint64(bz.InitrdAddrMax)+1)
		}
	default:
		return EntryState{}, 0, fmt.Errorf("boot: kernel image (%d bytes) is neither an ELF vmlinux nor a bzImage", len(p.Kernel))
	}

	var initrdAddr uint64
	if n := uint64(len(p.Initramfs)); n > 0 {
		if n > initrdMax || (initrdMax-n)&^(guestmem.PageSize-1) < pageUp(kernelEnd) {
			return EntryState{}, 0, fmt.Errorf("boot: initramfs of %d MiB does not fit in guest RAM between the kernel (ends at %d MiB) and %d MiB; give the VM more memory",
				n>>20, kernelEnd>>20, initrdMax>>20)
		}
		initrdAddr = (initrdMax - n) &^ (guestmem.PageSize - 1)
	}

	// Validated: write everything.
	w := writer{mem: mem}
	w.write(gdtAddr, gdtBytes(format == FormatBzImage))
	w.write(MPTableAddr, mp)
	w.write(cmdlineAddr, append([]byte(p.Cmdline), 0))
	w.write(initrdAddr, p.Initramfs)
	var st EntryState
	st.Regs.RFLAGS = 2
	switch format {
	case FormatPVH:
		for _, s := range elfK.Segments {
			w.write(s.Addr, s.Data)
			w.zero(s.Addr+uint64(len(s.Data)), s.MemSize-uint64(len(s.Data)))
		}
		w.write(pvhMemmapAddr, pvhMemmap(e820))
		w.write(pvhModAddr, pvhModule(initrdAddr, uint64(len(p.Initramfs))))
		w.write(pvhInfoAddr, pvhStartInfo(cmdlineAddr, initrdAddr, uint64(len(p.Initramfs)), len(e820)))
		st.Regs.RIP = uint64(elfK.Entry)
		st.Regs.RBX = pvhInfoAddr
	case FormatBzImage:
		zp, err := bz.zeroPage(cmdlineAddr, uint64(len(p.Cmdline)), initrdAddr, uint64(len(p.Initramfs)), e820)
		if err != nil {
			return EntryState{}, 0, err
		}
		w.write(bzImageLoadAddr, bz.Kernel)
		w.write(zeroPageAddr, zp)
		pml4, pdpt, pd := pageTables()
		w.write(pml4Addr, pml4)
		w.write(pdptAddr, pdpt)
		w.write(pdAddr, pd)
		st.long = true
		st.Regs.RIP = bzImageLoadAddr + 0x200 // startup_64
		st.Regs.RSI = zeroPageAddr
		st.Regs.RSP = bootStackTop
	}
	if w.err != nil {
		return EntryState{}, 0, w.err
	}
	return st, format, nil
}

func pageUp(x uint64) uint64 { return (x + guestmem.PageSize - 1) &^ (guestmem.PageSize - 1) }

// writer writes into guest memory and keeps the first error.
type writer struct {
	mem *guestmem.Memory
	err error
}

func (w *writer) write(gpa uint64, b []byte) {
	if w.err != nil || len(b) == 0 {
		return
	}
	if _, err := w.mem.WriteAt(b, int64(gpa)); err != nil {
		w.err = fmt.Errorf("boot: write %d bytes at %#x: %w", len(b), gpa, err)
	}
}

func (w *writer) zero(gpa, n uint64) {
	if w.err != nil || n == 0 {
		return
	}
	s, err := w.mem.Slice(gpa, n)
	if err != nil {
		w.err = fmt.Errorf("boot: zero %d bytes at %#x: %w", n, gpa, err)
		return
	}
	clear(s)
}
