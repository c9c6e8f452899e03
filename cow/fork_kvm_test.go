package cow

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmm/guestmem"
	"github.com/warrenvm/warren/vmm/hostprofile"
	"github.com/warrenvm/warren/vmm/testguest"
)

const (
	counterAddr = testguest.CounterAddr
	counterPort = testguest.CounterPort
	pageSize    = guestmem.PageSize
)

func counterConfig(t *testing.T, mem uint64, con *testguest.SyncBuffer) vmm.Config {
	return vmm.Config{MemBytes: mem, CPUs: 1, Kernel: testguest.Build(t, "counter"), Console: con,
		Profile: hostprofile.Detect("/sys/module"), TrackDirty: true}
}

// runVM adds the counter port and runs vm in the background until the
// test ends.
func runVM(t *testing.T, vm *vmm.VM) {
	t.Helper()
	if err := vm.PIO.Add(counterPort, 4, testguest.OnePort{}); err != nil {
		t.Fatal(err)
	}
	kvmtest.Start(t, vm, 10*time.Minute)
}

// runChild restores a fork child of pt in a new VM (cfg, with a console
// of its own) and runs it as runVM does.
func runChild(t *testing.T, cfg vmm.Config, pt *Point) *vmm.VM {
	t.Helper()
	mem, err := guestmem.NewFromBase(pt.Memory)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Console = &testguest.SyncBuffer{}
	vm, err := vmm.RestoreMemory(cfg, pt.State, mem)
	if err != nil {
		t.Fatal(err)
	}
	runVM(t, vm)
	return vm
}

func counter(vm *vmm.VM) uint32 {
	var b [4]byte
	vm.Memory().ReadAt(b[:], counterAddr)
	return binary.LittleEndian.Uint32(b[:])
}

// meminfo returns the /proc/meminfo fields in bytes.
func meminfo(t *testing.T) map[string]uint64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 {
			v, _ := strconv.ParseUint(fields[1], 10, 64)
			m[strings.TrimSuffix(fields[0], ":")] = v << 10
		}
	}
	return m
}

// used is the memory the guests can hold: shared memory (memfds) and
// anonymous pages (private copies).
func used(m map[string]uint64) uint64 { return m["Shmem"] + m["AnonPages"] }

