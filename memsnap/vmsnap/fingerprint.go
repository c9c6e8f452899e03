package vmsnap

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/warrenvm/warren/vmm/hostprofile"
	"github.com/warrenvm/warren/vmm/kvm"
)

// ErrIncompatibleCPU is wrapped by Load's refusal of a snapshot taken on a
// host whose fingerprint differs from this one's.
var ErrIncompatibleCPU = errors.New("incompatible CPU")

// Fingerprint identifies what a snapshot's vCPU state depends on: the host
// profile kind and the CPUID leaves KVM supports. It is stored, as JSON, in
// the state file's header and in every memory layer, and compared byte for
// byte on restore.
type Fingerprint struct {
	Profile hostprofile.Kind `json:"profile"`
	// CPUID is the SHA-256, in hex, of KVM_GET_SUPPORTED_CPUID (CPUIDHash).
	CPUID string `json:"cpuid_sha256"`
}

// Encode returns f's canonical bytes.
func (f Fingerprint) Encode() []byte {
	b, _ := json.Marshal(f) // two strings: cannot fail
	return b
}

// FingerprintSource returns the restoring host's fingerprint (encoded);
// HostFingerprint is the real one, tests inject others.
type FingerprintSource func() ([]byte, error)

// CPUIDHash is the SHA-256 of the CPUID entries sorted by function and
// index, each as seven little-endian 32-bit words (function, index, flags,
// EAX, EBX, ECX, EDX), after clearing the fields that name the host CPU the
// ioctl happened to run on (perCPU): KVM fills some leaves from the
// executing CPU, so they differ between two calls on one host.
func CPUIDHash(entries []kvm.CPUIDEntry) string {
	es := slices.Clone(entries)
	for i := range es {
		perCPU(&es[i])
	}
	slices.SortFunc(es, func(a, b kvm.CPUIDEntry) int {
		return cmp.Or(cmp.Compare(a.Function, b.Function), cmp.Compare(a.Index, b.Index))
	})
	h := sha256.New()
	for _, e := range es {
		var w [28]byte
		for i, v := range []uint32{e.Function, e.Index, e.Flags, e.EAX, e.EBX, e.ECX, e.EDX} {
			binary.LittleEndian.PutUint32(w[4*i:], v)
		}
		h.Write(w[:])
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

// perCPU clears the fields of e that identify the executing host CPU
// rather than what KVM supports: the initial APIC ID (leaf 1 EBX[31:24]),
// the x2APIC ID (leaves 0xB and 0x1F EDX) and AMD's extended APIC, core
// and node IDs (leaf 0x8000001E).
func perCPU(e *kvm.CPUIDEntry) {
	switch e.Function {
	case 0x1:
		e.EBX &^= 0xff000000
	case 0xb, 0x1f:
		e.EDX = 0
	case 0x8000001e:
		e.EAX = 0
		e.EBX &^= 0xff
		e.ECX &^= 0xff
	}
}

// HostFingerprint computes this host's fingerprint from the KVM device at
// kvmPath ("" means /dev/kvm) and profile, without creating a VM.
func HostFingerprint(kvmPath string, profile hostprofile.Profile) ([]byte, error) {
	if kvmPath == "" {
		kvmPath = kvm.DevicePath
	}
	sys, err := kvm.Open(kvmPath)
	if err != nil {
		return nil, fmt.Errorf("vmsnap: host fingerprint: %w", err)
	}
	defer sys.Close()
	ids, err := sys.SupportedCPUID()
	if err != nil {
		return nil, fmt.Errorf("vmsnap: host fingerprint: %w", err)
	}
	return Fingerprint{Profile: profile.Kind, CPUID: CPUIDHash(ids)}.Encode(), nil
}

// HostFingerprintSource returns a FingerprintSource for HostFingerprint.
func HostFingerprintSource(kvmPath string, profile hostprofile.Profile) FingerprintSource {
	return func() ([]byte, error) { return HostFingerprint(kvmPath, profile) }
}

// checkFingerprint refuses a snapshot fingerprint that is not the host's,
// saying what differs.
func checkFingerprint(path string, snap, host []byte) error {
	if bytes.Equal(snap, host) {
		return nil
	}
	var s, h Fingerprint
	if json.Unmarshal(snap, &s) == nil && json.Unmarshal(host, &h) == nil {
		switch {
		case s.Profile != h.Profile:
			return fmt.Errorf("vmsnap: %s: %w: the snapshot was taken on a %s host, this one is %s", path, ErrIncompatibleCPU, s.Profile, h.Profile)
		case s.CPUID != h.CPUID:
			return fmt.Errorf("vmsnap: %s: %w: KVM's supported CPUID differs (snapshot %.12s, this host %.12s)", path, ErrIncompatibleCPU, s.CPUID, h.CPUID)
		}
	}
	return fmt.Errorf("vmsnap: %s: %w: fingerprint %q, this host %q", path, ErrIncompatibleCPU, snap, host)
}
