package boot

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
)

// xenElfnotePhys32Entry is the ELF note type carrying the PVH 32-bit entry.
const xenElfnotePhys32Entry = 18

// pvhStartMagic identifies struct hvm_start_info.
const pvhStartMagic = 0x336ec578

// ELFKernel is a vmlinux ELF prepared for PVH boot.
type ELFKernel struct {
	// Entry is the physical PVH entry point from the Xen note.
	Entry uint32
	// Segments are the PT_LOAD segments (physical address and file bytes,
	// with MemSize >= len(Data); the rest is zero-filled).
	Segments []Segment
}

// Segment is one loadable piece of a kernel image.
type Segment struct {
	Addr    uint64
	Data    []byte
	MemSize uint64
}

// End is the first physical address after the segment.
func (s Segment) End() uint64 { return s.Addr + s.MemSize }

// ParseELF parses a 64-bit x86 vmlinux and finds its PVH entry note.
func ParseELF(image []byte) (*ELFKernel, error) {
	f, err := elf.NewFile(bytes.NewReader(image))
	if err != nil {
		return nil, fmt.Errorf("boot: parse ELF kernel: %w", err)
	}
	if f.Class != elf.ELFCLASS64 || f.Machine != elf.EM_X86_64 {
		return nil, fmt.Errorf("boot: ELF kernel is %v/%v, want ELFCLASS64/EM_X86_64", f.Class, f.Machine)
	}
	k := &ELFKernel{}
	found := false
	for _, p := range f.Progs {
		switch p.Type {
		case elf.PT_NOTE:
			data, err := io.ReadAll(p.Open())
			if err != nil {
				return nil, fmt.Errorf("boot: read ELF note segment: %w", err)
			}
			if e, ok, err := findPVHEntry(data); err != nil {
				return nil, err
			} else if ok {
				k.Entry, found = e, true
			}
		case elf.PT_LOAD:
			if p.Filesz > p.Memsz {
				return nil, fmt.Errorf("boot: ELF segment at %#x: file size %d > memory size %d", p.Paddr, p.Filesz, p.Memsz)
			}
			data := make([]byte, p.Filesz)
			if _, err := p.ReadAt(data, 0); err != nil {
				return nil, fmt.Errorf("boot: read ELF segment at %#x: %w", p.Paddr, err)
			}
			k.Segments = append(k.Segments, Segment{Addr: p.Paddr, Data: data, MemSize: p.Memsz})
		}
	}
	if !found {
		return nil, fmt.Errorf("boot: ELF kernel has no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY); build it with CONFIG_PVH=y")
	}
	if len(k.Segments) == 0 {
		return nil, fmt.Errorf("boot: ELF kernel has no loadable segments")
	}
	return k, nil
}

// findPVHEntry walks the notes of one PT_NOTE segment.
func findPVHEntry(notes []byte) (uint32, bool, error) {
	align4 := func(n uint32) uint64 { return (uint64(n) + 3) &^ 3 }
	for len(notes) > 0 {
		if len(notes) < 12 {
			return 0, false, fmt.Errorf("boot: truncated ELF note header")
		}
		namesz := binary.LittleEndian.Uint32(notes[0:])
		descsz := binary.LittleEndian.Uint32(notes[4:])
		typ := binary.LittleEndian.Uint32(notes[8:])
		rest := notes[12:]
		nameEnd, descEnd := align4(namesz), align4(namesz)+align4(descsz)
		if descEnd > uint64(len(rest)) {
			return 0, false, fmt.Errorf("boot: ELF note (name %d, desc %d bytes) overruns its segment", namesz, descsz)
		}
		name := rest[:namesz]
		desc := rest[nameEnd : nameEnd+uint64(descsz)]
		if typ == xenElfnotePhys32Entry && bytes.Equal(bytes.TrimRight(name, "\x00"), []byte("Xen")) {
			if len(desc) < 4 {
				return 0, false, fmt.Errorf("boot: PVH entry note has %d-byte payload", len(desc))
			}
			return binary.LittleEndian.Uint32(desc), true, nil
		}
		notes = rest[descEnd:]
	}
	return 0, false, nil
}

// pvhStartInfo builds struct hvm_start_info (version 1) with one module (the
// initramfs, when size > 0) and the memory map.
func pvhStartInfo(cmdline uint64, initrdAddr, initrdSize uint64, nMemmap int) []byte {
	b := make([]byte, 56)
	le := binary.LittleEndian
	le.PutUint32(b[0:], pvhStartMagic)
	le.PutUint32(b[4:], 1) // version
	if initrdSize > 0 {
		le.PutUint32(b[12:], 1) // nr_modules
		le.PutUint64(b[16:], pvhModAddr)
	}
	le.PutUint64(b[24:], cmdline)
	le.PutUint64(b[40:], pvhMemmapAddr)
	le.PutUint32(b[48:], uint32(nMemmap))
	return b
}

// pvhModule builds struct hvm_modlist_entry.
func pvhModule(addr, size uint64) []byte {
	b := make([]byte, 32)
	binary.LittleEndian.PutUint64(b[0:], addr)
	binary.LittleEndian.PutUint64(b[8:], size)
	return b
}

// pvhMemmap encodes the map as hvm_memmap_table_entry records.
func pvhMemmap(m []E820Entry) []byte {
	b := make([]byte, 24*len(m))
	for i, e := range m {
		binary.LittleEndian.PutUint64(b[24*i:], e.Addr)
		binary.LittleEndian.PutUint64(b[24*i+8:], e.Size)
		binary.LittleEndian.PutUint32(b[24*i+16:], e.Type)
	}
	return b
}
