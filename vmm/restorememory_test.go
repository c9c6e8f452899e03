package vmm

import (
	"strings"
	"testing"

	"github.com/warrenvm/warren/vmm/guestmem"
	"github.com/warrenvm/warren/vmm/hostprofile"
)

// TestRestoreMemoryRefuses checks that RestoreMemory turns away memory of
// the wrong size, and a state that does not fit, before touching KVM.
func TestRestoreMemoryRefuses(t *testing.T) {
	profile := hostprofile.Profile{Kind: hostprofile.Hardware, Module: "kvm_amd"}
	cfg := Config{MemBytes: 64 << 20, CPUs: 1, Profile: profile, KVMPath: "/nonexistent/kvm"}
	for _, c := range []struct {
		name string
		size uint64
		st   *State
		want string
	}{
		{"size", 32 << 20, fakeState(1), "guest memory is"},
		{"state", 64 << 20, nil, "none"},
		{"no memory", 0, fakeState(1), "no guest memory"},
	} {
		var mem *guestmem.Memory
		if c.size > 0 {
			var err error
			if mem, err = guestmem.New(c.size); err != nil {
				t.Fatal(err)
			}
		}
		_, err := RestoreMemory(cfg, c.st, mem)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.name, err, c.want)
		}
	}
}
