package cli

import (
	"fmt"
	"io"
	"log/slog"
	"net"

	"github.com/warrenvm/warren/devices/virtio"
	"github.com/warrenvm/warren/devices/virtio/blk"
	vnet "github.com/warrenvm/warren/devices/virtio/net"
	"github.com/warrenvm/warren/devices/virtio/rng"
	"github.com/warrenvm/warren/devices/virtio/vsock"
	"github.com/warrenvm/warren/guestinit/agent"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmm/guestmem"
	"github.com/warrenvm/warren/vmm/hostprofile"
)

// vmOptions is what `warren run` builds a VM from, after flag parsing.
type vmOptions struct {
	memMiB, cpus int
	kernel       []byte
	initramfs    []byte
	cmdline      string
	console      io.Writer
	kvmPath      string
	log          *slog.Logger
	rng          bool // attach a virtio-rng device
	disks        []diskSpec
	tap          string // virtio-net on this tap device, when set
	mac          net.HardwareAddr
	vsock        string // virtio-vsock with its host unix socket here, when set
	cid          uint64 // the guest's vsock CID
}

// buildVM wires the VM and its devices: disks first (vda, vdb, ... in
// order), then the network device, then the entropy device, then vsock
// (listening on its unix socket before the guest boots). The returned
// close function closes the VM and then the device backends.
func buildVM(o vmOptions) (*vmm.VM, func(), error) {
	vm, _, closeAll, err := buildVMWithDevices(o)
	return vm, closeAll, err
}

// vmDevices are device models that callers reach after the build: tests
// read their counters and trigger vsock transport resets. Each is nil
// when not asked for.
type vmDevices struct {
	rng   *rng.Device
	vsock *vsock.Device
}

// buildVMWithDevices is buildVM that also returns some device models.
func buildVMWithDevices(o vmOptions) (_ *vmm.VM, d vmDevices, closeAll func(), err error) {
	profile := hostprofile.Detect("/sys/module")
	o.log.Debug("host profile", "profile", profile.String())
	var (
		devs    []vmm.VirtioSpec
		closers []func() error
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
	for i, disk := range o.disks {
		dev, err := blk.New(disk.path, blk.Options{ReadOnly: disk.readOnly, ID: fmt.Sprintf("warren%d", i)})
		if err != nil {
			return nil, d, nil, fmt.Errorf("--disk %s: %w", disk.path, err)
		}
		closers = append(closers, dev.Close)
		devs = append(devs, virtioSpec(fmt.Sprintf("blk%d", i), 1, dev, o.log))
	}
	if o.tap != "" {
		dev, err := vnet.New(o.tap, o.mac, vnet.Options{})
		if err != nil {
			return nil, d, nil, fmt.Errorf("--tap %s: %w", o.tap, err)
		}
		closers = append(closers, dev.Close)
		devs = append(devs, virtioSpec("net0", 2, dev, o.log))
	}
	if o.rng {
		d.rng = rng.New()
		devs = append(devs, virtioSpec("rng", 1, d.rng, o.log))
	}
	if o.vsock != "" {
		dev := &vsock.Device{CID: o.cid, UDSPath: o.vsock,
			Services: map[uint32]func(net.Conn){agent.SyncPort: agent.ServeSync}}
		if err := dev.Listen(); err != nil {
			return nil, d, nil, fmt.Errorf("--vsock %s: %w", o.vsock, err)
		}
		closers = append(closers, dev.Close)
		devs = append(devs, virtioSpec("vsock", 3, dev, o.log))
		d.vsock = dev
	}
	vm, err := vmm.New(vmm.Config{
		MemBytes: uint64(o.memMiB) << 20, CPUs: o.cpus, Kernel: o.kernel, Initramfs: o.initramfs,
		Cmdline: o.cmdline, Console: o.console, Profile: profile, KVMPath: o.kvmPath, Log: o.log,
		Virtio: devs,
	})
	if err != nil {
		return nil, d, nil, err
	}
	o.log.Debug("booting", "format", vm.Format().String(), "cmdline", vm.Cmdline())
	return vm, d, func() { vm.Close(); closeDevs() }, nil
}

// virtioSpec puts dev behind a virtio-mmio transport.
func virtioSpec(name string, queues int, dev virtio.Device, log *slog.Logger) vmm.VirtioSpec {
	return vmm.VirtioSpec{Name: name, Queues: queues,
		New: func(mem *guestmem.Memory, irq vmm.Signaller) (vmm.VirtioTransport, error) {
			return virtio.NewMMIO(name, dev, mem, irq, log), nil
		}}
}
