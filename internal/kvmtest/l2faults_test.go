package kvmtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestL2Explained runs .ci/kvmhost/l2faults.sh's l2_explained, which tells
// CI's nested runs which failed attempts are the emulated host's known
// fault, on test logs of each kind: only the signatures it knows are
// excused.
func TestL2Explained(t *testing.T) {
	script, err := filepath.Abs("../../.ci/kvmhost/l2faults.sh")
	if err != nil {
		t.Fatal(err)
	}
	const (
		tf       = "    vm_test.go:80: vmm: vCPU 0: triple fault (KVM_EXIT_SHUTDOWN) at rip 0xfff0"
		knownTF  = "=== L2 shutdown exit (triple fault) in L1's KVM trace: warren-1 [000] kvm_exit: vcpu 0 reason shutdown rip 0xffffffff81288062 info 0 0 intr_info 0x80000b0e error_code 0x00000010"
		otherTF  = "=== L2 shutdown exit (triple fault) in L1's KVM trace: warren-1 [000] kvm_exit: vcpu 0 reason shutdown rip 0xffffffff81288062 info 0 0 intr_info 0x800000ec error_code 0x00000000"
		stall    = "    cli_test.go:96: L2 guest boot stalled: warren run did not end within 4m0s (killed); console:"
		hostLeak = "    cli_test.go:95: the stalled guest: L2 vCPU holds the emulated host's state: describe the guest: vCPU 0: CR3 outside guest RAM with paging on: CR3 0x101d58000, guest RAM 256 MiB"
		fail     = "--- FAIL: TestBootLinux (12.00s)"
		vmmTF    = "    fleet_e2e_test.go:749: the VMM (pid 2788) exited: warren run: vmm: vCPU 0: triple fault (KVM_EXIT_SHUTDOWN) at rip 0xfff0 (500 Internal Server Error)"
		vmmTFLog = `        {"level":"ERROR","msg":"template build failed","err":"the VMM (pid 2788) exited: warren run: vmm: vCPU 0: triple fault (KVM_EXIT_SHUTDOWN) at rip 0xfff0"}`
		vmmTF2   = "    fleet_e2e_test.go:749: the VMM (pid 2790) exited: warren run: vmm: vCPU 0: triple fault (KVM_EXIT_SHUTDOWN) at rip 0xfff0"
	)
	for _, c := range []struct {
		name    string
		log     []string
		traced  bool
		excused bool
		why     string
	}{
		{"traced known triple fault", []string{tf, knownTF, fail}, true, true, "each the emulated host's known"},
		{"untraced triple fault", []string{tf, fail}, true, false, "0 shutdown exit(s) traced"},
		// One VMM's death named by the test and again in the daemon's log.
		{"one fault reported twice", []string{vmmTF, knownTF, fail, vmmTFLog}, true, true, "1 L2 triple fault(s), each the emulated host's known"},
		{"two VMMs, one traced", []string{vmmTF, vmmTF2, knownTF, fail}, true, false, "2 L2 triple fault(s), 1 shutdown exit(s) traced"},
		{"no trace in L1", []string{tf, knownTF, fail}, false, false, "no L1 trace"},
		{"triple fault of another kind", []string{tf, otherTF, fail}, true, false, "0 of them the known"},
		{"stall in the emulated host's state", []string{hostLeak, stall, fail}, true, true, "holding L1's own state"},
		{"stall without it", []string{stall, fail}, true, false, "0 with a vCPU in the emulated host's state"},
		{"two stalls, one explained", []string{hostLeak, stall, stall, fail}, true, false, "2 L2 boot stall(s), 1 with"},
		{"an ordinary failure", []string{"    x_test.go:1: wrong answer", fail}, true, false, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "attempt.log")
			if err := os.WriteFile(log, []byte(strings.Join(c.log, "\n")+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			trace := ""
			if c.traced {
				trace = "/sys/kernel/tracing"
			}
			cmd := exec.Command("sh", "-c", `. "$1"; l2trace=$2; l2_explained "$3"`, "sh", script, trace, log)
			out, err := cmd.CombinedOutput()
			if excused := err == nil; excused != c.excused {
				t.Errorf("excused %v (%v), want %v; said %q", excused, err, c.excused, out)
			}
			if !strings.Contains(string(out), c.why) || (c.why == "" && len(out) != 0) {
				t.Errorf("said %q, want it to say %q", out, c.why)
			}
		})
	}
}
