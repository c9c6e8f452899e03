package uffd

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrUnsupported is wrapped by Start's error when this host cannot serve
// guest memory by userfaultfd (the message says which step failed); the
// caller then restores another way.
var ErrUnsupported = errors.New("userfaultfd restore unsupported")

// devPath is the userfaultfd device tried when the syscall is refused.
const devPath = "/dev/userfaultfd"

// ioctl issues request req on fd with the argument at arg.
func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if e != 0 {
		return e
	}
	return nil
}

// newFD returns a new userfaultfd, close-on-exec and non-blocking, that
// reports kernel-mode faults too: from userfaultfd(2), else from
// /dev/userfaultfd's USERFAULTFD_IOC_NEW. how says which.
func newFD() (fd int, how string, err error) {
	const flags = unix.O_CLOEXEC | unix.O_NONBLOCK // never uffdUserModeOnly
	r, _, e := unix.Syscall(unix.SYS_USERFAULTFD, flags, 0, 0)
	if e == 0 {
		return int(r), "userfaultfd(2)", nil
	}
	sysErr := e
	dev, err := unix.Open(devPath, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", fmt.Errorf("userfaultfd(2): %v; %s: %v: %w", sysErr, devPath, err, ErrUnsupported)
	}
	defer unix.Close(dev)
	r, _, e = unix.Syscall(unix.SYS_IOCTL, uintptr(dev), IoctlNew, flags)
	if e != 0 {
		return -1, "", fmt.Errorf("userfaultfd(2): %v; %s USERFAULTFD_IOC_NEW: %v: %w", sysErr, devPath, e, ErrUnsupported)
	}
	return int(r), devPath, nil
}

// open makes a userfaultfd, negotiates the API with the features a memfd
// needs and registers [base, base+size) in MISSING mode; the registration
// must offer UFFDIO_COPY, UFFDIO_ZEROPAGE and UFFDIO_WAKE. Errors wrap
// ErrUnsupported; nothing stays open or registered after one.
func open(base uintptr, size uint64) (fd int, how string, err error) {
	fd, how, err = newFD()
	if err != nil {
		return -1, "", err
	}
	defer func() {
		if err != nil {
			unix.Close(fd)
		}
	}()
	api := uffdioAPI{API: uffdAPI, Features: featureMissingShmem}
	if err := ioctl(fd, IoctlAPI, unsafe.Pointer(&api)); err != nil {
		return -1, "", fmt.Errorf("UFFDIO_API (features MISSING_SHMEM) on a descriptor from %s: %v: %w", how, err, ErrUnsupported)
	}
	if api.Features&featureMissingShmem == 0 {
		return -1, "", fmt.Errorf("UFFDIO_API: no UFFD_FEATURE_MISSING_SHMEM (features %#x): %w", api.Features, ErrUnsupported)
	}
	reg := uffdioRegister{Range: uffdioRange{Start: uint64(base), Len: size}, Mode: registerModeMissing}
	if err := ioctl(fd, IoctlRegister, unsafe.Pointer(&reg)); err != nil {
		return -1, "", fmt.Errorf("UFFDIO_REGISTER of %d bytes of guest memory (MISSING): %v: %w", size, err, ErrUnsupported)
	}
	const need = 1<<cmdCopy | 1<<cmdZeropage | 1<<cmdWake
	if reg.Ioctls&need != need {
		unregister(fd, base, size)
		return -1, "", fmt.Errorf("UFFDIO_REGISTER offers ioctls %#x, without UFFDIO_COPY, UFFDIO_ZEROPAGE or UFFDIO_WAKE: %w", reg.Ioctls, ErrUnsupported)
	}
	return fd, how, nil
}

// unregister ends fd's registration of [base, base+size); the kernel wakes
// the faults still waiting there, which then see the memfd as it is.
func unregister(fd int, base uintptr, size uint64) error {
	r := uffdioRange{Start: uint64(base), Len: size}
	if err := ioctl(fd, IoctlUnregister, unsafe.Pointer(&r)); err != nil {
		return fmt.Errorf("uffd: UFFDIO_UNREGISTER: %w", err)
	}
	return nil
}
