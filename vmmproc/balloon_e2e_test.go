package vmmproc

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/cow"
	"github.com/warrenvm/warren/devices/virtio"
	"github.com/warrenvm/warren/devices/virtio/balloon"
	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmm/hostprofile"
	"github.com/warrenvm/warren/vmmctl"
)

// bootBalloonGuest boots the project kernel and initramfs with memMiB of
// RAM and a balloon (balloonSpec, as `warren run --balloon` attaches it)
// as its only virtio device, and serves the control API's balloon routes
// on a socket; it returns the guest, the device and the API's client.
func bootBalloonGuest(t *testing.T, memMiB int) (*guest, *balloon.Device, vmmctl.Client) {
	t.Helper()
	kvmtest.Require(t)
	kernel, err := os.ReadFile(artifact(t, "WARREN_KERNEL", "vmlinux"))
	if err != nil {
		t.Fatal(err)
	}
	initramfs, err := os.ReadFile(artifact(t, "WARREN_INITRAMFS", "initramfs.cpio"))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dev := balloon.New()
	mmios := map[string]*virtio.MMIO{}
	g := &guest{t: t, con: newConsole(), done: make(chan error, 1)}
	vm, err := vmm.New(vmm.Config{MemBytes: uint64(memMiB) << 20, CPUs: 1, Kernel: kernel, Initramfs: initramfs,
		Cmdline: "warren.shell=1 warren.hostname=balloon", Console: g.con, Profile: hostprofile.Detect("/sys/module"),
		Log: log, Virtio: []vmm.VirtioSpec{balloonSpec(dev, log, mmios)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Reset() })
	tr := mmios[balloonName]
	vm.AddPauseHook(pauseHook(balloonName, tr))
	g.vm = vm
	ctx, cancel := context.WithCancel(context.Background())
	go func() { g.done <- vm.Run(ctx) }()
	var once sync.Once
	g.stop = func() {
		once.Do(func() {
			cancel()
			err := <-g.done
			g.done <- err
			tr.Shutdown()
			vm.Close()
			if t.Failed() {
				t.Logf("the VM's run ended with: %v", err)
				t.Logf("guest console:\n%s", tail([]byte(g.con.String())))
			}
		})
	}
	t.Cleanup(g.stop)
	sock := filepath.Join(t.TempDir(), "api.sock")
	a := &apiServer{vm: vm, log: log, opts: runOptions{MemMiB: memMiB},
		forker: &cow.Forker{VM: vm, Devices: []vmsnap.Device{{Name: balloonName, Transport: tr}}}}
	stopAPI, err := serveAPI(sock, a)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopAPI)
	g.waitOr(readyLine, bootDeadline, bootStalled)
	return g, dev, vmmctl.Client{Socket: sock}
}

// memfdBytes is the host memory behind the guest's RAM: the blocks its
// memfd holds.
func memfdBytes(t *testing.T, g *guest) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(g.vm.Memory().FD(), &st); err != nil {
		t.Fatal(err)
	}
	return uint64(st.Blocks) * 512
}

