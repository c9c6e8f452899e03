// Package internal holds helpers the whole module shares and nobody
// outside it may import: internal/atomicfile (the one atomic file
// replacement), internal/kvmtest (the gate for tests that need
// /dev/kvm), internal/logcap (caps on guest-driven logs),
// internal/testsum (`make test`'s summary), internal/testtls (TLS for
// tests), internal/netframe (Ethernet/IPv4/UDP frames for tests and
// benchmarks), internal/nsenter (code run in a named network namespace),
// internal/strictjson (strict JSON decoding), internal/virtiommio (the
// virtio-mmio register layout, read by host and guest code alike) and
// internal/layout (the repository's shape, checked).
//
// May import: internal's own packages only; every group may import it
// (internal/layout checks it).
package internal
