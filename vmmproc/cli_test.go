package vmmproc

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmmctl"
)

// cliMain is the warren command's cli.Main, set by cliMainHook
// (climain_test.go, an external test package, since cmd/warren/cli
// imports this package): the end-to-end tests drive the VMM as a user
// does, through the command, and the test binary runs as `warren` for
// the processes a VMM starts (fork children).
var cliMain func(args []string, stdin io.Reader, stdout, stderr io.Writer) int

// cli runs the warren command as a user would (in-process) and returns its
// exit code and output.
func cli(t *testing.T, stdin io.Reader, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = cliMain(args, stdin, &o, &e)
	return code, o.String(), e.String()
}

// warren exec's exit statuses for a program the agent killed at
// --timeout and for no such program (cmd/warren/cli's agent.go).
const (
	exitTimedOut = 124
	exitNotFound = 127
)

// artifact returns build/NAME at the repository root (or $ENV), failing the
// test when it is missing on a host that has KVM.
func artifact(t *testing.T, env, name string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		return p
	}
	_, file, _, _ := runtime.Caller(0)
	p := filepath.Join(filepath.Dir(file), "..", "build", name)
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
			// A process of its own with a deadline: a boot that hangs
			// fails here, with the console, instead of going silent until
			// the package's timeout (CI took a hang of pvh-2cpu for the
			// nested host frozen).
			// Its guest is described first (through the API socket).
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			api := filepath.Join(t.TempDir(), "api.sock")
			var described atomic.Value
			deadline := time.AfterFunc(bootDeadline, func() {
				described.Store(describeStalled(api, t.TempDir()))
				cancel()
			})
			defer deadline.Stop()
			var stderr bytes.Buffer
			cmd := cliProcess(ctx, "run", "--kernel", c.kernel, "--initramfs", initramfs, "--mem", "256",
				"--cpus", c.cpus, "--api", api, "--cmdline", "warren.poweroff=1 warren.hostname=e2e", "--console", console)
			cmd.Stderr = &stderr
			err := cmd.Run()
			log, _ := os.ReadFile(console)
			if ctx.Err() != nil {
				t.Logf("the stalled guest: %v\nits VMM's log:\n%s", described.Load(), tail(stderr.Bytes()))
				t.Fatalf("%s: warren run did not end within %v (killed); console:\n%s", bootStalled, bootDeadline, tail(log))
			}
			if err != nil {
				t.Fatalf("warren run: %v: %s\nconsole:\n%s", err, stderr.String(), tail(log))
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

// describeStalled describes the guest of the VMM whose API socket is api
// (vmmctl's DescribeGuest, its snapshot under dir), starting with
// hostStateInGuest when the VMM refused to save a vCPU for the emulated
// host's signature (vmm.ErrPagingOutsideRAM; the error crosses the API as
// text).
func describeStalled(api, dir string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := (vmmctl.Client{Socket: api}).DescribeGuest(ctx, dir)
	if err != nil && strings.Contains(err.Error(), vmm.ErrPagingOutsideRAM.Error()) {
		return fmt.Sprintf("%s: %v", hostStateInGuest, err)
	}
	if err != nil {
		return "no description: " + err.Error()
	}
	return d
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func tail(b []byte) string {
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
