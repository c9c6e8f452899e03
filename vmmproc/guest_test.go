package vmmproc

import (
	"bytes"
	"context"
	"fmt"
	"github.com/warrenvm/warren/internal/kvmtest"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenvm/warren/devices/virtio/rng"
	"github.com/warrenvm/warren/vmm"
)

// console collects guest output and lets a test wait for a pattern.
type console struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	cond *sync.Cond
}

func newConsole() *console {
	c := &console{}
	c.cond = sync.NewCond(&c.mu)
	return c
}

func (c *console) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.buf.Write(p)
	c.mu.Unlock()
	c.cond.Broadcast()
	return len(p), nil
}

func (c *console) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

// guest is a Linux guest booted in-process for end-to-end tests, driven
// through its serial console (the init's debug shell, warren.shell=1).
type guest struct {
	t    *testing.T
	vm   *vmm.VM
	con  *console
	done chan error
	from int // console offset searched by the next wait
	rng  *rng.Device
	dev  vmDevices
	// snapLayer and snapName are the snapshot a restored guest came from
	// (for startAPI, so its incremental snapshots build on it), and opts
	// the options it was restored with (its devices, for startAPI).
	snapLayer, snapName string
	opts                vmOptions
	// stop stops the VM and closes its devices (once; the test's cleanup
	// calls it too).
	stop func()
}

// bootGuest boots the project kernel and initramfs with opts and waits for
// the init's ready line.
func bootGuest(t *testing.T, o vmOptions) *guest {
	t.Helper()
	g, err := startGuest(t, o)
	if err != nil {
		t.Fatal(err)
	}
	g.waitOr(readyLine, bootDeadline, bootStalled)
	return g
}

// bootStalled starts the failure of a Linux boot that did not reach its
// ready line in time. In the nested host an L2 guest now and then stops
// early in its boot (QEMU's guests there too, 2 of 56 fresh boots:
// bench/results/2026-12-03-l2-faults, and on memfd memory as often as
// Warren's: bench/results/2026-12-04-l2-under-load). The failure logs
// three samples of the stalled vCPUs (rip with its kernel symbol, cr2,
// cr3, the LAPIC timer and pending interrupts), and hostStateInGuest when
// a vCPU holds the emulated host's own state.
const bootStalled = "L2 guest boot stalled"

// hostStateInGuest starts the log line of a vCPU whose state no guest of
// its VM can have made (vmm.ErrPagingOutsideRAM: paging on, CR3 outside
// guest RAM): in the nested host, the emulated nested SVM's leak of L1's
// host state into an L2 vCPU (.ci/kvmhost/README.md, "The fork hang is
// L1's host state in an L2 vCPU"). .ci/test-kvm.sh excuses a stalled boot
// only with this line beside it (.ci/kvmhost/l2faults.sh); a stall without
// it is a test failure.
const hostStateInGuest = "L2 vCPU holds the emulated host's state"

// bootDeadline bounds a test's Linux boot to the ready line: about 80 s
// on a PVM host (directly), 3-5 s in the nested host, under a second on
// hardware KVM. It stays under CI's 300 s of silence, after which the
// nested host is taken for frozen, so that a hung boot fails its test
// (with the console) instead.
const bootDeadline = 4 * time.Minute

