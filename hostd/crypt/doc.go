// Package crypt is bring-your-own-key encryption at rest for a tenant's
// snapshots (memsnap layer files, vmsnap state files) and disk overlays
// (cow/disk): authenticated encryption in fixed-size chunks, so that a
// lazy restore can still read any byte range by decrypting only the
// chunks that cover it, under a key fetched per tenant from a Provider.
//
// # Keys
//
// A Provider maps a tenant to its current Key: a stable ID, recorded in
// every file the key encrypts, and 32 bytes of material that no String,
// Format, slog or JSON path prints. LocalProvider keeps keys in
// DIR/<tenant>.key files (mode 0600, no symlinks, tenant names
// [a-z0-9-]{1,63}); its IDs are Fingerprint(material), so a re-created key
// always has a new ID. LocalProvider.Revoke crypto-shreds a key: it
// overwrites the key file with zeros, fsyncs, leaves a DIR/<tenant>.revoked
// marker with the time, and removes the key. From then on the provider
// answers with a *RevokedError (errors.Is(err, ErrRevoked), not ErrNoKey):
//
//	tenant acme: key revoked at 2026-12-01T12:00:00Z: its snapshots and disks can no longer be read
//
// and OpenReader prefixes it with the file name. Create refuses a revoked
// tenant; Reinstate lifts the revocation with a fresh key, which opens
// none of the old files (ErrWrongKey).
//
// # File format, version 1
//
// Integers are big-endian. A file is a fixed 160-byte header followed by
// one or more chunks, back to back:
//
//	offset  size  field
//	0       8     magic "WARRENC1"
//	8       2     format version (1)
//	10      2     flags, 0 (none defined; anything else is refused)
//	12      4     chunk size C: plaintext bytes per chunk, a power of two
//	              in [4 KiB, 16 MiB]; writers default to 64 KiB
//	16      32    file salt, random per file
//	48      1     key ID length n, 1..64
//	49      15    reserved, zero
//	64      64    key ID (printable ASCII), zero-padded
//	128     32    header MAC: HMAC-SHA256(K_hdr, bytes [0, 128))
//
// Per-file keys come from the tenant key K and the salt with HKDF-SHA256:
//
//	K_chunk = HKDF-SHA256(secret K, salt, info "warren chunk v1", 32 bytes)
//	K_hdr   = HKDF-SHA256(secret K, salt, info "warren header v1", 32 bytes)
//
// Chunk i (from 0) is AES-256-GCM under K_chunk of plaintext bytes
// [i*C, i*C+C) — every chunk holds exactly C bytes except the last, which
// holds 1..C bytes, or 0 when the whole plaintext is empty (an empty file
// still has one, empty, chunk) — stored as ciphertext followed by the
// 16-byte tag, at the fixed offset
//
//	160 + i*(C+16)
//
// The nonce is not stored: it is the chunk index, 8 bytes big-endian,
// followed by 4 zero bytes. Reuse is impossible because K_chunk is unique
// to the file (random 256-bit salt). The additional authenticated data is
//
//	SHA-256(header, all 160 bytes)  32 bytes
//	chunk index                     8 bytes
//	final flag                      1 byte: 1 for the last chunk, else 0
//	plaintext length                8 bytes: total bytes in the file, in
//	                                the last chunk only; 0 in the others
//
// so a chunk cannot be reordered (the index), moved to another file (the
// header hash, and the key), dropped or duplicated (the index), and the
// file cannot be truncated at a chunk boundary or extended (the final
// flag and the length).
//
// The plaintext length is not in the header. The header is written first
// and never rewritten, so a Writer can stream to a pipe; the length is
// implied by the file size — (size-160) determines the number of chunks
// and the last chunk's length — and authenticated by the last chunk's AAD.
// OpenReader therefore authenticates the header and the last chunk before
// it returns: a file it opens has exactly Size() plaintext bytes, and
// every later ReadAt only has to authenticate the chunks it reads.
// EncryptedSize gives the file size for a plaintext length.
//
// # Reading
//
// OpenReader checks, in order: the header's shape (ErrFormat), that the
// size matches a chunk layout (ErrAuth), the tenant's key (ErrNoKey,
// ErrRevoked), that the header names that key (ErrWrongKey), the header
// MAC and the final chunk (ErrAuth). Reader.ReadAt reads and decrypts
// only the chunks covering the range, with a small LRU of decrypted
// chunks (16 by default). A chunk that fails authentication gives a
// *ChunkError,
//
//	snapshot.wlayer: chunk 12 fails authentication: corrupt, truncated or not this tenant's
//
// and none of its bytes; callers must treat the file as bad. Decryption is
// in place in a scratch buffer that is wiped on failure.
//
// # Threat model
//
// Encryption at rest protects the bytes of snapshots and disks where they
// rest: a stolen or decommissioned disk, a backup or replica of the data
// directory, another tenant's process (or a bug) that gets to read files
// it should not, and it makes tampering with them detectable (every byte
// is authenticated, and chunks cannot be rearranged). It does not protect
// against a compromised host daemon or kernel: while a tenant's sandbox
// runs (or restores), the daemon holds the key and the guest's memory is
// plaintext in RAM. File names, sizes (to within a chunk's tag) and times
// are not hidden.
//
// Revocation is crypto-shredding: the files stay where they are but
// become unreadable because the key is gone. That holds only as far as no
// copy of the key survives: a key file in a backup, a filesystem
// snapshot, a copy-on-write or log-structured filesystem or flash
// translation layer that keeps the old blocks, or a daemon that still has
// the key in memory (a Reader opened before revocation keeps working until
// it is closed). Keep key directories out of backups, and have the daemon
// stop the tenant's sandboxes and drop its Readers when it revokes. New
// restores fail at once: OpenReader asks the provider for every file.
//
// # Use by the daemon
//
// Write snapshots and overlays as today, in plaintext on a tmpfs or into
// the temporary file of the atomic write, then encrypt them: EncryptFile
// (temporary file, fsync, rename, directory fsync; dst is never a half
// file) or NewWriter over the temporary file for streaming. For a
// snapshot that is the vmsnap state file and each memsnap layer file. A
// disk image or cow/disk overlay is mostly holes, so it is sealed with
// EncryptSparseFile (its data extents packed, see sparse.go) once no VMM
// has it open, and DecryptSparseFile restores it, holes and all, before
// one does: a live, writable overlay is rewritten in place and stays
// plaintext on the host while its sandbox runs.
//
// To restore, OpenReader each file for the tenant (this is where a revoked
// key stops the restore, with the message above). A lazy restore reads
// through Reader.ReadAt, into guest memory or from a userfaultfd handler
// that ReadAts the faulting page's range straight into the page it
// installs. A *Reader has ReadAt and Size, so it is a cow/disk.Backing as
// it stands (an encrypted read-only base image). memsnap opens layers by
// path today; its unexported openReader(path, io.ReaderAt, size) is the
// hook to export so that a layer (and vmsnap's state file) can be read
// through a Reader; likewise cow/disk's frozen overlays in a chain are
// opened by path and would need an open-from-ReaderAt to stay lazy (until
// then, DecryptFile them to tmpfs). Each miss costs one chunk (64 KiB) of
// I/O and AES-GCM (BenchmarkDecryptChunk: ~2.9 GB/s, ~22 µs per chunk, on
// one core with AES-NI), and the LRU absorbs neighbouring faults.
// DecryptFile is for eager restores or export.
package crypt
