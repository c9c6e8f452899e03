package boot

import (
	"encoding/binary"
	"fmt"
)

// Offsets in a bzImage file and in struct boot_params (the zero page); the
// setup header sits at the same offsets in both.
const (
	hdrSetupSects     = 0x1f1
	hdrVidMode        = 0x1fa
	hdrJump           = 0x200
	hdrMagic          = 0x202
	hdrVersion        = 0x206
	hdrTypeOfLoader   = 0x210
	hdrLoadflags      = 0x211
	hdrRamdiskImage   = 0x218
	hdrRamdiskSize    = 0x21c
	hdrCmdLinePtr     = 0x228
	hdrInitrdAddrMax  = 0x22c
	hdrXLoadflags     = 0x236
	hdrCmdlineSize    = 0x238
	hdrInitSize       = 0x260
	bpExtRamdiskImage = 0x0c0
	bpExtRamdiskSize  = 0x0c4
	bpExtCmdLinePtr   = 0x0c8
	bpE820Entries     = 0x1e8
	bpE820Table       = 0x2d0
	zeroPageSize      = 4096
	xlfKernel64       = 1 << 0
	minBootVersion    = 0x20c // 64-bit entry and xloadflags
)

// BzImage is a parsed bzImage ready for the 64-bit boot protocol.
type BzImage struct {
	// Header is the setup header, bytes [0x1f1, end of header), to be copied
	// into the zero page at the same offsets.
	Header []byte
	// Kernel is the protected-mode part, loaded at bzImageLoadAddr.
	Kernel []byte
	// InitSize is the memory the kernel needs from its load address to
	// decompress and run.
	InitSize uint32
	// InitrdAddrMax is the highest address the initramfs may end at.
	InitrdAddrMax uint32
	// CmdlineSize is the longest command line the kernel accepts.
	CmdlineSize uint32
}

// IsBzImage reports whether image carries a Linux setup header.
func IsBzImage(image []byte) bool {
	return len(image) > hdrMagic+4 && string(image[hdrMagic:hdrMagic+4]) == "HdrS"
}

// ParseBzImage checks a bzImage's setup header for 64-bit boot support.
func ParseBzImage(image []byte) (*BzImage, error) {
	if !IsBzImage(image) {
		return nil, fmt.Errorf("boot: not a bzImage (no HdrS setup header)")
	}
	le := binary.LittleEndian
	version := le.Uint16(image[hdrVersion:])
	if version < minBootVersion {
		return nil, fmt.Errorf("boot: bzImage boot protocol %d.%02d is too old; 2.12 or later is needed for 64-bit entry", version>>8, version&0xff)
	}
	hdrEnd := hdrMagic + int(image[hdrJump+1])
	if hdrEnd < hdrInitSize+4 || hdrEnd > len(image) || hdrEnd > zeroPageSize {
		return nil, fmt.Errorf("boot: bzImage setup header length %d is invalid", hdrEnd)
	}
	if le.Uint16(image[hdrXLoadflags:])&xlfKernel64 == 0 {
		return nil, fmt.Errorf("boot: bzImage has no 64-bit entry point (XLF_KERNEL_64 unset)")
	}
	setupSects := int(image[hdrSetupSects])
	if setupSects == 0 {
		setupSects = 4
	}
	off := (setupSects + 1) * 512
	if off >= len(image) {
		return nil, fmt.Errorf("boot: bzImage is truncated: %d setup sectors but only %d bytes", setupSects, len(image))
	}
	b := &BzImage{
		Header:        image[hdrSetupSects:hdrEnd],
		Kernel:        image[off:],
		InitSize:      le.Uint32(image[hdrInitSize:]),
		InitrdAddrMax: le.Uint32(image[hdrInitrdAddrMax:]),
		CmdlineSize:   le.Uint32(image[hdrCmdlineSize:]),
	}
	if b.InitSize < uint32(len(b.Kernel)) {
		b.InitSize = uint32(len(b.Kernel))
	}
	return b, nil
}

// zeroPage builds struct boot_params for the 64-bit boot protocol.
func (b *BzImage) zeroPage(cmdline, cmdlineLen, initrdAddr, initrdSize uint64, e820 []E820Entry) ([]byte, error) {
	if len(e820) > maxE820 {
		return nil, fmt.Errorf("boot: %d e820 entries, at most %d", len(e820), maxE820)
	}
	if b.CmdlineSize != 0 && cmdlineLen > uint64(b.CmdlineSize) {
		return nil, fmt.Errorf("boot: command line is %d bytes; this kernel accepts %d", cmdlineLen, b.CmdlineSize)
	}
	zp := make([]byte, zeroPageSize)
	copy(zp[hdrSetupSects:], b.Header)
	le := binary.LittleEndian
	le.PutUint16(zp[hdrVidMode:], 0xffff) // "normal" video mode
	zp[hdrTypeOfLoader] = 0xff            // undefined boot loader
	zp[hdrLoadflags] |= 0x01              // LOADED_HIGH
	le.PutUint32(zp[hdrCmdLinePtr:], uint32(cmdline))
	le.PutUint32(zp[bpExtCmdLinePtr:], uint32(cmdline>>32))
	le.PutUint32(zp[hdrRamdiskImage:], uint32(initrdAddr))
	le.PutUint32(zp[bpExtRamdiskImage:], uint32(initrdAddr>>32))
	le.PutUint32(zp[hdrRamdiskSize:], uint32(initrdSize))
	le.PutUint32(zp[bpExtRamdiskSize:], uint32(initrdSize>>32))
	zp[bpE820Entries] = byte(len(e820))
	for i, e := range e820 {
		o := bpE820Table + 20*i
		le.PutUint64(zp[o:], e.Addr)
		le.PutUint64(zp[o+8:], e.Size)
		le.PutUint32(zp[o+16:], e.Type)
	}
	return zp, nil
}
