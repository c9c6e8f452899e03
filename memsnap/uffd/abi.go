package uffd

// The userfaultfd ABI this package uses, which golang.org/x/sys/unix does
// not define: constants and structures from include/uapi/linux/userfaultfd.h
// (Linux 6.x), with the ioctl numbers as _IOC encodes them on x86-64
// (dir<<30 | size<<16 | type<<8 | nr). The sizes are checked by
// TestABISizes; vmmproc/jail's seccomp table names the same numbers.

// UFFD_API is the API version UFFDIO_API negotiates.
const uffdAPI = 0xAA

// userfaultfd(2) flags. UFFD_USER_MODE_ONLY is never set here: KVM's
// faults on guest memory are kernel-mode faults (get_user_pages), which a
// user-mode-only descriptor would not report.
const (
	uffdUserModeOnly = 1 // UFFD_USER_MODE_ONLY
)

// Features (struct uffdio_api.features).
const (
	// UFFD_FEATURE_MISSING_SHMEM: MISSING-mode registration of shmem
	// (memfd) mappings.
	featureMissingShmem = 1 << 5
)

// Registration modes (struct uffdio_register.mode).
const (
	registerModeMissing = 1 << 0 // UFFDIO_REGISTER_MODE_MISSING
)

// ioctl command numbers (the _UFFDIO_* bit positions, also the bits of
// struct uffdio_register.ioctls and uffdio_api.ioctls).
const (
	cmdRegister   = 0x00 // _UFFDIO_REGISTER
	cmdUnregister = 0x01 // _UFFDIO_UNREGISTER
	cmdWake       = 0x02 // _UFFDIO_WAKE
	cmdCopy       = 0x03 // _UFFDIO_COPY
	cmdZeropage   = 0x04 // _UFFDIO_ZEROPAGE
	cmdAPI        = 0x3F // _UFFDIO_API
)

// Copy and zeropage modes.
const (
	copyModeDontWake     = 1 << 0 // UFFDIO_COPY_MODE_DONTWAKE
	zeropageModeDontWake = 1 << 0 // UFFDIO_ZEROPAGE_MODE_DONTWAKE
)

// Events (struct uffd_msg.event) and page-fault flags.
const (
	eventPagefault     = 0x12   // UFFD_EVENT_PAGEFAULT
	pagefaultFlagWrite = 1 << 0 // UFFD_PAGEFAULT_FLAG_WRITE
)

// uffdioAPI is struct uffdio_api (24 bytes).
type uffdioAPI struct {
	API      uint64
	Features uint64
	Ioctls   uint64
}

// uffdioRange is struct uffdio_range (16 bytes).
type uffdioRange struct {
	Start uint64
	Len   uint64
}

// uffdioRegister is struct uffdio_register (32 bytes).
type uffdioRegister struct {
	Range  uffdioRange
	Mode   uint64
	Ioctls uint64
}

// uffdioCopy is struct uffdio_copy (40 bytes). Copy is written by the
// kernel: the bytes copied, or a negated errno.
type uffdioCopy struct {
	Dst  uint64
	Src  uint64
	Len  uint64
	Mode uint64
	Copy int64
}

// uffdioZeropage is struct uffdio_zeropage (32 bytes). Zeropage is written
// by the kernel like uffdioCopy.Copy.
type uffdioZeropage struct {
	Range    uffdioRange
	Mode     uint64
	Zeropage int64
}

// msgSize is sizeof(struct uffd_msg): an event byte, reserved bytes to 8,
// then a 24-byte union; for UFFD_EVENT_PAGEFAULT the union starts with
// __u64 flags and __u64 address.
const (
	msgSize          = 32
	msgOffEvent      = 0
	msgOffFaultFlags = 8
	msgOffFaultAddr  = 16
)

// _IOC encoding (x86-64, asm-generic/ioctl.h).
const (
	iocNone    = 0
	iocWrite   = 1
	iocRead    = 2
	uffdioType = 0xAA // UFFDIO
)

// The ioctl requests. A running server issues IoctlCopy, IoctlZeropage,
// IoctlWake and IoctlUnregister (vmmproc/jail's seccomp allowlist has
// exactly those); IoctlAPI and IoctlRegister (and the userfaultfd syscall
// itself) are issued by Start, before a VMM enters its jail; IoctlNew only
// when the syscall is refused and /dev/userfaultfd is used instead.
const (
	// IoctlAPI is UFFDIO_API: _IOWR(UFFDIO, _UFFDIO_API, struct uffdio_api).
	IoctlAPI = (iocRead|iocWrite)<<30 | 24<<16 | uffdioType<<8 | cmdAPI
	// IoctlRegister is UFFDIO_REGISTER: _IOWR(UFFDIO, _UFFDIO_REGISTER,
	// struct uffdio_register).
	IoctlRegister = (iocRead|iocWrite)<<30 | 32<<16 | uffdioType<<8 | cmdRegister
	// IoctlUnregister is UFFDIO_UNREGISTER: _IOR(UFFDIO, _UFFDIO_UNREGISTER,
	// struct uffdio_range).
	IoctlUnregister = iocRead<<30 | 16<<16 | uffdioType<<8 | cmdUnregister
	// IoctlWake is UFFDIO_WAKE: _IOR(UFFDIO, _UFFDIO_WAKE, struct uffdio_range).
	IoctlWake = iocRead<<30 | 16<<16 | uffdioType<<8 | cmdWake
	// IoctlCopy is UFFDIO_COPY: _IOWR(UFFDIO, _UFFDIO_COPY, struct uffdio_copy).
	IoctlCopy = (iocRead|iocWrite)<<30 | 40<<16 | uffdioType<<8 | cmdCopy
	// IoctlZeropage is UFFDIO_ZEROPAGE: _IOWR(UFFDIO, _UFFDIO_ZEROPAGE,
	// struct uffdio_zeropage).
	IoctlZeropage = (iocRead|iocWrite)<<30 | 32<<16 | uffdioType<<8 | cmdZeropage
	// IoctlNew is USERFAULTFD_IOC_NEW: _IO(USERFAULTFD_IOC, 0x00) on
	// /dev/userfaultfd (USERFAULTFD_IOC is 0xAA as well).
	IoctlNew = iocNone<<30 | 0<<16 | uffdioType<<8 | 0x00
)
