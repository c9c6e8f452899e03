package kvm

// Helpers for saving and restoring vCPU and VM state (snapshots, pause).

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
