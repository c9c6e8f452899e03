// Package kvm is Warren's thin binding to the Linux KVM API (/dev/kvm) on
// x86_64, written on golang.org/x/sys/unix without cgo.
//
// The package mirrors the kernel's three file-descriptor levels: System (the
// /dev/kvm fd), VM (one virtual machine) and VCPU (one virtual CPU). Every
// method is a single ioctl, and so are Get and Set, which read and write
// one piece of VM or vCPU state (a State: StateRegs, StateClock, ...);
// errors are *Error values that name the ioctl and carry the errno, so
// callers can test them with errors.Is(err, unix.EINTR).
//
// Concurrency: System and VM methods may be called from any goroutine. A VCPU
// must only be driven (Run, Get and Set of its state) by the one OS thread that
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

// ioctl issues one ioctl whose argument is a number, and retries only
// where the kernel asks for it (EINTR is returned to the caller for
// KVM_RUN; other requests are retried).
func ioctl(fd int, op string, req, arg uintptr) (uintptr, error) {
	for {
		r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, arg)
		if again, err := ioctlDone(op, errno); !again {
			return r, err
		}
	}
}

// ioctlPtr is ioctl for an argument that points to memory the kernel
// reads or writes. The pointer becomes a uintptr only in the system call's
// argument list, where the compiler keeps what it points to alive and in
// place (a uintptr made earlier may point to where a goroutine stack was
// before it grew).
func ioctlPtr(fd int, op string, req uintptr, arg unsafe.Pointer) (uintptr, error) {
	for {
		r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
		if again, err := ioctlDone(op, errno); !again {
			return r, err
		}
	}
}

// ioctlDone says whether an ioctl that returned errno is to be issued
// again, and otherwise its error.
func ioctlDone(op string, errno unix.Errno) (again bool, err error) {
	switch {
	case errno == 0:
		return false, nil
	case errno == unix.EINTR && op != "KVM_RUN":
		return true, nil
	}
	return false, &Error{Op: op, Errno: errno}
}

// set issues the _IOW request nr with a pointer to v (the plain KVM_SET_*
// methods, and the other requests that pass the kernel one structure).
func set[T any](fd int, op string, nr uintptr, v T) error {
	_, err := ioctlPtr(fd, op, iowT[T](nr), unsafe.Pointer(&v))
	return err
}

// entryList is a kernel structure made of a 32-bit count, 32 bits of
// padding and an array of E: struct kvm_msrs, struct kvm_cpuid2.
type entryList[E any] struct {
	buf     []uint64 // the structure; 64-bit words keep E's fields aligned
	entries []E      // its array, inside buf
}

// newEntryList makes a list with room for room entries and the count set
// to room.
func newEntryList[E any](room int) entryList[E] {
	buf := make([]uint64, 1+(max(room, 1)*int(sizeOf[E]())+7)/8)
	buf[0] = uint64(room)
	return entryList[E]{buf: buf, entries: unsafe.Slice((*E)(unsafe.Pointer(&buf[1])), room)}
}

// count is the structure's count field (the kernel may lower it).
func (l entryList[E]) count() int { return int(uint32(l.buf[0])) }

// ioctl issues req with the list as its argument.
func (l entryList[E]) ioctl(fd int, op string, req uintptr) (uintptr, error) {
	return ioctlPtr(fd, op, req, unsafe.Pointer(&l.buf[0]))
}

// sendEntries issues req with a list holding es, which must number at most
// limit (what names them in the error); the kernel's answer is in the
// returned list.
func sendEntries[E any](fd int, op string, req uintptr, es []E, limit int, what string) (entryList[E], uintptr, error) {
	if len(es) > limit {
		return entryList[E]{}, 0, fmt.Errorf("kvm: %s: %d %s, at most %d", op, len(es), what, limit)
	}
	l := newEntryList[E](len(es))
	copy(l.entries, es)
	r, err := l.ioctl(fd, op, req)
	return l, r, err
}
