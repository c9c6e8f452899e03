// Package qemu drives the peer VMM of Warren's benchmarks: QEMU -M microvm
// booting the same kernel and initramfs as Warren, with virtio-rng and the
// kernel's vhost-vsock, controlled over QMP and cloned by migrating to a
// file and starting a new QEMU with -incoming from it.
package qemu

import (
	"context"
	"net"
	"strconv"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/bench/vsockpeer"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmm/boot"
	"github.com/warrenvm/warren/vmm/hostprofile"
)

// Guest is the VM QEMU runs.
type Guest struct {
	Binary            string // qemu-system-x86_64
	Kernel, Initramfs string
	MemMiB            int
	CID               int // the guest's vsock CID (vhost-vsock guest-cid)
	// GuestArgs are the kernel arguments besides Warren's base line and
	// the host profile's, as `warren run --cmdline` gets them.
	GuestArgs string
	// Disks are raw disk images attached as virtio-blk devices, in order
	// (/dev/vda, ...), each with QEMU's snapshot=on: the guest's writes
	// go to a temporary file, the image is never written.
	Disks []string
	// NoVsock leaves the vhost-vsock device out (hosts without
	// /dev/vhost-vsock; the guest is then driven on its console only).
	NoVsock bool
}

// Argv is QEMU's microvm with g: one vCPU, virtio-rng (Warren gives its
// guests one by default), g's disks and the kernel's vhost-vsock. With qmpPath, QMP
// is served on that unix socket. A restore appends -incoming to the same
// line.
func Argv(g Guest, qmpPath string) []string {
	var cmd boot.Cmdline // what warren boots with, less its virtio_mmio entries
	cmd.Add(vmm.BaseCmdline)
	cmd.Add(hostprofile.Detect("/sys/module").KernelArgs()...)
	cmd.Add(g.GuestArgs)
	argv := []string{g.Binary, "-M", "microvm,acpi=off", "-accel", "kvm", "-cpu", "host,-arch-capabilities",
		"-m", strconv.Itoa(g.MemMiB), "-smp", "1",
		"-nodefaults", "-no-user-config", "-nographic", "-serial", "stdio", "-monitor", "none",
		"-kernel", g.Kernel, "-initrd", g.Initramfs, "-append", cmd.String(),
		"-device", "virtio-rng-device"}
	for i, d := range g.Disks {
		id := "disk" + strconv.Itoa(i)
		argv = append(argv, "-drive", "id="+id+",file="+d+",format=raw,if=none,snapshot=on", "-device", "virtio-blk-device,drive="+id)
	}
	if !g.NoVsock {
		argv = append(argv, "-device", "vhost-vsock-device,guest-cid="+strconv.Itoa(g.CID))
	}
	if qmpPath != "" {
		argv = append(argv, "-qmp", "unix:"+qmpPath+",server=on,wait=off")
	}
	return argv
}

// AgentClient reaches the agent of the QEMU guest with CID cid over
// AF_VSOCK, each dial made by wrap(dial) when wrap is not nil (for
// example agentdial.Racing).
func AgentClient(cid uint32, wrap func(agentclient.DialFunc) agentclient.DialFunc) *agentclient.Client {
	dial := func(ctx context.Context) (net.Conn, error) {
		return vsockpeer.Dial(ctx, cid, agentwire.Port)
	}
	if wrap != nil {
		return agentclient.NewDial(wrap(dial))
	}
	return agentclient.NewDial(dial)
}
