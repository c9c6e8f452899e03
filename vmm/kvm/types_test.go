package kvm

import (
	"testing"
	"unsafe"
)

// The kernel ABI fixes these sizes; a wrong Go layout would corrupt memory
// the kernel writes.
func TestStructSizes(t *testing.T) {
	cases := []struct {
		name string
		got  uintptr
		want uintptr
	}{
		{"kvm_regs", unsafe.Sizeof(Regs{}), 144},
		{"kvm_segment", unsafe.Sizeof(Segment{}), 24},
		{"kvm_dtable", unsafe.Sizeof(DTable{}), 16},
		{"kvm_sregs", unsafe.Sizeof(Sregs{}), 312},
		{"kvm_fpu", unsafe.Sizeof(FPU{}), 416},
		{"kvm_xsave", unsafe.Sizeof(Xsave{}), 4096},
		{"kvm_xcrs", unsafe.Sizeof(XCRs{}), 392},
		{"kvm_msr_entry", unsafe.Sizeof(MSREntry{}), 16},
		{"kvm_lapic_state", unsafe.Sizeof(LAPICState{}), 1024},
		{"kvm_cpuid_entry2", unsafe.Sizeof(CPUIDEntry{}), 40},
		{"kvm_vcpu_events", unsafe.Sizeof(VCPUEvents{}), 64},
		{"kvm_debugregs", unsafe.Sizeof(DebugRegs{}), 128},
		{"kvm_userspace_memory_region", unsafe.Sizeof(UserspaceMemoryRegion{}), 32},
		{"kvm_pit_config", unsafe.Sizeof(PITConfig{}), 64},
		{"kvm_pit_channel_state", unsafe.Sizeof(PITChannelState{}), 24},
		{"kvm_pit_state2", unsafe.Sizeof(PITState2{}), 112},
		{"kvm_irqchip", unsafe.Sizeof(IRQChip{}), 520},
		{"kvm_irq_level", unsafe.Sizeof(irqLevel{}), 8},
		{"kvm_irqfd", unsafe.Sizeof(IRQFD{}), 32},
		{"kvm_ioeventfd", unsafe.Sizeof(IOEventFD{}), 64},
		{"kvm_clock_data", unsafe.Sizeof(ClockData{}), 48},
		{"kvm_dirty_log", unsafe.Sizeof(dirtyLog{}), 16},
		{"kvm_clear_dirty_log", unsafe.Sizeof(clearDirtyLog{}), 24},
		{"kvm_enable_cap", unsafe.Sizeof(enableCap{}), 104},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("%s: Go size %d, kernel size %d", c.name, c.got, c.want)
		}
	}
}

// Request numbers checked against values from <linux/kvm.h> as compiled.
func TestRequestNumbers(t *testing.T) {
	cases := []struct {
		name      string
		got, want uintptr
	}{
		{"KVM_GET_API_VERSION", io(0x00), 0xae00},
		{"KVM_CREATE_VM", io(0x01), 0xae01},
		{"KVM_CREATE_VCPU", io(0x41), 0xae41},
		{"KVM_RUN", io(0x80), 0xae80},
		{"KVM_SET_USER_MEMORY_REGION", iowT[UserspaceMemoryRegion](0x46), 0x4020ae46},
		{"KVM_GET_SUPPORTED_CPUID", iowr(0x05, 8), 0xc008ae05},
		{"KVM_SET_CPUID2", iow(0x90, 8), 0x4008ae90},
		{"KVM_GET_MSRS", iowr(0x88, 8), 0xc008ae88},
		{"KVM_SET_MSRS", iow(0x89, 8), 0x4008ae89},
		{"KVM_CREATE_PIT2", iowT[PITConfig](0x77), 0x4040ae77},
		{"KVM_IRQ_LINE", iowT[irqLevel](0x61), 0x4008ae61},
		{"KVM_IRQFD", iowT[IRQFD](0x76), 0x4020ae76},
		{"KVM_IOEVENTFD", iowT[IOEventFD](0x79), 0x4040ae79},
		{"KVM_GET_DIRTY_LOG", iowT[dirtyLog](0x42), 0x4010ae42},
		{"KVM_CLEAR_DIRTY_LOG", iowrT[clearDirtyLog](0xc0), 0xc018aec0},
		{"KVM_ENABLE_CAP", iowT[enableCap](0xa3), 0x4068aea3},
		{"KVM_GET_IRQCHIP", iowrT[IRQChip](0x62), 0xc208ae62},
		{"KVM_SET_IRQCHIP", iorT[IRQChip](0x63), 0x8208ae63},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
}

// The State values' requests, against <linux/kvm.h> as compiled.
func TestStateRequests(t *testing.T) {
	cases := []struct {
		got        [2]string
		gotReq     [2]uintptr
		name       string
		getW, setW uintptr
	}{
		{ops(StateRegs), reqs(StateRegs), "REGS", 0x8090ae81, 0x4090ae82},
		{ops(StateSregs), reqs(StateSregs), "SREGS", 0x8138ae83, 0x4138ae84},
		{ops(StateFPU), reqs(StateFPU), "FPU", 0x81a0ae8c, 0x41a0ae8d},
		{ops(StateLAPIC), reqs(StateLAPIC), "LAPIC", 0x8400ae8e, 0x4400ae8f},
		{ops(StateMPState), reqs(StateMPState), "MP_STATE", 0x8004ae98, 0x4004ae99},
		{ops(StateVCPUEvents), reqs(StateVCPUEvents), "VCPU_EVENTS", 0x8040ae9f, 0x4040aea0},
		{ops(StateDebugRegs), reqs(StateDebugRegs), "DEBUGREGS", 0x8080aea1, 0x4080aea2},
		{ops(StateXsave), reqs(StateXsave), "XSAVE", 0x9000aea4, 0x5000aea5},
		{ops(StateXCRs), reqs(StateXCRs), "XCRS", 0x8188aea6, 0x4188aea7},
		{ops(StatePIT2), reqs(StatePIT2), "PIT2", 0x8070ae9f, 0x4070aea0},
		{ops(StateClock), reqs(StateClock), "CLOCK", 0x8030ae7c, 0x4030ae7b},
	}
	for _, c := range cases {
		if want := [2]string{"KVM_GET_" + c.name, "KVM_SET_" + c.name}; c.got != want {
			t.Errorf("%s: ops %q, want %q", c.name, c.got, want)
		}
		if want := [2]uintptr{c.getW, c.setW}; c.gotReq != want {
			t.Errorf("%s: requests %#x, want %#x", c.name, c.gotReq, want)
		}
	}
}

func ops[T any](s State[T]) [2]string   { return [2]string{s.getOp, s.setOp} }
func reqs[T any](s State[T]) [2]uintptr { return [2]uintptr{s.get, s.set} }
