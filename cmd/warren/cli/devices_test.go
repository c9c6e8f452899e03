package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenvm/warren/vmm/testguest"
)

// Device errors are reported before the VM starts.
func TestRunDeviceErrors(t *testing.T) {
	dir := t.TempDir()
	kernel := filepath.Join(dir, "hello.elf")
	os.WriteFile(kernel, testguest.Build(t, "hello"), 0o644)
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--disk", filepath.Join(dir, "missing.img")}, "--disk"},
		{[]string{"--mac", "52:54:00:12:34:56"}, "--mac needs --tap"},
		{[]string{"--tap", "t0", "--mac", "nope"}, "is not a 6-byte MAC"},
	}
	for _, c := range cases {
		rc, _, stderr := runCLI(append([]string{"run", "--kernel", kernel}, c.args...)...)
		if rc == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: rc=%d stderr=%q, want %q", c.args, rc, stderr, c.want)
		}
	}
}
