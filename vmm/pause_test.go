package vmm

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/vmm/guestmem"
	"github.com/warrenvm/warren/vmm/hostprofile"
	"github.com/warrenvm/warren/vmm/kvm"
	"github.com/warrenvm/warren/vmm/testguest"
)

// Addresses and port of the counter guest (testdata/guests/counter.S).
const (
	counterAddr = 0x300000
	sumAddr     = 0x300004
	counterPort = 0x510
	opcodeInDX  = 0xed // in (%dx), %eax
)

// counterDevice is the counter guest's port 0x510: each read returns 1,
// except the one read that follows arm, which signals entered, waits for
// release and returns magic.
type counterDevice struct {
	reads   atomic.Int64
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

const counterMagic = 0x01000000

func newCounterDevice() *counterDevice {
	return &counterDevice{entered: make(chan struct{}), release: make(chan struct{})}
}

func (d *counterDevice) Read(off uint64, data []byte) {
	d.reads.Add(1)
	v := uint32(1)
	if d.armed.CompareAndSwap(true, false) {
		close(d.entered)
		<-d.release
		v = counterMagic
	}
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	copy(data, b[:])
}

func (d *counterDevice) Write(uint64, []byte) {}

func counterConfig(t *testing.T, console *syncBuffer, cpus int) Config {
	return Config{MemBytes: 32 << 20, CPUs: cpus, Kernel: testguest.Build(t, "counter"),
		Console: console, Profile: hostprofile.Detect("/sys/module")}
}

// startCounter creates a VM from cfg (a restore when st is given), adds
// the counter device and runs it in the background. The returned function
// stops the VM and waits for Run.
func startCounter(t *testing.T, cfg Config, st *State, fill func(*guestmem.Memory) error) (*VM, *counterDevice, func()) {
	t.Helper()
	var vm *VM
	var err error
	if st == nil {
		vm, err = New(cfg)
	} else {
		vm, err = Restore(cfg, st, fill)
	}
	if err != nil {
		t.Fatal(err)
	}
	dev := newCounterDevice()
	if err := vm.PIO.Add(counterPort, 4, dev); err != nil {
		t.Fatal(err)
	}
	return vm, dev, kvmtest.Start(t, vm, 3*time.Minute)
}

func readCounter(t *testing.T, vm *VM, gpa int64) uint32 {
	t.Helper()
	var b [4]byte
	if _, err := vm.Memory().ReadAt(b[:], gpa); err != nil {
		t.Fatal(err)
	}
	return binary.LittleEndian.Uint32(b[:])
}

func pause(t *testing.T, vm *VM) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	if err := vm.Pause(ctx); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	return time.Since(start)
}

