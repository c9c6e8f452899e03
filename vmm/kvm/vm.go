package kvm

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// VM is one KVM virtual machine (the fd returned by KVM_CREATE_VM).
// Its methods may be called from any goroutine.
type VM struct {
	fd       int
	mmapSize int
}

// FD returns the raw descriptor.
func (vm *VM) FD() int { return vm.fd }

// Close closes the VM fd. The kernel frees the VM once its vCPU fds are
// closed too.
func (vm *VM) Close() error { return unix.Close(vm.fd) }

// CheckExtension is KVM_CHECK_EXTENSION on the VM fd.
func (vm *VM) CheckExtension(capability int) (int, error) {
	r, err := ioctl(vm.fd, "KVM_CHECK_EXTENSION", io(0x03), uintptr(capability))
	return int(r), err
}

// EnableCap is KVM_ENABLE_CAP on the VM fd with up to four arguments.
func (vm *VM) EnableCap(capability uint32, args ...uint64) error {
	c := enableCap{Cap: capability}
	copy(c.Args[:], args)
	return set(vm.fd, fmt.Sprintf("KVM_ENABLE_CAP(%d)", capability), 0xa3, c)
}

// SetUserMemoryRegion is KVM_SET_USER_MEMORY_REGION. A region of size 0
// deletes the slot.
func (vm *VM) SetUserMemoryRegion(r UserspaceMemoryRegion) error {
	return set(vm.fd, "KVM_SET_USER_MEMORY_REGION", 0x46, r)
}

// SetTSSAddr is KVM_SET_TSS_ADDR: three pages of guest physical space KVM
// needs on Intel hosts. It must not overlap RAM or devices.
func (vm *VM) SetTSSAddr(addr uint64) error {
	_, err := ioctl(vm.fd, "KVM_SET_TSS_ADDR", io(0x47), uintptr(addr))
	return err
}

// SetIdentityMapAddr is KVM_SET_IDENTITY_MAP_ADDR (one page, Intel hosts).
func (vm *VM) SetIdentityMapAddr(addr uint64) error {
	return set(vm.fd, "KVM_SET_IDENTITY_MAP_ADDR", 0x48, addr)
}

// CreateIRQChip is KVM_CREATE_IRQCHIP: in-kernel PIC, IOAPIC and local APICs.
func (vm *VM) CreateIRQChip() error {
	_, err := ioctl(vm.fd, "KVM_CREATE_IRQCHIP", io(0x60), 0)
	return err
}

// GetIRQChip is KVM_GET_IRQCHIP for chip (IRQChipPICMaster, ...).
func (vm *VM) GetIRQChip(chip uint32) (IRQChip, error) {
	c := IRQChip{ChipID: chip}
	_, err := ioctlPtr(vm.fd, "KVM_GET_IRQCHIP", iowrT[IRQChip](0x62), unsafe.Pointer(&c))
	return c, err
}

// SetIRQChip is KVM_SET_IRQCHIP.
func (vm *VM) SetIRQChip(c IRQChip) error {
	// The kernel header declares KVM_SET_IRQCHIP with _IOR.
	_, err := ioctlPtr(vm.fd, "KVM_SET_IRQCHIP", iorT[IRQChip](0x63), unsafe.Pointer(&c))
	return err
}

// CreatePIT2 is KVM_CREATE_PIT2: an in-kernel i8254 timer.
func (vm *VM) CreatePIT2(flags uint32) error {
	return set(vm.fd, "KVM_CREATE_PIT2", 0x77, PITConfig{Flags: flags})
}

// IRQLine is KVM_IRQ_LINE: sets the level of a GSI on the in-kernel irqchip.
func (vm *VM) IRQLine(gsi uint32, high bool) error {
	l := irqLevel{IRQ: gsi}
	if high {
		l.Level = 1
	}
	return set(vm.fd, "KVM_IRQ_LINE", 0x61, l)
}

// IRQFD is KVM_IRQFD: signalling eventfd fd raises gsi.
func (vm *VM) IRQFD(fd int, gsi uint32) error {
	return set(vm.fd, "KVM_IRQFD", 0x76, IRQFD{FD: uint32(fd), GSI: gsi})
}

// IRQFDDeassign removes an irqfd set up by IRQFD.
func (vm *VM) IRQFDDeassign(fd int, gsi uint32) error {
	return set(vm.fd, "KVM_IRQFD(deassign)", 0x76, IRQFD{FD: uint32(fd), GSI: gsi, Flags: IRQFDDeassign})
}

// IOEventFD is KVM_IOEVENTFD: a guest write of length len to addr (MMIO, or a
// port with IOEventFDPIO) signals fd instead of exiting to userspace. With
// IOEventFDDataMatch only writes of dataMatch do.
func (vm *VM) IOEventFD(e IOEventFD) error {
	return set(vm.fd, "KVM_IOEVENTFD", 0x79, e)
}

// GetDirtyLog is KVM_GET_DIRTY_LOG: fills bitmap (one bit per 4 KiB page of
// the slot, little-endian 64-bit words) with the pages written since the last
// call. With manual protection enabled the pages stay dirty-tracked until
// ClearDirtyLog.
func (vm *VM) GetDirtyLog(slot uint32, bitmap []uint64) error {
	if len(bitmap) == 0 {
		return fmt.Errorf("kvm: KVM_GET_DIRTY_LOG: empty bitmap")
	}
	d := dirtyLog{Slot: slot, Bitmap: uint64(uintptr(unsafe.Pointer(&bitmap[0])))}
	return set(vm.fd, "KVM_GET_DIRTY_LOG", 0x42, d)
}

// ClearDirtyLog is KVM_CLEAR_DIRTY_LOG (needs CapManualDirtyLogProtect2):
// re-protects the pages set in bitmap, which covers numPages pages starting
// at firstPage (both multiples of 64, except a range that ends the slot).
func (vm *VM) ClearDirtyLog(slot uint32, firstPage uint64, numPages uint32, bitmap []uint64) error {
	if len(bitmap) == 0 {
		return fmt.Errorf("kvm: KVM_CLEAR_DIRTY_LOG: empty bitmap")
	}
	c := clearDirtyLog{Slot: slot, NumPages: numPages, FirstPage: firstPage,
		Bitmap: uint64(uintptr(unsafe.Pointer(&bitmap[0])))}
	_, err := ioctlPtr(vm.fd, "KVM_CLEAR_DIRTY_LOG", iowrT[clearDirtyLog](0xc0), unsafe.Pointer(&c))
	return err
}

// CreateVCPU is KVM_CREATE_VCPU, and maps the vCPU's kvm_run page.
func (vm *VM) CreateVCPU(id int) (*VCPU, error) {
	r, err := ioctl(vm.fd, "KVM_CREATE_VCPU", io(0x41), uintptr(id))
	if err != nil {
		return nil, err
	}
	fd := int(r)
	mem, err := unix.Mmap(fd, 0, vm.mmapSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("kvm: mmap kvm_run of vcpu %d: %w", id, err)
	}
	return &VCPU{fd: fd, id: id, run: mem}, nil
}
