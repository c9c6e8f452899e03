package cli

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenvm/warren/hostd/client/clienttest"
	"github.com/warrenvm/warren/vmm/testguest"
)

// runCLI runs the warren command in-process with no input.
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

// cli runs the warren command as a user would (in-process) and returns its
// exit code and output.
func cli(t *testing.T, stdin io.Reader, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = Main(args, stdin, &o, &e)
	return code, o.String(), e.String()
}

// expect runs the warren command in-process with stdin ("": none) and
// fails the test unless it exits want; it returns its output.
func expect(t *testing.T, want int, stdin string, args ...string) (stdout, stderr string) {
	t.Helper()
	var in io.Reader
	if stdin != "" {
		in = strings.NewReader(stdin)
	}
	code, stdout, stderr := cli(t, in, args...)
	if code != want {
		t.Fatalf("warren %s: exit %d, want %d: %s%s", strings.Join(args, " "), code, want, stdout, stderr)
	}
	return stdout, stderr
}

// stubDaemon starts a stand-in warren-hostd that the daemon verbs reach,
// as tenant demo.
func stubDaemon(t *testing.T) *clienttest.Stub {
	stub := clienttest.New(t)
	t.Setenv("WARREN_HOST", stub.Socket)
	t.Setenv("WARREN_TENANT", "demo")
	return stub
}
