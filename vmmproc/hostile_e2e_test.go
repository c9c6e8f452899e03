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

// neighbour is a VMM running the counter guest (a dot a second or so,
// an X if its memory or registers go wrong), beside a hostile one.
type neighbour struct {
	t    *testing.T
	out  testguest.SyncBuffer
	err  testguest.SyncBuffer
	done chan error
}

// startNeighbour starts the counter guest's VMM and waits for its first
// dots; it is killed when the test ends.
func startNeighbour(t *testing.T, ctx context.Context, dir string) *neighbour {
	t.Helper()
	counter := filepath.Join(dir, "counter.elf")
	os.WriteFile(counter, testguest.Build(t, "counter"), 0o644)
	n := &neighbour{t: t, done: make(chan error, 1)}
	cmd := cliProcess(ctx, "run", "--kernel", counter, "--mem", "32")
	cmd.Stdout, cmd.Stderr = &n.out, &n.err
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { n.done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-n.done
	})
	n.waitDots(2, "before the hostile guest starts")
	return n
}

func (n *neighbour) dots() int { return strings.Count(n.out.String(), ".") }

// waitDots waits until the neighbour has printed at least want dots.
func (n *neighbour) waitDots(want int, what string) {
	n.t.Helper()
	for deadline := time.Now().Add(3 * time.Minute); n.dots() < want; time.Sleep(50 * time.Millisecond) {
		select {
		case err := <-n.done:
			n.t.Fatalf("the neighbour VMM exited (%v) %s: stdout %q, stderr %q", err, what, n.out.String(), n.err.String())
		default:
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("the neighbour printed %d dots, want %d %s", n.dots(), want, what)
		}
	}
}

// countsOn checks that the neighbour goes on counting, its memory and
// registers consistent, after the hostile guest.
func (n *neighbour) countsOn() {
	n.t.Helper()
	n.waitDots(n.dots()+2, "after the hostile guest")
	if strings.Contains(n.out.String(), "X") {
		n.t.Fatalf("the neighbour's memory or registers went wrong: %q", n.out.String())
	}
}

// checkHostileLog fails the test unless the hostile guest's VMM log shows
// a device gone to NEEDS_RESET and no crash inside the VMM.
func checkHostileLog(t *testing.T, log string) {
	t.Helper()
	logTail := log[max(0, len(log)-3000):]
	if !strings.Contains(log, "virtio device needs reset") {
		t.Errorf("no device went to NEEDS_RESET; log:\n%s", logTail)
	}
	if m := regexp.MustCompile(`(?m)^(panic: |fatal error: |SIGSEGV).*`).FindString(log); m != "" {
		t.Errorf("the hostile guest's VMM crashed inside (%q):\n%s", m, logTail)
	}
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
	hostile := filepath.Join(dir, "hostile.elf")
	os.WriteFile(hostile, testguest.Build(t, "hostile"), 0o644)
	disk := filepath.Join(dir, "disk.img")
	if err := os.WriteFile(disk, make([]byte, 16<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	nb := startNeighbour(t, ctx, dir)

	var out, errb testguest.SyncBuffer
	h := cliProcess(ctx, "run", "-v", "--kernel", hostile, "--mem", "64", "--disk", disk,
		"--vsock", filepath.Join(dir, "v.sock"))
	h.Stdout, h.Stderr = &out, &errb
	start := time.Now()
	err := h.Run()
	if err != nil || !strings.Contains(out.String(), "survived") {
		l := errb.String()
		t.Fatalf("the hostile guest's VMM: %v after %v; stdout %q; log:\n%s", err, time.Since(start), out.String(), l[max(0, len(l)-3000):])
	}
	t.Logf("the hostile guest ran %v", time.Since(start).Round(time.Millisecond))
	checkHostileLog(t, errb.String())
	nb.countsOn()
}

// TestHostileGuestProgram runs the hostile driver of the initramfs
// (guestinit/cmd/hostiledev) as root in a Linux guest, through the agent's
// exec, for a minute: it unbinds the guest's virtio drivers, maps every
// virtio-mmio window (rng, vsock and the ext4 data disk of the Linux
// template) through /dev/mem and writes random registers and crafted
// queues. The guest's VMM runs jailed (--jail strict) in a process of its
// own beside the counter guest's; it must survive the minute and stay up
// after it, its devices must go to NEEDS_RESET, and the neighbour must
// count on. WARREN_HOSTILE_RUN overrides the minute: the nested host runs
// it for 5 s (make test-kvm), since there a minute of it crashed L1's
// own kernel in 4 of 6 runs (the nested host's known "stack guard page"
// crash, in L1's page-fault entry: .ci/kvmhost/README.md), which a
// Warren VMM, an L1 user process, cannot cause.
func TestHostileGuestProgram(t *testing.T) {
	path := linuxTemplate(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	nb := startNeighbour(t, ctx, dir)

	sock, console := filepath.Join(dir, "v.sock"), filepath.Join(dir, "console")
	var out, errb testguest.SyncBuffer
	vmm := cliProcess(ctx, "restore", "-v", "--jail", "strict", "--vsock", sock, "--console", console, path)
	vmm.Stdout, vmm.Stderr = &out, &errb
	if err := vmm.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- vmm.Wait() }()
	defer func() {
		vmm.Process.Kill()
		<-done
		if t.Failed() {
			con, _ := os.ReadFile(console)
			l := errb.String()
			t.Logf("VMM log:\n%s\nconsole:\n%s", l[max(0, len(l)-3000):], tail(con))
		}
	}()
	mustRun(t, "health", "--wait", "3m", sock)
	runFor := time.Minute
	if v, err := time.ParseDuration(os.Getenv("WARREN_HOSTILE_RUN")); err == nil && v > 0 {
		runFor = v
	}
	started := mustRun(t, "exec", sock, "--", "hostiledev", "-detach", "-d", runFor.String())
	t.Logf("%s", strings.TrimSpace(started))
	start := time.Now()
	// The program's last line, on the guest's console. In the nested host
	// its minute of guest time may stretch; the VMM exiting ends the wait.
	re := regexp.MustCompile(`hostiledev: survived[^\n]*`)
	var line string
	next := start.Add(30 * time.Second) // a word now and then: CI takes a silent nested host for frozen
	for deadline := start.Add(runFor + 4*time.Minute); line == ""; time.Sleep(time.Second) {
		if time.Now().After(next) {
			t.Logf("waiting for the program's last line: %v", time.Since(start).Round(time.Second))
			next = next.Add(30 * time.Second)
		}
		select {
		case err := <-done:
			done <- err
			t.Fatalf("the hostile guest's VMM exited (%v) %v after the program started", err, time.Since(start).Round(time.Second))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no \"hostiledev: survived\" on the guest's console within %v", time.Since(start).Round(time.Second))
		}
		con, _ := os.ReadFile(console)
		line = re.FindString(string(con))
	}
	t.Logf("after %v: %s", time.Since(start).Round(time.Second), line)
	// Still up: not exited since, and its log as it should be.
	time.Sleep(time.Second)
	select {
	case err := <-done:
		done <- err
		t.Fatalf("the hostile guest's VMM exited (%v) after the program", err)
	default:
	}
	checkHostileLog(t, errb.String())
	// What the devices refused, once each.
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile(`needs reset" device=(\S+) err="([^"]*)"`).FindAllStringSubmatch(errb.String(), -1) {
		if r := m[1] + ": " + m[2]; !seen[r] && len(seen) < 20 {
			seen[r] = true
			t.Logf("refused: %s", r)
		}
	}
	nb.countsOn()
}
