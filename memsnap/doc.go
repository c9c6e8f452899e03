// Package memsnap stores guest memory snapshots as a chain of layer files:
// a base layer holding a full image and incremental layers holding the
// pages dirtied since their parent, each zstd-compressed in independent
// chunks, checksummed, and restorable eagerly into a memfd mapping
// (Chain.Restore) or flattened to a sparse raw image for a lazy MAP_PRIVATE
// restore (Chain.Flatten).
//
// Memory is the flat image of a guestmem.Memory: offset 0 is the first
// byte of the memfd, not a guest-physical address; the caller maps
// guest-physical ranges through guestmem's Regions. Pages are PageSize
// bytes (4096 by default). Nothing here touches a VM: the caller pauses the
// vCPUs before writing a layer and verifies a chain before creating a VM.
//
// # Ownership
//
// A Layer owns its open file; a Chain owns its layers. Both may be read
// from several goroutines at once and are closed once, after all use.
// Writers never modify an existing file: they write a temporary file in
// the same directory, fsync it, rename it over the destination and fsync
// the directory, so a crash leaves either the old file or the new one.
//
// # Identity
//
// A layer's identity (Hash) is SHA-256 over the header bytes, then the
// index bytes, then the footer bytes, in file order. The index records the
// SHA-256 of every chunk and the chunks tile the data region exactly, so
// the hash commits to every byte of the file, while Open computes it
// without reading chunk data. Nothing in a file refers to its own hash; an
// incremental layer's header records its parent's hash.
//
// # File format, version 1
//
// All integers are little-endian. CRC is CRC-32C (Castagnoli).
//
// A file is: header, chunks (the data region), index, footer.
//
// Header, at offset 0, 72+N+F+4 bytes:
//
//	offset  size  field
//	0       8     magic "WSNAPMEM"
//	8       2     format version (1); checked before anything else
//	10      1     kind: 1 base, 2 incremental
//	11      1     reserved, 0
//	12      4     page size, a power of two in [4096, 2 MiB]
//	16      8     memory size in bytes, a positive multiple of page size, <= 1 TiB
//	24      32    parent's content hash; all zero for a base
//	56      8     creation time, Unix nanoseconds
//	64      2     N, parent file name hint length (0..255; 0 for a base)
//	66      2     F, Fingerprint length (0..4096)
//	68      4     reserved, 0
//	72      N     parent file name hint (base name only; verified by hash)
//	72+N    F     Fingerprint, opaque caller bytes
//	72+N+F  4     CRC of header bytes [0, 72+N+F)
//
// Chunks follow the header back to back, from the header's end to the
// index offset, with no gaps. Each is one zstd frame (without zstd's own
// checksum) of the concatenated pages the index lists for it, at most
// 64 MiB uncompressed (writers default to 64 pages, 256 KiB).
// Writers align chunks to memory: a chunk holds stored pages of one
// aligned block of ChunkPages pages (pages [k*ChunkPages, (k+1)*ChunkPages))
// and never of two, so an unchanged block yields the same chunk bytes and
// SHA-256 in every layer that stores it (readers do not depend on this).
//
// Index, at the footer's index offset:
//
//	size     field
//	4        C, number of chunks
//	4        Z, number of zero runs (0 in a base layer)
//	C times, in file and page order:
//	  8      file offset of the chunk (equals the previous chunk's end)
//	  4      compressed length
//	  4      P, pages in the chunk (sum of its run counts)
//	  32     SHA-256 of the compressed bytes
//	  4      R, number of page runs (1..P)
//	  R times:
//	    8    first page number
//	    4    page count (>= 1)
//	Z times:
//	  8      first page number
//	  8      page count (>= 1)
//
// Stored runs are sorted and non-overlapping across the whole index; so
// are zero runs; no zero run overlaps a stored run; every run lies within
// memory size / page size pages. A zero run records pages dirtied to zero
// in an incremental layer. In a base layer pages not stored are zero; in an
// incremental layer pages not mentioned are the parent's.
//
// Footer, the last 32 bytes:
//
//	offset  size  field
//	0       8     index offset
//	8       8     index length; index offset + length = file size - 32
//	16      4     CRC of the index
//	20      4     CRC of footer bytes [0, 20)
//	24      8     magic "WSNAPEND"
//
// # Validation
//
// Open checks magic, version (ErrVersion, naming both versions), header,
// index and footer checksums, field ranges, that chunks tile the data
// region and lie within the file, and the run rules above; a truncated file
// fails the footer magic or extent checks. Layer.Verify reads every chunk
// and checks its SHA-256 and decompressed length. OpenChain follows parent
// hashes through a Resolver (Dir by default: the hinted name, then any
// *.wsnap file in the directory with the wanted hash) and checks that all
// layers share page size, memory size and Fingerprint. Errors wrap
// ErrCorrupt, ErrVersion, ErrMissingParent, ErrIncompatible or ErrCycle and
// name the file.
//
// May import: vmm, devices, cow (same rank: disk sets in whole-VM
// snapshots), internal. Not hostd, cmd, bench or guest code
// (internal/layout checks it).
package memsnap
