package product

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMissing runs Missing in a child test process with Env set and unset:
// required, it fails the test and names the product; otherwise it skips.
func TestMissing(t *testing.T) {
	if os.Getenv("PRODUCT_TEST_CHILD") == "1" {
		Missing(t, "build/vmlinux", "make kernel")
		t.Error("Missing returned")
		return
	}
	for _, tc := range []struct {
		env      string
		wantFail bool
		want     string
	}{
		{"required", true, "missing build product: build/vmlinux"},
		{"", false, "skipped: build/vmlinux is missing (make kernel)"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestMissing$", "-test.v")
		cmd.Env = append(os.Environ(), "PRODUCT_TEST_CHILD=1", Env+"="+tc.env)
		out, err := cmd.CombinedOutput()
		if failed := err != nil; failed != tc.wantFail {
			t.Errorf("%s=%q: child failed=%v, want %v:\n%s", Env, tc.env, failed, tc.wantFail, out)
		}
		if !strings.Contains(string(out), tc.want) {
			t.Errorf("%s=%q: output lacks %q:\n%s", Env, tc.env, tc.want, out)
		}
		if !tc.wantFail && !strings.Contains(string(out), "--- SKIP: TestMissing") {
			t.Errorf("%s=%q: child did not skip:\n%s", Env, tc.env, out)
		}
	}
}
