// Package product is how tests end when a build product or an installed
// tool they need is missing: the kernel and initramfs, bin/warren, the
// test disk, the Debian image, the fleet's kube-apiserver, etcd, weed and
// kubectl, a static busybox.
//
// Under `make test` (and so CI) every such product is built or installed
// before any test runs, and the Makefile sets Env to "required": a missing
// one is then a bug in the build and fails the test, so that no test skips
// silently on the hosts users run (issue 18: on a host with /dev/kvm the
// daemon's end-to-end tests once all skipped because bin/warren was not
// built). A plain `go test` leaves Env unset, and the test skips with one
// message naming what is missing and the command that makes it.
package product

import (
	"os"
	"testing"
)

// Env is the variable `make test` sets to "required".
const Env = "WARREN_PRODUCTS"

// Required reports whether missing products fail tests (Env is
// "required").
func Required() bool { return os.Getenv(Env) == "required" }

// Missing ends t because what (a path or a tool's name, with the reason,
// e.g. the stat error) is missing; how is the command that makes or
// installs it ("make kernel initramfs", "apt-get install busybox-static").
// It fails t when Required, and skips it otherwise. It does not return.
func Missing(t testing.TB, what, how string) {
	t.Helper()
	if Required() {
		t.Fatalf("missing build product: %s; make test builds it before the tests (%s), so this is a bug in the build (%s=required)", what, how, Env)
	}
	t.Skipf("skipped: %s is missing (%s)", what, how)
}