// TestBalloonEndToEnd boots Linux with the balloon and checks that memory
// the guest frees goes back to the host (free page reporting: the memfd
// behind guest RAM shrinks by about what the guest freed), that the guest
// sends statistics when asked, and that a target set through the control
// API is followed by the guest's driver (actual) and its pages discarded,
// then given back.
func TestBalloonEndToEnd(t *testing.T) {
	const memMiB = 512
	g, dev, c := bootBalloonGuest(t, memMiB)
	ctx := context.Background()
	rep, err := c.Balloon(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Active || !rep.FreePageReporting || !rep.StatsQueue {
		t.Fatalf("the driver did not take the device with its features: %+v", rep)
	}

	// Statistics, every second.
	one := uint64(1)
	if _, err := c.SetBalloon(ctx, vmmctl.BalloonRequest{StatsIntervalS: &one}); err != nil {
		t.Fatal(err)
	}
	kvmtest.WaitFor(t, 2*time.Minute, "two statistics updates", func() bool { return dev.Metrics.StatsUpdates.Load() >= 2 })
	if rep, err = c.Balloon(ctx); err != nil {
		t.Fatal(err)
	}
	var total uint64
	for _, s := range rep.Stats {
		if s.Name == "total-memory" {
			total = s.Value
		}
	}
	if total == 0 || total > memMiB<<20 {
		t.Errorf("total-memory statistic %d, guest has %d MiB: %+v", total, memMiB, rep.Stats)
	}

	// Free page reporting: memtouch fills 32 MiB of anonymous memory with
	// random bytes and exits, freeing it. (A first-touch fault costs
	// 3-10 ms of emulated guest kernel time on a PVM host, so 64 MiB
	// would take minutes.) The boot's own reports (of the memory free at
	// start) are over once the counter rests. A sampler finds the memfd's
	// peak while memtouch holds its memory.
	const touchMiB = 32
	settle := func(what string) uint64 {
		last, since := dev.Metrics.ReportDiscardedBytes.Load(), time.Now()
		kvmtest.WaitFor(t, 3*time.Minute, what, func() bool {
			if n := dev.Metrics.ReportDiscardedBytes.Load(); n != last {
				last, since = n, time.Now()
			}
			return time.Since(since) > 10*time.Second
		})
		return last
	}
	before := settle("the boot's free page reports to end")
	base := memfdBytes(t, g)
	var peak atomic.Uint64
	stopSampler := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			var st unix.Stat_t
			if unix.Fstat(g.vm.Memory().FD(), &st) == nil && uint64(st.Blocks)*512 > peak.Load() {
				peak.Store(uint64(st.Blocks) * 512)
			}
			select {
			case <-stopSampler:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	start := time.Now()
	g.sh(fmt.Sprintf("memtouch %d </dev/null", touchMiB), 5*time.Minute)
	t.Logf("memtouch %d took %v", touchMiB, time.Since(start).Round(time.Millisecond))
	freed := time.Now()
	kvmtest.WaitFor(t, 3*time.Minute, "half of it reported free and discarded", func() bool {
		return dev.Metrics.ReportDiscardedBytes.Load()-before >= touchMiB<<20/2
	})
	reported := time.Since(freed)
	settle("the reports to end")
	close(stopSampler)
	<-sampled
	after := memfdBytes(t, g)
	t.Logf("reported and discarded %d MiB (half within %v); memfd %d MiB before, %d at its peak, %d after",
		(dev.Metrics.ReportDiscardedBytes.Load()-before)>>20, reported.Round(time.Millisecond), base>>20, peak.Load()>>20, after>>20)
	if p := peak.Load(); p < base+touchMiB<<20/2 || p < after+touchMiB<<20/2 {
		t.Errorf("the memfd went from %d MiB to a peak of %d and back to %d: not half of the %d MiB given back", base>>20, p>>20, after>>20, touchMiB)
	}

	// A target: the driver inflates to it, and its pages are discarded.
	const target = 32
	if rep, err = c.SetBalloonTarget(ctx, target); err != nil || rep.TargetMiB != target || rep.TargetPages != target*256 {
		t.Fatalf("set target: %+v, %v", rep, err)
	}
	kvmtest.WaitFor(t, 3*time.Minute, "actual to reach the target", func() bool {
		r, err := c.Balloon(ctx)
		return err == nil && r.ActualMiB == target
	})
	if n := dev.Metrics.InflateDiscardedPages.Load(); n < target*256 {
		t.Errorf("%d pages discarded by inflation, want %d", n, target*256)
	}
	if _, err := c.SetBalloonTarget(ctx, 0); err != nil {
		t.Fatal(err)
	}
	kvmtest.WaitFor(t, 3*time.Minute, "actual back to 0", func() bool {
		r, err := c.Balloon(ctx)
		return err == nil && r.ActualPages == 0
	})
	if n := dev.Metrics.DeflatedPages.Load(); n != target*256 {
		t.Errorf("%d pages deflated, want %d", n, target*256)
	}

	// The API refuses a target past the guest's memory.
	if _, err := c.SetBalloonTarget(ctx, memMiB+1); err == nil {
		t.Error("a target past the guest's memory was accepted")
	}
	if rep, err = c.Balloon(ctx); err != nil || rep.Counters.Errors != 0 {
		t.Errorf("final state %+v, %v", rep, err)
	}
	t.Logf("counters: %+v", rep.Counters)
}
