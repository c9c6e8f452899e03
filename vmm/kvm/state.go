package kvm

import "unsafe"

// Helpers for saving and restoring vCPU and VM state (snapshots, pause).

// State is one piece of vCPU or VM state that KVM reads with one _IOR
// request and writes with one _IOW request, each passing a T: Get and Set
// take one of the State values below.
type State[T any] struct {
	getOp, setOp string  // the requests' names, for errors
	get, set     uintptr // the encoded requests
}

func newState[T any](name string, get, set uintptr) State[T] {
	return State[T]{getOp: "KVM_GET_" + name, setOp: "KVM_SET_" + name, get: iorT[T](get), set: iowT[T](set)}
}

// The vCPU state that Get and Set read and write on a *VCPU
// (KVM_GET_REGS and KVM_SET_REGS, ...). StateXsave is the legacy 4 KiB
// area; see VCPU.GetXsave2 and VCPU.SetXsave for the larger one.
var (
	StateRegs       = newState[Regs]("REGS", 0x81, 0x82)
	StateSregs      = newState[Sregs]("SREGS", 0x83, 0x84)
	StateFPU        = newState[FPU]("FPU", 0x8c, 0x8d)
	StateLAPIC      = newState[LAPICState]("LAPIC", 0x8e, 0x8f)
	StateMPState    = newState[uint32]("MP_STATE", 0x98, 0x99)
	StateVCPUEvents = newState[VCPUEvents]("VCPU_EVENTS", 0x9f, 0xa0)
	StateDebugRegs  = newState[DebugRegs]("DEBUGREGS", 0xa1, 0xa2)
	StateXsave      = newState[Xsave]("XSAVE", 0xa4, 0xa5)
	StateXCRs       = newState[XCRs]("XCRS", 0xa6, 0xa7)
)

// The VM state that Get and Set read and write on a *VM (KVM_GET_PIT2 and
// KVM_SET_PIT2; KVM_GET_CLOCK, the guest's kvmclock, and KVM_SET_CLOCK).
var (
	StatePIT2  = newState[PITState2]("PIT2", 0x9f, 0xa0)
	StateClock = newState[ClockData]("CLOCK", 0x7c, 0x7b)
)

// Handle is what Get and Set issue their requests on: a *VCPU for the
// vCPU states, a *VM for the VM ones. On a *VCPU they follow the VCPU
// thread rule.
type Handle interface{ FD() int }

// Get reads state s of h with its KVM_GET_* request.
func Get[T any](h Handle, s State[T]) (T, error) {
	var v T
	_, err := ioctlPtr(h.FD(), s.getOp, s.get, unsafe.Pointer(&v))
	return v, err
}

// Set writes v as state s of h with its KVM_SET_* request.
func Set[T any](h Handle, s State[T], v T) error {
	_, err := ioctlPtr(h.FD(), s.setOp, s.set, unsafe.Pointer(&v))
	return err
}

// Flags of VCPUEvents.Flags: on KVM_SET_VCPU_EVENTS they say which optional
// fields the kernel should take from the structure.
const (
	VCPUEventValidNMIPending  = 1 << 0
	VCPUEventValidSIPIVector  = 1 << 1
	VCPUEventValidShadow      = 1 << 2
	VCPUEventValidSMM         = 1 << 3
	VCPUEventValidPayload     = 1 << 4
	VCPUEventValidTripleFault = 1 << 5
)

// Well-known MSRs that a saved vCPU must carry even where
// KVM_GET_MSR_INDEX_LIST omits them (it lists what KVM saves, but the set
// varies by kernel version). Unreadable ones are dropped at save time.
const (
	MSRIA32TSC          = 0x10
	MSRIA32APICBase     = 0x1b
	MSRIA32TSCAdjust    = 0x3b
	MSRIA32SysenterCS   = 0x174
	MSRIA32SysenterESP  = 0x175
	MSRIA32SysenterEIP  = 0x176
	MSRIA32MiscEnable   = 0x1a0
	MSRIA32CRPAT        = 0x277
	MSRIA32TSCDeadline  = 0x6e0
	MSREFER             = 0xc0000080
	MSRSTAR             = 0xc0000081
	MSRLSTAR            = 0xc0000082
	MSRCSTAR            = 0xc0000083
	MSRSyscallMask      = 0xc0000084
	MSRKernelGSBase     = 0xc0000102
	MSRTSCAux           = 0xc0000103
	MSRKVMWallClockNew  = 0x4b564d00
	MSRKVMSystemTimeNew = 0x4b564d01
	MSRKVMAsyncPFEn     = 0x4b564d02
	MSRKVMStealTime     = 0x4b564d03
	MSRKVMPVEOIEn       = 0x4b564d04
	MSRKVMPollControl   = 0x4b564d05
	MSRKVMAsyncPFInt    = 0x4b564d06
	MSRKVMWallClock     = 0x11
	MSRKVMSystemTime    = 0x12
)

// EssentialMSRs lists the MSRs above, in the order they should be written
// back: the TSC first (other MSRs and the kvmclock pages are relative to it),
// TSC_DEADLINE last (KVM drops it unless the LAPIC timer is already in
// TSC-deadline mode, so the LAPIC must be restored before the MSRs).
var EssentialMSRs = []uint32{
	MSRIA32TSC, MSRIA32TSCAdjust, MSRIA32SysenterCS, MSRIA32SysenterESP, MSRIA32SysenterEIP,
	MSRIA32MiscEnable, MSRIA32CRPAT, MSREFER, MSRSTAR, MSRLSTAR, MSRCSTAR, MSRSyscallMask,
	MSRKernelGSBase, MSRTSCAux, MSRKVMWallClock, MSRKVMSystemTime, MSRKVMWallClockNew,
	MSRKVMSystemTimeNew, MSRKVMAsyncPFEn, MSRKVMStealTime, MSRKVMPVEOIEn, MSRKVMPollControl,
	MSRKVMAsyncPFInt, MSRIA32TSCDeadline,
}

// ReadableMSRs reads as many of indices as the vCPU will give: KVM_GET_MSRS
// stops at the first MSR it cannot read, so that one is skipped and the
// read continues after it. The result keeps the order of indices. Same
// thread rule as every VCPU method.
func (c *VCPU) ReadableMSRs(indices []uint32) ([]MSREntry, error) {
	var out []MSREntry
	for len(indices) > 0 {
		n := min(len(indices), maxMSRs)
		got, err := c.GetMSRs(indices[:n])
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
		skip := len(got)
		if skip < n {
			skip++ // the MSR KVM refused
		}
		indices = indices[skip:]
	}
	return out, nil
}
