package vmm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/vmm/boot"
	"github.com/warrenvm/warren/vmm/guestmem"
	"github.com/warrenvm/warren/vmm/hostprofile"
	"github.com/warrenvm/warren/vmm/kvm"
	"github.com/warrenvm/warren/vmm/serial"
)

// BaseCmdline is always on the guest kernel command line: the console on
// COM1, reboot through the i8042 (which Warren treats as power-off), and a
// panic that reboots after a second instead of hanging.
const BaseCmdline = "console=ttyS0 reboot=k panic=1"

// Addresses KVM needs on Intel hosts, just below the 4 GiB boundary and
// above the IOAPIC/LAPIC pages.
const (
	tssAddr         = 0xfffbd000
	identityMapAddr = 0xfffbc000
)

// MaxCPUs is the most vCPUs a Warren VM may have.
const MaxCPUs = 32

// Config describes a VM.
type Config struct {
	MemBytes  uint64 // guest RAM, a positive multiple of 4 KiB, at least 16 MiB
	CPUs      int    // 1..MaxCPUs
	Kernel    []byte // vmlinux (PVH) or bzImage
	Initramfs []byte // optional
	// Cmdline is appended to BaseCmdline and the host profile's arguments.
	Cmdline string
	// Console receives the guest's COM1 output; nil discards it.
	Console io.Writer
	// Profile adapts CPUID and the command line to the host.
	Profile hostprofile.Profile
	// KVMPath is the KVM device; "" means /dev/kvm.
	KVMPath string
	// Log receives diagnostics; nil means slog.Default().
	Log *slog.Logger
	// Virtio lists the virtio-mmio devices, in order (their addresses and
	// interrupt lines follow from their position).
	Virtio []VirtioSpec
	// TrackDirty turns on KVM dirty-page logging for guest RAM (with manual
	// re-protection where KVM offers it), read with DirtyPages.
	TrackDirty bool
	// StartPaused makes Run create the vCPUs and park them before the first
	// guest instruction, as if Pause had been called: Pause then returns once
	// they are parked (SaveState works), and Resume lets the guest run.
	StartPaused bool
	// OnFirstRun, when non-nil, is called once, by vCPU 0's thread just
	// before its first KVM_RUN (for timing: `warren restore --timing`). It
	// runs on the vCPU's thread, so it must return at once.
	OnFirstRun func()
}

// ErrPanic is wrapped by Run's error when the guest kernel panicked.
var ErrPanic = errors.New("guest kernel panicked")

// VM is a configured virtual machine. Create with New, start with Run.
type VM struct {
	cfg     Config
	log     *slog.Logger
	sys     *kvm.System
	vm      *kvm.VM // cleared by Close, under closeMu
	mem     *guestmem.Memory
	entry   boot.EntryState
	format  boot.Format
	cmdline string
	cpuid   []kvm.CPUIDEntry

	// PIO and MMIO are the port and memory-mapped device buses. Add devices
	// before Run.
	PIO, MMIO Bus

	uart    *serial.UART
	console *panicWatcher
	conbuf  *lineBuffer // between console and the UART

	manualProtect bool // dirty pages stay logged until dirtyPages clears them
	// dirtyMu serialises reads of KVM's dirty log (TakeDirty); dirtyLedger
	// keeps what each reader has not taken yet.
	dirtyMu     sync.Mutex
	dirtyLedger guestmem.Ledger
	closers     []func()          // run by Close, last first
	transports  []VirtioTransport // in Config.Virtio order

	stopping atomic.Bool
	stopOnce sync.Once
	stopErr  error         // why the VM stopped; written once, before done closes
	done     chan struct{} // closed by Stop
	vcpuMu   sync.Mutex
	tids     map[int]int // vCPU id -> OS thread id, while running
	vcpus    map[int]*kvm.VCPU

	// closeMu guards vm against Close for InjectIRQ, which host-input
	// goroutines call too: no ioctl goes to the VM's descriptor once it
	// is closed (or to a file that reuses the number).
	closeMu sync.RWMutex

	pause   pauseState // see pause.go
	restore *State     // set by Restore: the vCPU threads load it instead of booting
}

