package vmm

import (
	"testing"

	"github.com/warrenvm/warren/vmm/kvm"
)

func TestVCPUCPUID(t *testing.T) {
	table := []kvm.CPUIDEntry{
		{Function: 1, EBX: 0xff00abcd, EDX: cpuidHTT},
		{Function: 0xb, Index: 0, EDX: 99},
		{Function: 0xb, Index: 1, EDX: 99},
		{Function: 0x1f, EDX: 99},
		{Function: 7, EBX: 5},
	}
	got := vcpuCPUID(table, 3, 4)
	if got[0].EBX != 0x0304abcd || got[0].ECX&cpuidHypervisor == 0 || got[0].EDX&cpuidHTT == 0 {
		t.Errorf("leaf 1 = %+v", got[0])
	}
	for _, e := range got[1:4] {
		if e.EDX != 3 {
			t.Errorf("leaf %#x.%d x2APIC id = %d, want 3", e.Function, e.Index, e.EDX)
		}
	}
	if got[4] != table[4] {
		t.Errorf("unrelated leaf changed: %+v", got[4])
	}
	if table[0].EBX != 0xff00abcd {
		t.Error("input modified")
	}
	if one := vcpuCPUID(table, 0, 1); one[0].EDX&cpuidHTT != 0 || one[0].EBX>>16 != 1 {
		t.Errorf("single vCPU leaf 1 = %+v", one[0])
	}
}
