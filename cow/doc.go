// Package cow forks running VMs copy-on-write and is the home of their
// rollback's building blocks; cow/disk holds the disk overlays.
//
// # Forking
//
// Forker.Fork pauses the parent for milliseconds: it saves the machine and
// virtio transport states (kilobytes), freezes each writable disk under
// new overlays (cow/disk Fork: one for the parent, one per child), and
// turns the parent's guest RAM into an immutable base (guestmem Fork): the
// first time, the parent's memfd itself becomes the base and the parent
// continues on a MAP_PRIVATE mapping of it at the same address; later, only
// the pages the parent wrote since (found in /proc/self/pagemap) are copied
// into a new sparse layer stacked on the earlier ones. Nothing is copied
// in proportion to the memory size, so the pause and the children's start
// do not grow with it. The result, a Point, is what a child is made from:
// guestmem NewFromBase maps the base's layers MAP_PRIVATE, and vmm
// RestoreMemory loads the state. Parent and children share every page none
// of them wrote; each keeps only its own written pages, as anonymous
// memory.
//
// `warren fork` (vmmproc) runs each child as its own process,
// passing it the base's file descriptors: a child outlives its parent, and
// a parent outlives a killed child. The base's files are memfds or the
// lazily restored snapshot image; the kernel frees them when the last
// process holding them exits. Deleting the parent (stopping its process,
// removing its snapshot files or its frozen disk image) while children
// run is therefore safe: each child holds open descriptors of every file
// it reads (TestForkEndToEnd stops the parent and reads on in its
// children). A frozen disk image is locked shared and refuses writers,
// so it cannot be changed under its children by another Warren.
//
// # Identity
//
// A child is given, by its new process: its own control and vsock
// sockets, a new vsock CID (the guest driver learns it from the transport
// reset every restored VM gets), its own tap and a new MAC when the parent
// has a tap, its own disk overlays, and, through the guest agent's re-sync
// line (agentwire SyncMessage.Identity), a new hostname, machine id
// and MAC set in the guest, a resynced clock and fresh entropy credited to
// the guest's pool.
//
// What a guest program can still observe as shared with its parent and
// siblings: everything in memory at the fork, byte for byte. That includes
// secrets the parent held in memory (keys, tokens, session cookies), the
// state of user-space random generators seeded before the fork (only the
// kernel's pool is reseeded; a program that cached random bytes, or an
// OpenSSL/Go PRNG state, repeats its siblings' outputs until it reseeds),
// TCP connections and their sequence numbers (a child's connections reset
// on the network side, but the sockets look open until then), in-guest
// UUIDs and temporary names already generated, boot_id
// (/proc/sys/kernel/random/boot_id is per boot, not per fork), the
// uptime and monotonic clocks (CLOCK_MONOTONIC continues from the fork;
// only CLOCK_REALTIME is set), and the disk contents up to the fork. Do not
// fork a sandbox that holds a secret its children must not share.
//
// # Disks in snapshots
//
// DiskSet is a VM's disks as its snapshots, rollbacks and forks change
// them (it implements vmsnap.Disks). Every snapshot freezes each writable
// disk's live top in place at the snapshot's instant and the VM goes on in
// a new overlay over it, with no copy of the data: the pause holds one
// sync of the old top (the new top's file is made before the pause, its
// header written after it: cow/disk Pending). The frozen layer is the
// snapshot's disk state. A full snapshot then keeps the chain short: the
// run of layers the VM owns (those in its live top's directory, from the
// top down to the first layer elsewhere: a template's base, a fork
// parent's layer) is merged into one overlay over that foreign layer, a
// copy of only the blocks the run holds, and the live top is rebased onto
// it (cow/disk Merge, Rebase); the snapshot records the merged layer, and
// the frozen one, referenced by nothing, is removed. A rollback gives each
// writable disk a new overlay over the snapshot's layer in the pause in
// which the memory is restored, and removes the replaced live top: live
// tops are referenced by nothing (snapshots record frozen layers, fork
// children stand on frozen layers). Live reports each disk's top and
// chain, so that whoever keeps the files (warren-hostd) knows what a
// running VM references.
//
// A fork child's overlays go into a directory of its own when the fork is
// given one: its later layers are then its own, and the parent's layers
// under them stay foreign to it (never merged by the child).
//
// # Rollback
//
// vmsnap Snapshotter.Rollback puts a running VM back to one of its
// snapshots in place; it lives beside the snapshot code it shares
// (memsnap Chain.RestoreOver rewrites only the pages that differ).
//
// May import: vmm, devices, memsnap (same rank: snapshot layers for
// fork bases), internal. Not hostd, cmd, bench or guest code
// (internal/layout checks it).
package cow
