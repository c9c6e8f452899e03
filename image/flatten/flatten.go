// Package flatten merges the layers of an OCI or Docker image into the one
// tree a container would see, as a single tar stream, without unpacking
// anything onto the host's file system.
//
// It works in two passes over the (already verified) uncompressed layers:
//
//   - Pass 1 (Tree.AddLayer, once per layer, bottom layer first) reads only
//     the headers. It applies each layer's whiteouts (".wh.NAME") and opaque
//     markers (".wh..wh..opq") to the layers below it, then the layer's own
//     entries, and keeps in memory which entry of which layer ends up
//     visible at every path, and which paths share an inode (hard links).
//   - Pass 2 (Tree.WriteTo) writes the final tree as one tar stream: every
//     directory first (parents before children, with their final
//     metadata), then the data of every visible regular file, read from the
//     layers bottom-up and streamed through, then symlinks, device nodes
//     and fifos, and last the hard links, each naming a path written before
//     it. Only the layers that hold visible data are read again.
//
// Names are interpreted relative to the image's root: a leading "/" and a
// leading "./" mean the same thing ("/etc/passwd", "./etc/passwd" and
// "etc/passwd" are one path); empty and "." components are dropped. A name
// with a ".." component, a NUL byte, a component longer than 255 bytes or
// more than MaxPathBytes in all is refused, and so is an entry below a
// symlink or below a non-directory (the tree is never looked up through a
// symlink), a hard link to a path that does not exist (yet) or to a
// directory, xattrs that an ext4 inode cannot hold or outside the user.,
// trusted. and security. namespaces, and entry types a root file system
// cannot hold. Every refusal is an error that names the layer, the entry and
// the rule. Paths under /.warren (Reserved) are Warren's: entries there, and
// whiteouts of them, are dropped.
//
// Hard links are kept as links. A link shares the inode its target had when
// the link was made, as on a real file system: when a later layer replaces
// or removes the target path, the link keeps the old contents (the first of
// its remaining paths, in sorted order, becomes the one that holds them).
//
// Nothing here trusts the layers: the memory a Tree holds is bounded by
// Limits, and pass 2 checks that every entry it copies is the one pass 1
// chose (same type, size and name).
package flatten

import (
	"archive/tar"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"sort"
	"strings"
	"time"
)

// Reserved is the top-level directory that belongs to Warren (see
// guestinit/imageconfig.Path): an image's entries under it are dropped.
const Reserved = ".warren"

// Bounds every Tree enforces, whatever its Limits.
const (
	// MaxPathBytes bounds an entry's name (and a hard link's target) as
	// it appears in the tar header.
	MaxPathBytes = 4096
	// MaxNameBytes bounds one path component (ext4's limit).
	MaxNameBytes = 255
	// MaxSymlinkBytes bounds a symlink's target.
	MaxSymlinkBytes = 4095
	// MaxXattrBytes bounds one entry's extended attributes, counted as
	// ext4 lays them out (16 bytes of entry header plus the name and the
	// value, each padded to 4 bytes): what one xattr block holds.
	MaxXattrBytes = 4096 - 36
	// MaxLinks bounds the hard links to one inode (ext4's limit).
	MaxLinks = 65000
	// MaxDevMajor and MaxDevMinor bound a device node's numbers (Linux's
	// dev_t: 12 and 20 bits).
	MaxDevMajor = 1<<12 - 1
	MaxDevMinor = 1<<20 - 1
)

// Defaults for a zero Limits field.
const (
	DefaultMaxEntries       = 1 << 20
	DefaultMaxMetadataBytes = 256 << 20
)

// Limits bound what a Tree keeps in memory over all its layers.
type Limits struct {
	// MaxEntries bounds the tree's nodes ever made: entries read
	// (whiteouts included) plus the directories implied by them.
	MaxEntries int
	// MaxMetadataBytes bounds the bytes of names, symlink targets and
	// xattrs the tree has kept.
	MaxMetadataBytes int64
}

