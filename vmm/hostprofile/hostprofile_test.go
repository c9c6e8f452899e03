package hostprofile

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/warrenvm/warren/vmm/kvm"
)

func fakeSysfs(t *testing.T, modules map[string]string) string {
	dir := t.TempDir()
	for m, native := range modules {
		p := filepath.Join(dir, m, "parameters")
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if native != "" {
			os.WriteFile(filepath.Join(p, "pvm_native"), []byte(native+"\n"), 0o644)
		}
	}
	return dir
}

func TestDetect(t *testing.T) {
	t.Setenv("WARREN_HOST_PROFILE", "")
	cases := []struct {
		modules map[string]string
		want    Kind
		module  string
	}{
		{map[string]string{"kvm": "", "kvm_intel": ""}, Hardware, "kvm_intel"},
		{map[string]string{"kvm": "", "kvm_amd": ""}, Hardware, "kvm_amd"},
		{map[string]string{"kvm": "", "kvm_pvm": "Y"}, PVMNative, "kvm_pvm"},
		{map[string]string{"kvm": "", "kvm_pvm": "N"}, Hardware, "kvm_pvm"},
		{map[string]string{}, Hardware, ""},
	}
	for _, c := range cases {
		p := Detect(fakeSysfs(t, c.modules))
		if p.Kind != c.want || p.Module != c.module {
			t.Errorf("%v: got %+v, want %s/%s", c.modules, p, c.want, c.module)
		}
	}
	t.Setenv("WARREN_HOST_PROFILE", "pvm-native")
	if p := Detect(fakeSysfs(t, map[string]string{"kvm_intel": ""})); p.Kind != PVMNative {
		t.Errorf("override ignored: %+v", p)
	}
}

func TestKernelArgs(t *testing.T) {
	if a := (Profile{Kind: Hardware}).KernelArgs(); len(a) != 0 {
		t.Errorf("hardware args %v", a)
	}
	a := (Profile{Kind: PVMNative}).KernelArgs()
	if !slices.Contains(a, "warren_pvm_native") || !slices.Contains(a, "noxsave") {
		t.Errorf("pvm args %v", a)
	}
}

func TestFilterCPUID(t *testing.T) {
	in := []kvm.CPUIDEntry{
		{Function: 1, ECX: 0xffffffff, EDX: 0xffffffff},
		{Function: 7, Index: 0, EBX: 0xffffffff},
		{Function: 0xd, Index: 0, EAX: 7},
		{Function: 0x80000001, EDX: 0xffffffff},
		{Function: 0x40000001, EAX: 0xffffffff},
	}
	hw := (Profile{Kind: Hardware}).FilterCPUID(in)
	if !slices.Equal(hw, in) {
		t.Errorf("hardware profile changed CPUID: %+v", hw)
	}
	pvm := (Profile{Kind: PVMNative}).FilterCPUID(in)
	if len(pvm) != 4 {
		t.Fatalf("pvm kept %d leaves, want leaf 0xd dropped", len(pvm))
	}
	if pvm[0].ECX&(leaf1ECXPOPCNT|leaf1ECXCX16|leaf1ECXXSAVE) != 0 || pvm[0].EDX != 0xffffffff {
		t.Errorf("leaf 1 = %+v", pvm[0])
	}
	if pvm[1].EBX&(leaf7EBXFSGS|leaf7EBXSMAP) != 0 {
		t.Errorf("leaf 7 = %+v", pvm[1])
	}
	if pvm[2].EDX&ext1EDXRDTSCP != 0 {
		t.Errorf("leaf 0x80000001 = %+v", pvm[2])
	}
	if pvm[3].EAX&(kvmFeaturePVUnhalt|kvmFeaturePVSendIPI|kvmFeaturePVSchedYield) != 0 || pvm[3].EAX&1 == 0 {
		t.Errorf("KVM features leaf = %#x", pvm[3].EAX)
	}
	if in[0].ECX != 0xffffffff {
		t.Error("input modified")
	}
}