// New validates cfg, creates the KVM VM, its memory and devices, and loads
// the kernel. Nothing runs until Run.
func New(cfg Config) (_ *VM, err error) {
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	if len(cfg.Kernel) == 0 {
		return nil, fmt.Errorf("vmm: no kernel image")
	}
	v := newVM(cfg)
	cfg = v.cfg
	var cmd boot.Cmdline
	cmd.Add(BaseCmdline)
	cmd.Add(cfg.Profile.KernelArgs()...)
	for i := range cfg.Virtio {
		cmd.Add(virtioCmdline(i))
	}
	cmd.Add(cfg.Cmdline)
	if err := cmd.Validate(); err != nil {
		return nil, err
	}
	v.cmdline = cmd.String()

	defer func() {
		if err != nil {
			v.Close()
		}
	}()
	// Guest memory and the kernel first: bad input is reported before KVM
	// is touched (and on hosts without it).
	if v.mem, err = guestmem.New(cfg.MemBytes); err != nil {
		return nil, err
	}
	if v.entry, v.format, err = boot.Load(v.mem, boot.Params{
		Kernel: cfg.Kernel, Initramfs: cfg.Initramfs, Cmdline: v.cmdline, CPUs: cfg.CPUs,
	}); err != nil {
		return nil, err
	}
	// The boot image's pages are no incremental snapshot's concern (the
	// first snapshot is a full one); a full one's pre-copy need not copy
	// them twice.
	v.mem.ForgetWritten()
	if err := v.createKVM(); err != nil {
		return nil, err
	}
	return v, nil
}

// checkConfig validates what New and Restore have in common.
func checkConfig(cfg Config) error {
	if cfg.CPUs < 1 || cfg.CPUs > MaxCPUs {
		return fmt.Errorf("vmm: %d vCPUs requested; between 1 and %d are supported", cfg.CPUs, MaxCPUs)
	}
	if cfg.MemBytes < 16<<20 || cfg.MemBytes%guestmem.PageSize != 0 {
		return fmt.Errorf("vmm: %d MiB of memory requested; at least 16 MiB, in whole pages, is needed", cfg.MemBytes>>20)
	}
	if len(cfg.Virtio) > MaxVirtioDevices {
		return fmt.Errorf("vmm: %d virtio devices; at most %d are supported", len(cfg.Virtio), MaxVirtioDevices)
	}
	return nil
}

// newVM returns a VM with cfg's defaults filled in and nothing created.
func newVM(cfg Config) *VM {
	if cfg.Console == nil {
		cfg.Console = io.Discard
	}
	if cfg.KVMPath == "" {
		cfg.KVMPath = kvm.DevicePath
	}
	v := &VM{cfg: cfg, log: cfg.Log, done: make(chan struct{}), tids: map[int]int{}, vcpus: map[int]*kvm.VCPU{}}
	if v.log == nil {
		v.log = slog.Default()
	}
	v.pause.init(cfg.CPUs, cfg.StartPaused)
	return v
}

