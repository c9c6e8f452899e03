// Command probe proves that /dev/kvm really runs a guest: it creates a VM
// with one page of real-mode code, runs it and checks the exits
// (KVM_EXIT_IO with 'A', a timed busy loop, KVM_EXIT_IO with 'B', then
// KVM_EXIT_HLT). It also reports KVM_CHECK_EXTENSION for the capabilities
// the Warren VMM cares about, and optionally repeats the run with an
// in-kernel irqchip and PIT.
//
// With -choose it instead decides where a KVM test suite runs fastest on
// this machine and prints one word, "direct" or "nested", with its reasons
// on stderr: see choose.
//
// It only uses package syscall so that it stays a tiny static binary
// (CGO_ENABLED=0) that can run in the kvmhost L1 guest (.ci/kvmhost/run.sh).
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"
)

const (
	kvmGetAPIVersion       = 0xAE00
	kvmCreateVM            = 0xAE01
	kvmCheckExtension      = 0xAE03
	kvmGetVCPUMmapSize     = 0xAE04
	kvmCreateVCPU          = 0xAE41
	kvmSetUserMemoryRegion = 0x4020AE46
	kvmCreateIRQChip       = 0xAE60
	kvmCreatePIT2          = 0x4040AE77
	kvmRun                 = 0xAE80
	kvmGetRegs             = 0x8090AE81
	kvmSetRegs             = 0x4090AE82
	kvmGetSregs            = 0x8138AE83
	kvmSetSregs            = 0x4138AE84

	exitIO  = 2
	exitHLT = 5

	guestAddr = 0x1000
	memSize   = 0x1000
)

// Real-mode guest code, loaded at guestAddr:
//
//	mov  $0x3f8,%dx       BA F8 03
//	mov  $'A',%al         B0 41
//	out  %al,(%dx)        EE
//	mov  $N,%ecx          66 B9 nn nn nn nn   (N patched at offset 8)
//	1: dec %ecx           66 49
//	jnz  1b               75 FC
//	mov  $'B',%al         B0 42
//	out  %al,(%dx)        EE
//	mov  $M,%ecx          66 B9 mm mm mm mm   (M patched at offset 21)
//	2: out %al,$0x80      E6 80               (M exits to userspace)
//	dec  %ecx             66 49
//	jnz  2b               75 FA
//	mov  $'C',%al         B0 43
//	out  %al,(%dx)        EE
//	hlt                   F4
var code = []byte{
	0xBA, 0xF8, 0x03,
	0xB0, 'A',
	0xEE,
	0x66, 0xB9, 0, 0, 0, 0,
	0x66, 0x49,
	0x75, 0xFC,
	0xB0, 'B',
	0xEE,
	0x66, 0xB9, 0, 0, 0, 0,
	0xE6, 0x80,
	0x66, 0x49,
	0x75, 0xFA,
	0xB0, 'C',
	0xEE,
	0xF4,
}

const (
	loopCountOffset = 8
	exitCountOffset = 21
)

type userspaceMemoryRegion struct {
	Slot          uint32
	Flags         uint32
	GuestPhysAddr uint64
	MemorySize    uint64
	UserspaceAddr uint64
}

type regs struct {
	RAX, RBX, RCX, RDX, RSI, RDI, RSP, RBP uint64
	R8, R9, R10, R11, R12, R13, R14, R15   uint64
	RIP, RFLAGS                            uint64
}

type segment struct {
	Base                         uint64
	Limit                        uint32
	Selector                     uint16
	Type, Present, DPL, DB, S, L uint8
	G, AVL, Unusable, Padding    uint8
}

type dtable struct {
	Base    uint64
	Limit   uint16
	Padding [3]uint16
}

type sregs struct {
	CS, DS, ES, FS, GS, SS, TR, LDT segment
	GDT, IDT                        dtable
	CR0, CR2, CR3, CR4, CR8         uint64
	EFER, APICBase                  uint64
	InterruptBitmap                 [4]uint64
}

func ioctl(fd uintptr, req uintptr, arg uintptr) (uintptr, error) {
	r, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, req, arg)
	if e != 0 {
		return r, e
	}
	return r, nil
}

// must issues an ioctl that has to succeed.
func must(what string, fd, req, arg uintptr) uintptr {
	v, err := ioctl(fd, req, arg)
	if err != nil {
		fail("%s: %v", what, err)
	}
	return v
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "probe: FAIL: "+format+"\n", a...)
	os.Exit(1)
}

