package vmm

import "github.com/warrenvm/warren/vmm/kvm"

// CPUID bits the VMM sets per vCPU.
const (
	cpuidHypervisor = 1 << 31 // leaf 1 ECX: running under a hypervisor
	cpuidHTT        = 1 << 28 // leaf 1 EDX: more than one logical CPU
)

// vcpuCPUID specialises a VM-wide CPUID table for vCPU id of n: APIC IDs in
// leaves 1, 0xB and 0x1F, the logical CPU count, and the hypervisor bit.
func vcpuCPUID(table []kvm.CPUIDEntry, id, n int) []kvm.CPUIDEntry {
	out := append([]kvm.CPUIDEntry(nil), table...)
	for i := range out {
		e := &out[i]
		switch e.Function {
		case 1:
			e.EBX = e.EBX&0x0000ffff | uint32(id)<<24 | uint32(min(n, 255))<<16
			e.ECX |= cpuidHypervisor
			if n > 1 {
				e.EDX |= cpuidHTT
			} else {
				e.EDX &^= cpuidHTT
			}
		case 0xb, 0x1f:
			e.EDX = uint32(id)
		}
	}
	return out
}
