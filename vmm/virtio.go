package vmm

import (
	"encoding/binary"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/vmm/guestmem"
	"github.com/warrenvm/warren/vmm/kvm"
)

// Where virtio-mmio devices go: one 4 KiB window each from VirtioMMIOBase
// (inside the 32-bit MMIO hole), one ISA interrupt line each from
// VirtioFirstGSI (4 is COM1).
const (
	VirtioMMIOBase   = 0xd000_0000
	VirtioMMIOSize   = 0x1000
	VirtioFirstGSI   = 5
	MaxVirtioDevices = 16 - VirtioFirstGSI
	virtioNotifyReg  = 0x050
)

// VirtioTransport is a virtio-mmio device as the VM sees it: a register
// window and a way to deliver queue notifications.
// devices/virtio.MMIO implements it.
type VirtioTransport interface {
	Device
	// Notify delivers a driver notification for a queue; it must not block.
	Notify(queue uint32)
	// Shutdown stops the device's workers; called when the VM is closed.
	Shutdown()
}

// Signaller raises a device's interrupt line.
type Signaller interface {
	Signal() error
}

// VirtioSpec asks for one virtio-mmio device.
type VirtioSpec struct {
	Name   string
	Queues int // notifications of queues 0..Queues-1 go through ioeventfds
	// New builds the transport once guest memory exists.
	New func(mem *guestmem.Memory, irq Signaller) (VirtioTransport, error)
}

// eventfdSignaller raises an interrupt through a KVM irqfd.
type eventfdSignaller struct{ fd int }

func (e eventfdSignaller) Signal() error {
	var one [8]byte
	binary.LittleEndian.PutUint64(one[:], 1)
	_, err := unix.Write(e.fd, one[:])
	if err == unix.EAGAIN { // counter saturated: an interrupt is pending anyway
		return nil
	}
	return err
}

// virtioCmdline returns the kernel arguments that declare device i.
func virtioCmdline(i int) string {
	return fmt.Sprintf("virtio_mmio.device=4K@%#x:%d", VirtioMMIOBase+i*VirtioMMIOSize, VirtioFirstGSI+i)
}

// attachVirtio creates the devices: an irqfd for each interrupt line, an
// ioeventfd per queue on the QueueNotify register (falling back to MMIO
// exits where KVM refuses one), and the register window on the MMIO bus.
func (v *VM) attachVirtio() error {
	for i, spec := range v.cfg.Virtio {
		base := uint64(VirtioMMIOBase + i*VirtioMMIOSize)
		gsi := uint32(VirtioFirstGSI + i)
		irqfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			return fmt.Errorf("vmm: %s: eventfd: %w", spec.Name, err)
		}
		v.closers = append(v.closers, func() { unix.Close(irqfd) })
		if err := v.vm.IRQFD(irqfd, gsi); err != nil {
			return fmt.Errorf("vmm: %s: %w", spec.Name, err)
		}
		t, err := spec.New(v.mem, eventfdSignaller{irqfd})
		if err != nil {
			return fmt.Errorf("vmm: %s: %w", spec.Name, err)
		}
		v.closers = append(v.closers, t.Shutdown)
		v.transports = append(v.transports, t)
		if err := v.MMIO.Add(base, VirtioMMIOSize, t); err != nil {
			return err
		}
		for q := 0; q < spec.Queues; q++ {
			if err := v.notifyFD(t, base, uint32(q)); err != nil {
				v.log.Debug("ioeventfd refused; queue notifications use MMIO exits", "device", spec.Name, "queue", q, "err", err)
			}
		}
	}
	return nil
}

// notifyFD routes guest writes of q to the QueueNotify register of the
// device at base through an eventfd to t.Notify, without a VM exit to us.
func (v *VM) notifyFD(t VirtioTransport, base uint64, q uint32) error {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return err
	}
	if err := v.vm.IOEventFD(kvm.IOEventFD{
		Addr: base + virtioNotifyReg, Len: 4, FD: int32(fd),
		DataMatch: uint64(q), Flags: kvm.IOEventFDDataMatch,
	}); err != nil {
		unix.Close(fd)
		return err
	}
	f := os.NewFile(uintptr(fd), "ioeventfd") // non-blocking: reads park in the poller
	v.closers = append(v.closers, func() { f.Close() })
	go func() {
		buf := make([]byte, 8)
		for {
			if _, err := f.Read(buf); err != nil {
				return // closed with the VM
			}
			t.Notify(q)
		}
	}()
	return nil
}

// pendingRaiser is a transport that can re-signal an interrupt it raised
// but the guest has not acknowledged (virtio.MMIO does).
type pendingRaiser interface{ RaisePending() }

// raisePendingVirtio re-signals the virtio interrupts still pending once a
// restored VM's LAPICs hold their saved state: a device restored and
// activated before that may have signalled into an irqchip whose LAPIC
// state was then overwritten, and with event-idx the device would not
// signal again until the driver, which never saw the first, acknowledges.
func (v *VM) raisePendingVirtio() {
	for _, t := range v.transports {
		if r, ok := t.(pendingRaiser); ok {
			r.RaisePending()
		}
	}
}