// Stats describe a flattened tree (after all AddLayer calls).
type Stats struct {
	// Entries is the number of tar headers read over all layers.
	Entries int
	// Dirs, Files, Symlinks, Specials (device nodes and fifos) and
	// HardLinks count the visible paths by kind (a file with two names
	// counts as one of Files and one of HardLinks).
	Dirs, Files, Symlinks, Specials, HardLinks int
	// ContentBytes is the size of the visible regular files, each inode
	// once.
	ContentBytes int64
	// DataBlocks estimates the 4 KiB blocks the tree's contents take in
	// an ext4 file system: regular files' data, one per directory, long
	// symlinks.
	DataBlocks int64
}

// Inodes is the number of distinct inodes in the visible tree.
func (s Stats) Inodes() int { return s.Dirs + s.Files + s.Symlinks + s.Specials }

// A Tree is pass 1's result: the final tree of an image's layers. Its
// methods must be called from one goroutine at a time.
type Tree struct {
	lim     Limits
	root    *node
	layers  int   // AddLayer calls that succeeded
	nodes   int   // nodes ever made
	meta    int64 // metadata bytes kept
	entries int   // headers read
	failed  error // a failed AddLayer poisons the tree
	planned *plan
}

// node is one name in the tree. A directory's node owns its children; a
// hard link is a second node sharing an inode.
type node struct {
	kids map[string]*node // directories only
	ino  *inode
}

// inode is what a path's entry says about the file behind it.
type inode struct {
	typ          byte // tar.TypeReg, TypeDir, TypeSymlink, TypeChar, TypeBlock, TypeFifo
	mode         int64
	uid, gid     int
	mtime        time.Time
	target       string // a symlink's target
	major, minor int64
	size         int64
	xattrs       map[string]string
	links        int // hard links ever made to it (bounded by MaxLinks)

	// The entry that holds a regular file's data: layer, index of its
	// header in that layer, and a hash of the header's name (pass 2
	// checks it found the same entry).
	layer, index int
	nameHash     uint64

	// Set by plan: the first visible path, which carries the data.
	primary string
}

// New returns an empty tree (an image with no layers: just "/").
func New(lim Limits) *Tree {
	if lim.MaxEntries <= 0 {
		lim.MaxEntries = DefaultMaxEntries
	}
	if lim.MaxMetadataBytes <= 0 {
		lim.MaxMetadataBytes = DefaultMaxMetadataBytes
	}
	return &Tree{lim: lim, root: &node{kids: map[string]*node{}, ino: impliedDir()}, nodes: 1}
}

// Layers is the number of layers added.
func (t *Tree) Layers() int { return t.layers }

// entry is one parsed header of a layer.
type entry struct {
	index    int
	rawName  string
	path     []string // cleaned components; empty: the root
	whiteout int      // 0: none; whiteoutPath; whiteoutOpaque
	ino      inode    // for non-links
	link     []string // a hard link's target
}

const (
	whiteoutPath = 1 + iota
	whiteoutOpaque
)

const (
	whPrefix = ".wh."
	whOpaque = ".wh..wh..opq"
)

// AddLayer reads one layer's uncompressed tar stream (layers in order,
// the bottom one first) and applies it to the tree. It reads r to its end
// (so a caller hashing r sees every byte). After an error the tree is
// unusable.
func (t *Tree) AddLayer(r io.Reader) error {
	if t.failed != nil {
		return t.failed
	}
	if t.planned != nil {
		return errors.New("flatten: AddLayer after WriteTo")
	}
	err := t.addLayer(r)
	if err == nil {
		// Trailing bytes after the end-of-archive blocks are part of
		// the layer's diff_id; read them too.
		_, err = io.Copy(io.Discard, r)
		if err != nil {
			err = fmt.Errorf("layer %d: %w", t.layers, err)
		}
	}
	if err != nil {
		t.failed = err
		return err
	}
	t.layers++
	return nil
}