// createKVM creates the KVM VM over v.mem (already filled), its irqchip,
// PIT and memory slots, and the devices. On error the caller closes v.
func (v *VM) createKVM() (err error) {
	cfg := v.cfg
	if v.sys, err = kvm.Open(cfg.KVMPath); err != nil {
		return err
	}
	for _, c := range []struct {
		cap  int
		name string
	}{{kvm.CapIRQChip, "IRQCHIP"}, {kvm.CapUserMemory, "USER_MEMORY"}, {kvm.CapPIT2, "PIT2"}, {kvm.CapImmediateExit, "IMMEDIATE_EXIT"}} {
		if n, err := v.sys.CheckExtension(c.cap); err != nil || n == 0 {
			return fmt.Errorf("vmm: this KVM lacks KVM_CAP_%s, which Warren needs", c.name)
		}
	}
	if v.vm, err = v.sys.CreateVM(); err != nil {
		return err
	}
	// Intel VMX needs these; elsewhere they may be refused, which is harmless.
	if err := v.vm.SetTSSAddr(tssAddr); err != nil {
		v.log.Debug("KVM_SET_TSS_ADDR refused", "err", err)
	}
	if err := v.vm.SetIdentityMapAddr(identityMapAddr); err != nil {
		v.log.Debug("KVM_SET_IDENTITY_MAP_ADDR refused", "err", err)
	}
	if err := v.vm.CreateIRQChip(); err != nil {
		return err
	}
	if err := v.vm.CreatePIT2(kvm.PITSpeakerDummy); err != nil {
		return err
	}
	var slotFlags uint32
	if cfg.TrackDirty {
		slotFlags = kvm.MemLogDirtyPages
		if n, _ := v.sys.CheckExtension(kvm.CapManualDirtyLogProtect2); n&1 != 0 {
			if err := v.vm.EnableCap(kvm.CapManualDirtyLogProtect2, 1); err != nil {
				return err
			}
			v.manualProtect = true
		}
	}
	for i, r := range v.mem.Regions() {
		host := v.mem.Host(r)
		if err := v.vm.SetUserMemoryRegion(kvm.UserspaceMemoryRegion{
			Slot: uint32(i), Flags: slotFlags, GuestPhysAddr: r.GPA, MemorySize: r.Size,
			UserspaceAddr: uint64(uintptrOf(host)),
		}); err != nil {
			return err
		}
	}
	supported, err := v.sys.SupportedCPUID()
	if err != nil {
		return err
	}
	v.cpuid = cfg.Profile.FilterCPUID(supported)

	if err := v.attachVirtio(); err != nil {
		return err
	}
	v.console = &panicWatcher{w: cfg.Console}
	v.conbuf = newLineBuffer(v.console)
	v.uart = serial.New(v.conbuf, func() { v.pulseIRQ(serial.COM1IRQ) })
	for _, d := range []struct {
		base, size uint64
		dev        Device
	}{
		{serial.COM1Port, 8, uartPorts{v.uart}},
		{i8042DataPort, 5, i8042{reset: func() { v.Stop(nil) }}},
		{0x80, 1, sink{}}, // POST codes
	} {
		if err := v.PIO.Add(d.base, d.size, d.dev); err != nil {
			return err
		}
	}

	return nil
}

// Cmdline returns the full kernel command line the guest boots with.
func (v *VM) Cmdline() string { return v.cmdline }

// Format returns the kind of kernel image loaded.
func (v *VM) Format() boot.Format { return v.format }

// Memory returns guest RAM.
func (v *VM) Memory() *guestmem.Memory { return v.mem }

// KVM returns the KVM VM, for device setup (irqfd, ioeventfd) and tests.
func (v *VM) KVM() *kvm.VM { return v.vm }

// InjectIRQ raises an edge on an ISA interrupt line (GSI) of the in-kernel
// irqchip.
func (v *VM) InjectIRQ(gsi uint32) error {
	v.closeMu.RLock()
	defer v.closeMu.RUnlock()
	if v.vm == nil {
		return errors.New("vmm: the VM is closed")
	}
	if err := v.vm.IRQLine(gsi, true); err != nil {
		return err
	}
	return v.vm.IRQLine(gsi, false)
}

func (v *VM) pulseIRQ(gsi uint32) {
	if err := v.InjectIRQ(gsi); err != nil {
		v.log.Warn("irq injection failed", "gsi", gsi, "err", err)
	}
}

// TakeDirty returns the pages of the flat memfd image (bit p%64 of word
// p/64) that the guest wrote since t's previous TakeDirty, from KVM's dirty
// log of every region, and starts a new logging round; what it read from
// KVM is kept for the other reader (guestmem.Ledger), so snapshots and forks
// each see every guest write. It needs Config.TrackDirty. Pages written by
// the VMM itself are not included (guestmem TakeWritten). Its cost is one
// bit per page of RAM (KVM_GET_DIRTY_LOG's bitmap) plus the pages found.
// Call it with the vCPUs paused where the caller needs an exact cut.
func (v *VM) TakeDirty(t guestmem.Tracker) ([]uint64, error) {
	if !v.cfg.TrackDirty {
		return nil, fmt.Errorf("vmm: dirty-page logging is off (Config.TrackDirty)")
	}
	v.dirtyMu.Lock()
	defer v.dirtyMu.Unlock()
	flat := make([]uint64, (v.mem.Size()/guestmem.PageSize+63)/64)
	for i, r := range v.mem.Regions() {
		bm, err := v.dirtyPages(i)
		if err != nil {
			return nil, err
		}
		first := r.Offset / guestmem.PageSize
		if first%64 == 0 {
			// Regions start on 64-page boundaries (the 3 GiB hole): whole words.
			for w, bits := range bm {
				flat[first/64+uint64(w)] |= bits
			}
			continue
		}
		for p := uint64(0); p < r.Size/guestmem.PageSize; p++ {
			if bm[p/64]&(1<<(p%64)) != 0 {
				q := first + p
				flat[q/64] |= 1 << (q % 64)
			}
		}
	}
	return v.dirtyLedger.Take(t, flat), nil
}

