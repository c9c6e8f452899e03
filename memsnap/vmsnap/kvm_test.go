package vmsnap

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmm/hostprofile"
	"github.com/warrenvm/warren/vmm/kvm"
	"github.com/warrenvm/warren/vmm/testguest"
)

// The counter guest (vmm/testdata/guests/counter.S): it counts at
// counterAddr and in EBX, and reads port counterPort now and then.
const (
	counterAddr = testguest.CounterAddr
	counterPort = testguest.CounterPort
	extraGPA    = 0x800000 // where the test writes pages as a device would
)

func counterConfig(t *testing.T, con *testguest.SyncBuffer) vmm.Config {
	return vmm.Config{MemBytes: 32 << 20, CPUs: 1, Kernel: testguest.Build(t, "counter"), Console: con,
		Profile: hostprofile.Detect("/sys/module"), TrackDirty: true}
}

// runVM adds the counter port and runs vm in the background; the returned
// function stops it and waits.
func runVM(t *testing.T, vm *vmm.VM) func() {
	t.Helper()
	if err := vm.PIO.Add(counterPort, 4, testguest.OnePort{}); err != nil {
		t.Fatal(err)
	}
	return kvmtest.Start(t, vm, 5*time.Minute)
}

func counter(vm *vmm.VM) uint32 {
	var b [4]byte
	vm.Memory().ReadAt(b[:], counterAddr)
	return binary.LittleEndian.Uint32(b[:])
}

// snappedCounter is the counter guest running (counterConfig, runVM) with
// its Snapshotter, whose OnPaused keeps a copy of guest RAM in ram.
type snappedCounter struct {
	vm   *vmm.VM
	s    *Snapshotter
	fp   []byte
	con  *testguest.SyncBuffer
	stop func()
	ram  []byte // guest RAM as in the last snapshot's pause
}

// startSnappedCounter starts the counter guest and its Snapshotter (run
// options opts) and waits for it to count.
func startSnappedCounter(t *testing.T, opts string) *snappedCounter {
	t.Helper()
	c := &snappedCounter{con: new(testguest.SyncBuffer)}
	cfg := counterConfig(t, c.con)
	var err error
	if c.vm, err = vmm.New(cfg); err != nil {
		t.Fatal(err)
	}
	c.stop = runVM(t, c.vm)
	if c.fp, err = HostFingerprint("", cfg.Profile); err != nil {
		t.Fatal(err)
	}
	c.s = NewSnapshotter(c.vm, nil, json.RawMessage(opts), c.fp)
	c.s.OnPaused = func(vm *vmm.VM) { c.ram = bytes.Clone(vm.Memory().Flat()) }
	kvmtest.WaitFor(t, 2*time.Minute, "3 dots", func() bool { return strings.Count(c.con.String(), ".") >= 3 })
	return c
}

// TestSnapshotCounter runs the counter guest, takes a full snapshot and
// three incremental ones (writing 0, 64 and 256 extra pages through the
// VMM's accessors before them, as a device would), keeping a copy of guest
// RAM taken inside each pause, checks that each incremental layer's size
// follows the pages written, and restores every snapshot, eagerly and
// lazily, in a new process (TestSnapshotRestoreChild): RAM must equal the
// copy and the registers the saved ones, and the guest must count on.
func TestSnapshotCounter(t *testing.T) {
	kvmtest.Require(t)
	c := startSnappedCounter(t, `{"test":"counter"}`)
	vm, s, stop := c.vm, c.s, c.stop
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(1, 2))
	extra := []int{0, 0, 64, 256}
	var reports []*Report
	for i, n := range extra {
		if n > 0 {
			if err := vm.Pause(context.Background()); err != nil {
				t.Fatal(err)
			}
			page := make([]byte, pageSize)
			for p := range n {
				for j := range page {
					page[j] = byte(r.Uint32())
				}
				if _, err := vm.Memory().WriteAt(page, int64(extraGPA+p*pageSize)); err != nil {
					t.Fatal(err)
				}
			}
			if err := vm.Resume(); err != nil {
				t.Fatal(err)
			}
		}
		before := counter(vm)
		kvmtest.WaitFor(t, 2*time.Minute, "the guest to count", func() bool { return counter(vm) > before+1000 })
		kind := Incremental
		if i == 0 {
			kind = Full
		}
		rep, err := s.Take(context.Background(), filepath.Join(dir, fmt.Sprintf("s%d", i)), kind)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%v", rep)
		reports = append(reports, rep)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("s%d.ram", i)), c.ram, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	stop()
	if strings.Contains(c.con.String(), "X") {
		t.Fatalf("the guest failed: %q", c.con.String())
	}
	// The counter guest itself dirties one page (its counter); the extra
	// pages come on top, and each random page costs about its size.
	for i := 1; i < len(extra); i++ {
		p := reports[i].Pages
		if p < uint64(extra[i])+1 || p > uint64(extra[i])+4 {
			t.Errorf("incremental s%d holds %d pages; %d written by the test + the counter's page expected", i, p, extra[i])
		}
	}
	if b2, b3 := reports[2].LayerBytes, reports[3].LayerBytes; b3 < 3*b2 || b3 > 5*b2 || b2 < 64*pageSize {
		t.Errorf("layer sizes %d (64 pages) and %d (256 pages) are not proportional", b2, b3)
	}

	kvmtest.RunChild(t, "TestSnapshotRestoreChild", "WARREN_VMSNAP_CHILD="+dir)
}

