package kvm

import "fmt"

// The structures below mirror the x86_64 layouts in <linux/kvm.h> and
// <asm/kvm.h> byte for byte; sizes are asserted in types_test.go.

// Regs is struct kvm_regs: the general-purpose registers.
type Regs struct {
	RAX, RBX, RCX, RDX, RSI, RDI, RSP, RBP uint64
	R8, R9, R10, R11, R12, R13, R14, R15   uint64
	RIP, RFLAGS                            uint64
}

// Segment is struct kvm_segment.
type Segment struct {
	Base     uint64
	Limit    uint32
	Selector uint16
	Type     uint8
	Present  uint8
	DPL      uint8
	DB       uint8
	S        uint8
	L        uint8
	G        uint8
	AVL      uint8
	Unusable uint8
	_        uint8
}

// DTable is struct kvm_dtable (GDT/IDT register).
type DTable struct {
	Base  uint64
	Limit uint16
	_     [3]uint16
}

// Sregs is struct kvm_sregs: segment and control registers.
type Sregs struct {
	CS, DS, ES, FS, GS, SS Segment
	TR, LDT                Segment
	GDT, IDT               DTable
	CR0, CR2, CR3, CR4     uint64
	CR8, EFER, APICBase    uint64
	InterruptBitmap        [4]uint64
}

// FPU is struct kvm_fpu: legacy x87/SSE state.
type FPU struct {
	FPR        [8][16]uint8
	FCW        uint16
	FSW        uint16
	FTWX       uint8
	_          uint8
	LastOpcode uint16
	LastIP     uint64
	LastDP     uint64
	XMM        [16][16]uint8
	MXCSR      uint32
	_          uint32
}

// Xsave is struct kvm_xsave in its legacy 4 KiB form. KVM_GET_XSAVE2 may
// return more: see VCPU.GetXsave2.
type Xsave struct {
	Region [1024]uint32
}

// XCR is one extended control register value.
type XCR struct {
	XCR   uint32
	_     uint32
	Value uint64
}

// XCRs is struct kvm_xcrs.
type XCRs struct {
	NrXCRs uint32
	Flags  uint32
	XCRs   [16]XCR
	_      [16]uint64
}

// MSREntry is struct kvm_msr_entry.
type MSREntry struct {
	Index uint32
	_     uint32
	Data  uint64
}

// LAPICState is struct kvm_lapic_state: the local APIC register page.
type LAPICState struct {
	Regs [1024]byte
}

// CPUIDEntry is struct kvm_cpuid_entry2.
type CPUIDEntry struct {
	Function uint32
	Index    uint32
	Flags    uint32
	EAX      uint32
	EBX      uint32
	ECX      uint32
	EDX      uint32
	_        [3]uint32
}

// CPUIDFlagSignificantIndex marks a CPUID entry whose Index (ECX input) matters.
const CPUIDFlagSignificantIndex = 1

// MPState values for struct kvm_mp_state.
const (
	MPStateRunnable      = 0
	MPStateUninitialized = 1
	MPStateInitReceived  = 2
	MPStateHalted        = 3
	MPStateSipiReceived  = 4
)

// VCPUEvents is struct kvm_vcpu_events: pending exceptions, interrupts, NMIs
// and SMIs.
type VCPUEvents struct {
	Exception struct {
		Injected     uint8
		Nr           uint8
		HasErrorCode uint8
		Pending      uint8
		ErrorCode    uint32
	}
	Interrupt struct {
		Injected uint8
		Nr       uint8
		Soft     uint8
		Shadow   uint8
	}
	NMI struct {
		Injected uint8
		Pending  uint8
		Masked   uint8
		_        uint8
	}
	SipiVector uint32
	Flags      uint32
	SMI        struct {
		SMM          uint8
		Pending      uint8
		SMMInsideNMI uint8
		LatchedInit  uint8
	}
	TripleFault struct {
		Pending uint8
	}
	_                   [26]uint8
	ExceptionHasPayload uint8
	ExceptionPayload    uint64
}

// DebugRegs is struct kvm_debugregs.
type DebugRegs struct {
	DB    [4]uint64
	DR6   uint64
	DR7   uint64
	Flags uint64
	_     [9]uint64
}

// UserspaceMemoryRegion is struct kvm_userspace_memory_region.
type UserspaceMemoryRegion struct {
	Slot          uint32
	Flags         uint32
	GuestPhysAddr uint64
	MemorySize    uint64
	UserspaceAddr uint64
}

// Memory region flags.
const (
	MemLogDirtyPages = 1 << 0
	MemReadonly      = 1 << 1
)

// PITConfig is struct kvm_pit_config.
type PITConfig struct {
	Flags uint32
	_     [15]uint32
}

// PITSpeakerDummy asks KVM to emulate a dummy PC speaker port (0x61).
const PITSpeakerDummy = 1

