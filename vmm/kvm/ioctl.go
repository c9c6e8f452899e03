// Package kvm is Warren's thin binding to the Linux KVM API (/dev/kvm) on
// x86_64, written on golang.org/x/sys/unix without cgo.
//
// The package mirrors the kernel's three file-descriptor levels: System (the
// /dev/kvm fd), VM (one virtual machine) and VCPU (one virtual CPU). Every
// method is a single ioctl; errors are *Error values that name the ioctl and
// carry the errno, so callers can test them with errors.Is(err, unix.EINTR).
//
// Concurrency: System and VM methods may be called from any goroutine. A VCPU
// must only be driven (Run, Get*/Set* of its state) by the one OS thread that
// owns it; the vmm package locks each vCPU goroutine to its thread. The single
// exception is Kick fields of the shared kvm_run page (ImmediateExit), which
// other threads may set to interrupt the owner.
package kvm

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

const kvmio = 0xAE

// Linux _IOC encoding for x86_64.
const (
	iocNone  = 0
	iocWrite = 1
	iocRead  = 2
)

func ioc(dir, nr, size uintptr) uintptr {
	return dir<<30 | size<<16 | kvmio<<8 | nr
}

func io(nr uintptr) uintptr           { return ioc(iocNone, nr, 0) }
func ior(nr, size uintptr) uintptr    { return ioc(iocRead, nr, size) }
func iow(nr, size uintptr) uintptr    { return ioc(iocWrite, nr, size) }
func iowr(nr, size uintptr) uintptr   { return ioc(iocRead|iocWrite, nr, size) }
func sizeOf[T any]() uintptr          { var v T; return unsafe.Sizeof(v) }
func ptr[T any](v *T) uintptr         { return uintptr(unsafe.Pointer(v)) }
func iorT[T any](nr uintptr) uintptr  { return ior(nr, sizeOf[T]()) }
func iowT[T any](nr uintptr) uintptr  { return iow(nr, sizeOf[T]()) }
func iowrT[T any](nr uintptr) uintptr { return iowr(nr, sizeOf[T]()) }

// Error is a failed KVM ioctl: the request's name and the errno it returned.
type Error struct {
	Op    string
	Errno unix.Errno
}

func (e *Error) Error() string { return fmt.Sprintf("kvm: %s: %v", e.Op, e.Errno) }

// Unwrap returns the errno, so errors.Is(err, unix.EINTR) works.
func (e *Error) Unwrap() error { return e.Errno }

// ioctl issues one ioctl and retries only where the kernel asks for it
// (EINTR is returned to the caller for KVM_RUN; other requests are retried).
func ioctl(fd int, op string, req, arg uintptr) (uintptr, error) {
	for {
		r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, arg)
		if errno == 0 {
			return r, nil
		}
		if errno == unix.EINTR && op != "KVM_RUN" {
			continue
		}
		return r, &Error{Op: op, Errno: errno}
	}
}