// TestPauseResume pauses the counter guest twice (with an idle second vCPU,
// which waits for a SIPI inside KVM_RUN) and checks it makes no progress
// while paused and carries on after Resume.
func TestPauseResume(t *testing.T) {
	kvmtest.Require(t)
	var con syncBuffer
	vm, _, stop := startCounter(t, counterConfig(t, &con, 2), nil, nil)
	// Device hooks: quiesced after the vCPUs park, in order; resumed
	// before they run, in reverse; a failing one undoes the pause.
	var hookMu sync.Mutex
	var events []string
	var failQuiesce atomic.Bool
	record := func(e string) {
		hookMu.Lock()
		defer hookMu.Unlock()
		events = append(events, e)
	}
	takeEvents := func() string {
		hookMu.Lock()
		defer hookMu.Unlock()
		s := strings.Join(events, ",")
		events = nil
		return s
	}
	vm.AddPauseHook(PauseHook{Name: "a",
		Quiesce: func(context.Context) error {
			if vm.pause.round() == nil {
				t.Error("quiesce a: no pause round open")
			}
			record("qa")
			return nil
		},
		Resume: func() error { record("ra"); return nil }})
	vm.AddPauseHook(PauseHook{Name: "b",
		Quiesce: func(context.Context) error {
			if failQuiesce.Load() {
				return errors.New("busy")
			}
			record("qb")
			return nil
		},
		Resume: func() error { record("rb"); return nil }})
	kvmtest.WaitFor(t, time.Minute, "3 dots", func() bool { return strings.Count(con.String(), ".") >= 3 })

	took := pause(t, vm)
	t.Logf("Pause took %v", took)
	if !vm.Paused() {
		t.Error("Paused() = false after Pause")
	}
	c1, out1 := readCounter(t, vm, counterAddr), con.String()
	time.Sleep(300 * time.Millisecond)
	if c2, out2 := readCounter(t, vm, counterAddr), con.String(); c2 != c1 || out2 != out1 {
		t.Fatalf("the guest ran while paused: counter %d -> %d, console %d -> %d bytes", c1, c2, len(out1), len(out2))
	}
	st, err := vm.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	// The guest increments memory first, then EBX.
	if ebx := uint32(st.VCPUs[0].Regs.RBX); ebx != c1 && ebx != c1-1 {
		t.Errorf("saved EBX %d, counter in memory %d", ebx, c1)
	}
	if err := vm.Pause(context.Background()); err != nil { // already paused: no-op
		t.Errorf("second Pause: %v", err)
	}
	if err := vm.Resume(); err != nil {
		t.Fatal(err)
	}
	if got := takeEvents(); got != "qa,qb,rb,ra" {
		t.Errorf("hook calls %q, want qa,qb,rb,ra", got)
	}
	kvmtest.WaitFor(t, time.Minute, "progress after Resume", func() bool { return readCounter(t, vm, counterAddr) > c1+1<<20 })

	// A hook that fails to quiesce: Pause fails and the guest runs on.
	failQuiesce.Store(true)
	if err := vm.Pause(context.Background()); err == nil || !strings.Contains(err.Error(), "quiesce b: busy") {
		t.Errorf("Pause with a failing hook: %v", err)
	}
	failQuiesce.Store(false)
	if got := takeEvents(); got != "qa,ra" {
		t.Errorf("hook calls %q after a failed quiesce, want qa,ra", got)
	}
	if vm.Paused() {
		t.Error("Paused() after a failed Pause")
	}
	c5 := readCounter(t, vm, counterAddr)
	kvmtest.WaitFor(t, time.Minute, "progress after a failed Pause", func() bool { return readCounter(t, vm, counterAddr) > c5+1<<20 })

	// A second round works the same way.
	pause(t, vm)
	c3 := readCounter(t, vm, counterAddr)
	time.Sleep(100 * time.Millisecond)
	if c4 := readCounter(t, vm, counterAddr); c4 != c3 {
		t.Fatalf("the guest ran during the second pause: %d -> %d", c3, c4)
	}
	if err := vm.Resume(); err != nil {
		t.Fatal(err)
	}
	kvmtest.WaitFor(t, time.Minute, "progress after the second Resume", func() bool { return readCounter(t, vm, counterAddr) > c3+1<<20 })
	stop()
	if strings.Contains(con.String(), "X") {
		t.Errorf("the guest saw memory and EBX disagree: %q", con.String())
	}
}

// TestPauseCompletesPortIO pauses while the guest's IN instruction is being
// served: the saved registers must show it completed (the value in EAX,
// RIP past the instruction), as KVM does only on the next KVM_RUN.
func TestPauseCompletesPortIO(t *testing.T) {
	kvmtest.Require(t)
	var con syncBuffer
	vm, dev, stop := startCounter(t, counterConfig(t, &con, 1), nil, nil)
	kvmtest.WaitFor(t, time.Minute, "a dot", func() bool { return strings.Contains(con.String(), ".") })
	dev.armed.Store(true)
	<-dev.entered // a vCPU thread is now inside the port read
	paused := make(chan error, 1)
	go func() { paused <- vm.Pause(context.Background()) }()
	kvmtest.WaitFor(t, time.Minute, "the pause request", vm.pause.requested.Load)
	close(dev.release)
	if err := <-paused; err != nil {
		t.Fatal(err)
	}
	st, err := vm.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	r := st.VCPUs[0].Regs
	if uint32(r.RAX) != counterMagic {
		t.Errorf("EAX = %#x after the paused IN, want %#x", uint32(r.RAX), counterMagic)
	}
	var op [1]byte
	if _, err := vm.Memory().ReadAt(op[:], int64(r.RIP-1)); err != nil {
		t.Fatal(err)
	}
	if op[0] != opcodeInDX {
		t.Errorf("RIP %#x does not follow the IN instruction (byte before it %#x)", r.RIP, op[0])
	}
	if err := vm.Resume(); err != nil {
		t.Fatal(err)
	}
	kvmtest.WaitFor(t, time.Minute, "the magic value in the guest's sum", func() bool { return readCounter(t, vm, sumAddr) >= counterMagic })
	stop()
}

