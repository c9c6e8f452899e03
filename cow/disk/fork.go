package disk

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/warrenvm/warren/internal/atomicfile"
	"golang.org/x/sys/unix"
)

// Ext is the file name extension of the overlays Fork creates.
const Ext = ".wcow"

// frozen is what Fork needs of the disk it freezes: an *Overlay or a *Raw,
// opened writable.
type frozen interface {
	Backing
	Path() string
	Sync() error
	Close() error
	file() *os.File
	setReadOnly(bool) (was bool)
}

func (o *Overlay) file() *os.File                 { return o.f }
func (o *Overlay) setReadOnly(ro bool) (was bool) { return o.readOnly.Swap(ro) }
func (r *Raw) file() *os.File                     { return r.f }
func (r *Raw) setReadOnly(ro bool) (was bool)     { return r.readOnly.Swap(ro) }

// Fork freezes the disk whose current top is cur, an *Overlay or a *Raw
// opened writable (anything else is refused), and stacks new overlays on
// it: one for the parent, returned open and writable, and n for children,
// returned as paths of closed files (a child opens its own with
// OpenChain(path, false)). The parent and every child see the disk as it
// was at the fork and write independently from then on.
//
// The caller must keep cur quiet while Fork runs: no write, discard or
// Sync (a virtio-blk device on it quiesced); reads are fine.
//
// Freezing cur: Fork syncs it, makes it refuse writes and discards from
// now on (its Sync and Close become no-ops on the data, as for a read-only
// open), and converts its exclusive flock into a shared one, so that other
// processes can open the children's chains (OpenChain takes shared locks
// below the top) while this one still has cur open, and nobody can open
// cur for writing again.
//
// Ownership: on success the parent's overlay owns cur: its Close closes
// cur too (and, for an overlay from OpenChain, the layers below). The
// caller keeps only the parent's overlay and must not close cur itself.
// On error cur is as before (writable, exclusively locked, owned by the
// caller) and every file Fork created is removed.
//
// Files: created in dir (cur's directory when dir is ""), named
// <stem>.<unique>.wcow, where stem is the base name of cur's file without
// its extension and without a unique part an earlier Fork gave it (so
// that names do not grow fork after fork: disk.img, then
// disk.<unique>.wcow for every generation), and unique is the time in
// nanoseconds and 32 random bits, in hex. Each header's base path is cur's
// base name if dir is cur's directory, else cur's absolute path. Every new
// file and dir are fsynced before Fork returns.
func Fork(cur Backing, n int, dir string) (parent *Overlay, children []string, err error) {
	if n < 0 {
		return nil, nil, fmt.Errorf("fork: %d children", n)
	}
	return ForkInto(cur, dir, make([]string, n))
}

// ForkInto is Fork with a directory per child: child k's overlay is
// created in childDirs[k] ("" : dir), with cur's absolute path as its base
// path when that is not cur's directory. The parent's goes into dir, as
// for Fork.
func ForkInto(cur Backing, dir string, childDirs []string) (parent *Overlay, children []string, err error) {
	parent, children, _, err = forkInto(cur, dir, childDirs, false, Create)
	return parent, children, err
}

// ForkDeferred is ForkInto for children that make their own overlays:
// children that run as other users, in directories this process may not
// write. It freezes cur and makes the parent's overlay as ForkInto does,
// makes cur readable by its group (the children's: hostd/daemon's
// grants), and returns the path child k's overlay is to have in
// childDirs[k] and cur's absolute path, which child k passes to
// CreateChild before it opens its disk.
func ForkDeferred(cur Backing, dir string, childDirs []string) (parent *Overlay, children []string, base string, err error) {
	return forkInto(cur, dir, childDirs, true, Create)
}

// CreateChild makes a fork child's overlay at path over the frozen image
// base (ForkDeferred's), as ForkInto would have made it: its header
// records base's absolute path. The file and its directory are fsynced;
// an existing path is refused.
func CreateChild(path, base string) error {
	if !filepath.IsAbs(base) {
		return fmt.Errorf("fork child %s: base %q is not absolute", path, base)
	}
	var b interface {
		Backing
		Close() error
	}
	var err error
	if ov, ierr := IsOverlay(base); ierr != nil {
		return fmt.Errorf("fork child %s: %w", path, ierr)
	} else if ov {
		b, err = OpenChain(base, true)
	} else {
		b, err = OpenRaw(base, false)
	}
	if err != nil {
		return fmt.Errorf("fork child %s: %w", path, err)
	}
	defer b.Close()
	o, err := Create(path, b, CreateOptions{BasePath: base})
	if err != nil {
		return err
	}
	if err := o.Close(); err != nil {
		os.Remove(path)
		return err
	}
	return atomicfile.SyncDir(filepath.Dir(path))
}

// forkInto is ForkInto, and with deferChildren ForkDeferred, making the
// overlays with newOverlay (Create; a test's may fail); it returns cur's
// absolute path too.
func forkInto(cur Backing, dir string, childDirs []string, deferChildren bool,
	newOverlay func(string, Backing, CreateOptions) (*Overlay, error)) (parent *Overlay, children []string, curPath string, err error) {
	fc, ok := cur.(frozen)
	if !ok {
		return nil, nil, "", fmt.Errorf("fork: %T is not an overlay or raw image file", cur)
	}
	curPath, err = filepath.Abs(fc.Path())
	if err != nil {
		return nil, nil, "", fmt.Errorf("fork %s: %w", fc.Path(), err)
	}
	fail := func(err error) (*Overlay, []string, string, error) {
		return nil, nil, "", fmt.Errorf("fork %s: %w", curPath, err)
	}
	if dir == "" {
		dir = filepath.Dir(curPath)
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return fail(err)
	}
	dirs := []string{dir}
	for _, d := range childDirs {
		if d == "" {
			d = dir
		}
		if d, err = filepath.Abs(d); err != nil {
			return fail(err)
		}
		dirs = append(dirs, d)
	}
	stem := forkStem(curPath)

	if err := fc.Sync(); err != nil {
		return fail(err)
	}
	if fc.setReadOnly(true) {
		return fail(errors.New("read-only: only a writable disk is forked"))
	}
	var created []string
	undo := func() {
		if parent != nil {
			parent.Close() // does not own cur yet
		}
		for _, p := range created {
			os.Remove(p)
		}
		for _, d := range dirs {
			atomicfile.SyncDir(d)
		}
		fc.setReadOnly(false)
	}
	create := func(dir string) (*Overlay, error) {
		basePath := curPath
		if dir == filepath.Dir(curPath) {
			basePath = filepath.Base(curPath)
		}
		p := filepath.Join(dir, stem+"."+uniqueSuffix()+Ext)
		o, err := newOverlay(p, fc, CreateOptions{BasePath: basePath})
		if err != nil {
			return nil, err
		}
		created = append(created, p)
		return o, nil
	}
	if parent, err = create(dir); err != nil {
		undo()
		return fail(err)
	}
	for _, d := range dirs[1:] {
		if deferChildren {
			children = append(children, filepath.Join(d, stem+"."+uniqueSuffix()+Ext))
			continue
		}
		c, err := create(d)
		if err == nil {
			err = c.Close()
		}
		if err != nil {
			undo()
			return fail(err)
		}
		children = append(children, c.Path())
	}
	if deferChildren {
		// The children open it as their own uids, in its group (a file
		// this process does not own is left as it is).
		if err := fc.file().Chmod(0o640); err != nil && !errors.Is(err, os.ErrPermission) {
			undo()
			return fail(err)
		}
	}
	// Shared lock last: converting it is the one step that cannot be
	// undone for sure (Linux drops the old lock before taking the new).
	if err := flock(fc.file(), unix.LOCK_SH); err != nil {
		rerr := flock(fc.file(), unix.LOCK_EX)
		undo()
		if rerr != nil {
			return fail(fmt.Errorf("downgrade lock: %w (and the exclusive lock is lost: %v)", err, rerr))
		}
		return fail(fmt.Errorf("downgrade lock: %w", err))
	}
	parent.closeBase = fc.Close
	return parent, children, curPath, nil
}

// forkStem is the base name of path without its extension and without a
// unique part (see uniqueSuffix) that a Fork gave it.
func forkStem(path string) string {
	base := filepath.Base(path)
	stem := strings.TrimSuffix(base, filepath.Ext(base))
	if i := strings.LastIndexByte(stem, '.'); i >= 0 && isUniqueSuffix(stem[i+1:]) {
		stem = stem[:i]
	}
	if stem == "" {
		stem = "disk"
	}
	return stem
}

// uniqueSuffix is the time in nanoseconds and 32 random bits, in hex:
// "<hex>-<8 hex>".
func uniqueSuffix() string {
	var rnd [4]byte
	rand.Read(rnd[:])
	return fmt.Sprintf("%x-%08x", time.Now().UnixNano(), binary.LittleEndian.Uint32(rnd[:]))
}

// isUniqueSuffix reports whether s has the form uniqueSuffix makes.
func isUniqueSuffix(s string) bool {
	t, r, ok := strings.Cut(s, "-")
	return ok && len(t) >= 1 && len(t) <= 16 && isHex(t) && len(r) == 8 && isHex(r)
}

func isHex(s string) bool {
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Pending is the new top of a disk frozen at a snapshot, made in three
// steps so that the snapshot's pause holds only a sync of the old top:
// PrepareFreeze, before the pause, creates its file (full size, holes, no
// header yet: not an overlay) and syncs it with its directory; Freeze, in
// the pause, freezes the old top and hands out the new one, open and
// writable; Commit, after the pause, writes the new top's header (whose
// base digest, Identity of the frozen view, hashes 2 MiB: too slow for the
// pause) and fdatasyncs it. Until Commit the new top is not an overlay on
// disk; it is referenced by nothing but its VM (a snapshot records the
// frozen layer, never a live top), so a crash in between loses nothing a
// snapshot holds. Commit must run before anything builds on the new top
// (a freeze of it, a fork, a Rebase).
type Pending struct {
	cur  frozen
	f    *os.File
	path string
	hdr  Header
	top  *Overlay // after Freeze
	done bool     // committed or discarded
}

// PrepareFreeze makes the file of the overlay that will go over cur (an
// *Overlay or a *Raw opened writable) when Freeze freezes it, beside cur,
// named as Fork names its files, and locks it exclusively. Nothing of cur
// changes.
func PrepareFreeze(cur Backing) (*Pending, error) {
	fc, ok := cur.(frozen)
	if !ok {
		return nil, fmt.Errorf("freeze: %T is not an overlay or raw image file", cur)
	}
	curPath, err := filepath.Abs(fc.Path())
	if err != nil {
		return nil, fmt.Errorf("freeze %s: %w", fc.Path(), err)
	}
	h := Header{BlockSize: DefaultBlockSize, VirtualSize: uint64(cur.Size()), BaseSize: uint64(cur.Size()),
		BasePath: filepath.Base(curPath), Version: Version, Generation: 1}
	if err := h.check(MaxBasePath); err != nil {
		return nil, fmt.Errorf("freeze %s: %w", curPath, err)
	}
	p := NewLayerPath(filepath.Dir(curPath), curPath)
	f, err := createFile(p, nil, int64(h.FileSize()))
	if err != nil {
		return nil, fmt.Errorf("freeze %s: %w", curPath, err)
	}
	return &Pending{cur: fc, f: f, path: p, hdr: h}, nil
}

// Path is the new top's file.
func (p *Pending) Path() string { return p.path }

// State says where p is: frozen (Freeze ran) and done (committed or
// discarded).
func (p *Pending) State() (frozen, done bool) { return p.top != nil, p.done }

// Freeze freezes the disk's top as Fork does (synced, refusing writes
// from now on, its lock made shared) and returns the new top over it,
// open and writable, which owns the frozen one (Close closes it). The
// caller keeps the old top quiet meanwhile, as for Fork, and calls Commit
// after the pause. On an error the old top is as before and the prepared
// file stays (Discard it).
func (p *Pending) Freeze() (*Overlay, error) {
	fc := p.cur
	fail := func(err error) (*Overlay, error) { return nil, fmt.Errorf("freeze %s: %w", fc.Path(), err) }
	if p.top != nil || p.done {
		return fail(errors.New("already frozen or discarded"))
	}
	if fc.Size() != int64(p.hdr.VirtualSize) {
		return fail(errors.New("the disk changed size"))
	}
	if err := fc.Sync(); err != nil {
		return fail(err)
	}
	if fc.setReadOnly(true) {
		return fail(errors.New("read-only: only a writable disk is frozen"))
	}
	if err := flock(fc.file(), unix.LOCK_SH); err != nil {
		rerr := flock(fc.file(), unix.LOCK_EX)
		fc.setReadOnly(false)
		if rerr != nil {
			return fail(fmt.Errorf("downgrade lock: %w (and the exclusive lock is lost: %v)", err, rerr))
		}
		return fail(fmt.Errorf("downgrade lock: %w", err))
	}
	h := p.hdr
	p.top = newOverlay(p.f, &h, fc, false)
	p.top.closeBase = fc.Close
	return p.top, nil
}

// Commit writes the new top's header (after Freeze, the VM running: the
// frozen view does not change any more) and fdatasyncs it.
func (p *Pending) Commit() error {
	if p.top == nil || p.done {
		return fmt.Errorf("commit %s: not frozen, or already done", p.path)
	}
	p.done = true
	id, err := Identity(p.cur)
	if err != nil {
		return fmt.Errorf("commit %s: %w", p.path, err)
	}
	h := p.hdr
	h.BaseDigest = id
	b, err := h.Marshal()
	if err != nil {
		return fmt.Errorf("commit %s: %w", p.path, err)
	}
	if _, err := p.f.WriteAt(b, 0); err != nil {
		return fmt.Errorf("commit %s: %w", p.path, err)
	}
	if err := fdatasync(p.f); err != nil {
		return fmt.Errorf("commit %s: %w", p.path, err)
	}
	p.top.baseMu.Lock()
	p.top.hdr.BaseDigest = id
	p.top.baseMu.Unlock()
	return nil
}

// Discard removes the prepared file if Freeze did not use it (a snapshot
// that failed before its freeze); after Freeze it does nothing.
func (p *Pending) Discard() {
	if p.top != nil || p.done {
		return
	}
	p.done = true
	p.f.Close()
	os.Remove(p.path)
}
