package cli

import (
	"bytes"
	"github.com/warrenvm/warren/internal/kvmtest"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/warrenvm/warren/vmm/testguest"
)

func runCLI(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	rc := Main(args, nil, &out, &errb)
	return rc, out.String(), errb.String()
}

// Bad input gets a clear error and a non-zero exit, before any VM runs (so
// these pass on hosts without KVM too).
func TestRunBadInput(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage")
	os.WriteFile(garbage, []byte("this is not a kernel image"), 0o644)
	kernel := filepath.Join(dir, "hello.elf")
	os.WriteFile(kernel, testguest.Build(t, "hello"), 0o644)
	big := filepath.Join(dir, "big.cpio")
	os.WriteFile(big, make([]byte, 40<<20), 0o644)

	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no kernel flag", []string{"run"}, "--kernel or --kernel-fd is required"},
		{"kernel fd is stdin", []string{"run", "--kernel-fd", "0"}, "not an inherited descriptor"},
		{"kernel path and fd", []string{"run", "--kernel", kernel, "--kernel-fd", "9"}, "give one"},
		{"kernel fd not open", []string{"run", "--kernel-fd", "987"}, "--kernel-fd 987"},
		{"missing kernel", []string{"run", "--kernel", filepath.Join(dir, "nope")}, "read kernel: open"},
		{"garbage kernel", []string{"run", "--kernel", garbage}, "neither an ELF vmlinux nor a bzImage"},
		{"mem 0", []string{"run", "--kernel", kernel, "--mem", "0"}, "--mem must be a positive"},
		{"cpus 0", []string{"run", "--kernel", kernel, "--cpus", "0"}, "0 vCPUs requested"},
		{"initramfs too big", []string{"run", "--kernel", kernel, "--initramfs", big, "--mem", "32"}, "initramfs of 40 MiB does not fit"},
		{"missing initramfs", []string{"run", "--kernel", kernel, "--initramfs", filepath.Join(dir, "nope")}, "read initramfs"},
	}
	for _, c := range cases {
		rc, _, stderr := runCLI(c.args...)
		if rc == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("%s: rc=%d stderr=%q, want non-zero and %q", c.name, rc, stderr, c.want)
		}
	}
	if rc, _, _ := runCLI("bogus"); rc != 2 {
		t.Errorf("unknown command rc=%d", rc)
	}
}

// artifact returns build/NAME at the repository root (or $ENV), failing the
// test when it is missing on a host that has KVM.
func artifact(t *testing.T, env, name string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		return p
	}
	_, file, _, _ := runtime.Caller(0)
	p := filepath.Join(filepath.Dir(file), "..", "..", "..", "build", name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is missing: run `make kernel initramfs` first (or set %s)", p, env)
	}
	return p
}

var readyLine = regexp.MustCompile(`(?m)^warren-init: ready uptime=\d+\.\d+\r?$`)

// TestBootLinux boots the project's kernel and initramfs to the init's
// ready line and a clean power-off, through the CLI as a user runs it.
func TestBootLinux(t *testing.T) {
	kvmtest.Require(t)
	if testing.Short() {
		t.Skip("skipped in -short mode: a full Linux boot")
	}
	kernel := artifact(t, "WARREN_KERNEL", "vmlinux")
	initramfs := artifact(t, "WARREN_INITRAMFS", "initramfs.cpio")
	cases := []struct {
		name   string
		kernel string
		cpus   string
	}{
		{"pvh-1cpu", kernel, "1"},
		{"pvh-2cpu", kernel, "2"},
	}
	if bz := os.Getenv("WARREN_BZIMAGE"); bz != "" {
		cases = append(cases, struct{ name, kernel, cpus string }{"bzimage-1cpu", bz, "1"})
	} else if p := filepath.Join(filepath.Dir(kernel), "bzImage"); fileExists(p) {
		cases = append(cases, struct{ name, kernel, cpus string }{"bzimage-1cpu", p, "1"})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			console := filepath.Join(t.TempDir(), "console.log")
			rc, _, stderr := runCLI("run", "--kernel", c.kernel, "--initramfs", initramfs, "--mem", "256",
				"--cpus", c.cpus, "--cmdline", "warren.poweroff=1 warren.hostname=e2e", "--console", console)
			log, _ := os.ReadFile(console)
			if rc != 0 {
				t.Fatalf("warren run exited %d: %s\nconsole:\n%s", rc, stderr, tail(log))
			}
			if n := len(readyLine.FindAll(log, -1)); n != 1 {
				t.Fatalf("%d ready lines, want exactly 1; console:\n%s", n, tail(log))
			}
			if c.cpus == "2" && !bytes.Contains(log, []byte("2 CPUs")) && !bytes.Contains(log, []byte("Brought up 1 node, 2 CPUs")) {
				t.Errorf("second vCPU did not come up; console:\n%s", tail(log))
			}
		})
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func tail(b []byte) string {
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