func (t *Tree) addLayer(r io.Reader) error {
	layer := t.layers
	tr := tar.NewReader(r)
	var ents []entry
	for i := 0; ; i++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("layer %d: entry %d: %w", layer, i, err)
		}
		t.entries++
		if t.entries > t.lim.MaxEntries {
			return fmt.Errorf("layer %d: more than %d entries in the image", layer, t.lim.MaxEntries)
		}
		e, keep, err := parseEntry(hdr, i)
		if err != nil {
			return fmt.Errorf("layer %d: entry %d (%.200q): %w", layer, i, hdr.Name, err)
		}
		if !keep {
			continue
		}
		e.ino.layer, e.ino.index = layer, i
		ents = append(ents, e)
	}
	// Whiteouts hide what the layers below hold, never the layer's own
	// entries: apply them all first.
	for i := range ents {
		if ents[i].whiteout != 0 {
			t.applyWhiteout(&ents[i])
		}
	}
	for i := range ents {
		e := &ents[i]
		if e.whiteout != 0 {
			continue
		}
		if err := t.apply(e); err != nil {
			return fmt.Errorf("layer %d: entry %d (%.200q): %w", layer, e.index, e.rawName, err)
		}
	}
	return nil
}

// parseEntry checks one header. keep is false for entries that are
// dropped (under Reserved, or PAX global headers).
func parseEntry(hdr *tar.Header, index int) (e entry, keep bool, err error) {
	e.index, e.rawName = index, hdr.Name
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return e, false, nil
	}
	p, err := cleanPath(hdr.Name)
	if err != nil {
		return e, false, err
	}
	e.path = p
	if len(p) > 0 && p[0] == Reserved {
		return e, false, nil
	}
	if len(p) > 0 {
		base := p[len(p)-1]
		if strings.HasPrefix(base, whPrefix) {
			switch {
			case base == whOpaque:
				e.whiteout = whiteoutOpaque
				e.path = p[:len(p)-1]
			case strings.HasPrefix(base, whPrefix+whPrefix):
				return e, false, fmt.Errorf("unsupported whiteout %q (aufs metadata)", base)
			default:
				name := base[len(whPrefix):]
				if name == "" || name == "." || name == ".." {
					return e, false, fmt.Errorf("whiteout %q names nothing", base)
				}
				e.whiteout = whiteoutPath
				e.path = append(append([]string(nil), p[:len(p)-1]...), name)
				if e.path[0] == Reserved {
					return e, false, nil
				}
			}
			return e, true, nil
		}
	}
	ino := &e.ino
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeGNUSparse:
		ino.typ = tar.TypeReg
		if hdr.Size < 0 {
			return e, false, fmt.Errorf("negative size %d", hdr.Size)
		}
		ino.size = hdr.Size
		h := fnv.New64a()
		h.Write([]byte(hdr.Name))
		ino.nameHash = h.Sum64()
	case tar.TypeDir, tar.TypeFifo:
		ino.typ = hdr.Typeflag
	case tar.TypeSymlink:
		ino.typ = tar.TypeSymlink
		switch {
		case hdr.Linkname == "":
			return e, false, errors.New("symlink with an empty target")
		case len(hdr.Linkname) > MaxSymlinkBytes:
			return e, false, fmt.Errorf("symlink target of %d bytes, more than %d", len(hdr.Linkname), MaxSymlinkBytes)
		case strings.IndexByte(hdr.Linkname, 0) >= 0:
			return e, false, errors.New("symlink target holds a NUL byte")
		}
		ino.target = hdr.Linkname
	case tar.TypeChar, tar.TypeBlock:
		ino.typ = hdr.Typeflag
		if hdr.Devmajor < 0 || hdr.Devmajor > MaxDevMajor || hdr.Devminor < 0 || hdr.Devminor > MaxDevMinor {
			return e, false, fmt.Errorf("device number %d:%d out of range", hdr.Devmajor, hdr.Devminor)
		}
		ino.major, ino.minor = hdr.Devmajor, hdr.Devminor
	case tar.TypeLink:
		l, err := cleanPath(hdr.Linkname)
		if err != nil {
			return e, false, fmt.Errorf("hard link target: %w", err)
		}
		if len(l) == 0 {
			return e, false, errors.New("hard link to the root directory")
		}
		if len(p) == 0 {
			return e, false, errors.New("a hard link in place of the root directory")
		}
		e.link = l
		return e, true, nil
	default:
		return e, false, fmt.Errorf("tar entry type %q, which a root file system cannot hold", hdr.Typeflag)
	}
	if len(p) == 0 && ino.typ != tar.TypeDir {
		return e, false, errors.New("the root is not a directory")
	}
	if hdr.Mode < 0 {
		return e, false, fmt.Errorf("negative mode %d", hdr.Mode)
	}
	ino.mode = hdr.Mode & 0o7777
	if hdr.Uid < 0 || int64(hdr.Uid) > 1<<32-1 || hdr.Gid < 0 || int64(hdr.Gid) > 1<<32-1 {
		return e, false, fmt.Errorf("owner %d:%d out of range", hdr.Uid, hdr.Gid)
	}
	ino.uid, ino.gid = hdr.Uid, hdr.Gid
	ino.mtime = hdr.ModTime
	x, err := parseXattrs(hdr.PAXRecords)
	if err != nil {
		return e, false, err
	}
	ino.xattrs = x
	return e, true, nil
}

