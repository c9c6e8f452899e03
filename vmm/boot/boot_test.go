package boot

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/warrenvm/warren/vmm/guestmem"
	"github.com/warrenvm/warren/vmm/kvm"
)

// makeELF builds a minimal x86_64 ELF with one PT_LOAD segment at paddr and,
// when notes is non-nil, one PT_NOTE segment holding notes.
func makeELF(paddr uint64, payload []byte, memsz uint64, notes []byte) []byte {
	le := binary.LittleEndian
	phnum := 1
	if notes != nil {
		phnum = 2
	}
	hdr := make([]byte, 64+56*phnum)
	copy(hdr, "\x7fELF\x02\x01\x01")
	le.PutUint16(hdr[16:], 2)  // ET_EXEC
	le.PutUint16(hdr[18:], 62) // EM_X86_64
	le.PutUint32(hdr[20:], 1)
	le.PutUint64(hdr[24:], paddr)
	le.PutUint64(hdr[32:], 64)
	le.PutUint16(hdr[52:], 64)
	le.PutUint16(hdr[54:], 56)
	le.PutUint16(hdr[56:], uint16(phnum))
	le.PutUint16(hdr[58:], 64)
	off := uint64(len(hdr))
	ph := hdr[64:]
	le.PutUint32(ph[0:], 1) // PT_LOAD
	le.PutUint64(ph[8:], off)
	le.PutUint64(ph[16:], paddr)
	le.PutUint64(ph[24:], paddr)
	le.PutUint64(ph[32:], uint64(len(payload)))
	le.PutUint64(ph[40:], memsz)
	out := append(hdr, payload...)
	if notes != nil {
		ph = hdr[64+56:]
		le.PutUint32(ph[0:], 4) // PT_NOTE
		le.PutUint64(ph[8:], uint64(len(out)))
		le.PutUint64(ph[32:], uint64(len(notes)))
		le.PutUint64(ph[40:], uint64(len(notes)))
		copy(out[64+56:], ph[:56])
		out = append(out, notes...)
	}
	return out
}

func note(name string, typ uint32, desc []byte) []byte {
	le := binary.LittleEndian
	b := make([]byte, 12)
	le.PutUint32(b[0:], uint32(len(name)+1))
	le.PutUint32(b[4:], uint32(len(desc)))
	le.PutUint32(b[8:], typ)
	n := append([]byte(name), 0)
	for len(n)%4 != 0 {
		n = append(n, 0)
	}
	d := append([]byte(nil), desc...)
	for len(d)%4 != 0 {
		d = append(d, 0)
	}
	return append(append(b, n...), d...)
}

func u32(v uint32) []byte { b := make([]byte, 4); binary.LittleEndian.PutUint32(b, v); return b }

func TestParseELFPVHNote(t *testing.T) {
	notes := append(note("GNU", 3, []byte("build-id")), note("Xen", 18, u32(0x1000123))...)
	k, err := ParseELF(makeELF(0x1000000, []byte{1, 2, 3}, 0x2000, notes))
	if err != nil {
		t.Fatal(err)
	}
	if k.Entry != 0x1000123 {
		t.Errorf("entry = %#x", k.Entry)
	}
	if len(k.Segments) != 1 || k.Segments[0].Addr != 0x1000000 || k.Segments[0].MemSize != 0x2000 {
		t.Errorf("segments = %+v", k.Segments)
	}
}

func TestParseELFErrors(t *testing.T) {
	cases := map[string]struct {
		image []byte
		want  string
	}{
		"no note":        {makeELF(0x1000000, []byte{1}, 1, nil), "no PVH entry note"},
		"other notes":    {makeELF(0x1000000, []byte{1}, 1, note("Xen", 5, u32(1))), "no PVH entry note"},
		"short payload":  {makeELF(0x1000000, []byte{1}, 1, note("Xen", 18, []byte{1, 2})), "2-byte payload"},
		"overrun":        {makeELF(0x1000000, []byte{1}, 1, note("Xen", 18, u32(1))[:16]), "overruns"},
		"garbage":        {[]byte("\x7fELF garbage that is not an ELF file at all"), "parse ELF"},
		"filesz > memsz": {makeELF(0x1000000, []byte{1, 2, 3}, 1, note("Xen", 18, u32(1))), "file size"},
	}
	for name, c := range cases {
		_, err := ParseELF(c.image)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", name, err, c.want)
		}
	}
}

