// Package hostprofile tells what kind of KVM this host offers and adapts the
// guest to it. Hardware KVM (kvm_intel, kvm_amd) gets nothing: the guest sees
// KVM's supported CPUID unchanged and no extra kernel arguments. PVM in
// "native" mode (kvm_pvm with pvm_native=Y), where guest ring 0 is run by
// KVM's instruction emulator, gets a CPUID mask for the instructions that
// emulator lacks and the kernel arguments our patched guest kernel needs
// (see kernel/README.md).
package hostprofile

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/warrenvm/warren/vmm/kvm"
)

// Kind names a host profile.
type Kind string

// The profiles.
const (
	Hardware  Kind = "hardware"   // VT-x/AMD-V through kvm_intel or kvm_amd
	PVMNative Kind = "pvm-native" // kvm_pvm with guest kernel mode emulated
)

// Profile is how guests are adapted to this host.
type Profile struct {
	Kind Kind
	// Module is the KVM vendor module found (kvm_intel, kvm_amd, kvm_pvm), or
	// "" when none was recognised.
	Module string
}

// Detect inspects sysfsModule (normally /sys/module) for the loaded KVM
// vendor module. The environment variable WARREN_HOST_PROFILE=hardware or
// =pvm-native overrides detection.
func Detect(sysfsModule string) Profile {
	if k := os.Getenv("WARREN_HOST_PROFILE"); k == string(Hardware) || k == string(PVMNative) {
		return Profile{Kind: Kind(k), Module: "override"}
	}
	for _, m := range []string{"kvm_intel", "kvm_amd"} {
		if _, err := os.Stat(filepath.Join(sysfsModule, m)); err == nil {
			return Profile{Kind: Hardware, Module: m}
		}
	}
	if _, err := os.Stat(filepath.Join(sysfsModule, "kvm_pvm")); err == nil {
		native, _ := os.ReadFile(filepath.Join(sysfsModule, "kvm_pvm", "parameters", "pvm_native"))
		if strings.TrimSpace(string(native)) != "N" {
			return Profile{Kind: PVMNative, Module: "kvm_pvm"}
		}
		return Profile{Kind: Hardware, Module: "kvm_pvm"}
	}
	return Profile{Kind: Hardware}
}

// String describes the profile for logs.
func (p Profile) String() string {
	if p.Module == "" {
		return string(p.Kind)
	}
	return string(p.Kind) + " (" + p.Module + ")"
}

// KernelArgs are the guest kernel arguments this host needs.
func (p Profile) KernelArgs() []string {
	if p.Kind != PVMNative {
		return nil
	}
	// warren_pvm_native turns on our kernel patch's workarounds; the rest
	// keep the guest off instructions PVM's emulator cannot execute in guest
	// ring 0 (CPUID masking alone does not hide XSAVE there).
	return []string{"warren_pvm_native", "noxsave", "clearcpuid=popcnt,cx16,rdtscp,fsgsbase,smap"}
}

// CPUID feature bits masked on PVM hosts.
const (
	leaf1ECXFMA     = 1 << 12
	leaf1ECXCX16    = 1 << 13
	leaf1ECXPOPCNT  = 1 << 23
	leaf1ECXXSAVE   = 1 << 26
	leaf1ECXOSXSAVE = 1 << 27
	leaf1ECXAVX     = 1 << 28
	leaf1ECXF16C    = 1 << 29
	leaf7EBXFSGS    = 1 << 0
	leaf7EBXAVX2    = 1 << 5
	leaf7EBXSMAP    = 1 << 20
	leaf7EBXAVX512  = 1<<16 | 1<<17 | 1<<21 | 1<<26 | 1<<27 | 1<<28 | 1<<30 | 1<<31
	ext1EDXRDTSCP   = 1 << 27
	// KVM paravirtual features (leaf 0x40000001 EAX) that work through
	// hypercalls, which hang a guest on a PVM host.
	kvmFeaturePVUnhalt     = 1 << 7
	kvmFeaturePVSendIPI    = 1 << 11
	kvmFeaturePVSchedYield = 1 << 13
)

// FilterCPUID returns the CPUID table a guest on this host should see,
// starting from KVM_GET_SUPPORTED_CPUID. The input is not modified.
func (p Profile) FilterCPUID(in []kvm.CPUIDEntry) []kvm.CPUIDEntry {
	out := make([]kvm.CPUIDEntry, 0, len(in))
	for _, e := range in {
		if p.Kind == PVMNative {
			switch e.Function {
			case 1:
				e.ECX &^= leaf1ECXCX16 | leaf1ECXPOPCNT | leaf1ECXXSAVE | leaf1ECXOSXSAVE |
					leaf1ECXAVX | leaf1ECXF16C | leaf1ECXFMA
			case 7:
				if e.Index == 0 {
					e.EBX &^= leaf7EBXFSGS | leaf7EBXSMAP | leaf7EBXAVX2 | leaf7EBXAVX512
				}
			case 0xd:
				continue // no XSAVE: drop its enumeration leaf
			case 0x80000001:
				e.EDX &^= ext1EDXRDTSCP
			case 0x40000001:
				e.EAX &^= kvmFeaturePVUnhalt | kvmFeaturePVSendIPI | kvmFeaturePVSchedYield
			}
		}
		out = append(out, e)
	}
	return out
}