// TestForkSharesMemory forks a running 1 GiB counter guest whose RAM is
// all in use 16 times, runs every child, and has each write its own 256
// pages: the parent keeps counting after its pause, every child counts on
// from the fork, sees the fork-time memory and only its own writes, and
// the host's memory grows by about the pages written, not by 16 GiB.
func TestForkSharesMemory(t *testing.T) {
	kvmtest.Require(t)
	const (
		memBytes = 1 << 30
		children = 16
		written  = 256 // pages each child writes
		fillFrom = 16 << 20
	)
	var con testguest.SyncBuffer
	cfg := counterConfig(t, memBytes, &con)
	parent, err := vmm.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runVM(t, parent)
	kvmtest.WaitFor(t, 2*time.Minute, "the parent to count", func() bool { return counter(parent) > 100 })

	// The guest's RAM in use: every page from fillFrom on holds its own
	// page number (written by the host, as a guest that filled its page
	// cache would have; the counter guest never looks there).
	if err := parent.Pause(context.Background()); err != nil {
		t.Fatal(err)
	}
	flat := parent.Memory().Flat()
	for off := uint64(fillFrom); off < memBytes; off += pageSize {
		binary.LittleEndian.PutUint64(flat[off:], off/pageSize)
	}
	if err := parent.Resume(); err != nil {
		t.Fatal(err)
	}
	before := meminfo(t)

	f := &Forker{VM: parent}
	start := time.Now()
	pt, err := f.Fork(context.Background(), children, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pt.Close()
	t.Logf("fork of a %d MiB guest: parent paused %v, Fork took %v, memory in %d layers", memBytes>>20, pt.Pause, time.Since(start), len(pt.Memory.Layers))
	atFork := binary.LittleEndian.Uint32(pageAt(t, pt, counterAddr/pageSize))
	c0 := counter(parent)
	kvmtest.WaitFor(t, 2*time.Minute, "the parent to count on after the fork", func() bool { return counter(parent) > c0+1000 })

	kids := make([]*vmm.VM, children)
	for k := range children {
		kids[k] = runChild(t, cfg, pt)
	}
	for k, vm := range kids {
		kvmtest.WaitFor(t, 2*time.Minute, fmt.Sprintf("child %d to count", k), func() bool { return counter(vm) > atFork+1000 })
		// The child's own writes, as a device of its would make them.
		if err := vm.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		for p := range uint64(written) {
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], uint64(k)<<32|p)
			if _, err := vm.Memory().WriteAt(b[:], int64(fillFrom+p*pageSize)); err != nil {
				t.Fatal(err)
			}
		}
		if err := vm.Resume(); err != nil {
			t.Fatal(err)
		}
	}
	after := meminfo(t)

	// Every child sees its own writes and the fork-time content elsewhere.
	for k, vm := range kids {
		for _, p := range []uint64{0, written - 1} {
			var b [8]byte
			vm.Memory().ReadAt(b[:], int64(fillFrom+p*pageSize))
			if got := binary.LittleEndian.Uint64(b[:]); got != uint64(k)<<32|p {
				t.Fatalf("child %d page %d: %#x", k, p, got)
			}
		}
		for _, off := range []uint64{fillFrom + written*pageSize, memBytes / 2, memBytes - pageSize} {
			var b [8]byte
			vm.Memory().ReadAt(b[:], int64(off))
			if got := binary.LittleEndian.Uint64(b[:]); got != off/pageSize {
				t.Fatalf("child %d at %#x: %d, want the fork-time %d", k, off, got, off/pageSize)
			}
		}
	}
	var b [8]byte
	parent.Memory().ReadAt(b[:], fillFrom)
	if got := binary.LittleEndian.Uint64(b[:]); got != fillFrom/pageSize {
		t.Fatalf("the parent sees %#x after its children wrote, want its own %d", got, fillFrom/pageSize)
	}

	growth := int64(used(after)) - int64(used(before))
	touched := int64(children * written * pageSize)
	t.Logf("host memory (Shmem+AnonPages) grew by %.1f MiB for %d children of a %d MiB guest that wrote %.1f MiB in all (%d MiB if nothing were shared)",
		float64(growth)/(1<<20), children, memBytes>>20, float64(touched)/(1<<20), children*memBytes>>20)
	// The children wrote 16 MiB; each also dirties its counter page, its
	// stack and what KVM writes (kvmclock, steal time), and the parent
	// goes on too. 64 MiB of slack is far below the 1 GiB even one
	// unshared copy would cost.
	if growth > touched+64<<20 {
		t.Errorf("host memory grew by %d MiB: the children do not share the parent's memory", growth>>20)
	}
	if strings.Contains(con.String(), "X") {
		t.Fatalf("the guest failed: %q", con.String())
	}
}

// pageAt reads page p of the fork point's memory through a fresh mapping.
func pageAt(t *testing.T, pt *Point, p uint64) []byte {
	t.Helper()
	m, err := guestmem.NewFromBase(pt.Memory)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	return bytes.Clone(m.Flat()[p*pageSize : (p+1)*pageSize])
}