// dirtyPages returns a bitmap (bit i of word i/64 is page i of the region)
// of the pages of memory region i that the guest wrote since the previous
// call, and starts a new logging round. dirtyMu is held.
func (v *VM) dirtyPages(region int) ([]uint64, error) {
	rs := v.mem.Regions()
	if region < 0 || region >= len(rs) {
		return nil, fmt.Errorf("vmm: no memory region %d", region)
	}
	pages := rs[region].Size / guestmem.PageSize
	bitmap := make([]uint64, (pages+63)/64)
	if err := v.vm.GetDirtyLog(uint32(region), bitmap); err != nil {
		return nil, err
	}
	if v.manualProtect {
		if err := v.vm.ClearDirtyLog(uint32(region), 0, uint32(pages), bitmap); err != nil {
			return nil, err
		}
	}
	return bitmap, nil
}

// TracksDirty reports whether dirty-page logging is on (Config.TrackDirty).
func (v *VM) TracksDirty() bool { return v.cfg.TrackDirty }

// SerialInput queues bytes for the guest's COM1.
func (v *VM) SerialInput(b []byte) { v.uart.Input(b) }

// Run starts the vCPUs and blocks until the guest powers off (nil), an
// error stops it, or ctx is done. The VM cannot be run twice.
func (v *VM) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	start := make(chan struct{})
	ready := make(chan error, v.cfg.CPUs)
	for id := 0; id < v.cfg.CPUs; id++ {
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			v.vcpuThread(id, ready, start)
		}(id)
	}
	var setupErr error
	for i := 0; i < v.cfg.CPUs; i++ {
		if err := <-ready; err != nil && setupErr == nil {
			setupErr = err
		}
	}
	if setupErr == nil && v.restore != nil {
		setupErr = v.restoreClock()
		// Now that the LAPICs exist, an interrupt the UART raised while
		// the VM was being restored can be delivered; so can those of
		// virtio devices restored and activated before the vCPUs.
		v.uart.RaisePending()
		v.raisePendingVirtio()
	}
	if setupErr != nil {
		v.Stop(setupErr)
	}
	close(start)
	select {
	case <-v.done:
	case <-ctx.Done():
		v.Stop(fmt.Errorf("vmm: stopped: %w", ctx.Err()))
	}
	// Kick until every vCPU thread has left KVM_RUN.
	exited := make(chan struct{})
	go func() { wg.Wait(); close(exited) }()
	for {
		v.kick()
		select {
		case <-exited:
			ferr := v.conbuf.Flush()
			err := v.stopErr
			if err == nil {
				if p := v.console.Panic(); p != "" {
					err = fmt.Errorf("vmm: %w: %s", ErrPanic, p)
				} else if ferr != nil {
					err = fmt.Errorf("vmm: console: %w", ferr)
				}
			}
			return err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop asks the VM to stop with reason (nil: a clean power-off). The first
// call wins; it returns at once, and Run returns once the vCPUs are out.
func (v *VM) Stop(reason error) {
	v.stopOnce.Do(func() {
		v.stopErr = reason
		v.stopping.Store(true)
		close(v.done)
		v.kick()
	})
}

// kick makes every running vCPU leave KVM_RUN.
func (v *VM) kick() {
	v.vcpuMu.Lock()
	defer v.vcpuMu.Unlock()
	pid := unix.Getpid()
	for id, c := range v.vcpus {
		c.SetImmediateExit(true)
		unix.Tgkill(pid, v.tids[id], unix.SIGURG) // Go tolerates stray SIGURG
	}
}

// Close releases the VM's KVM objects and memory. Call after Run returns.
func (v *VM) Close() error {
	for i := len(v.closers) - 1; i >= 0; i-- {
		v.closers[i]()
	}
	v.closers = nil
	v.closeMu.Lock()
	closeField(&v.vm)
	v.closeMu.Unlock()
	closeField(&v.sys)
	closeField(&v.mem)
	return nil
}

// closeField closes *p, when it holds an object, and clears it.
func closeField[T interface {
	comparable
	Close() error
}](p *T) {
	var none T
	if *p != none {
		(*p).Close()
		*p = none
	}
}