// PITChannelState is struct kvm_pit_channel_state.
type PITChannelState struct {
	Count         uint32
	LatchedCount  uint16
	CountLatched  uint8
	StatusLatched uint8
	Status        uint8
	ReadState     uint8
	WriteState    uint8
	WriteLatch    uint8
	RWMode        uint8
	Mode          uint8
	BCD           uint8
	Gate          uint8
	CountLoadTime int64
}

// PITState2 is struct kvm_pit_state2.
type PITState2 struct {
	Channels [3]PITChannelState
	Flags    uint32
	_        [9]uint32
}

// IRQChip identifiers for struct kvm_irqchip.
const (
	IRQChipPICMaster = 0
	IRQChipPICSlave  = 1
	IRQChipIOAPIC    = 2
)

// IRQChip is struct kvm_irqchip: the state of one in-kernel interrupt
// controller (PIC master/slave or IOAPIC) as an opaque 512-byte blob.
type IRQChip struct {
	ChipID uint32
	_      uint32
	Chip   [512]byte
}

type irqLevel struct {
	IRQ   uint32
	Level uint32
}

// IRQFD is struct kvm_irqfd.
type IRQFD struct {
	FD         uint32
	GSI        uint32
	Flags      uint32
	ResampleFD uint32
	_          [16]uint8
}

// IRQFDDeassign removes an irqfd.
const IRQFDDeassign = 1

// IOEventFD is struct kvm_ioeventfd.
type IOEventFD struct {
	DataMatch uint64
	Addr      uint64
	Len       uint32
	FD        int32
	Flags     uint32
	_         [36]uint8
}

// IOEventFD flags.
const (
	IOEventFDDataMatch = 1 << 0
	IOEventFDPIO       = 1 << 1
	IOEventFDDeassign  = 1 << 2
)

// ClockData is struct kvm_clock_data.
type ClockData struct {
	Clock    uint64
	Flags    uint32
	_        uint32
	Realtime uint64
	HostTSC  uint64
	_        [4]uint32
}

type dirtyLog struct {
	Slot   uint32
	_      uint32
	Bitmap uint64
}

type clearDirtyLog struct {
	Slot      uint32
	NumPages  uint32
	FirstPage uint64
	Bitmap    uint64
}

type enableCap struct {
	Cap   uint32
	Flags uint32
	Args  [4]uint64
	_     [64]uint8
}

// Capabilities for KVM_CHECK_EXTENSION / KVM_ENABLE_CAP.
const (
	CapIRQChip                = 0
	CapHLT                    = 1
	CapUserMemory             = 3
	CapSetTSSAddr             = 4
	CapExtCPUID               = 7
	CapNrVCPUs                = 9
	CapNrMemslots             = 10
	CapPIT                    = 11
	CapCoalescedMMIO          = 15
	CapSyncMMU                = 16
	CapIOMMU                  = 18
	CapMPState                = 14
	CapIRQInjectStatus        = 26
	CapAdjustClock            = 39
	CapIRQFD                  = 32
	CapPIT2                   = 33
	CapSetBootCPUID           = 34
	CapPITState2              = 35
	CapIOEventFD              = 36
	CapVCPUEvents             = 41
	CapDebugRegs              = 50
	CapXSave                  = 55
	CapXCRs                   = 56
	CapTSCControl             = 60
	CapGetTSCKHz              = 61
	CapImmediateExit          = 136
	CapManualDirtyLogProtect2 = 168
	CapMaxVCPUs               = 66
	CapXSave2                 = 208
	CapDirtyLogRing           = 192
)

// Exit reasons in kvm_run.exit_reason.
const (
	ExitUnknown       = 0
	ExitException     = 1
	ExitIO            = 2
	ExitHypercall     = 3
	ExitDebug         = 4
	ExitHLT           = 5
	ExitMMIO          = 6
	ExitIRQWindowOpen = 7
	ExitShutdown      = 8
	ExitFailEntry     = 9
	ExitIntr          = 10
	ExitInternalError = 17
	ExitSystemEvent   = 24
)

// Directions of a port I/O exit.
const (
	ExitIOIn  = 0
	ExitIOOut = 1
)

// System event types in an ExitSystemEvent.
const (
	SystemEventShutdown = 1
	SystemEventReset    = 2
	SystemEventCrash    = 3
)

// ExitReasonName returns a readable name for a kvm_run exit reason.
func ExitReasonName(r uint32) string {
	names := map[uint32]string{
		ExitUnknown: "UNKNOWN", ExitException: "EXCEPTION", ExitIO: "IO",
		ExitHypercall: "HYPERCALL", ExitDebug: "DEBUG", ExitHLT: "HLT",
		ExitMMIO: "MMIO", ExitIRQWindowOpen: "IRQ_WINDOW_OPEN",
		ExitShutdown: "SHUTDOWN", ExitFailEntry: "FAIL_ENTRY", ExitIntr: "INTR",
		ExitInternalError: "INTERNAL_ERROR", ExitSystemEvent: "SYSTEM_EVENT",
	}
	if n, ok := names[r]; ok {
		return n
	}
	return fmt.Sprintf("exit(%d)", r)
}