// cleanPath splits a tar name into clean components (see the package
// comment for the rules).
func cleanPath(name string) ([]string, error) {
	if len(name) > MaxPathBytes {
		return nil, fmt.Errorf("name of %d bytes, more than %d", len(name), MaxPathBytes)
	}
	if strings.IndexByte(name, 0) >= 0 {
		return nil, errors.New("name holds a NUL byte")
	}
	var out []string
	for c := range strings.SplitSeq(name, "/") {
		switch c {
		case "", ".":
			continue
		case "..":
			return nil, errors.New(`name has a ".." component`)
		}
		if len(c) > MaxNameBytes {
			return nil, fmt.Errorf("name component of %d bytes, more than %d", len(c), MaxNameBytes)
		}
		out = append(out, c)
	}
	return out, nil
}

const xattrPAXPrefix = "SCHILY.xattr."

// parseXattrs picks an entry's xattrs out of its PAX records and checks
// them.
func parseXattrs(recs map[string]string) (map[string]string, error) {
	var x map[string]string
	size := 0
	for k, v := range recs {
		name, ok := strings.CutPrefix(k, xattrPAXPrefix)
		if !ok {
			continue
		}
		if name == "" || len(name) > 255 || strings.IndexByte(name, 0) >= 0 {
			return nil, fmt.Errorf("xattr name %.80q is not valid", name)
		}
		suffix := ""
		for _, p := range []string{"user.", "trusted.", "security."} {
			if s, ok := strings.CutPrefix(name, p); ok {
				suffix = s
				break
			}
		}
		if suffix == "" {
			return nil, fmt.Errorf("xattr %.80q: only user., trusted. and security. xattrs are kept (ACLs are not supported)", name)
		}
		size += 16 + (len(suffix)+3)&^3 + (len(v)+3)&^3
		if size > MaxXattrBytes {
			return nil, fmt.Errorf("xattrs of more than %d bytes (what an ext4 inode holds)", MaxXattrBytes)
		}
		if x == nil {
			x = map[string]string{}
		}
		x[name] = v
	}
	return x, nil
}

// metaBytes is what an inode costs the tree's metadata budget.
func (ino *inode) metaBytes() int64 {
	n := int64(len(ino.target))
	for k, v := range ino.xattrs {
		n += int64(len(k) + len(v))
	}
	return n
}

