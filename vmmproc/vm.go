package vmmproc

import (
	"context"
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/cow"
	"github.com/warrenvm/warren/devices/virtio"
	"github.com/warrenvm/warren/devices/virtio/balloon"
	"github.com/warrenvm/warren/devices/virtio/blk"
	vnet "github.com/warrenvm/warren/devices/virtio/net"
	"github.com/warrenvm/warren/devices/virtio/rng"
	"github.com/warrenvm/warren/devices/virtio/vsock"
	"github.com/warrenvm/warren/memsnap/uffd"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmm/guestmem"
	"github.com/warrenvm/warren/vmm/hostprofile"
	"github.com/warrenvm/warren/vmmproc/egress"
)

// vmOptions is what `warren run` and `warren restore` build a VM from,
// after flag parsing.
type vmOptions struct {
	memMiB, cpus int
	kernel       []byte
	initramfs    []byte
	cmdline      string
	console      io.Writer
	kvmPath      string
	log          *slog.Logger
	rng          bool // attach a virtio-rng device
	balloon      bool // attach a virtio-balloon device (the last one)
	disks        []diskSpec
	// diskChains, by disk index, is the chain the image of a writable
	// disk restored over a snapshot's layer must have under it (the
	// snapshot's record, its layer first), checked when it is opened;
	// ownDisks marks the disks whose image was made for this VM
	// (cow.Disk.OwnTop).
	diskChains map[int][]string
	ownDisks   map[int]bool
	tap        string // virtio-net on this tap device, when set
	mac        net.HardwareAddr
	// privateNet puts the tap and its egress services in a network
	// namespace of the VMM's own (privnet.go).
	privateNet bool
	// egress, when set, starts the tap's egress services (filter,
	// resolver, credential proxy, audit log) before the guest runs.
	egress *EgressOptions
	vsock  string // virtio-vsock with its host unix socket here, when set
	cid    uint64 // the guest's vsock CID
	// identity, when set, is sent to the guest agent with every re-sync
	// (a forked child's new hostname and machine id).
	identity   *agentwire.Identity
	trackDirty bool // KVM dirty-page logging, for incremental snapshots
	// proc is the VMM process the VM runs in (nil: a plain one).
	proc *process

	// restore, when set, makes the VM from this snapshot instead of the
	// kernel (kernel, initramfs and cmdline are then unused), its memory
	// in memMode (restoreVM); the devices' states are restored and vsock
	// is reset. uffd configures the fault server of the Uffd mode (its
	// Log and OnError are set by restoreVM); recordWorkingSet is the file
	// the control API writes the recorded working set to.
	restore          *vmsnap.Snapshot
	memMode          vmsnap.MemoryMode
	uffd             uffd.Options
	recordWorkingSet string
	// fork, when set, makes the VM a forked child from a parent's frozen
	// state and memory base (warren fork-child).
	fork *forkRestore
	// onFirstRun, when set, is vmm.Config.OnFirstRun (warren restore --timing).
	onFirstRun func()
}

// buildVM wires the VM and its devices: disks first (vda, vdb, ... in
// order), then the network device, then the entropy device, then vsock
// (listening on its unix socket before the guest boots). The returned
// close function closes the VM and then the device backends.
func buildVM(o vmOptions) (*vmm.VM, func(), error) {
	vm, _, closeAll, err := buildVMWithDevices(o)
	return vm, closeAll, err
}

// built is a VM made by build, with its devices and the function that
// closes them all.
type built struct {
	vm    *vmm.VM
	devs  vmDevices
	close func()
}

// build is buildVMWithDevices returning a built.
func build(o vmOptions) (*built, error) {
	noHugePages(o.log)
	vm, d, closeAll, err := buildVMWithDevices(o)
	if err != nil {
		return nil, err
	}
	return &built{vm: vm, devs: d, close: closeAll}, nil
}

