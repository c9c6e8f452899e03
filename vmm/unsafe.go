package vmm

import (
	"unsafe"

	"github.com/warrenvm/warren/vmm/kvm"
)

// uintptrOf returns the host address of a mapping, for KVM memory slots.
func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// xsaveBytes returns a copy of the legacy 4 KiB XSAVE area as bytes.
func xsaveBytes(x *kvm.Xsave) []byte {
	return append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(&x.Region[0])), len(x.Region)*4)...)
}
