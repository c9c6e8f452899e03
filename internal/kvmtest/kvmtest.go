// Package kvmtest is the one gate for tests that need /dev/kvm.
//
// `make test` decides per machine where KVM tests run (.ci/kvmhost/probe
// -choose): directly on this machine's /dev/kvm, or inside the nested KVM
// host (.ci/kvmhost), which runs them faster where /dev/kvm emulates guest
// kernel mode (a PVM host). In the second case the host half of `make test`
// sets WARREN_KVM_TESTS=nested, and Require skips there: the same tests run
// in the nested host, where the variable is not set.
package kvmtest

import (
	"os"
	"testing"
)

// Env is the variable `make test` sets to "nested" when this machine's KVM
// tests run in the nested KVM host instead.
const Env = "WARREN_KVM_TESTS"

// Require skips t unless KVM tests run here: /dev/kvm exists and Env is
// not "nested".
func Require(t testing.TB) {
	t.Helper()
	if os.Getenv(Env) == "nested" {
		t.Skip("skipped here: make test runs KVM tests in the nested KVM host on this machine (" + Env + "=nested)")
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		t.Skip("skipped: /dev/kvm is absent on this host (make test runs KVM tests in a nested KVM host)")
	}
}
