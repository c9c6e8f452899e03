package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenvm/warren/vmm/testguest"
)

func TestDiskFlag(t *testing.T) {
	var d diskFlag
	for _, v := range []string{"a.img", "b.img,ro", "c.img,rw"} {
		if err := d.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	if len(d) != 3 || d[0].readOnly || !d[1].readOnly || d[2].readOnly || d[1].path != "b.img" {
		t.Fatalf("parsed %+v", d)
	}
	for _, bad := range []string{"", ",ro", "x.img,fast"} {
		if err := d.Set(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseMAC(t *testing.T) {
	m, err := parseMAC("")
	if err != nil || len(m) != 6 || m[0]&1 != 0 || m[0]&2 == 0 {
		t.Errorf("random MAC %v, %v", m, err)
	}
	if m, err := parseMAC("52:54:00:12:34:56"); err != nil || m.String() != "52:54:00:12:34:56" {
		t.Errorf("parsed %v, %v", m, err)
	}
	for _, bad := range []string{"01:00:5e:00:00:01", "zz", "52:54:00:12:34"} {
		if _, err := parseMAC(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

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
