// Package devices holds the VM's device models: devices/virtio (the
// virtio 1.x core: split virtqueues, the virtio-mmio transport) and its
// devices (blk, net, rng, vsock), each owning its save and restore beside
// it. Everything a guest writes into a queue is validated where it is
// read: a malformed chain fails that request, never the VMM.
//
// May import: vmm (same rank), vmm/kvm, internal. Not cow, memsnap, ebpf,
// image, hostd, cmd, bench or guest code (internal/layout checks it).
package devices