// TestSaveRestore saves a running guest with two vCPUs (the second idle,
// waiting for a SIPI), restores it into a new VM in this process and checks that the state reads back unchanged and the guest
// carries on.
func TestSaveRestore(t *testing.T) {
	kvmtest.Require(t)
	cfg, blob, ram, saved := saveCounter(t, 2)
	restoreCounter(t, cfg, blob, ram, saved)
}

// TestSaveRestoreNewProcess restores in a new process: the test writes the
// state and RAM to files and re-executes its own binary, which runs
// TestRestoreChild on them.
func TestSaveRestoreNewProcess(t *testing.T) {
	kvmtest.Require(t)
	_, blob, ram, saved := saveCounter(t, 1)
	dir := t.TempDir()
	for name, b := range map[string][]byte{"state.json": blob, "ram": ram, "counter": binary.LittleEndian.AppendUint32(nil, saved)} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	kvmtest.RunChild(t, "TestRestoreChild", "WARREN_RESTORE_CHILD="+dir)
}

// TestRestoreChild is the restoring half of TestSaveRestoreNewProcess; it
// skips unless run by it.
func TestRestoreChild(t *testing.T) {
	dir := kvmtest.Child(t, "WARREN_RESTORE_CHILD", "TestSaveRestoreNewProcess")
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var con syncBuffer
	cfg := counterConfig(t, &con, 1)
	restoreCounter(t, cfg, read("state.json"), read("ram"), binary.LittleEndian.Uint32(read("counter")))
}

// saveCounter runs the counter guest a while, pauses it, saves its state
// (blob, marshalled) and RAM, and closes it. saved is the guest's counter
// at that point.
func saveCounter(t *testing.T, cpus int) (cfg Config, blob, ram []byte, saved uint32) {
	t.Helper()
	var con syncBuffer
	cfg = counterConfig(t, &con, cpus)
	vm, _, stop := startCounter(t, cfg, nil, nil)
	kvmtest.WaitFor(t, time.Minute, "3 dots", func() bool { return strings.Count(con.String(), ".") >= 3 })
	t.Logf("Pause took %v", pause(t, vm))
	start := time.Now()
	st, err := vm.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("SaveState took %v: %d MSRs, XSAVE %d bytes, XCRs %v", time.Since(start), len(st.VCPUs[0].MSRs), len(st.VCPUs[0].Xsave), st.VCPUs[0].XCRs != nil)
	ram = make([]byte, cfg.MemBytes)
	for _, r := range vm.Memory().Regions() {
		copy(ram[r.Offset:], vm.Memory().Host(r))
	}
	saved = readCounter(t, vm, counterAddr)
	stop()
	if strings.Contains(con.String(), "X") {
		t.Fatalf("the guest failed before the save: %q", con.String())
	}
	if blob, err = st.Marshal(); err != nil {
		t.Fatal(err)
	}
	return cfg, blob, ram, saved
}

// restoreCounter restores the encoded state blob and RAM into a new VM,
// paused, checks the state reads back as saved, resumes it and checks the
// guest carries on counting from saved.
func restoreCounter(t *testing.T, cfg Config, blob, ram []byte, saved uint32) {
	t.Helper()
	st, err := UnmarshalState(blob)
	if err != nil {
		t.Fatal(err)
	}
	var con syncBuffer
	cfg.Console, cfg.Kernel, cfg.StartPaused = &con, nil, true
	filled := false
	start := time.Now()
	vm, _, stop := startCounter(t, cfg, st, func(m *guestmem.Memory) error {
		filled = true
		for _, r := range m.Regions() {
			copy(m.Host(r), ram[r.Offset:r.Offset+r.Size])
		}
		return nil
	})
	if !filled {
		t.Fatal("Restore did not call fill")
	}
	pause(t, vm) // waits for the vCPUs to load their state and park
	t.Logf("Restore to parked vCPUs took %v", time.Since(start))
	back, err := vm.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	compareStates(t, st, back)
	if c := readCounter(t, vm, counterAddr); c != saved {
		t.Fatalf("restored counter %d, saved %d", c, saved)
	}
	if err := vm.Resume(); err != nil {
		t.Fatal(err)
	}
	kvmtest.WaitFor(t, time.Minute, "progress after restore", func() bool { return readCounter(t, vm, counterAddr) > saved+1<<20 })
	kvmtest.WaitFor(t, time.Minute, "a dot after restore", func() bool { return strings.Contains(con.String(), ".") })
	stop()
	if out := con.String(); strings.Contains(out, "X") {
		t.Errorf("after restore the guest saw memory and EBX disagree: %q", out)
	}
}