func (t *Tree) newNode(ino *inode, name string) (*node, error) {
	t.nodes++
	if t.nodes > t.lim.MaxEntries {
		return nil, fmt.Errorf("more than %d entries in the image", t.lim.MaxEntries)
	}
	t.meta += int64(len(name)) + 64
	if ino != nil {
		t.meta += ino.metaBytes()
	}
	if t.meta > t.lim.MaxMetadataBytes {
		return nil, fmt.Errorf("more than %d bytes of names, link targets and xattrs in the image", t.lim.MaxMetadataBytes)
	}
	n := &node{ino: ino}
	if ino.typ == tar.TypeDir {
		n.kids = map[string]*node{}
	}
	return n, nil
}

// lookup finds path literally (never through a symlink); nil if absent.
func (t *Tree) lookup(path []string) *node {
	n := t.root
	for _, c := range path {
		if n.kids == nil {
			return nil
		}
		if n = n.kids[c]; n == nil {
			return nil
		}
	}
	return n
}

// applyWhiteout hides a path (or, opaque, a directory's children) of the
// layers below. A whiteout of something absent does nothing.
func (t *Tree) applyWhiteout(e *entry) {
	if e.whiteout == whiteoutOpaque {
		if d := t.lookup(e.path); d != nil && d.kids != nil && len(d.kids) > 0 {
			d.kids = map[string]*node{}
		}
		return
	}
	parent := t.lookup(e.path[:len(e.path)-1])
	if parent != nil && parent.kids != nil {
		delete(parent.kids, e.path[len(e.path)-1])
	}
}

// parentDir returns the directory that holds path, making the missing
// ones (as 0755 root-owned directories, as a container runtime does).
func (t *Tree) parentDir(path []string) (*node, error) {
	n := t.root
	for i, c := range path[:len(path)-1] {
		k := n.kids[c]
		if k == nil {
			var err error
			if k, err = t.newNode(impliedDir(), c); err != nil {
				return nil, err
			}
			n.kids[c] = k
		} else if k.kids == nil {
			what := "not a directory"
			if k.ino.typ == tar.TypeSymlink {
				what = "a symlink"
			}
			return nil, fmt.Errorf("parent %q is %s", strings.Join(path[:i+1], "/"), what)
		}
		n = k
	}
	return n, nil
}

// apply adds one entry of the current layer.
func (t *Tree) apply(e *entry) error {
	if len(e.path) == 0 {
		// The root directory's own metadata.
		t.root.ino.setMeta(&e.ino)
		return nil
	}
	parent, err := t.parentDir(e.path)
	if err != nil {
		return err
	}
	base := e.path[len(e.path)-1]
	old := parent.kids[base]
	if e.link != nil {
		target := t.lookup(e.link)
		switch {
		case target == nil:
			return fmt.Errorf("hard link to %q, which does not exist", strings.Join(e.link, "/"))
		case target.kids != nil:
			return fmt.Errorf("hard link to directory %q", strings.Join(e.link, "/"))
		case old != nil && old.ino == target.ino:
			return nil
		case target.ino.links >= MaxLinks:
			return fmt.Errorf("more than %d hard links to %q", MaxLinks, strings.Join(e.link, "/"))
		}
		n, err := t.newNode(target.ino, base)
		if err != nil {
			return err
		}
		target.ino.links++
		n.ino = target.ino
		n.kids = nil
		parent.kids[base] = n
		return nil
	}
	if e.ino.typ == tar.TypeDir && old != nil && old.kids != nil {
		// A directory over a directory: new metadata, same children.
		t.meta += e.ino.metaBytes()
		if t.meta > t.lim.MaxMetadataBytes {
			return fmt.Errorf("more than %d bytes of names, link targets and xattrs in the image", t.lim.MaxMetadataBytes)
		}
		old.ino.setMeta(&e.ino)
		return nil
	}
	ino := e.ino
	n, err := t.newNode(&ino, base)
	if err != nil {
		return err
	}
	parent.kids[base] = n // whatever was there (a whole subtree) is gone
	return nil
}

// impliedDir is a directory no entry describes (the root, or the parent
// of an entry that came without its own): 0755, root's, time 0.
func impliedDir() *inode {
	return &inode{typ: tar.TypeDir, mode: 0o755, mtime: time.Unix(0, 0), layer: -1}
}

// setMeta gives a directory the metadata of a later entry for it.
func (ino *inode) setMeta(from *inode) {
	ino.mode, ino.uid, ino.gid, ino.mtime, ino.xattrs = from.mode, from.uid, from.gid, from.mtime, from.xattrs
}

// plan is what pass 2 writes, computed once from the final tree.
type plan struct {
	dirs     []pathNode
	data     []map[int]*inode // per layer: header index -> inode whose data it holds
	specials []pathNode       // symlinks, devices, fifos (their first path)
	links    []pathNode       // further paths of an inode, in order
	stats    Stats
}

type pathNode struct {
	path string
	ino  *inode
}

// Stats returns the tree's statistics. It is valid once every layer has
// been added.
func (t *Tree) Stats() Stats {
	if t.failed != nil {
		return Stats{}
	}
	return t.plan().stats
}

func (t *Tree) plan() *plan {
	if t.planned != nil {
		return t.planned
	}
	p := &plan{data: make([]map[int]*inode, t.layers)}
	p.stats.Entries = t.entries
	var walk func(n *node, path string)
	walk = func(n *node, path string) {
		if n.kids != nil {
			p.dirs = append(p.dirs, pathNode{path, n.ino})
			p.stats.Dirs++
			p.stats.DataBlocks++
			names := make([]string, 0, len(n.kids))
			for k := range n.kids {
				names = append(names, k)
			}
			sort.Strings(names)
			for _, k := range names {
				kp := k
				if path != "" {
					kp = path + "/" + k
				}
				walk(n.kids[k], kp)
			}
			return
		}
		ino := n.ino
		if ino.primary != "" {
			p.links = append(p.links, pathNode{path, ino})
			p.stats.HardLinks++
			return
		}
		ino.primary = path
		switch ino.typ {
		case tar.TypeReg:
			p.stats.Files++
			p.stats.ContentBytes += ino.size
			p.stats.DataBlocks += (ino.size + 4095) / 4096
			if p.data[ino.layer] == nil {
				p.data[ino.layer] = map[int]*inode{}
			}
			p.data[ino.layer][ino.index] = ino
		case tar.TypeSymlink:
			p.stats.Symlinks++
			if len(ino.target) > 59 {
				p.stats.DataBlocks++
			}
			p.specials = append(p.specials, pathNode{path, ino})
		default:
			p.stats.Specials++
			p.specials = append(p.specials, pathNode{path, ino})
		}
	}
	walk(t.root, "")
	t.planned = p
	return p
}

// Has reports whether path (cleaned as tar names are) is in the final
// tree.
func (t *Tree) Has(path string) bool {
	p, err := cleanPath(path)
	return err == nil && t.lookup(p) != nil
}

// LayerOpener opens layer i's uncompressed tar stream again for pass 2.
// The caller closes it; an error from Close fails WriteTo.
type LayerOpener func(i int) (io.ReadCloser, error)

// WriteTo is pass 2: it writes the final tree into tw (PAX headers; it
// does not close tw, so a caller can append entries of its own under
// Reserved), reading the data of visible regular files from open. It
// returns the number of bytes of file data written; progress, if not
// nil, is given that number after each file.
func (t *Tree) WriteTo(tw *tar.Writer, open LayerOpener, progress func(int64)) (int64, error) {
	if t.failed != nil {
		return 0, t.failed
	}
	p := t.plan()
	for _, d := range p.dirs {
		name := "./"
		if d.path != "" {
			name = d.path + "/"
		}
		if err := tw.WriteHeader(d.ino.header(name)); err != nil {
			return 0, fmt.Errorf("flatten: write %q: %w", name, err)
		}
	}
	var written int64
	for layer, want := range p.data {
		if len(want) == 0 {
			continue
		}
		n, err := t.copyLayer(tw, open, layer, want, written, progress)
		written += n
		if err != nil {
			return written, err
		}
	}
	for _, s := range p.specials {
		if err := tw.WriteHeader(s.ino.header(s.path)); err != nil {
			return written, fmt.Errorf("flatten: write %q: %w", s.path, err)
		}
	}
	for _, l := range p.links {
		h := l.ino.header(l.path)
		h.Typeflag, h.Linkname, h.Size, h.PAXRecords = tar.TypeLink, l.ino.primary, 0, nil
		if err := tw.WriteHeader(h); err != nil {
			return written, fmt.Errorf("flatten: write %q: %w", l.path, err)
		}
	}
	return written, nil
}

// copyLayer streams the wanted regular files of one layer into tw, and
// stops reading the layer after the last of them.
func (t *Tree) copyLayer(tw *tar.Writer, open LayerOpener, layer int, want map[int]*inode, before int64, progress func(int64)) (n int64, err error) {
	rc, err := open(layer)
	if err != nil {
		return 0, fmt.Errorf("flatten: layer %d: %w", layer, err)
	}
	defer func() {
		if cerr := rc.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("flatten: layer %d: %w", layer, cerr)
		}
	}()
	last := -1
	for i := range want {
		last = max(last, i)
	}
	tr := tar.NewReader(rc)
	for i := 0; i <= last; i++ {
		hdr, err := tr.Next()
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return n, fmt.Errorf("flatten: layer %d: entry %d: %w (the layer changed between passes)", layer, i, err)
		}
		ino := want[i]
		if ino == nil {
			continue
		}
		h := fnv.New64a()
		h.Write([]byte(hdr.Name))
		if (hdr.Typeflag != tar.TypeReg && hdr.Typeflag != tar.TypeGNUSparse) || hdr.Size != ino.size || h.Sum64() != ino.nameHash {
			return n, fmt.Errorf("flatten: layer %d: entry %d (%.200q) is not the one read in pass 1 (the layer changed between passes)", layer, i, hdr.Name)
		}
		if err := tw.WriteHeader(ino.header(ino.primary)); err != nil {
			return n, fmt.Errorf("flatten: write %q: %w", ino.primary, err)
		}
		c, err := io.CopyN(tw, tr, ino.size)
		n += c
		if err != nil {
			return n, fmt.Errorf("flatten: layer %d: %q: %w", layer, hdr.Name, err)
		}
		if progress != nil {
			progress(before + n)
		}
	}
	return n, nil
}

// header is the tar header that recreates ino at name.
func (ino *inode) header(name string) *tar.Header {
	h := &tar.Header{
		Typeflag:   ino.typ,
		Name:       name,
		Mode:       ino.mode,
		Uid:        ino.uid,
		Gid:        ino.gid,
		ModTime:    ino.mtime,
		AccessTime: ino.mtime,
		ChangeTime: ino.mtime,
		Format:     tar.FormatPAX,
	}
	switch ino.typ {
	case tar.TypeReg:
		h.Size = ino.size
	case tar.TypeSymlink:
		h.Linkname = ino.target
	case tar.TypeChar, tar.TypeBlock:
		h.Devmajor, h.Devminor = ino.major, ino.minor
	}
	if len(ino.xattrs) > 0 {
		h.PAXRecords = make(map[string]string, len(ino.xattrs))
		for k, v := range ino.xattrs {
			h.PAXRecords[xattrPAXPrefix+k] = v
		}
	}
	return h
}
