package kvm

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// VCPU is one virtual CPU: its fd and its mapped kvm_run page.
//
// Thread rule: KVM requires that a vCPU is run from one thread; every method
// except SetImmediateExit (and Get and Set on the vCPU) must be called only
// from the OS thread that owns the vCPU (runtime.LockOSThread), and never
// concurrently with Run.
type VCPU struct {
	fd  int
	id  int
	run []byte // the shared kvm_run page; owned by the vCPU thread
}

// ID is the vCPU index given to CreateVCPU (also its APIC ID in Warren).
func (c *VCPU) ID() int { return c.id }

// FD returns the raw descriptor.
func (c *VCPU) FD() int { return c.fd }

// Close unmaps kvm_run and closes the vCPU fd.
func (c *VCPU) Close() error {
	if c.run != nil {
		unix.Munmap(c.run)
		c.run = nil
	}
	return unix.Close(c.fd)
}

// Run is KVM_RUN. It returns an error wrapping unix.EINTR when a signal
// interrupted it (or ImmediateExit was set); the exit is then in ExitReason
// as ExitIntr or unchanged.
func (c *VCPU) Run() error {
	_, err := ioctl(c.fd, "KVM_RUN", io(0x80), 0)
	return err
}

// kvm_run field offsets.
const (
	runImmediateExit = 1
	runExitReason    = 8
	runIfFlag        = 13
	runUnion         = 32
)

// SetImmediateExit sets kvm_run.immediate_exit: while it is 1, KVM_RUN
// returns EINTR at once. Safe to call from any thread (it is how other
// threads make a vCPU leave the guest, together with a signal).
func (c *VCPU) SetImmediateExit(on bool) {
	p := (*uint32)(unsafe.Pointer(&c.run[0])) // bytes 0..3: request_interrupt_window, immediate_exit, padding
	for {
		old := atomic.LoadUint32(p)
		nw := old &^ (0xff << 8)
		if on {
			nw |= 1 << 8
		}
		if atomic.CompareAndSwapUint32(p, old, nw) {
			return
		}
	}
}

// ExitReason returns kvm_run.exit_reason after Run.
func (c *VCPU) ExitReason() uint32 {
	return binary.LittleEndian.Uint32(c.run[runExitReason:])
}

// IOExit describes a KVM_EXIT_IO: Count repetitions of Size bytes at Port.
// Data aliases the kvm_run page: for ExitIOIn the VMM fills it before the
// next Run; for ExitIOOut it holds what the guest wrote.
type IOExit struct {
	Direction uint8
	Size      uint8
	Port      uint16
	Count     uint32
	Data      []byte
}

// IO decodes the current exit as port I/O. It validates the kernel-supplied
// offset and length against the mapping.
func (c *VCPU) IO() (IOExit, error) {
	u := c.run[runUnion:]
	e := IOExit{Direction: u[0], Size: u[1], Port: binary.LittleEndian.Uint16(u[2:]),
		Count: binary.LittleEndian.Uint32(u[4:])}
	off := binary.LittleEndian.Uint64(u[8:])
	n := uint64(e.Size) * uint64(e.Count)
	if off > uint64(len(c.run)) || n > uint64(len(c.run))-off {
		return e, fmt.Errorf("kvm: io exit data [%d,+%d) outside kvm_run", off, n)
	}
	e.Data = c.run[off : off+n]
	return e, nil
}

// MMIOExit describes a KVM_EXIT_MMIO. Data aliases kvm_run: for a read the
// VMM fills Data[:Len] before the next Run.
type MMIOExit struct {
	Addr    uint64
	Data    []byte
	Len     uint32
	IsWrite bool
}

// MMIO decodes the current exit as an MMIO access.
func (c *VCPU) MMIO() MMIOExit {
	u := c.run[runUnion:]
	l := binary.LittleEndian.Uint32(u[16:])
	if l > 8 {
		l = 8
	}
	return MMIOExit{Addr: binary.LittleEndian.Uint64(u[0:]), Data: u[8 : 8+l], Len: l, IsWrite: u[20] != 0}
}