// vmDevices are device models that callers reach after the build: tests
// read their counters and trigger vsock transport resets; snapshots save
// the transports. Each model is nil when not asked for.
type vmDevices struct {
	rng *rng.Device
	// balloon is the memory balloon (nil without vmOptions.balloon).
	balloon *balloon.Device
	vsock   *vsock.Device
	// snap are the virtio transports in VM order, for vmsnap.
	snap []vmsnap.Device
	// profile is the host profile the VM was built for.
	profile hostprofile.Profile
	// sync is the vsock re-sync service (nil without vsock): it tells the
	// guest agent the time, entropy and, for a fork child, its identity.
	sync *agentclient.SyncService
	// disks are the VM's disks in order; diskSet the same as snapshots,
	// rollbacks and forks change them.
	disks   []cow.Disk
	diskSet *cow.DiskSet
	// egress is the tap's egress services (nil without vmOptions.egress).
	egress *egress.Sandbox
	// netns is the VM's private network namespace (vmOptions.privateNet;
	// -1 without one), where its tap and the egress services' sockets are.
	netns netns.NsHandle
	// memMode is the memory mode a restored VM got (after any fallback);
	// empty for a booted VM or a fork child. uffd is its fault server in
	// the Uffd mode (nil otherwise), owned by the build: the close
	// function closes it, after the vCPUs have stopped and before the VM.
	memMode vmsnap.MemoryMode
	uffd    *uffd.Server
}