// timeMSRs count host time: after a restore they are at least the saved
// value.
var timeMSRs = map[uint32]bool{
	kvm.MSRIA32TSC: true,
	0x40000010:     true, // Hyper-V VP_RUNTIME
	0x40000020:     true, // Hyper-V TIME_REF_COUNT
}

// compareStates checks that a state read back right after Restore equals
// the saved one, except what moves with host time (the TSC, the PIT's load
// time, the kvmclock).
func compareStates(t *testing.T, want, got *State) {
	t.Helper()
	for i := range want.VCPUs {
		w, g := want.VCPUs[i], got.VCPUs[i]
		if g.Regs != w.Regs {
			t.Errorf("vCPU %d regs:\n got %+v\nwant %+v", i, g.Regs, w.Regs)
		}
		if g.Sregs != w.Sregs {
			t.Errorf("vCPU %d sregs:\n got %+v\nwant %+v", i, g.Sregs, w.Sregs)
		}
		if g.MPState != w.MPState {
			t.Errorf("vCPU %d MP state %d, want %d", i, g.MPState, w.MPState)
		}
		if g.FPU != w.FPU {
			t.Errorf("vCPU %d FPU differs", i)
		}
		if string(g.Xsave) != string(w.Xsave) {
			t.Errorf("vCPU %d XSAVE area differs", i)
		}
		if (g.XCRs == nil) != (w.XCRs == nil) || g.XCRs != nil && *g.XCRs != *w.XCRs {
			t.Errorf("vCPU %d XCRs %+v, want %+v", i, g.XCRs, w.XCRs)
		}
		if string(g.LAPIC) != string(w.LAPIC) {
			t.Errorf("vCPU %d LAPIC differs", i)
		}
		if g.Events != w.Events {
			t.Errorf("vCPU %d events %+v, want %+v", i, g.Events, w.Events)
		}
		if g.DebugRegs != w.DebugRegs {
			t.Errorf("vCPU %d debug regs %+v, want %+v", i, g.DebugRegs, w.DebugRegs)
		}
		if len(g.CPUID) != len(w.CPUID) {
			t.Errorf("vCPU %d: %d CPUID entries, want %d", i, len(g.CPUID), len(w.CPUID))
		}
		gm := map[uint32]uint64{}
		for _, m := range g.MSRs {
			gm[m.Index] = m.Data
		}
		for _, m := range w.MSRs {
			d, ok := gm[m.Index]
			switch {
			case !ok:
				t.Errorf("vCPU %d: MSR %#x not readable after restore", i, m.Index)
			case timeMSRs[m.Index]:
				if d < m.Data {
					t.Errorf("vCPU %d: MSR %#x went back: %#x, saved %#x", i, m.Index, d, m.Data)
				}
			case d != m.Data:
				t.Errorf("vCPU %d: MSR %#x = %#x, saved %#x", i, m.Index, d, m.Data)
			}
		}
	}
	for _, c := range []struct {
		name      string
		got, want []byte
	}{{"PIC master", got.PICMaster, want.PICMaster}, {"PIC slave", got.PICSlave, want.PICSlave}, {"IOAPIC", got.IOAPIC, want.IOAPIC}} {
		if string(c.got) != string(c.want) {
			t.Errorf("%s state differs", c.name)
		}
	}
	for i := range want.PIT.Channels {
		g, w := got.PIT.Channels[i], want.PIT.Channels[i]
		g.CountLoadTime, w.CountLoadTime = 0, 0
		if g != w {
			t.Errorf("PIT channel %d %+v, want %+v", i, g, w)
		}
	}
	if got.Machine.Cmdline != want.Machine.Cmdline || got.UART.LCR != want.UART.LCR {
		t.Errorf("machine/UART state differs: %+v %+v", got.Machine, got.UART)
	}
}