func makeBzImage(kernel []byte, version uint16, xlf uint16) []byte {
	le := binary.LittleEndian
	img := make([]byte, 5*512)
	img[hdrSetupSects] = 4
	img[hdrJump+1] = 0x66 // header ends at 0x268
	copy(img[hdrMagic:], "HdrS")
	le.PutUint16(img[hdrVersion:], version)
	le.PutUint16(img[hdrXLoadflags:], xlf)
	le.PutUint32(img[hdrInitSize:], 4<<20)
	le.PutUint32(img[hdrInitrdAddrMax:], 0x7fffffff)
	le.PutUint32(img[hdrCmdlineSize:], 2047)
	return append(img, kernel...)
}

func TestParseBzImage(t *testing.T) {
	b, err := ParseBzImage(makeBzImage([]byte("KERNEL"), 0x20f, 1))
	if err != nil {
		t.Fatal(err)
	}
	if string(b.Kernel) != "KERNEL" || b.InitSize != 4<<20 || b.CmdlineSize != 2047 {
		t.Errorf("parsed %+v", b)
	}
	if _, err := ParseBzImage(makeBzImage(nil, 0x20b, 1)); err == nil || !strings.Contains(err.Error(), "too old") {
		t.Errorf("old protocol: %v", err)
	}
	if _, err := ParseBzImage(makeBzImage([]byte("K"), 0x20f, 0)); err == nil || !strings.Contains(err.Error(), "64-bit") {
		t.Errorf("no 64-bit entry: %v", err)
	}
	if _, err := ParseBzImage(makeBzImage(nil, 0x20f, 1)); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("truncated: %v", err)
	}
}

func TestE820(t *testing.T) {
	m, err := E820(guestmem.Layout(256 << 20))
	if err != nil {
		t.Fatal(err)
	}
	want := []E820Entry{{0, 0x9fc00, E820RAM}, {0x9fc00, 0x400, E820Reserved}, {0x100000, 255 << 20, E820RAM}}
	if len(m) != len(want) {
		t.Fatalf("e820 = %+v", m)
	}
	for i := range want {
		if m[i] != want[i] {
			t.Errorf("entry %d = %+v, want %+v", i, m[i], want[i])
		}
	}
	m, _ = E820(guestmem.Layout(4 << 30))
	if last := m[len(m)-1]; last != (E820Entry{1 << 32, 1 << 30, E820RAM}) {
		t.Errorf("high entry = %+v", last)
	}
	if _, err := E820(guestmem.Layout(1 << 20)); err == nil {
		t.Error("1 MiB of RAM accepted")
	}
}

func TestMPTable(t *testing.T) {
	for _, cpus := range []int{1, 2, 8} {
		b, err := MPTable(cpus)
		if err != nil {
			t.Fatal(err)
		}
		if string(b[:4]) != "_MP_" || sum(b[:16]) != 0 {
			t.Errorf("cpus=%d: bad floating pointer", cpus)
		}
		if binary.LittleEndian.Uint32(b[4:]) != MPTableAddr+16 {
			t.Errorf("cpus=%d: table pointer %#x", cpus, binary.LittleEndian.Uint32(b[4:]))
		}
		tbl := b[16:]
		n := int(binary.LittleEndian.Uint16(tbl[4:]))
		if string(tbl[:4]) != "PCMP" || n != len(tbl) || sum(tbl[:n]) != 0 {
			t.Errorf("cpus=%d: bad config table (len %d of %d)", cpus, n, len(tbl))
		}
		// Count processor entries (type 0, 20 bytes) and check the BSP flag.
		procs := 0
		for off := 44; off < n; {
			switch tbl[off] {
			case 0:
				if tbl[off+1] != byte(procs) || (tbl[off+3]&2 != 0) != (procs == 0) {
					t.Errorf("cpus=%d: processor entry %d flags %#x", cpus, procs, tbl[off+3])
				}
				procs++
				off += 20
			default:
				off += 8
			}
		}
		if procs != cpus {
			t.Errorf("cpus=%d: %d processor entries", cpus, procs)
		}
	}
	if _, err := MPTable(0); err == nil {
		t.Error("0 CPUs accepted")
	}
}