// buildVMWithDevices is buildVM that also returns some device models.
// Every virtio transport's Quiesce and Resume are registered as the VM's
// pause hooks.
func buildVMWithDevices(o vmOptions) (_ *vmm.VM, d vmDevices, closeAll func(), err error) {
	profile := hostprofile.Detect("/sys/module")
	d.profile = profile
	d.netns = -1
	o.log.Debug("host profile", "profile", profile.String())
	var (
		devs    []vmm.VirtioSpec
		closers []func() error
		mmios   = map[string]*virtio.MMIO{} // filled as the VM creates the transports
		resets  = map[string]func(){}
	)
	closeDevs := func() {
		for _, c := range closers {
			c()
		}
	}
	defer func() {
		if err != nil {
			closeDevs()
		}
	}()
	add := func(name string, queues int, dev virtio.Device) {
		devs = append(devs, virtioSpec(name, queues, dev, o.log, mmios))
	}
	for i, disk := range o.disks {
		opts := blk.Options{ReadOnly: disk.readOnly, ID: fmt.Sprintf("warren%d", i)}
		var dev *blk.Device
		if disk.readOnly {
			dev, err = blk.New(disk.path, opts)
		} else {
			// Writable disks go through cow/disk, so that they can fork
			// (and an overlay file, a fork child's disk, is followed
			// down its chain).
			var be blk.Backend
			if be, err = cow.OpenDisk(disk.path, false); err == nil {
				if chain, ok := o.diskChains[i]; ok {
					if err = cow.CheckChain(be, chain); err != nil {
						be.Close()
						return nil, d, nil, fmt.Errorf("--disk %s: not an overlay over the snapshot's layer %s: %w", disk.path, chain[0], err)
					}
				}
				name, _ := filepath.Abs(disk.path)
				if disk.name != "" {
					name = disk.name
				}
				if dev, err = blk.NewWithBackend(be, name, opts); err != nil {
					be.Close()
				}
			}
		}
		if err != nil {
			return nil, d, nil, fmt.Errorf("--disk %s: %w", disk.path, err)
		}
		closers = append(closers, dev.Close)
		add(fmt.Sprintf("blk%d", i), 1, dev)
		d.disks = append(d.disks, cow.Disk{Dev: dev, ReadOnly: disk.readOnly, OwnTop: o.ownDisks[i]})
	}
	d.diskSet = cow.NewDiskSet(d.disks)
	if o.tap != "" {
		var dev *vnet.Device
		if dev, err = openNet(o, &d, &closers); err != nil {
			return nil, d, nil, err
		}
		add("net0", 2, dev)
	} else if o.egress != nil {
		return nil, d, nil, fmt.Errorf("--egress needs --tap")
	} else if o.privateNet {
		return nil, d, nil, fmt.Errorf("--private-net needs --tap")
	}
	if o.rng {
		d.rng = rng.New()
		add("rng", 1, d.rng)
	}
	if o.vsock != "" {
		d.sync = &agentclient.SyncService{}
		d.sync.SetIdentity(o.identity)
		if d.egress != nil {
			d.sync.SetEgress(d.egress.Guest())
		}
		dev := &vsock.Device{CID: o.cid, UDSPath: o.vsock,
			Services: map[uint32]func(net.Conn){agentwire.SyncPort: d.sync.Serve}}
		if err := dev.Listen(); err != nil {
			return nil, d, nil, fmt.Errorf("--vsock %s: %w", o.vsock, err)
		}
		closers = append(closers, dev.Close)
		add("vsock", 3, dev)
		d.vsock = dev
		resets["vsock"] = dev.TransportReset
	}
	if o.balloon {
		// Last, so that every other device keeps its window and line.
		d.balloon = balloon.New()
		devs = append(devs, balloonSpec(d.balloon, o.log, mmios))
	}
	cfg := vmm.Config{
		MemBytes: uint64(o.memMiB) << 20, CPUs: o.cpus, Kernel: o.kernel, Initramfs: o.initramfs,
		Cmdline: o.cmdline, Console: o.console, Profile: profile, KVMPath: o.kvmPath, Log: o.log,
		Virtio: devs, TrackDirty: o.trackDirty, OnFirstRun: trimAfter(o.onFirstRun),
	}
	var vm *vmm.VM
	switch {
	case o.fork != nil:
		mem := o.fork.mem
		o.fork.mem = nil // the VM owns it now, even on error
		vm, err = vmm.RestoreMemory(cfg, o.fork.state, mem)
	case o.restore != nil:
		vm, d.uffd, d.memMode, err = restoreVM(o, cfg)
	default:
		vm, err = vmm.New(cfg)
	}
	if err != nil {
		return nil, d, nil, err
	}
	srv := d.uffd
	closeVM := func() {
		if srv != nil {
			srv.Close()
		}
		vm.Close()
	}
	for _, spec := range devs {
		t := mmios[spec.Name]
		d.snap = append(d.snap, vmsnap.Device{Name: spec.Name, Transport: t, AfterRestore: resets[spec.Name]})
		vm.AddPauseHook(pauseHook(spec.Name, t))
	}
	switch {
	case o.fork != nil:
		saved := &vmsnap.Snapshot{Path: "the fork's parent", Devices: o.fork.devices}
		if err := saved.RestoreDevices(d.snap); err != nil {
			closeVM()
			return nil, d, nil, err
		}
	case o.restore != nil:
		if err := o.restore.RestoreDevices(d.snap); err != nil {
			closeVM()
			return nil, d, nil, err
		}
	default:
		o.log.Debug("booting", "format", vm.Format().String(), "cmdline", vm.Cmdline())
	}
	return vm, d, func() { closeVM(); closeDevs() }, nil
}

