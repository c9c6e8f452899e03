package cli

import (
	"path/filepath"
	"strings"
	"testing"
)

// The agent verbs refuse bad input with a clear error and a non-zero exit,
// and report a VM that is not there (no KVM needed).
func TestAgentVerbsBadInput(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "no-vm.sock")
	cases := []struct {
		name     string
		args     []string
		wantCode int
		want     string
	}{
		{"exec without --", []string{"exec", missing, "true"}, 2, "usage: warren exec"},
		{"exec without program", []string{"exec", missing, "--"}, 2, "usage: warren exec"},
		{"exec bad env", []string{"exec", "--env", "NOEQUALS", missing, "--", "true"}, 2, `--env "NOEQUALS" is not KEY=VALUE`},
		{"exec no VM", []string{"exec", missing, "--", "true"}, exitExecFailed, "no-vm.sock"},
		{"health no VM", []string{"health", missing}, 1, "no-vm.sock"},
		{"health no args", []string{"health"}, 2, "usage: warren health"},
		{"cp both host", []string{"cp", "a", "b"}, 1, "exactly one of a and b must be VM:/guest/path"},
		{"cp both guest", []string{"cp", missing + ":/a", missing + ":/b"}, 1, "exactly one of"},
		{"cp one arg", []string{"cp", "a"}, 2, "usage: warren cp"},
		{"cp missing host file", []string{"cp", filepath.Join(dir, "nope"), missing + ":/tmp/x"}, 1, "no such file"},
		{"cp no VM", []string{"cp", missing + ":/etc/hosts", filepath.Join(dir, "out")}, 1, "no-vm.sock"},
	}
	for _, c := range cases {
		rc, _, stderr := runCLI(c.args...)
		if rc != c.wantCode || !strings.Contains(stderr, c.want) {
			t.Errorf("%s: rc=%d stderr=%q, want %d and %q", c.name, rc, stderr, c.wantCode, c.want)
		}
	}
}
