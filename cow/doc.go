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
// `warren fork` (cmd/warren/cli) runs each child as its own process,
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
// line (guestinit/agent SyncMessage.Identity), a new hostname, machine id
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
// # Rollback
//
// vmsnap Snapshotter.Rollback puts a running VM back to one of its
// snapshots in place; it lives beside the snapshot code it shares
// (memsnap Chain.RestoreOver rewrites only the pages that differ).
package cow
