package main

import (
	"crypto/sha256"
	"os"

	"github.com/warrenvm/warren/memsnap"
)

// Object store: what the fleet's object store (fleet/objstore) keeps of
// the memory of the bundles a fleet uploads (hostd/daemon bundle.go): a
// bundle's memory is one full memsnap layer of the guest's memory, cut
// into pieces that the object store keeps as blobs by content, once per
// tenant and key. Version 1 bundles cut it every bundleChunk (4 MiB)
// bytes of the file; version 2 at its chunks (memsnap ChunkCuts with
// memoryGroupMin, one chunk a piece for guests up to 4 GiB). The count is
// the object store's rule (a blob per distinct piece); the pieces are
// not uploaded to a server here (hostd/daemon's TestObjectSnapshots
// checks, against a real S3 server, that a bundle with one changed page
// adds that page's piece and not the others).

// bundleChunk and memoryGroupMin are hostd/daemon's.
const (
	bundleChunk    = 4 << 20
	memoryGroupMin = memsnap.DefaultChunkPages * memsnap.DefaultPageSize
)

// objectStore counts the memory of bundles uploaded to one tenant's
// namespace, cut both ways.
type objectStore struct {
	Bundles int    `json:"bundles"`
	Logical int64  `json:"logical_bytes"` // the bundles' memory layers, summed
	V1      pieces `json:"v1_every_4mib"`
	V2      pieces `json:"v2_at_chunks"`
}

// pieces is the distinct pieces kept of one way to cut.
type pieces struct {
	Pieces int   `json:"pieces"` // in all the bundles
	Blobs  int   `json:"blobs"`  // distinct ones
	Stored int64 `json:"stored_bytes"`
	seen   map[[32]byte]bool
}

func (p *pieces) add(b []byte) {
	if allZero(b) {
		return // a bundle leaves out all-zero pieces
	}
	p.Pieces++
	s := sha256.Sum256(b)
	if p.seen == nil {
		p.seen = map[[32]byte]bool{}
	}
	if !p.seen[s] {
		p.seen[s] = true
		p.Blobs++
		p.Stored += int64(len(b))
	}
}

// cut adds file's bytes between consecutive cuts, each cut again every
// bundleChunk bytes.
func (p *pieces) cut(file []byte, cuts []int64) {
	for i := 0; i+1 < len(cuts); i++ {
		for off := cuts[i]; off < cuts[i+1]; off += bundleChunk {
			p.add(file[off:min(off+bundleChunk, cuts[i+1])])
		}
	}
}

// upload counts the bundle whose memory is the full layer at path.
func (o *objectStore) upload(path string) {
	file, err := os.ReadFile(path)
	check(err)
	l, err := memsnap.Open(path)
	check(err)
	defer l.Close()
	if l.Kind() != memsnap.KindBase {
		panic(path + ": a bundle's memory is a full layer")
	}
	o.Bundles++
	o.Logical += int64(len(file))
	o.V1.cut(file, []int64{0, int64(len(file))})
	o.V2.cut(file, l.ChunkCuts(memoryGroupMin))
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
