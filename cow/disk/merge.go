package disk

import (
	"errors"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
)

// mergeChunk is the most Merge reads through the view at once.
const mergeChunk = 1 << 20

// MergeStats says what Merge did.
type MergeStats struct {
	// Blocks is the number of blocks the merged overlay holds; Bytes the
	// bytes it wrote (blocks that read as all zero stay holes, allocated).
	Blocks, Bytes int64
}

// Merge writes a new overlay at path (which must not exist) over base
// whose view equals layers[0]'s, holding only the blocks the layers hold:
// layers are an overlay and the overlays under it, top first, each one's
// base the next, and the last one's base is base. A block of the new
// overlay is allocated when any layer holds any byte of it, and its
// content is read through layers[0]'s view (the highest layer holding
// each byte wins, as a reader of layers[0] sees it); the rest reads from
// base, as it did. Blocks that read as all zero (discarded, or written
// zero) are allocated and left holes. The block size is layers[0]'s.
//
// basePath is recorded in the new header (as CreateOptions.BasePath).
// The layers and base must not change meanwhile (frozen layers); reading
// them concurrently is fine. The new overlay is synced and closed before
// Merge returns; on error it is removed. Nothing is copied but the blocks
// the layers hold: the cost is proportional to them, not to the disk.
func Merge(path string, layers []*Overlay, base Backing, basePath string) (MergeStats, error) {
	var st MergeStats
	fail := func(err error) (MergeStats, error) { return MergeStats{}, fmt.Errorf("merge into %s: %w", path, err) }
	if len(layers) == 0 {
		return fail(errors.New("no layers"))
	}
	for i, l := range layers {
		want := base
		if i+1 < len(layers) {
			want = layers[i+1]
		}
		if l.Base() != want {
			return fail(fmt.Errorf("layer %d (%s) is not over the next one", i, l.Path()))
		}
	}
	top := layers[0]
	m, err := Create(path, base, CreateOptions{BlockSize: int(top.bs), BasePath: basePath})
	if err != nil {
		return fail(err)
	}
	ok := false
	defer func() {
		if !ok {
			m.f.Close()
			os.Remove(path)
		}
	}()
	want := m.heldBy(layers)
	buf := make([]byte, mergeChunk)
	per := int64(mergeChunk) / m.bs
	nb := int64(len(want)) * 64
	for b := int64(0); b < nb; {
		if want[b/64] == 0 {
			b = (b/64 + 1) * 64
			continue
		}
		if want[b/64]&(1<<(b%64)) == 0 {
			b++
			continue
		}
		// A run of wanted blocks, at most one chunk.
		end := b + 1
		for end < nb && end-b < per && want[end/64]&(1<<(end%64)) != 0 {
			end++
		}
		start, stop := b*m.bs, min(end*m.bs, m.size)
		chunk := buf[:stop-start]
		if err := readFull(top, chunk, start); err != nil {
			return fail(fmt.Errorf("read the layers at %d: %w", start, err))
		}
		for i := b; i < end; i++ {
			blk := chunk[(i-b)*m.bs : min((i-b+1)*m.bs, int64(len(chunk)))]
			if !allZero(blk) {
				if _, err := m.f.WriteAt(blk, m.data+i*m.bs); err != nil {
					return fail(err)
				}
				st.Bytes += int64(len(blk))
			}
			m.setAllocated(i)
			st.Blocks++
		}
		b = end
	}
	if err := m.Sync(); err != nil {
		return fail(err)
	}
	if err := m.f.Close(); err != nil {
		return fail(err)
	}
	ok = true
	return st, nil
}

// heldBy returns the set of o's blocks (bit i%64 of word i/64 for block i)
// that any of layers holds any byte of; the layers may have other block
// sizes than o's, over the same virtual size.
func (o *Overlay) heldBy(layers []*Overlay) []uint64 {
	want := make([]uint64, (o.size+o.bs-1)/o.bs/64+1)
	for _, l := range layers {
		for w := range l.bitmap {
			word := l.bitmap[w].Load()
			for word != 0 {
				i := int64(w)*64 + int64(bits.TrailingZeros64(word))
				word &= word - 1
				first := i * l.bs / o.bs
				last := (min((i+1)*l.bs, l.size) - 1) / o.bs
				for j := first; j <= last; j++ {
					want[j/64] |= 1 << (j % 64)
				}
			}
		}
	}
	return want
}

// MergeOwned merges the run of overlays that layer and the layers under it
// hold in layer's own directory (Owned) into one new overlay beside it
// (NewLayerPath), over the first layer under the run, whose view equals
// layer's: only for a run of two layers or more (a run of one is already
// as short as it gets: path is then ""). It returns the new overlay's path
// and its chain, itself first, down to the bottom image (absolute paths).
// The layers must be frozen.
func MergeOwned(layer *Overlay) (path string, chain []string, st MergeStats, err error) {
	dir := filepath.Dir(absPath(layer.Path()))
	run, rest := Owned(layer, dir)
	if len(run) < 2 {
		return "", nil, MergeStats{}, nil
	}
	restPath := pathOfLayer(rest)
	if restPath == "" {
		return "", nil, MergeStats{}, fmt.Errorf("merge %s: the layer under its run (%T) is not a file", layer.Path(), rest)
	}
	restPath = absPath(restPath)
	bp := restPath
	if filepath.Dir(restPath) == dir {
		bp = filepath.Base(restPath)
	}
	path = NewLayerPath(dir, layer.Path())
	if st, err = Merge(path, run, rest, bp); err != nil {
		return "", nil, st, err
	}
	under := Chain(layer)[len(run)-1:]
	return path, append([]string{path}, under...), st, nil
}

// pathOfLayer is the file path of an Overlay or Raw, else "".
func pathOfLayer(b Backing) string {
	switch l := b.(type) {
	case *Overlay:
		return l.Path()
	case *Raw:
		return l.Path()
	}
	return ""
}
