package cli

import (
	"io"
	"log/slog"

	"github.com/warrenvm/warren/devices/virtio"
	"github.com/warrenvm/warren/devices/virtio/rng"
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
}

// buildVM wires the VM and its devices. The caller closes the VM.
func buildVM(o vmOptions) (*vmm.VM, error) {
	profile := hostprofile.Detect("/sys/module")
	o.log.Debug("host profile", "profile", profile.String())
	var devs []vmm.VirtioSpec
	if o.rng {
		devs = append(devs, virtioSpec("rng", 1, rng.New(), o.log))
	}
	vm, err := vmm.New(vmm.Config{
		MemBytes: uint64(o.memMiB) << 20, CPUs: o.cpus, Kernel: o.kernel, Initramfs: o.initramfs,
		Cmdline: o.cmdline, Console: o.console, Profile: profile, KVMPath: o.kvmPath, Log: o.log,
		Virtio: devs,
	})
	if err != nil {
		return nil, err
	}
	o.log.Debug("booting", "format", vm.Format().String(), "cmdline", vm.Cmdline())
	return vm, nil
}

// virtioSpec puts dev behind a virtio-mmio transport.
func virtioSpec(name string, queues int, dev virtio.Device, log *slog.Logger) vmm.VirtioSpec {
	return vmm.VirtioSpec{Name: name, Queues: queues,
		New: func(mem *guestmem.Memory, irq vmm.Signaller) (vmm.VirtioTransport, error) {
			return virtio.NewMMIO(name, dev, mem, irq, log), nil
		}}
}