// startGuest builds and starts the guest without waiting for it. It may run
// on a thread in another network namespace (the tap is created there).
func startGuest(t *testing.T, o vmOptions) (*guest, error) {
	kvmtest.Require(t)
	var err error
	if o.kernel, err = os.ReadFile(artifact(t, "WARREN_KERNEL", "vmlinux")); err != nil {
		return nil, err
	}
	if o.initramfs, err = os.ReadFile(artifact(t, "WARREN_INITRAMFS", "initramfs.cpio")); err != nil {
		return nil, err
	}
	if o.memMiB == 0 {
		o.memMiB = 256
	}
	if o.cpus == 0 {
		o.cpus = 1
	}
	g := &guest{t: t, con: newConsole(), done: make(chan error, 1)}
	o.console = g.con
	o.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var closeAll func()
	if g.vm, g.dev, closeAll, err = buildVMWithDevices(o); err != nil {
		return nil, err
	}
	g.rng = g.dev.rng
	ctx, cancel := context.WithCancel(context.Background())
	go func() { g.done <- g.vm.Run(ctx) }()
	var once sync.Once
	g.stop = func() {
		once.Do(func() {
			cancel()
			err := <-g.done
			g.done <- err
			closeAll()
			if t.Failed() {
				// Why the VM stopped, when it did on its own (a triple
				// fault says so here).
				t.Logf("the VM's run ended with: %v", err)
				t.Logf("guest console:\n%s", tail([]byte(g.con.String())))
			}
		})
	}
	t.Cleanup(g.stop)
	return g, nil
}

// wait blocks until re matches console output after the previous match and
// returns the match.
func (g *guest) wait(re *regexp.Regexp, timeout time.Duration) string {
	g.t.Helper()
	return g.waitOr(re, timeout, "")
}

// waitOr is wait, failing with what (and the timeout) when it times out.
func (g *guest) waitOr(re *regexp.Regexp, timeout time.Duration, what string) string {
	g.t.Helper()
	deadline := time.Now().Add(timeout)
	stop := time.AfterFunc(timeout, g.con.cond.Broadcast)
	defer stop.Stop()
	g.con.mu.Lock()
	defer g.con.mu.Unlock()
	for {
		out := g.con.buf.Bytes()[g.from:]
		if loc := re.FindIndex(out); loc != nil {
			m := string(out[loc[0]:loc[1]])
			g.from += loc[1]
			return m
		}
		if time.Now().After(deadline) {
			if what == bootStalled {
				// Where the stalled guest is: three samples of its vCPUs
				// a second apart (a vCPU halted with a timer armed, or
				// spinning in one place, tell different stories).
				g.con.mu.Unlock()
				for i := 0; i < 3; i++ {
					g.t.Logf("stalled guest, sample %d:", i+1)
					dumpGuest(g.t, g)
					time.Sleep(time.Second)
				}
				g.con.mu.Lock()
			}
			if what != "" {
				g.t.Fatalf("%s: no %q within %s", what, re, timeout)
			}
			g.t.Fatalf("timed out after %s waiting for %q", timeout, re)
		}
		select {
		case err := <-g.done:
			g.done <- err
			g.t.Fatalf("guest stopped (%v) while waiting for %q", err, re)
		default:
		}
		g.con.cond.Wait()
	}
}

var cmdSeq int

// sh runs a shell command in the guest and returns its output, using a
// marker the shell computes (so the echoed input never matches it).
func (g *guest) sh(cmd string, timeout time.Duration) string {
	g.t.Helper()
	cmdSeq++
	n := cmdSeq
	g.vm.SerialInput([]byte(fmt.Sprintf("%s; echo END-$((%d+1))-$?\n", cmd, n*1000)))
	re := regexp.MustCompile(fmt.Sprintf(`(?s)^(.*?)END-%d-(\d+)`, n*1000+1))
	m := g.wait(re, timeout)
	sub := re.FindStringSubmatch(m)
	out := sub[1]
	// Drop whatever precedes the terminal's echo of the command line.
	if i := strings.LastIndex(out, fmt.Sprintf("END-$((%d+1))-$?", n*1000)); i >= 0 {
		out = out[i:]
		if j := strings.IndexByte(out, '\n'); j >= 0 {
			out = out[j+1:]
		}
	}
	if sub[2] != "0" {
		g.t.Fatalf("guest command %q failed (status %s): %s", cmd, sub[2], out)
	}
	return strings.ReplaceAll(out, "\r", "")
}

// stop waits for the guest to power off by itself and returns Run's error.
func (g *guest) stopped(timeout time.Duration) error {
	select {
	case err := <-g.done:
		g.done <- err
		return err
	case <-time.After(timeout):
		g.t.Fatal("guest did not power off")
		return nil
	}
}