// TestSnapshotRestoreChild is the restoring half of TestSnapshotCounter,
// in a new process; it skips unless run by it.
func TestSnapshotRestoreChild(t *testing.T) {
	dir := kvmtest.Child(t, "WARREN_VMSNAP_CHILD", "TestSnapshotCounter")
	for i := range 4 {
		for _, lazy := range []bool{false, true} {
			name := fmt.Sprintf("s%d", i)
			t.Run(fmt.Sprintf("%s/lazy=%v", name, lazy), func(t *testing.T) {
				var con testguest.SyncBuffer
				cfg := counterConfig(t, &con)
				cfg.Kernel, cfg.StartPaused = nil, true
				start := time.Now()
				snap, err := Load(filepath.Join(dir, name), HostFingerprintSource("", cfg.Profile))
				if err != nil {
					t.Fatal(err)
				}
				defer snap.Close()
				loaded := time.Since(start)
				vm, err := snap.Restore(cfg, lazy)
				if err != nil {
					t.Fatal(err)
				}
				if err := snap.RestoreDevices(nil); err != nil {
					t.Fatal(err)
				}
				runVM(t, vm)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if err := vm.Pause(ctx); err != nil { // the vCPUs have loaded their state
					t.Fatal(err)
				}
				t.Logf("%d layers; load+verify %v, restore to parked vCPUs %v", len(snap.Chain.Layers()), loaded, time.Since(start))
				want, err := os.ReadFile(filepath.Join(dir, name+".ram"))
				if err != nil {
					t.Fatal(err)
				}
				if got := vm.Memory().Flat(); !bytes.Equal(got, want) {
					n := 0
					for p := 0; p < len(got); p += pageSize {
						if !bytes.Equal(got[p:p+pageSize], want[p:p+pageSize]) {
							if n < 5 {
								t.Errorf("page %#x differs", p)
							}
							n++
						}
					}
					t.Fatalf("guest RAM differs from the copy taken in the pause: %d pages", n)
				}
				back, err := vm.SaveState()
				if err != nil {
					t.Fatal(err)
				}
				w, g := snap.State.VCPUs[0], back.VCPUs[0]
				if g.Regs != w.Regs || g.Sregs != w.Sregs || g.FPU != w.FPU || !bytes.Equal(g.LAPIC, w.LAPIC) || g.Events != w.Events {
					t.Fatalf("registers differ after restore:\n got %+v\nwant %+v", g.Regs, w.Regs)
				}
				// The guest increments memory first, then EBX: a pause
				// may land between the two on a real CPU (TCG runs the
				// whole block, so the nested host never shows it), and
				// the guest then finishes the pair after the restore.
				saved := counter(vm)
				if ebx := uint32(w.Regs.RBX); saved != ebx && saved != ebx+1 {
					t.Fatalf("counter %d, EBX %d", saved, w.Regs.RBX)
				}
				if err := vm.Resume(); err != nil {
					t.Fatal(err)
				}
				kvmtest.WaitFor(t, 2*time.Minute, "progress after restore", func() bool { return counter(vm) > saved+1<<19 })
				kvmtest.WaitFor(t, 2*time.Minute, "a dot after restore", func() bool { return strings.Contains(con.String(), ".") })
				if strings.Contains(con.String(), "X") {
					t.Fatalf("after restore the guest saw memory and EBX disagree: %q", con.String())
				}
			})
		}
	}
}

// TestFingerprintStable reads KVM's supported CPUID on every host CPU: the
// fingerprint must not depend on where the ioctl runs (entries that differ
// after perCPU are named).
func TestFingerprintStable(t *testing.T) {
	kvmtest.Require(t)
	type result struct {
		ids []kvm.CPUIDEntry
		err error
	}
	var first []kvm.CPUIDEntry
	for cpu := range runtime.NumCPU() {
		ch := make(chan result)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			var set unix.CPUSet
			set.Set(cpu)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				ch <- result{err: err}
				return
			}
			sys, err := kvm.Open(kvm.DevicePath)
			if err != nil {
				ch <- result{err: err}
				return
			}
			defer sys.Close()
			ids, err := sys.SupportedCPUID()
			ch <- result{ids, err}
		}()
		r := <-ch
		if r.err != nil {
			t.Fatal(r.err)
		}
		if first == nil {
			first = r.ids
			continue
		}
		if CPUIDHash(r.ids) == CPUIDHash(first) {
			continue
		}
		for i := range min(len(first), len(r.ids)) {
			a, b := first[i], r.ids[i]
			perCPU(&a)
			perCPU(&b)
			if a != b {
				t.Errorf("CPU %d: leaf %#x.%d is %+v, on CPU 0 %+v", cpu, a.Function, a.Index, r.ids[i], first[i])
			}
		}
		if len(first) != len(r.ids) {
			t.Errorf("CPU %d: %d entries, CPU 0 %d", cpu, len(r.ids), len(first))
		}
	}
	t.Logf("%d CPUs agree on %s", runtime.NumCPU(), CPUIDHash(first))
}
