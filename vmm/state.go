package vmm

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/warrenvm/warren/internal/strictjson"
	"github.com/warrenvm/warren/vmm/guestmem"
	"github.com/warrenvm/warren/vmm/hostprofile"
	"github.com/warrenvm/warren/vmm/kvm"
	"github.com/warrenvm/warren/vmm/serial"
)

// StateVersion is the version of State this package writes and the only
// one Restore accepts. Bump it whenever State's meaning or layout changes.
const StateVersion = 1

// State is the complete machine state of a paused VM, except guest RAM and
// the virtio devices' own state (which their packages save): what SaveState
// returns and Restore needs. It serializes deterministically with Marshal
// (JSON: fields in declaration order, blobs in base64); the snapshot format
// wraps it with checksums.
type State struct {
	Version int
	Machine MachineState
	// VCPUs holds one entry per vCPU, in ID order.
	VCPUs []VCPUState
	// PICMaster, PICSlave and IOAPIC are the in-kernel irqchip states
	// (the 512-byte chip payload of struct kvm_irqchip).
	PICMaster, PICSlave, IOAPIC []byte
	// PIT is the in-kernel i8254.
	PIT kvm.PITState2
	// Clock is the VM's kvmclock (KVM_GET_CLOCK).
	Clock kvm.ClockData
	// UART is COM1.
	UART serial.State
}

// MachineState is the part of the VM's configuration that the saved state
// depends on; Restore refuses a Config that disagrees.
type MachineState struct {
	MemBytes uint64
	CPUs     int
	// Cmdline is the kernel command line the guest booted with.
	Cmdline string
	Profile hostprofile.Profile
	// Virtio names the virtio-mmio devices in order (their windows and
	// interrupt lines follow from the position).
	Virtio []string `json:",omitempty"`
}

// VCPUState is one vCPU's architectural state as KVM exposes it.
type VCPUState struct {
	ID int
	// CPUID is the table set with KVM_SET_CPUID2 (KVM_GET_CPUID2).
	CPUID []kvm.CPUIDEntry
	// TSCKHz is the vCPU's TSC frequency (KVM_GET_TSC_KHZ; 0 if unknown).
	TSCKHz  uint32
	MPState uint32
	Regs    kvm.Regs
	Sregs   kvm.Sregs
	// FPU is the legacy x87/SSE state; Xsave, when present, supersedes it.
	FPU kvm.FPU
	// Xsave is the KVM_GET_XSAVE2 (or KVM_GET_XSAVE) area, at least 4 KiB;
	// empty when KVM lacks KVM_CAP_XSAVE.
	Xsave []byte `json:",omitempty"`
	// XCRs is nil when KVM lacks KVM_CAP_XCRS.
	XCRs *kvm.XCRs `json:",omitempty"`
	// MSRs are every MSR that KVM lists (or kvm.EssentialMSRs names) and
	// that read back, in the order they are to be written.
	MSRs []MSR
	// LAPIC is the 1 KiB local APIC register page.
	LAPIC     []byte
	Events    kvm.VCPUEvents
	DebugRegs kvm.DebugRegs
}

// MSR is one model-specific register.
type MSR struct {
	Index uint32
	Data  uint64
}

// Limits on what a state from outside may hold.
const (
	maxStateMSRs   = 1024
	maxStateCPUID  = 256
	maxStateXsave  = 1 << 20
	irqChipSize    = 512
	lapicStateSize = 1024
)

// Marshal encodes s deterministically.
func (s *State) Marshal() ([]byte, error) {
	return json.Marshal(s)
}