// InternalError returns the suberror and data words of a
// KVM_EXIT_INTERNAL_ERROR.
func (c *VCPU) InternalError() (suberror uint32, data []uint64) {
	u := c.run[runUnion:]
	sub := binary.LittleEndian.Uint32(u[0:])
	n := binary.LittleEndian.Uint32(u[4:])
	if n > 16 {
		n = 16
	}
	for i := uint32(0); i < n; i++ {
		data = append(data, binary.LittleEndian.Uint64(u[8+8*i:]))
	}
	return sub, data
}

// SystemEvent returns the type of a KVM_EXIT_SYSTEM_EVENT.
func (c *VCPU) SystemEvent() uint32 {
	return binary.LittleEndian.Uint32(c.run[runUnion:])
}

// FailEntry returns the hardware reason of a KVM_EXIT_FAIL_ENTRY.
func (c *VCPU) FailEntry() uint64 {
	return binary.LittleEndian.Uint64(c.run[runUnion:])
}

// GetXsave2 is KVM_GET_XSAVE2: size is the value of
// CheckExtension(CapXSave2) (at least 4096); the returned slice has that size.
func (c *VCPU) GetXsave2(size int) ([]byte, error) {
	if size < 4096 {
		size = 4096
	}
	buf := make([]uint32, (size+3)/4)
	_, err := ioctlPtr(c.fd, "KVM_GET_XSAVE2", iorT[Xsave](0xcf), unsafe.Pointer(&buf[0]))
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), size), nil
}

// SetXsave is KVM_SET_XSAVE; data may be longer than 4 KiB when it came from
// GetXsave2.
func (c *VCPU) SetXsave(data []byte) error {
	if len(data) < 4096 {
		return fmt.Errorf("kvm: KVM_SET_XSAVE: %d bytes, want at least 4096", len(data))
	}
	buf := make([]uint32, (len(data)+3)/4)
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), len(buf)*4), data)
	_, err := ioctlPtr(c.fd, "KVM_SET_XSAVE", iowT[Xsave](0xa5), unsafe.Pointer(&buf[0]))
	return err
}

const maxMSRs = 512

// GetMSRs is KVM_GET_MSRS: fills Data for each entry's Index. It returns the
// entries read; KVM stops at the first MSR it cannot read, so the result may
// be shorter than the input.
func (c *VCPU) GetMSRs(indices []uint32) ([]MSREntry, error) {
	es := make([]MSREntry, len(indices))
	for i, idx := range indices {
		es[i].Index = idx
	}
	l, r, err := sendEntries(c.fd, "KVM_GET_MSRS", iowr(0x88, 8), es, maxMSRs, "MSRs")
	if err != nil {
		return nil, err
	}
	return append([]MSREntry(nil), l.entries[:r]...), nil
}

// SetMSRs is KVM_SET_MSRS; it fails unless every entry was written.
func (c *VCPU) SetMSRs(entries []MSREntry) error {
	_, r, err := sendEntries(c.fd, "KVM_SET_MSRS", iow(0x89, 8), entries, maxMSRs, "MSRs")
	if err != nil {
		return err
	}
	if int(r) != len(entries) {
		return fmt.Errorf("kvm: KVM_SET_MSRS: MSR %#x refused (%d of %d set)", entries[r].Index, r, len(entries))
	}
	return nil
}

// SetCPUID2 is KVM_SET_CPUID2.
func (c *VCPU) SetCPUID2(entries []CPUIDEntry) error {
	_, _, err := sendEntries(c.fd, "KVM_SET_CPUID2", iow(0x90, 8), entries, maxCPUIDEntries, "entries")
	return err
}

// GetCPUID2 is KVM_GET_CPUID2: the table last set.
func (c *VCPU) GetCPUID2() ([]CPUIDEntry, error) {
	return getCPUID(c.fd, "KVM_GET_CPUID2", 0x91)
}

// GetTSCKHz is KVM_GET_TSC_KHZ.
func (c *VCPU) GetTSCKHz() (uint32, error) {
	r, err := ioctl(c.fd, "KVM_GET_TSC_KHZ", io(0xa3), 0)
	return uint32(r), err
}

// SetTSCKHz is KVM_SET_TSC_KHZ.
func (c *VCPU) SetTSCKHz(khz uint32) error {
	_, err := ioctl(c.fd, "KVM_SET_TSC_KHZ", io(0xa2), uintptr(khz))
	return err
}