func sum(b []byte) (s byte) {
	for _, c := range b {
		s += c
	}
	return s
}

func TestCmdline(t *testing.T) {
	var c Cmdline
	c.Add("console=ttyS0  reboot=k", "", "warren.poweroff=1")
	if c.String() != "console=ttyS0 reboot=k warren.poweroff=1" {
		t.Errorf("cmdline %q", c.String())
	}
	if !c.Has("reboot") || c.Has("reb") || !c.Has("warren.poweroff") {
		t.Error("Has is wrong")
	}
	c.Add(strings.Repeat("x", MaxCmdline))
	if c.Validate() == nil {
		t.Error("overlong command line accepted")
	}
}

func newMem(t *testing.T, size uint64) *guestmem.Memory {
	m, err := guestmem.New(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func TestLoadPVH(t *testing.T) {
	mem := newMem(t, 64<<20)
	kernel := makeELF(0x1000000, []byte("CODE"), 0x1000, note("Xen", 18, u32(0x1000000)))
	initrd := bytes.Repeat([]byte{0xAB}, 10000)
	st, f, err := Load(mem, Params{Kernel: kernel, Initramfs: initrd, Cmdline: "console=ttyS0", CPUs: 2})
	if err != nil {
		t.Fatal(err)
	}
	if f != FormatPVH || st.Long() || st.Regs.RIP != 0x1000000 || st.Regs.RBX != pvhInfoAddr {
		t.Fatalf("format %v, state %+v", f, st.Regs)
	}
	info := read(t, mem, pvhInfoAddr, 56)
	le := binary.LittleEndian
	if le.Uint32(info) != pvhStartMagic || le.Uint32(info[12:]) != 1 {
		t.Fatalf("start info %x", info)
	}
	cmd := read(t, mem, le.Uint64(info[24:]), 14)
	if string(cmd) != "console=ttyS0\x00" {
		t.Errorf("cmdline %q", cmd)
	}
	mod := read(t, mem, le.Uint64(info[16:]), 16)
	addr, size := le.Uint64(mod), le.Uint64(mod[8:])
	if size != 10000 || addr%4096 != 0 || addr+size > 64<<20 || !bytes.Equal(read(t, mem, addr, size), initrd) {
		t.Errorf("module at %#x size %d", addr, size)
	}
	if string(read(t, mem, 0x1000000, 4)) != "CODE" {
		t.Error("kernel segment not loaded")
	}
	if n := le.Uint32(info[48:]); n != 3 {
		t.Errorf("%d memmap entries", n)
	}
	if string(read(t, mem, MPTableAddr, 4)) != "_MP_" {
		t.Error("no MP table")
	}
	var s kvm.Sregs
	st.Apply(&s)
	if s.CR0&cr0PE == 0 || s.CR0&cr0PG != 0 || s.CS.DB != 1 || s.CS.L != 0 || s.CS.Selector != selCode || s.TR.Type != 0xb {
		t.Errorf("PVH sregs %+v", s)
	}
}

func TestLoadBzImage(t *testing.T) {
	mem := newMem(t, 64<<20)
	st, f, err := Load(mem, Params{Kernel: makeBzImage([]byte("BZKERNEL"), 0x20f, 1), Initramfs: []byte("INITRD"), Cmdline: "quiet", CPUs: 1})
	if err != nil {
		t.Fatal(err)
	}
	if f != FormatBzImage || !st.Long() || st.Regs.RIP != 0x100200 || st.Regs.RSI != zeroPageAddr {
		t.Fatalf("format %v regs %+v", f, st.Regs)
	}
	zp := read(t, mem, zeroPageAddr, 4096)
	le := binary.LittleEndian
	if string(zp[hdrMagic:hdrMagic+4]) != "HdrS" || zp[hdrTypeOfLoader] != 0xff {
		t.Error("zero page header not copied")
	}
	if zp[bpE820Entries] != 3 || le.Uint64(zp[bpE820Table+40:]) != HighMemStart {
		t.Errorf("e820 in zero page: %d entries", zp[bpE820Entries])
	}
	rd, n := le.Uint32(zp[hdrRamdiskImage:]), le.Uint32(zp[hdrRamdiskSize:])
	if n != 6 || string(read(t, mem, uint64(rd), 6)) != "INITRD" {
		t.Errorf("ramdisk at %#x size %d", rd, n)
	}
	if string(read(t, mem, le.Uint64(zp[hdrCmdLinePtr:])&0xffffffff, 5)) != "quiet" {
		t.Error("cmdline")
	}
	if string(read(t, mem, 0x100000, 8)) != "BZKERNEL" {
		t.Error("kernel not at 1 MiB")
	}
	// The identity map covers the entry point.
	pd := read(t, mem, pdAddr, 8)
	if le.Uint64(pd) != 0x83 {
		t.Errorf("first PDE %#x", le.Uint64(pd))
	}
	var s kvm.Sregs
	st.Apply(&s)
	if s.CR0&cr0PG == 0 || s.EFER&eferLMA == 0 || s.CS.L != 1 || s.CR3 != pml4Addr {
		t.Errorf("long mode sregs %+v", s)
	}
}

func TestLoadRejects(t *testing.T) {
	mem := newMem(t, 32<<20)
	kernel := makeELF(0x1000000, []byte("CODE"), 0x1000, note("Xen", 18, u32(0x1000000)))
	cases := map[string]struct {
		p    Params
		want string
	}{
		"garbage kernel":  {Params{Kernel: []byte("not a kernel"), CPUs: 1}, "neither an ELF"},
		"empty kernel":    {Params{Kernel: nil, CPUs: 1}, "neither an ELF"},
		"initrd too big":  {Params{Kernel: kernel, Initramfs: make([]byte, 20<<20), CPUs: 1}, "does not fit"},
		"kernel too high": {Params{Kernel: makeELF(0x3000000, []byte("X"), 1, note("Xen", 18, u32(1))), CPUs: 1}, "does not fit"},
		"zero cpus":       {Params{Kernel: kernel, CPUs: 0}, "vCPUs"},
		"long cmdline":    {Params{Kernel: kernel, CPUs: 1, Cmdline: strings.Repeat("a", MaxCmdline)}, "command line"},
	}
	for name, c := range cases {
		_, _, err := Load(mem, c.p)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want %q", name, err, c.want)
		}
	}
}

func read(t *testing.T, mem *guestmem.Memory, gpa, n uint64) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := mem.ReadAt(b, int64(gpa)); err != nil {
		t.Fatal(err)
	}
	return b
}

func FuzzParseELF(f *testing.F) {
	f.Add(makeELF(0x1000000, []byte{1, 2}, 2, note("Xen", 18, u32(0x1000000))))
	f.Add([]byte("\x7fELF"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ParseELF(b) // must not panic
	})
}

func FuzzParseBzImage(f *testing.F) {
	f.Add(makeBzImage([]byte("K"), 0x20f, 1))
	f.Fuzz(func(t *testing.T, b []byte) {
		ParseBzImage(b)
	})
}