var caps = []struct {
	name string
	num  uintptr
}{
	{"IRQCHIP", 0},
	{"IRQFD", 32},
	{"PIT2", 33},
	{"IOEVENTFD", 36},
	{"XSAVE", 55},
	{"XCRS", 56},
	{"MANUAL_DIRTY_LOG_PROTECT2", 168},
}

func main() {
	loops := flag.Uint("loops", 10_000_000, "iterations of the guest's busy loop (dec ecx; jnz)")
	exits := flag.Uint("exits", 10_000, "KVM_EXIT_IO round trips (out to port 0x80) to time; at least 1")
	irqchip := flag.Bool("irqchip", true, "also run the guest in a VM with KVM_CREATE_IRQCHIP + KVM_CREATE_PIT2")
	rateOnly := flag.Bool("rate", false, "run the plain guest once and print its loop rate, in M iterations/s, on the last line (used by -choose)")
	chooseMode := flag.Bool("choose", false, "print \"direct\" or \"nested\": where KVM tests run fastest here (reasons on stderr)")
	minRate := flag.Float64("min-rate", 50, "with -choose: the guest kernel-mode loop rate, in M iterations/s, at or above which /dev/kvm is used directly")
	flag.Parse()
	if *chooseMode {
		choose(*minRate)
		return
	}

	t0 := time.Now()
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		fail("open /dev/kvm: %v", err)
	}
	kvm := f.Fd()
	api := must("KVM_GET_API_VERSION", kvm, kvmGetAPIVersion, 0)
	if api != 12 {
		fail("KVM_GET_API_VERSION = %d, want 12", api)
	}
	fmt.Printf("probe: KVM_GET_API_VERSION = %d\n", api)
	for _, c := range caps {
		v, err := ioctl(kvm, kvmCheckExtension, c.num)
		if err != nil {
			fmt.Printf("probe: KVM_CHECK_EXTENSION(%s=%d) error %v\n", c.name, c.num, err)
			continue
		}
		fmt.Printf("probe: KVM_CHECK_EXTENSION(%s=%d) = %d\n", c.name, c.num, v)
	}

	if *loops < 1 || *exits < 1 || *loops > 1<<32-1 || *exits > 1<<32-1 {
		fail("-loops and -exits must be in 1..2^32-1")
	}
	loopTime := runGuest("plain", kvm, uint32(*loops), uint32(*exits), false)
	if *rateOnly {
		fmt.Printf("%.3f\n", float64(*loops)/loopTime.Seconds()/1e6)
		return
	}
	if *irqchip {
		runGuest("irqchip+pit2", kvm, uint32(*loops), uint32(*exits), true)
	}
	fmt.Printf("probe: PASS (total %v)\n", time.Since(t0).Round(time.Millisecond))
}

