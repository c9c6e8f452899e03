package kvm_test

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/vmm/kvm"
	"github.com/warrenvm/warren/vmm/testguest"
)

func openKVM(t *testing.T) *kvm.System {
	t.Helper()
	kvmtest.Require(t)
	s, err := kvm.Open(kvm.DevicePath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestSystem(t *testing.T) {
	s := openKVM(t)
	if n, err := s.CheckExtension(kvm.CapIRQChip); err != nil || n == 0 {
		t.Errorf("KVM_CAP_IRQCHIP = %d, %v", n, err)
	}
	if n, err := s.VCPUMmapSize(); err != nil || n < 4096 {
		t.Errorf("vcpu mmap size %d, %v", n, err)
	}
	cpuid, err := s.SupportedCPUID()
	if err != nil || len(cpuid) == 0 || cpuid[0].Function != 0 {
		t.Errorf("supported CPUID: %d entries, %v", len(cpuid), err)
	}
	if _, err := s.MSRIndexList(); err != nil {
		t.Error(err)
	}
}

func TestErrorsNameTheIoctl(t *testing.T) {
	s := openKVM(t)
	vm, err := s.CreateVM()
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	// Slot 0 of 4095 bytes is invalid (not page-sized).
	err = vm.SetUserMemoryRegion(kvm.UserspaceMemoryRegion{MemorySize: 4095, UserspaceAddr: 4096})
	var kerr *kvm.Error
	if !errors.As(err, &kerr) || kerr.Op != "KVM_SET_USER_MEMORY_REGION" || !errors.Is(err, unix.EINVAL) {
		t.Fatalf("err = %v, want a KVM_SET_USER_MEMORY_REGION EINVAL", err)
	}
}

// TestRealModeExits runs a 16-bit guest with no irqchip: two port writes,
// then HLT, which exits to userspace since there is no in-kernel LAPIC.
func TestRealModeExits(t *testing.T) {
	s := openKVM(t)
	code := testguest.BuildFlat(t, "hlt16", 0x1000)
	vm, err := s.CreateVM()
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	mem, err := unix.Mmap(-1, 0, 0x10000, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	copy(mem[0x1000:], code)
	if err := vm.SetUserMemoryRegion(kvm.UserspaceMemoryRegion{MemorySize: 0x10000, UserspaceAddr: uint64(addr(mem))}); err != nil {
		t.Fatal(err)
	}
	c, err := vm.CreateVCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sregs, err := kvm.Get(c, kvm.StateSregs)
	if err != nil {
		t.Fatal(err)
	}
	sregs.CS.Base, sregs.CS.Selector = 0, 0
	if err := kvm.Set(c, kvm.StateSregs, sregs); err != nil {
		t.Fatal(err)
	}
	if err := kvm.Set(c, kvm.StateRegs, kvm.Regs{RIP: 0x1000, RFLAGS: 2, RBX: 40, RCX: 2}); err != nil {
		t.Fatal(err)
	}
	var out []byte
	for {
		if err := c.Run(); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			t.Fatal(err)
		}
		r := c.ExitReason()
		if r == kvm.ExitHLT {
			break
		}
		if r != kvm.ExitIO {
			t.Fatalf("exit %s", kvm.ExitReasonName(r))
		}
		io, err := c.IO()
		if err != nil {
			t.Fatal(err)
		}
		if io.Port != 0x3f8 || io.Direction != kvm.ExitIOOut || io.Size != 1 {
			t.Fatalf("io exit %+v", io)
		}
		out = append(out, io.Data...)
	}
	if string(out) != "ok" {
		t.Errorf("port output %q", out)
	}
	regs, err := kvm.Get(c, kvm.StateRegs)
	if err != nil {
		t.Fatal(err)
	}
	if regs.RCX&0xffff != 42 {
		t.Errorf("CX = %d after the guest added BX, want 42", regs.RCX&0xffff)
	}
}

// TestReadableMSRs reads KVM's MSR list with an MSR that does not exist in
// the middle: it is skipped, the ones after it are still read.
func TestReadableMSRs(t *testing.T) {
	s := openKVM(t)
	list, err := s.MSRIndexList()
	if err != nil || len(list) < 2 {
		t.Fatalf("MSR index list: %d entries, %v", len(list), err)
	}
	vm, err := s.CreateVM()
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	c, err := vm.CreateVCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const bogus = 0x0badcafe
	want := []uint32{kvm.MSRIA32TSC, bogus, kvm.MSRLSTAR, kvm.MSRSTAR}
	got, err := c.ReadableMSRs(want)
	if err != nil {
		t.Fatal(err)
	}
	var idx []uint32
	for _, e := range got {
		idx = append(idx, e.Index)
	}
	if len(idx) != 3 || idx[0] != kvm.MSRIA32TSC || idx[1] != kvm.MSRLSTAR || idx[2] != kvm.MSRSTAR {
		t.Errorf("read MSRs %#x, want TSC, LSTAR, STAR", idx)
	}
	all, err := c.ReadableMSRs(append(list, kvm.EssentialMSRs...))
	if err != nil || len(all) < len(kvm.EssentialMSRs)/2 {
		t.Errorf("%d readable MSRs of %d listed, %v", len(all), len(list), err)
	}
}