// UnmarshalState decodes and validates a state written by Marshal. Unknown
// fields, a different StateVersion and out-of-range sizes are refused.
func UnmarshalState(b []byte) (*State, error) {
	var s State
	if err := strictjson.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("vmm: state: %w", err)
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// Validate checks the state's version and internal consistency: every size
// that Restore hands to KVM. It does not compare with a Config (Restore
// does that).
func (s *State) Validate() error {
	if s == nil {
		return fmt.Errorf("vmm: state: none")
	}
	if s.Version != StateVersion {
		return fmt.Errorf("vmm: state: version %d, this Warren reads version %d", s.Version, StateVersion)
	}
	m := s.Machine
	if m.CPUs < 1 || m.CPUs > MaxCPUs || len(s.VCPUs) != m.CPUs {
		return fmt.Errorf("vmm: state: %d vCPU states for %d vCPUs (1..%d)", len(s.VCPUs), m.CPUs, MaxCPUs)
	}
	if len(m.Virtio) > MaxVirtioDevices {
		return fmt.Errorf("vmm: state: %d virtio devices", len(m.Virtio))
	}
	for _, c := range []struct {
		name string
		b    []byte
	}{{"PIC master", s.PICMaster}, {"PIC slave", s.PICSlave}, {"IOAPIC", s.IOAPIC}} {
		if len(c.b) != irqChipSize {
			return fmt.Errorf("vmm: state: %s state is %d bytes, want %d", c.name, len(c.b), irqChipSize)
		}
	}
	if err := s.UART.Validate(); err != nil {
		return fmt.Errorf("vmm: state: %w", err)
	}
	for i, c := range s.VCPUs {
		if c.ID != i {
			return fmt.Errorf("vmm: state: vCPU state %d has ID %d", i, c.ID)
		}
		if len(c.CPUID) == 0 || len(c.CPUID) > maxStateCPUID {
			return fmt.Errorf("vmm: state: vCPU %d: %d CPUID entries (1..%d)", i, len(c.CPUID), maxStateCPUID)
		}
		if len(c.MSRs) > maxStateMSRs {
			return fmt.Errorf("vmm: state: vCPU %d: %d MSRs, at most %d", i, len(c.MSRs), maxStateMSRs)
		}
		if n := len(c.Xsave); n != 0 && (n < 4096 || n > maxStateXsave || n%4 != 0) {
			return fmt.Errorf("vmm: state: vCPU %d: XSAVE area of %d bytes", i, n)
		}
		if c.XCRs != nil && c.XCRs.NrXCRs > uint32(len(c.XCRs.XCRs)) {
			return fmt.Errorf("vmm: state: vCPU %d: %d XCRs", i, c.XCRs.NrXCRs)
		}
		if len(c.LAPIC) != lapicStateSize {
			return fmt.Errorf("vmm: state: vCPU %d: LAPIC state is %d bytes, want %d", i, len(c.LAPIC), lapicStateSize)
		}
		if c.MPState > kvm.MPStateSipiReceived {
			return fmt.Errorf("vmm: state: vCPU %d: MP state %d", i, c.MPState)
		}
		if err := checkPaging(c, m.MemBytes); err != nil {
			return fmt.Errorf("vmm: state: vCPU %d: %w", i, err)
		}
	}
	return nil
}

// ErrPagingOutsideRAM is wrapped by the error of a save, a load or a
// Validate that found a vCPU with paging on and CR3 outside guest RAM: a
// state no guest of the VM can have made (checkPaging). Test harnesses in
// the nested KVM host tell the emulator's fault from the guest's by it.
var ErrPagingOutsideRAM = errors.New("CR3 outside guest RAM with paging on")

// checkPaging refuses a vCPU state with paging on whose CR3 names a page
// table outside guest RAM of memBytes: a guest running on it faults on
// every fetch, and its page walks through MMIO space never end. (Fork
// children in the nested KVM host hung so, CR3 0x101d58000 in a 128 MiB
// guest and RIP in L1's own KVM: the emulated nested SVM's host state in
// the guest's vCPU; see .ci/kvmhost/README.md and vmsnap's Describe.)
func checkPaging(c VCPUState, memBytes uint64) error {
	const cr0PG = 1 << 31
	if c.Sregs.CR0&cr0PG == 0 {
		return nil
	}
	base := c.Sregs.CR3 &^ 0xfff
	for _, r := range guestmem.Layout(memBytes) {
		if base >= r.GPA && base < r.GPA+r.Size {
			return nil
		}
	}
	return fmt.Errorf("%w: CR3 %#x, guest RAM %d MiB", ErrPagingOutsideRAM, c.Sregs.CR3, memBytes>>20)
}

// matches reports why cfg cannot host s, or nil.
func (s *State) matches(cfg Config) error {
	m := s.Machine
	if cfg.CPUs != m.CPUs {
		return fmt.Errorf("vmm: restore: the state has %d vCPUs, the config %d", m.CPUs, cfg.CPUs)
	}
	if cfg.MemBytes != m.MemBytes {
		return fmt.Errorf("vmm: restore: the state has %d MiB of memory, the config %d MiB", m.MemBytes>>20, cfg.MemBytes>>20)
	}
	if len(cfg.Virtio) != len(m.Virtio) {
		return fmt.Errorf("vmm: restore: the state has %d virtio devices, the config %d", len(m.Virtio), len(cfg.Virtio))
	}
	for i, d := range cfg.Virtio {
		if d.Name != m.Virtio[i] {
			return fmt.Errorf("vmm: restore: virtio device %d is %q in the state, %q in the config", i, m.Virtio[i], d.Name)
		}
	}
	if cfg.Profile.Kind != m.Profile.Kind {
		return fmt.Errorf("vmm: restore: the state was taken on a %s host, this one is %s", m.Profile.Kind, cfg.Profile.Kind)
	}
	return nil
}