// runGuest runs the probe's guest in a new VM and returns how long its busy
// loop took.
func runGuest(name string, kvm uintptr, loops, exits uint32, irqchip bool) time.Duration {
	vm := must("KVM_CREATE_VM", kvm, kvmCreateVM, 0)
	defer syscall.Close(int(vm))
	if irqchip {
		must("KVM_CREATE_IRQCHIP", vm, kvmCreateIRQChip, 0)
		var pit [64]byte // struct kvm_pit_config: flags + pad[15]
		must("KVM_CREATE_PIT2", vm, kvmCreatePIT2, uintptr(unsafe.Pointer(&pit[0])))
	}

	mem, err := syscall.Mmap(-1, 0, memSize, syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_SHARED|syscall.MAP_ANONYMOUS)
	if err != nil {
		fail("mmap guest memory: %v", err)
	}
	defer syscall.Munmap(mem)
	copy(mem, code)
	binary.LittleEndian.PutUint32(mem[loopCountOffset:], loops)
	binary.LittleEndian.PutUint32(mem[exitCountOffset:], exits)
	region := userspaceMemoryRegion{
		Slot:          0,
		GuestPhysAddr: guestAddr,
		MemorySize:    memSize,
		UserspaceAddr: uint64(uintptr(unsafe.Pointer(&mem[0]))),
	}
	must("KVM_SET_USER_MEMORY_REGION", vm, kvmSetUserMemoryRegion, uintptr(unsafe.Pointer(&region)))

	vcpu := must("KVM_CREATE_VCPU", vm, kvmCreateVCPU, 0)
	defer syscall.Close(int(vcpu))
	runSize := must("KVM_GET_VCPU_MMAP_SIZE", kvm, kvmGetVCPUMmapSize, 0)
	run, err := syscall.Mmap(int(vcpu), 0, int(runSize), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		fail("mmap kvm_run: %v", err)
	}
	defer syscall.Munmap(run)

	var sr sregs
	must("KVM_GET_SREGS", vcpu, kvmGetSregs, uintptr(unsafe.Pointer(&sr)))
	sr.CS.Base = 0
	sr.CS.Selector = 0
	must("KVM_SET_SREGS", vcpu, kvmSetSregs, uintptr(unsafe.Pointer(&sr)))
	r := regs{RIP: guestAddr, RFLAGS: 2}
	must("KVM_SET_REGS", vcpu, kvmSetRegs, uintptr(unsafe.Pointer(&r)))

	var (
		out         []byte
		tA, tB      time.Time
		loopTime    time.Duration
		exitTime    time.Duration
		port80Exits uint32
		start       = time.Now()
		report      = func(tail string) {
			fmt.Printf("probe: %s: guest wrote %q to port 0x3f8%s; "+
				"%d-iteration busy loop took %v (%.1f M iter/s); "+
				"%d KVM_EXIT_IO round trips took %v (%.1f us each); run total %v\n",
				name, out, tail, loops, loopTime.Round(time.Microsecond),
				float64(loops)/loopTime.Seconds()/1e6,
				port80Exits, exitTime.Round(time.Microsecond),
				exitTime.Seconds()*1e6/float64(port80Exits),
				time.Since(start).Round(time.Microsecond))
		}
	)
	for {
		if _, err := ioctl(vcpu, kvmRun, 0); err != nil {
			if err == syscall.EINTR {
				continue
			}
			fail("%s: KVM_RUN: %v", name, err)
		}
		reason := binary.LittleEndian.Uint32(run[8:])
		switch reason {
		case exitIO:
			dir, size := run[32], run[33]
			port := binary.LittleEndian.Uint16(run[34:])
			count := binary.LittleEndian.Uint32(run[36:])
			off := binary.LittleEndian.Uint64(run[40:])
			if dir != 1 || size != 1 || count != 1 || (port != 0x3f8 && port != 0x80) {
				fail("%s: unexpected io exit dir=%d size=%d port=%#x count=%d", name, dir, size, port, count)
			}
			if port == 0x80 {
				port80Exits++
				continue
			}
			c := run[off]
			out = append(out, c)
			if len(out) > 3 {
				fail("%s: guest wrote too much: %q", name, out)
			}
			switch c {
			case 'A':
				tA = time.Now()
			case 'B':
				tB = time.Now()
				loopTime = tB.Sub(tA)
			case 'C':
				exitTime = time.Since(tB)
				if port80Exits != exits {
					fail("%s: saw %d exits on port 0x80, want %d", name, port80Exits, exits)
				}
				if irqchip {
					// With an in-kernel irqchip, HLT is handled in the kernel
					// (the vCPU blocks until an interrupt, and IF=0 here), so
					// there is no KVM_EXIT_HLT to wait for.
					report("")
					return loopTime
				}
			}
		case exitHLT:
			if string(out) != "ABC" {
				fail("%s: guest wrote %q before HLT, want \"ABC\"", name, out)
			}
			var rr regs
			must("KVM_GET_REGS", vcpu, kvmGetRegs, uintptr(unsafe.Pointer(&rr)))
			if rr.RCX&0xffffffff != 0 {
				fail("%s: ecx = %#x after loop, want 0", name, rr.RCX)
			}
			wantRIP := uint64(guestAddr + len(code))
			if rr.RIP != wantRIP {
				fail("%s: rip = %#x after hlt, want %#x", name, rr.RIP, wantRIP)
			}
			report(fmt.Sprintf(" then KVM_EXIT_HLT at rip %#x", rr.RIP))
			return loopTime
		default:
			fail("%s: unexpected exit reason %d (output so far %q)", name, reason, out)
		}
	}
}

// Compile-time checks that the Go structs match the kernel ABI sizes
// encoded in the ioctl numbers.
var (
	_ [0x20 - unsafe.Sizeof(userspaceMemoryRegion{})]struct{}
	_ [unsafe.Sizeof(userspaceMemoryRegion{}) - 0x20]struct{}
	_ [0x90 - unsafe.Sizeof(regs{})]struct{}
	_ [unsafe.Sizeof(regs{}) - 0x90]struct{}
	_ [0x138 - unsafe.Sizeof(sregs{})]struct{}
	_ [unsafe.Sizeof(sregs{}) - 0x138]struct{}
)