// TestForkTracksWrites checks that a later fork copies every page written
// since the previous one, found from KVM's dirty log and the VMM's own
// write record rather than a scan of memory, also when a snapshot (which
// reads the same records) and a rollback (which rewrites memory in place,
// seen by no dirty log) come between forks: each child sees exactly the
// parent's memory at its fork.
func TestForkTracksWrites(t *testing.T) {
	kvmtest.Require(t)
	const fillFrom = 8 << 20
	var con testguest.SyncBuffer
	cfg := counterConfig(t, 64<<20, &con)
	parent, err := vmm.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runVM(t, parent)
	kvmtest.WaitFor(t, 2*time.Minute, "the parent to count", func() bool { return counter(parent) > 100 })
	fp, err := vmsnap.HostFingerprint("", cfg.Profile)
	if err != nil {
		t.Fatal(err)
	}
	s := vmsnap.NewSnapshotter(parent, nil, json.RawMessage(`{}`), fp)
	snaps := t.TempDir()
	// hostWrite writes v into n pages from fillFrom as a device would
	// (guestmem WriteAt: the VMM's record, not KVM's).
	hostWrite := func(v byte, n int) {
		t.Helper()
		if err := parent.Pause(context.Background()); err != nil {
			t.Fatal(err)
		}
		for p := range n {
			if _, err := parent.Memory().WriteAt(bytes.Repeat([]byte{v}, pageSize), int64(fillFrom+p*pageSize)); err != nil {
				t.Fatal(err)
			}
		}
		if err := parent.Resume(); err != nil {
			t.Fatal(err)
		}
	}
	f := &Forker{VM: parent}
	// fork forks once and checks the child's memory: the guest's counter
	// as the fork's saved registers have it (the guest increments memory,
	// then EBX: the two may differ by one), and v in the first n pages
	// written from the host.
	fork := func(step string, v byte, n int) {
		t.Helper()
		pt, err := f.Fork(context.Background(), 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer pt.Close()
		got := binary.LittleEndian.Uint32(pageAt(t, pt, counterAddr/pageSize)[counterAddr%pageSize:])
		ebx := uint32(pt.State.VCPUs[0].Regs.RBX)
		if got != ebx && got != ebx+1 {
			t.Fatalf("%s: the child's counter is %d, the parent's EBX at the fork %d: a page the guest wrote was not copied", step, got, ebx)
		}
		for _, p := range []int{0, n - 1} {
			if b := pageAt(t, pt, fillFrom/pageSize+uint64(p)); b[0] != v || b[pageSize-1] != v {
				t.Fatalf("%s: the child's page %d from %#x holds %#x, want %#x", step, p, fillFrom, b[0], v)
			}
		}
		t.Logf("%s: parent paused %v, %d layers, counter %d", step, pt.Pause, len(pt.Memory.Layers), got)
	}

	hostWrite(0x11, 16)
	fork("first fork", 0x11, 16)
	hostWrite(0x22, 16)
	if _, err := s.Take(context.Background(), filepath.Join(snaps, "full"), vmsnap.Full); err != nil {
		t.Fatal(err)
	}
	// The snapshot took the records; the fork still sees the writes.
	fork("fork after a snapshot", 0x22, 16)
	hostWrite(0x33, 32)
	if _, err := s.Take(context.Background(), filepath.Join(snaps, "inc"), vmsnap.Incremental); err != nil {
		t.Fatal(err)
	}
	fork("fork after an incremental snapshot", 0x33, 32)
	// Back to the full snapshot (0x22 in 16 pages, 0x33 gone from the
	// other 16: RestoreOver rewrites them in place, in no dirty log).
	snap, err := vmsnap.Load(filepath.Join(snaps, "full"), vmsnap.HostFingerprintSource("", cfg.Profile))
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	if _, err := s.Rollback(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	kvmtest.WaitFor(t, 2*time.Minute, "the parent to count after the rollback", func() bool { return counter(parent) > 100 })
	fork("fork after a rollback", 0x22, 16)
	pt, err := f.Fork(context.Background(), 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pt.Close()
	if b := pageAt(t, pt, fillFrom/pageSize+20); b[0] != 0 {
		t.Fatalf("after the rollback the child's page 20 from %#x holds %#x, want the snapshot's 0", fillFrom, b[0])
	}
	if strings.Contains(con.String(), "X") {
		t.Fatalf("the guest failed: %q", con.String())
	}
}
