// Package pagestore is the host's content-addressed store of guest memory
// chunks: a memsnap layer file is replaced by a small reference file (its
// header, index and footer, and the store name of each chunk), and its
// chunks are kept once per namespace however many layers hold them.
//
// Memsnap writers align chunks to memory (a chunk holds the stored pages
// of one aligned block of 256 pages), and their compression is
// deterministic, so a block that did not change between two snapshots,
// or between a template and a sandbox's snapshot, is the same chunk,
// byte for byte, with the same SHA-256 in both layers' indexes. Zero pages
// are never stored (memsnap leaves them out of chunks). The fleet's object
// store keeps the same chunks: a bundle cuts its memory layer at them
// (hostd/daemon bundle.go), and fleet/objstore keeps each piece once per
// tenant and key.
//
// # Namespaces and encryption
//
// The store lives in one directory per host (the daemon's STATE/pagestore)
// and is split into namespaces, one per tenant and key:
//
//	ROOT/TENANT/plain/               a tenant without a key
//	ROOT/TENANT/KEYID/               a tenant with a key (crypt key ID)
//	ROOT/TENANT/KEYID/idkey          32 random bytes, sealed under the key
//	ROOT/TENANT/NS/chunks/XX/NAME    a chunk: XX the first two hex digits of NAME
//	ROOT/TENANT/NS/chunks/XX/.tmp-*  a chunk being written (swept)
//
// Chunks are shared only within a namespace: never across tenants, and
// never across a tenant's keys. A chunk's NAME is 64 hex digits: in a
// plain namespace, the SHA-256 of its compressed bytes (the Sum its layers'
// indexes record); in a keyed one, HMAC-SHA256(idkey, that SHA-256), so
// that neither the names nor their presence confirm any content without the
// tenant's key, and revoking the key (crypto-shredding it) also destroys
// idkey. A plain chunk file holds the compressed bytes; a keyed one holds
// them sealed in hostd/crypt's authenticated format under the tenant's key.
// Reading a chunk checks its length and its SHA-256 against the layer's
// index after any decryption, so a corrupt, swapped or missing chunk is an
// error (ErrCorrupt, ErrMissing) before any VM runs.
//
// # Reference file, version 1
//
// A store-backed layer keeps the layer's name (NAME.<unique>.wsnap) and is
// this file instead of the layer (integers little-endian, CRC-32C):
//
//	offset  size  field
//	0       8     magic "WPAGEREF"
//	8       2     version (1)
//	10      2     flags: bit 0, the chunks are in a keyed namespace; others 0
//	12      4     C, number of chunks (the layer's, <= MaxChunks)
//	16      8     the layer file's size in bytes
//	24      32    the layer's memsnap Hash
//	56      4     H, header length (<= MaxHeaderLen)
//	60      4     T, index-and-footer length (<= MaxTailLen)
//	64      H     the layer's header bytes
//	64+H    T     the layer's index and footer bytes
//	64+H+T  C*32  each chunk's store name, in file order
//	end-4   4     CRC of all bytes before it
//
// ParseRef checks the CRC and every length, opens the header, index and
// footer as a memsnap layer (which validates them), checks that its Hash
// is the recorded one and that its chunks tile exactly the gap between
// header and index. Materialize writes the layer back byte for byte: the
// header, each chunk read from the store and checked, the index and footer;
// the result is opened and its Hash compared, so a rebuilt layer is the
// layer that was ingested, and the incremental layers that name it as
// their parent by hash still find it.
//
// A layer may also be kept plain with its reference file beside it, in
// the subdirectory CacheRefDir of its directory (DIR/pages/NAME.<unique>.wsnap
// for DIR/NAME.<unique>.wsnap): a template's, which every create restores
// in place. The layer is then a cache of the store: Stats counts it (and
// flattened *.wraw images) as a cache, not as a plain layer, and it may be
// removed and rebuilt by Materialize; Check says beforehand whether every
// chunk is there.
//
// For a tenant with a key the daemon seals the reference file itself under
// the key like any other snapshot file (hostd/daemon atrest.go); the
// namespace's Provider opens it.
//
// # Crash safety and reference counts
//
// Ingest writes the chunks a namespace lacks as temporary files, syncs the
// file system (syncfs), renames them to their names and syncs again; only
// then does it replace the layer with its reference file (internal/atomicfile:
// temporary file, fsync, rename, directory fsync). A chunk name therefore
// never exists without its complete content, and a reference file never
// exists before its chunks. A crash at any step leaves the layer whole (as
// the layer or as its reference file) and at worst chunks nothing refers
// to.
//
// Reference counts are not stored, so they cannot go stale: Sweep derives
// them from the live reference files (every *.wsnap under the roots it is
// given, decrypted where sealed) and removes the chunks, and the temporary
// files, that none of them names. Deleting a snapshot is removing its
// files and sweeping; a crash between the two leaves garbage that the next
// sweep removes, never a reference to a removed chunk. A sweep refuses to
// remove anything when a reference file it finds cannot be read. Ingest,
// Sweep and Stats of one namespace are serialised by the Store.
//
// May import: memsnap, hostd/crypt, internal. Not hostd/daemon.
package pagestore
