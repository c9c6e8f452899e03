package kvm

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DevicePath is where the KVM device node normally lives.
const DevicePath = "/dev/kvm"

// APIVersion is the only KVM API version this package speaks.
const APIVersion = 12

// System is an open /dev/kvm: the system-level file descriptor.
type System struct {
	fd int
}

// Open opens path (normally DevicePath) and checks the API version.
func Open(path string) (*System, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("kvm: open %s: %w", path, err)
	}
	s := &System{fd: fd}
	v, err := s.APIVersion()
	if err != nil {
		s.Close()
		return nil, err
	}
	if v != APIVersion {
		s.Close()
		return nil, fmt.Errorf("kvm: %s speaks API version %d, want %d", path, v, APIVersion)
	}
	return s, nil
}

// FD returns the raw descriptor.
func (s *System) FD() int { return s.fd }

// Close closes /dev/kvm. VMs created from it stay valid.
func (s *System) Close() error { return unix.Close(s.fd) }

// APIVersion is KVM_GET_API_VERSION.
func (s *System) APIVersion() (int, error) {
	r, err := ioctl(s.fd, "KVM_GET_API_VERSION", io(0x00), 0)
	return int(r), err
}

// CheckExtension is KVM_CHECK_EXTENSION on the system fd: 0 when the
// capability is absent, otherwise a capability-specific positive value.
func (s *System) CheckExtension(capability int) (int, error) {
	r, err := ioctl(s.fd, "KVM_CHECK_EXTENSION", io(0x03), uintptr(capability))
	return int(r), err
}

// VCPUMmapSize is KVM_GET_VCPU_MMAP_SIZE: the size of each vCPU's kvm_run mapping.
func (s *System) VCPUMmapSize() (int, error) {
	r, err := ioctl(s.fd, "KVM_GET_VCPU_MMAP_SIZE", io(0x04), 0)
	return int(r), err
}

const maxCPUIDEntries = 256

// SupportedCPUID is KVM_GET_SUPPORTED_CPUID: the CPUID leaves KVM can offer.
func (s *System) SupportedCPUID() ([]CPUIDEntry, error) {
	return getCPUID(s.fd, "KVM_GET_SUPPORTED_CPUID", 0x05)
}

// getCPUID issues request nr (KVM_GET_SUPPORTED_CPUID, KVM_GET_CPUID2)
// with a struct kvm_cpuid2 that has room for maxCPUIDEntries entries, and
// returns the entries the kernel filled in.
func getCPUID(fd int, op string, nr uintptr) ([]CPUIDEntry, error) {
	l := newEntryList[CPUIDEntry](maxCPUIDEntries)
	if _, err := l.ioctl(fd, op, iowr(nr, 8)); err != nil {
		return nil, err
	}
	return append([]CPUIDEntry(nil), l.entries[:l.count()]...), nil
}

// MSRIndexList is KVM_GET_MSR_INDEX_LIST: the MSRs that KVM saves and restores.
func (s *System) MSRIndexList() ([]uint32, error) {
	const max = 1024
	var b struct {
		N       uint32
		Indices [max]uint32
	}
	b.N = max
	if _, err := ioctlPtr(s.fd, "KVM_GET_MSR_INDEX_LIST", iowr(0x02, 4), unsafe.Pointer(&b)); err != nil {
		return nil, err
	}
	return append([]uint32(nil), b.Indices[:b.N]...), nil
}

// CreateVM is KVM_CREATE_VM (machine type 0).
func (s *System) CreateVM() (*VM, error) {
	r, err := ioctl(s.fd, "KVM_CREATE_VM", io(0x01), 0)
	if err != nil {
		return nil, err
	}
	size, err := s.VCPUMmapSize()
	if err != nil {
		unix.Close(int(r))
		return nil, err
	}
	return &VM{fd: int(r), mmapSize: size}, nil
}