// restoreVM makes o.restore's VM with its memory in o.memMode (Eager when
// empty) and returns the mode it got and, in the Uffd mode, the fault
// server. Where the host cannot serve memory by userfaultfd it logs one
// line and restores with Mmap instead. The server's first serving error
// stops the VM (a fault it could not serve would leave a vCPU waiting).
func restoreVM(o vmOptions, cfg vmm.Config) (*vmm.VM, *uffd.Server, vmsnap.MemoryMode, error) {
	mode := o.memMode
	if mode == "" {
		mode = vmsnap.Eager
	}
	var (
		target atomic.Pointer[vmm.VM]
		failed atomic.Pointer[error]
	)
	stop := func(vm *vmm.VM, err error) { vm.Stop(fmt.Errorf("guest memory: %w", err)) }
	uo := o.uffd
	uo.Log = o.log
	uo.OnError = func(err error) {
		failed.Store(&err)
		if vm := target.Load(); vm != nil {
			stop(vm, err)
		}
	}
	vm, srv, err := o.restore.RestoreWith(cfg, vmsnap.RestoreOptions{Mode: mode, Uffd: uo})
	if mode == vmsnap.Uffd && errors.Is(err, uffd.ErrUnsupported) {
		o.log.Warn("--lazy=uffd: userfaultfd unavailable, restoring with --lazy=mmap", "err", err)
		mode = vmsnap.Mmap
		vm, srv, err = o.restore.RestoreWith(cfg, vmsnap.RestoreOptions{Mode: mode})
	}
	if err != nil {
		return nil, nil, "", err
	}
	target.Store(vm)
	if e := failed.Load(); e != nil {
		stop(vm, *e)
	}
	return vm, srv, mode, nil
}

// pauseHook makes transport t's Quiesce and Resume the VM's pause hook for
// device name: a snapshot then sees no device touching guest memory.
func pauseHook(name string, t *virtio.MMIO) vmm.PauseHook {
	return vmm.PauseHook{Name: name, Quiesce: t.Quiesce, Resume: t.Resume}
}

// virtioSpec puts dev behind a virtio-mmio transport, recorded in mmios
// under name when the VM creates it.
func virtioSpec(name string, queues int, dev virtio.Device, log *slog.Logger, mmios map[string]*virtio.MMIO) vmm.VirtioSpec {
	return vmm.VirtioSpec{Name: name, Queues: queues,
		New: func(mem *guestmem.Memory, irq vmm.Signaller) (vmm.VirtioTransport, error) {
			t := virtio.NewMMIO(name, dev, mem, irq, log)
			mmios[name] = t
			return t, nil
		}}
}

// openNet opens o's tap and starts its egress services (d.egress), in a
// private network namespace (d.netns) when o.privateNet is set. What it
// opens is appended to closers, in the order they must close.
func openNet(o vmOptions, d *vmDevices, closers *[]func() error) (*vnet.Device, error) {
	return openNetWith(o.proc.helperConn(), o, d, closers)
}

// openNetWith is openNet with the family's helper conn (nil: none).
func openNetWith(conn *os.File, o vmOptions, d *vmDevices, closers *[]func() error) (*vnet.Device, error) {
	var dev *vnet.Device
	if conn != nil && o.privateNet {
		// Made by the family's helper: this VMM has no privilege for it.
		tap, ns, prep, err := askPrivateNet(conn, o)
		if err != nil {
			return nil, err
		}
		d.netns = ns
		*closers = append(*closers, func() error { return ns.Close() })
		if dev, err = vnet.NewBackend(tap, o.mac, vnet.Options{NewIdentity: o.fork != nil}); err != nil {
			tap.Close()
			if prep != nil {
				prep.Close()
			}
			return nil, fmt.Errorf("--tap %s: %w", o.tap, err)
		}
		if o.egress != nil {
			if d.egress, err = startEgress(o.egress, o.tap, o, prep); err != nil {
				dev.Close()
				return nil, fmt.Errorf("--egress: %w", err)
			}
			*closers = append(*closers, d.egress.Close)
		}
		*closers = append(*closers, dev.Close)
		return dev, nil
	}
	makeNet := func() error {
		var err error
		if dev, err = vnet.New(o.tap, o.mac, vnet.Options{NewIdentity: o.fork != nil}); err != nil {
			return fmt.Errorf("--tap %s: %w", o.tap, err)
		}
		if o.egress != nil {
			if d.egress, err = startEgress(o.egress, o.tap, o, nil); err != nil {
				dev.Close()
				return fmt.Errorf("--egress: %w", err)
			}
			// Stopped before the tap goes.
			*closers = append(*closers, d.egress.Close)
		}
		*closers = append(*closers, dev.Close)
		return nil
	}
	if !o.privateNet {
		return dev, makeNet()
	}
	h, err := inPrivateNetns(makeNet)
	if err != nil {
		return nil, err
	}
	d.netns = h
	*closers = append(*closers, func() error { return h.Close() })
	return dev, nil
}

