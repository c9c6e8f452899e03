package vmmproc

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/vmm/testguest"
)

// cliProcessEnv makes this test binary run as `warren ARGS...` (TestMain).
const cliProcessEnv = "WARREN_TEST_CLI_PROCESS"

// cliProcess is `warren args...` as a process of its own (this binary).
func cliProcess(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), cliProcessEnv+"=1")
	return cmd
}

// TestHostileGuestDevices runs the hostile test guest (vmm/testdata/guests/
// hostile.S: tens of thousands of random writes to every virtio-mmio
// window, queues brought up on random memory and descriptor chains that
// loop, point outside RAM, nest indirect tables, and notified) with a
// disk, vsock and rng attached, beside a neighbour VMM running the counter
// guest. The hostile VMM must survive to the guest's own power-off, its
// devices must go to NEEDS_RESET on what they refuse, and the neighbour
// must count on, its memory consistent, throughout.
func TestHostileGuestDevices(t *testing.T) {
	kvmtest.Require(t)
	dir := t.TempDir()
	hostile, counter := filepath.Join(dir, "hostile.elf"), filepath.Join(dir, "counter.elf")
	os.WriteFile(hostile, testguest.Build(t, "hostile"), 0o644)
	os.WriteFile(counter, testguest.Build(t, "counter"), 0o644)
	disk := filepath.Join(dir, "disk.img")
	if err := os.WriteFile(disk, make([]byte, 16<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	var nbOut, nbErr testguest.SyncBuffer
	nb := cliProcess(ctx, "run", "--kernel", counter, "--mem", "32")
	nb.Stdout, nb.Stderr = &nbOut, &nbErr
	if err := nb.Start(); err != nil {
		t.Fatal(err)
	}
	nbDone := make(chan error, 1)
	go func() { nbDone <- nb.Wait() }()
	defer func() {
		nb.Process.Kill()
		<-nbDone
	}()
	dots := func() int { return strings.Count(nbOut.String(), ".") }
	waitDots := func(n int, what string) {
		t.Helper()
		for deadline := time.Now().Add(3 * time.Minute); dots() < n; time.Sleep(50 * time.Millisecond) {
			select {
			case err := <-nbDone:
				t.Fatalf("the neighbour VMM exited (%v) %s: stdout %q, stderr %q", err, what, nbOut.String(), nbErr.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("the neighbour printed %d dots, want %d %s", dots(), n, what)
			}
		}
	}
	waitDots(2, "before the hostile guest starts")

	var out, errb testguest.SyncBuffer
	h := cliProcess(ctx, "run", "-v", "--kernel", hostile, "--mem", "64", "--disk", disk,
		"--vsock", filepath.Join(dir, "v.sock"))
	h.Stdout, h.Stderr = &out, &errb
	start := time.Now()
	err := h.Run()
	logTail := func() string { l := errb.String(); return l[max(0, len(l)-3000):] }
	if err != nil || !strings.Contains(out.String(), "survived") {
		t.Fatalf("the hostile guest's VMM: %v after %v; stdout %q; log:\n%s", err, time.Since(start), out.String(), logTail())
	}
	t.Logf("the hostile guest ran %v", time.Since(start).Round(time.Millisecond))
	log := errb.String()
	if !strings.Contains(log, "virtio device needs reset") {
		t.Errorf("no device went to NEEDS_RESET; log:\n%s", logTail())
	}
	if m := regexp.MustCompile(`(?m)^(panic: |fatal error: |SIGSEGV).*`).FindString(log); m != "" {
		t.Errorf("the hostile guest's VMM crashed inside (%q):\n%s", m, logTail())
	}
	waitDots(dots()+2, "after the hostile guest")
	if strings.Contains(nbOut.String(), "X") {
		t.Fatalf("the neighbour's memory or registers went wrong: %q", nbOut.String())
	}
}
