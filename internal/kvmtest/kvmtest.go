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
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
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

// WaitFor polls cond every few milliseconds until it holds, and fails t
// (naming what) when limit passes first.
func WaitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// VM is what Start runs: the VMM's *vmm.VM (internal imports none of the
// module's other packages).
type VM interface {
	Run(ctx context.Context) error
	Stop(reason error)
	Close() error
}

// Start runs vm in the background for at most limit. The function it
// returns, also registered with t.Cleanup (it runs once), stops vm, waits
// for Run, fails t if Run failed, and closes vm.
func Start(t testing.TB, vm VM, limit time.Duration) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	runErr := make(chan error, 1)
	go func() { runErr <- vm.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			vm.Stop(nil)
			if err := <-runErr; err != nil {
				t.Errorf("Run: %v", err)
			}
			cancel()
			vm.Close()
		})
	}
	t.Cleanup(stop)
	return stop
}

// RunChild runs test (a top-level test of the same binary, which skips
// unless env is set) in a new process of this test binary with env set
// (NAME=VALUE), logs its output, and fails t unless it ran and passed: a
// restore in a process that never held the VM.
func RunChild(t testing.TB, test, env string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), env)
	out, err := cmd.CombinedOutput()
	t.Logf("child:\n%s", out)
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: "+test) {
		t.Fatalf("the child did not run %s", test)
	}
}

// Child is the start of the child half of a test that runs it with
// RunChild: it returns the value of env, which the parent test (named
// parent) sets, and skips t when env is unset (t is not run by parent) or
// when KVM tests do not run here (Require).
func Child(t testing.TB, env, parent string) string {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		t.Skip("run by " + parent)
	}
	Require(t)
	return v
}