// runForeground feeds stdin to the guest's console and runs vm until it
// powers off (nil), fails or is interrupted (an error "interrupted").
func runForeground(vm *vmm.VM, stdin io.Reader) error {
	// The console's input: what arrives on stdin goes to the guest's COM1
	// (as with QEMU's -serial stdio). A terminal stays in its normal mode,
	// so lines are sent on Enter and Ctrl-C still stops warren.
	if stdin != nil {
		go func() {
			buf := make([]byte, 4096)
			for {
				n, err := stdin.Read(buf)
				if n > 0 {
					vm.SerialInput(buf[:n])
				}
				if err != nil {
					return
				}
			}
		}()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := vm.Run(ctx); err != nil {
		if errors.Is(err, context.Canceled) {
			return errors.New("interrupted")
		}
		return err
	}
	return nil
}

// noHugePages turns transparent huge pages off for this process
// (PR_SET_THP_DISABLE; inherited by the processes it starts). A VMM's own
// memory is a Go heap of a few MiB; on a host whose THP setting is
// "always" (Debian's and RHEL's default) the kernel backs it with 2 MiB
// pages, and an idle fork child held 5-6 MiB of heap resident where 2 MiB
// were in use (bench/fork's density measurement in the nested host:
// 10.5 MiB per child against 5.9 MiB with THP off). Guest RAM is a shmem
// memfd of 4 KiB pages either way. A failure is logged and harmless.
func noHugePages(log *slog.Logger) {
	if err := unix.Prctl(unix.PR_SET_THP_DISABLE, 1, 0, 0, 0); err != nil && log != nil {
		log.Warn("transparent huge pages stay on for the VMM's heap", "err", err)
	}
}

// trimAfter returns an OnFirstRun that calls first (when set) and then
// starts trimHeap in a goroutine of its own (never on the vCPU thread that
// calls OnFirstRun).
func trimAfter(first func()) func() {
	return func() {
		if first != nil {
			first()
		}
		go trimHeap(trimEvery, trimSlack, nil)
	}
}

// How often trimHeap looks, and how much free heap it lets the Go runtime
// keep.
const (
	trimEvery = 30 * time.Second
	trimSlack = 1 << 20
)

// trimHeap returns the Go heap's free memory to the host now and then,
// every period, again whenever more than slack bytes of it are free but
// still resident. Setting a VM up (reading a fork spec or a snapshot's
// state, decoding device states, building devices) and the guest's
// first traffic leave megabytes of free heap that the Go runtime's
// background scavenger keeps resident for as long as the heap stays below
// its goal (4 MiB at least): in an idle VMM, for ever. Measured (bench/fork
// density, issue 20): an idle fork child whose live heap was under 1 MiB
// held 8 MiB of heap; 4.9 MiB with this trim, 2 MiB with noHugePages too.
// The check reads runtime/metrics (no
// stop of the world); a trim is a GC of a heap of a few MiB. It runs for
// the process's life, or until stop is closed.
func trimHeap(period time.Duration, slack uint64, stop <-chan struct{}) {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}}
	for {
		debug.FreeOSMemory()
		for {
			select {
			case <-stop:
				return
			case <-time.After(period):
			}
			metrics.Read(sample)
			if sample[0].Value.Kind() == metrics.KindUint64 && sample[0].Value.Uint64() > slack {
				break
			}
		}
	}
}
