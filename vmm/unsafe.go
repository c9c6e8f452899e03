package vmm

import "unsafe"

// uintptrOf returns the host address of a mapping, for KVM memory slots.
func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }
