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

	"golang.org/x/sys/unix"
)

// Ext is the file name extension of the overlays Fork creates.
const Ext = ".wcow"

// forkCreate is Create; tests make it fail.
var forkCreate = Create

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
	fc, ok := cur.(frozen)
	if !ok {
		return nil, nil, fmt.Errorf("fork: %T is not an overlay or raw image file", cur)
	}
	curPath, err := filepath.Abs(fc.Path())
	if err != nil {
		return nil, nil, fmt.Errorf("fork %s: %w", fc.Path(), err)
	}
	fail := func(err error) (*Overlay, []string, error) {
		return nil, nil, fmt.Errorf("fork %s: %w", curPath, err)
	}
	if n < 0 {
		return fail(fmt.Errorf("%d children", n))
	}
	if dir == "" {
		dir = filepath.Dir(curPath)
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return fail(err)
	}
	basePath := curPath
	if dir == filepath.Dir(curPath) {
		basePath = filepath.Base(curPath)
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
		syncDir(dir)
		fc.setReadOnly(false)
	}
	create := func() (*Overlay, error) {
		p := filepath.Join(dir, stem+"."+uniqueSuffix()+Ext)
		o, err := forkCreate(p, fc, CreateOptions{BasePath: basePath})
		if err != nil {
			return nil, err
		}
		created = append(created, p)
		return o, nil
	}
	if parent, err = create(); err != nil {
		undo()
		return fail(err)
	}
	for range n {
		c, err := create()
		if err == nil {
			err = c.Close()
		}
		if err != nil {
			undo()
			return fail(err)
		}
		children = append(children, c.Path())
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
	return parent, children, nil
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
