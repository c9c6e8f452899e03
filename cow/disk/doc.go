// Package disk is copy-on-write disk images for forked sandboxes: an
// Overlay is a sparse file that holds the blocks a VM has written, over a
// read-only base image that any number of overlays share.
//
// # Reads and writes
//
// The virtual disk is as large as the base and is cut into blocks of
// BlockSize bytes (DefaultBlockSize, 64 KiB, unless Create is told
// otherwise; the last block may be short). Each block is either allocated,
// its bytes live in the overlay, or not, and its bytes are the base's. A
// write to an unallocated block first copies the block up from the base
// (read-modify-write: the written bytes are merged into the base's block,
// and the whole block is written once), then marks it allocated; a write
// that covers a whole block skips the base read. Bits are only ever set,
// never cleared.
//
// 64 KiB is a compromise: a smaller block wastes less on a guest's 4 KiB
// random writes (each first write to a block costs a block of copy-up), a
// larger one keeps the bitmap and the number of extents in the overlay
// file small (2 MiB of bitmap for a 1 TiB disk) and makes copy-up one
// sizeable sequential I/O. It matches qcow2's default cluster size.
//
// A base is anything with ReadAt and Size (Backing): a raw image (Raw), or
// another Overlay, so that repeated forks stack without copying: the fork
// freezes the parent's overlay and gives the parent and the child each a
// new overlay over it. OpenChain reopens a stack from the top file alone,
// following the base paths recorded in the headers. A base must not change
// while overlays depend on it; Open checks what it cheaply can (see
// Identity).
//
// # Forking
//
// Fork does that to a running disk: it syncs the current top (a writable
// Overlay or Raw), makes it refuse writes and turns its exclusive flock
// into a shared one, and creates in one directory a new overlay for the
// parent (returned open; it owns the frozen top and closes it on Close)
// and one per child (returned as paths, for OpenChain), named
// <stem>.<time>-<random>.wcow with the frozen file's base name as their
// base path. A virtio-blk device on the disk is quiesced around it and
// given the parent's overlay with blk.Device.SwapBackend.
//
// # Snapshots, merging and rebasing
//
// A VM's snapshot freezes each writable disk the same way, with no child
// (Fork with n = 0): the frozen top is the snapshot's disk state, and the
// VM goes on in a new overlay over it. So each snapshot adds a layer to
// the running disk's chain. Merge keeps the chain short: it copies the
// blocks a run of frozen layers holds (only those) into one new overlay
// over the layer under the run, and Rebase moves the running top onto
// that overlay, which reads the same by construction. Owned finds the run
// a VM may merge: the overlays from the top down that live in its own
// directory, stopping at the first layer elsewhere (a template's base, a
// fork parent's layer), which others share. A frozen layer is never
// changed again, header included: only a live top is rebased.
//
// # On-disk format (version 2)
//
// One file, little-endian throughout:
//
//	offset 0           header region, HeaderSize (4096) bytes: two slots
//	                   of SlotSize (2048) bytes, each:
//	   0  [8]byte  magic "WRNCOWD1"
//	   8  uint32   format version (2); magic and version never move
//	  12  uint32   header size (4096)
//	  16  uint32   block size, a power of two in [4 KiB, 16 MiB]
//	  20  uint32   flags, 0 (none defined)
//	  24  uint64   virtual size in bytes (equal to the base's size)
//	  32  uint64   bitmap offset (4096)
//	  40  uint64   bitmap size: ceil(blocks/8) rounded up to 4096
//	  48  uint64   data offset: bitmap end rounded up to the block size
//	  56  uint64   base size
//	  64  [32]byte base digest (Identity)
//	  96  uint64   generation, from 1
//	 104  uint16   length n of the base path (at most MaxBasePath)
//	 106  [n]byte  base path, as given to Create or Rebase (relative
//	               paths are relative to the overlay's directory)
//	106+n uint32   CRC-32C of the slot's bytes [0, 106+n)
//	               then zeros up to the slot's end
//	bitmap offset      the allocation bitmap: bit i%64 of little-endian
//	                   uint64 word i/64 is block i; bits past the last
//	                   block are zero
//	data offset        block i at data offset + i*block size; the file is
//	                   data offset + virtual size long, and unallocated
//	                   blocks are holes
//
// The header is the valid slot with the higher generation; Create writes
// slot 0 (generation 1) and leaves slot 1 zero (empty). Rebase writes the
// other slot with the next generation, so a torn write leaves the old one
// in force. Both valid slots must describe the same disk (block size and
// sizes); equal generations are corrupt.
//
// Version 1 (still read, never written) had one header over the whole
// region, laid out as a slot without the generation: the path length at
// 96, the path at 98, its CRC after it, zeros up to 4096.
//
// Open refuses a file without the magic (ErrNotOverlay), another version
// (ErrVersion), a header or bitmap that does not check out (ErrCorrupt), and
// a base that is not the one the overlay was made over (ErrBaseMismatch).
//
// # Base identity
//
// The header records the base's size and a SHA-256 digest of the size and
// the first and last MiB of its content (Identity), read through ReadAt, so
// it works for a raw file and for an overlay alike and survives copying the
// base elsewhere (mtimes do not). It catches a wrong file, a resize, and the
// usual rewrites (partition table, file system superblocks and their backups
// sit in those MiB); it cannot see a change confined to the middle of the
// base. The path is recorded for OpenChain only; it is not checked.
//
// # Crash consistency
//
// The bitmap on disk is written only by Sync (and Close), after the data:
// Sync snapshots the dirty bitmap pages, fdatasyncs the file (so every block
// whose bit is in the snapshot has its data on disk), writes those pages,
// and fdatasyncs again. Hence:
//
//   - after Sync returns, everything written before it was called is
//     durable and reads back after a crash;
//   - after a crash before Sync, a block whose bit did not reach the disk
//     reads from the base, as if the writes to it had never happened
//     (a later copy-up rewrites the whole block, so stale bytes the crash
//     left in the file are never seen); a block that was already allocated
//     may show any mix of old and new bytes, as a raw disk would;
//   - a torn bitmap write is harmless: every bit, old or new, has durable
//     data, and bits are only set.
//
// The header is written by Create, and by Rebase only into the slot not
// in force (see above): a crash during a Rebase leaves an overlay that
// opens over the old base or the new one, which read the same.
//
// # Concurrency
//
// ReadAt, WriteAt, Discard, Size, Allocated and Sync may be called from
// any number of goroutines at once, and with a Rebase (reads of the base
// hold a lock that Rebase takes exclusively to swap it). Concurrent writes to distinct bytes of
// one block both survive (copy-up of a block is serialised by a lock
// striped over blocks, and a block's bit is set only after its copied-up
// data is in the file); concurrent access to the same bytes has the
// semantics of pread/pwrite on a raw file. Metrics are atomic counters.
// Close and Rebase must not race with each other, nor Close with anything
// else.
package disk
