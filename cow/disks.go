package cow

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/devices/virtio/blk"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"golang.org/x/sys/unix"
)

// Disk is one virtio-blk disk of a VM that forks and snapshots. A
// writable disk must have been made with blk.NewWithBackend over a
// writable cow/disk Raw or Overlay (OpenDisk does that), so that its image
// can be frozen.
type Disk struct {
	Dev      *blk.Device
	ReadOnly bool
	// OwnTop says the image the VM was started on is the VM's own (made
	// for it: a restore's new overlay, one given with --disk-path, a fork
	// child's): a rollback removes it like the tops its snapshots make.
	// An image the user named (warren run --disk) is only closed.
	OwnTop bool
}

// DiskFiles names one writable disk's files, as the VM's control API
// reports them (snapshot, rollback and fork answers, GET /v1/disks).
type DiskFiles struct {
	// Index is the disk's position among the VM's disks.
	Index int `json:"index"`
	// Layer is, in a snapshot's answer, the frozen (or merged) layer the
	// snapshot records; empty elsewhere.
	Layer string `json:"layer,omitempty"`
	// Chain is the images under Top, top first, down to the bottom image
	// (in a snapshot's answer Layer is the first), as absolute paths.
	Chain []string `json:"chain"`
	// Top is the live top the VM writes to.
	Top string `json:"top"`
}

// OpenDisk opens the image at path as a disk backend that can fork: a
// cow/disk overlay (with its chain) when the file is one, else a raw
// image. Writable images are locked exclusively, read-only ones shared.
func OpenDisk(path string, readOnly bool) (blk.Backend, error) {
	ov, err := disk.IsOverlay(path)
	if err != nil {
		return nil, err
	}
	if ov {
		return disk.OpenChain(path, readOnly)
	}
	return disk.OpenRaw(path, !readOnly)
}

// DiskSet is a VM's disks as its snapshots, rollbacks and forks change
// them; it implements vmsnap.Disks.
//
// Invariants. A writable disk's device serves its live top: a writable
// cow/disk Overlay (or, before the first freeze, the image the VM was
// started on), which nothing else references: snapshots record frozen
// layers only, and a fork gives its children overlays over a frozen layer
// only. So a rollback may remove the live top it replaces. Frozen layers
// are never written or rebased again. A VM's own layers are those in its
// live top's directory (cow/disk Owned), where every freeze, rollback and
// fork puts the VM's new top; a full snapshot merges them (never a layer
// elsewhere: a template's base, a fork parent's layer).
//
// mu serialises every change of the stacks: a snapshot (Lock, Prepare,
// Freeze, Settle, Unlock: the Snapshotter), a rollback (Lock,
// PrepareRollback, Swap, Done or Abort, Unlock), a fork (forkDisks) and
// Live. ownTop and pending are guarded by mu.
type DiskSet struct {
	mu     sync.Mutex
	disks  []Disk
	ownTop []bool
	// pending are the new tops Prepare made, by disk index, until Settle
	// commits them (after Freeze used them); Unlock discards those no
	// Freeze used and commits the others (a snapshot that failed).
	pending map[int]*disk.Pending
}

// NewDiskSet returns the set of disks, in the VM's disk order.
func NewDiskSet(disks []Disk) *DiskSet {
	s := &DiskSet{disks: disks}
	for _, d := range disks {
		s.ownTop = append(s.ownTop, d.OwnTop)
	}
	return s
}

// Disks are the VM's disks, in order.
func (s *DiskSet) Disks() []Disk { return s.disks }

// Lock takes the set's lock (vmsnap.Disks).
func (s *DiskSet) Lock() { s.mu.Lock() }

// Unlock releases it, first settling the new tops Prepare made that are
// left over (a snapshot that failed in between): a frozen one's header is
// committed (its VM runs on it), an unused one's file is removed.
func (s *DiskSet) Unlock() {
	s.settlePending()
	s.mu.Unlock()
}

// settlePending commits or discards the pending new tops (caller holds
// the lock).
func (s *DiskSet) settlePending() error {
	var errs []error
	for i, p := range s.pending {
		switch frozen, done := p.State(); {
		case !frozen:
			p.Discard()
		case !done:
			if err := p.Commit(); err != nil {
				errs = append(errs, fmt.Errorf("disk %d: %w", i, err))
			}
		}
		delete(s.pending, i)
	}
	return errors.Join(errs...)
}

// top returns writable disk i's live top as the frozen image Fork takes.
func (s *DiskSet) top(i int) (disk.Backing, error) {
	d := s.disks[i]
	cur, ok := d.Dev.Backend().(disk.Backing)
	if !ok {
		return nil, fmt.Errorf("disk %s: its backend (%T) cannot be frozen", d.Dev.Path(), d.Dev.Backend())
	}
	return cur, nil
}

// Prepare syncs each writable top and makes the file of the new top that
// Freeze will stack on it, beside it (cow/disk PrepareFreeze), so that the
// pause holds only a sync and a header write per disk (vmsnap.Disks; the
// VM running, caller holds the lock).
func (s *DiskSet) Prepare() error {
	s.pending = map[int]*disk.Pending{}
	for i, d := range s.disks {
		if d.ReadOnly {
			continue
		}
		if err := d.Dev.Backend().Sync(); err != nil {
			return fmt.Errorf("disk %d (%s): sync: %w", i, d.Dev.Path(), err)
		}
		cur, err := s.top(i)
		if err != nil {
			return err
		}
		p, err := disk.PrepareFreeze(cur)
		if err != nil {
			return fmt.Errorf("disk %d (%s): %w", i, d.Dev.Path(), err)
		}
		s.pending[i] = p
	}
	return nil
}

// Freeze freezes each writable disk's top in place and gives the device
// the new overlay Prepare made over it (cow/disk Pending), and returns the
// frozen layers (vmsnap.Disks; in the pause, caller holds the lock). On an
// error the disks already frozen stay so (their VM runs on their new
// overlays, which is as good as before).
func (s *DiskSet) Freeze() ([]vmsnap.DiskLayer, error) {
	out := []vmsnap.DiskLayer{}
	for i, d := range s.disks {
		if d.ReadOnly {
			continue
		}
		cur, err := s.top(i)
		if err != nil {
			return nil, err
		}
		p := s.pending[i]
		if p == nil {
			return nil, fmt.Errorf("disk %d (%s): no new top prepared (Prepare was not called)", i, d.Dev.Path())
		}
		top, err := p.Freeze()
		if err != nil {
			return nil, fmt.Errorf("disk %d (%s): %w", i, d.Dev.Path(), err)
		}
		if _, err := d.Dev.SwapBackend(top); err != nil {
			// top owns cur now; closing it would close the disk under the
			// device. Leave both; the snapshot fails.
			return nil, fmt.Errorf("disk %d (%s): %w", i, d.Dev.Path(), err)
		}
		s.ownTop[i] = true
		layer := absPath(pathOf(cur))
		out = append(out, vmsnap.DiskLayer{Index: i, Layer: layer, Chain: append([]string{layer}, disk.Chain(cur)...)})
	}
	return out, nil
}

// Settle returns the layers a snapshot records (vmsnap.Disks; the VM
// running, caller holds the lock), after committing the new tops (their
// headers, cow/disk Pending Commit). For a full one it merges, for each
// disk, the run of layers the VM owns from the frozen layer down
// (cow/disk MergeOwned: a copy of only the blocks those layers hold) into
// one overlay beside them, rebases the live top onto it (same content by
// construction), removes the frozen layer (which nothing references yet:
// the snapshot records the merged one, and no fork has run since the
// freeze), and records the merged layer. A disk whose merge or rebase
// fails keeps its frozen layer, and the error says so.
func (s *DiskSet) Settle(frozen []vmsnap.DiskLayer, full bool) ([]vmsnap.DiskLayer, error) {
	out := slices.Clone(frozen)
	// The new tops' headers first: the merge rebases onto them.
	if err := s.settlePending(); err != nil {
		// A new top without its header cannot be built on: no merge.
		return out, err
	}
	if !full {
		return out, nil
	}
	var errs []error
	for k, fl := range frozen {
		top, ok := s.disks[fl.Index].Dev.Backend().(*disk.Overlay)
		if !ok {
			continue
		}
		layer, ok := top.Base().(*disk.Overlay)
		if !ok || absPath(layer.Path()) != fl.Layer {
			continue // a raw image frozen in place: nothing under it to merge
		}
		m, chain, _, err := disk.MergeOwned(layer)
		if err != nil {
			errs = append(errs, fmt.Errorf("disk %d: merge: %w", fl.Index, err))
			continue
		}
		if m == "" {
			continue
		}
		if err := top.Rebase(m); err != nil {
			os.Remove(m)
			errs = append(errs, fmt.Errorf("disk %d: %w", fl.Index, err))
			continue
		}
		// The rebase closed the old chain (the top owned it).
		if err := os.Remove(fl.Layer); err != nil {
			errs = append(errs, fmt.Errorf("disk %d: remove the merged-away layer: %w", fl.Index, err))
		}
		out[k] = vmsnap.DiskLayer{Index: fl.Index, Layer: m, Chain: chain}
	}
	return out, errors.Join(errs...)
}

// Live reports each writable disk's live top and the chain under it.
func (s *DiskSet) Live() []DiskFiles {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live()
}

func (s *DiskSet) live() []DiskFiles {
	out := []DiskFiles{}
	for i, d := range s.disks {
		if d.ReadOnly {
			continue
		}
		be := d.Dev.Backend()
		chain := []string{}
		if b, ok := be.(disk.Backing); ok {
			chain = append(chain, disk.Chain(b)...)
		}
		out = append(out, DiskFiles{Index: i, Top: absPath(pathOf(be)), Chain: chain})
	}
	return out
}

// LiveLocked is Live for a caller that holds the lock.
func (s *DiskSet) LiveLocked() []DiskFiles { return s.live() }

// PrepareRollback checks snap's disk layers against the VM's writable
// disks and makes a new overlay over each layer in the directory of the
// disk's live top (the VM's own), opened and checked against the chain
// the snapshot recorded (vmsnap.Disks; caller holds the lock). A snapshot
// without disk layers (format version 1) is refused for a VM with
// writable disks, naming its version.
func (s *DiskSet) PrepareRollback(snap *vmsnap.Snapshot) (vmsnap.DiskRollback, error) {
	writable, layers, err := s.check(snap)
	if err != nil {
		return nil, err
	}
	r := &rollback{s: s}
	for _, i := range writable {
		cur := s.disks[i].Dev.Backend()
		dir := filepath.Dir(absPath(pathOf(cur)))
		o, err := newTopOver(layers[i], dir, s.disks[i].Dev.Capacity()*blk.SectorSize)
		if err != nil {
			r.Abort()
			return nil, fmt.Errorf("disk %d (%s): %w", i, s.disks[i].Dev.Path(), err)
		}
		r.idx = append(r.idx, i)
		r.fresh = append(r.fresh, o)
	}
	return r, nil
}

// CanRollback says whether the VM's disks can be rolled back to snap's:
// nil, or why not (what PrepareRollback would refuse, without making
// anything). The disks do not change between it and a rollback only if the
// caller serialises them (the control API's callers do).
func (s *DiskSet) CanRollback(snap *vmsnap.Snapshot) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _, err := s.check(snap)
	return err
}

// check returns the writable disks' indices and, by index, their layers
// in snap, or why snap cannot give them back (caller holds the lock).
func (s *DiskSet) check(snap *vmsnap.Snapshot) ([]int, map[int]vmsnap.DiskLayer, error) {
	var writable []int
	for i, d := range s.disks {
		if !d.ReadOnly {
			writable = append(writable, i)
		}
	}
	if len(writable) == 0 {
		return nil, nil, nil
	}
	if snap.Disks == nil {
		var names []string
		for _, i := range writable {
			names = append(names, s.disks[i].Dev.Path())
		}
		return nil, nil, fmt.Errorf("the VM has writable disks (%v) and snapshot %s holds no disk state (snapshot format version %d, from before snapshots held disks): rolling back memory alone would corrupt their file systems",
			names, snap.Path, snap.Meta.Version)
	}
	layers, err := matchLayers(snap.Disks, s.disks)
	if err != nil {
		return nil, nil, fmt.Errorf("snapshot %s: %w", snap.Path, err)
	}
	return writable, layers, nil
}

// matchLayers returns, by disk index, the layer of each writable disk,
// refusing a layer missing for a writable disk or recorded for a
// read-only or absent one.
func matchLayers(layers []vmsnap.DiskLayer, disks []Disk) (map[int]vmsnap.DiskLayer, error) {
	by := map[int]vmsnap.DiskLayer{}
	for _, l := range layers {
		if l.Index >= len(disks) || disks[l.Index].ReadOnly {
			return nil, fmt.Errorf("it holds a layer for disk %d, which this VM has not as a writable disk", l.Index)
		}
		by[l.Index] = l
	}
	for i, d := range disks {
		if _, ok := by[i]; !ok && !d.ReadOnly {
			return nil, fmt.Errorf("it holds no layer for writable disk %d (%s)", i, d.Dev.Path())
		}
	}
	return by, nil
}

// newTopOver makes a new overlay over layer's image in dir, opens it with
// its chain and checks it against the chain the snapshot recorded and the
// disk's size. On an error the new file is removed.
func newTopOver(layer vmsnap.DiskLayer, dir string, size uint64) (*disk.Overlay, error) {
	p := disk.NewLayerPath(dir, layer.Layer)
	if err := disk.CreateOn(p, layer.Layer); err != nil {
		return nil, err
	}
	o, err := disk.OpenChain(p, false)
	if err == nil {
		err = CheckChain(o, layer.Chain)
		if err == nil && uint64(o.Size()) != size {
			err = fmt.Errorf("the layer is %d bytes, the disk %d", o.Size(), size)
		}
		if err != nil {
			o.Close()
		}
	}
	if err != nil {
		os.Remove(p)
		return nil, err
	}
	return o, nil
}

// CheckChain checks that the images under be (an opened overlay) are
// exactly chain, the ones a snapshot recorded for its layer: frozen
// layers never change, so any difference means the files were replaced.
func CheckChain(be blk.Backend, chain []string) error {
	b, ok := be.(disk.Backing)
	if !ok {
		return fmt.Errorf("%T is not a cow/disk image", be)
	}
	if got := disk.Chain(b); !slices.Equal(got, chain) {
		return fmt.Errorf("the disk's chain is %q, the snapshot recorded %q", got, chain)
	}
	return nil
}

// rollback is a DiskSet's rollback in progress: the new tops by disk.
type rollback struct {
	s     *DiskSet
	idx   []int
	fresh []*disk.Overlay
	// old are the tops Swap replaced, by position in idx.
	old []blk.Backend
}

// Swap gives each device its new top (in the pause).
func (r *rollback) Swap() error {
	for k, i := range r.idx {
		old, err := r.s.disks[i].Dev.SwapBackend(r.fresh[k])
		if err != nil {
			return fmt.Errorf("disk %d: %w", i, err)
		}
		r.old = append(r.old, old)
	}
	return nil
}

// Done closes the replaced tops and removes those that were the VM's own
// live tops (writable overlays nothing else references), after the resume.
func (r *rollback) Done() error {
	var errs []error
	for k, old := range r.old {
		i := r.idx[k]
		p := absPath(pathOf(old))
		own := r.s.ownTop[i]
		ov, isOverlay := old.(*disk.Overlay)
		live := isOverlay && !ov.ReadOnly()
		if err := old.Close(); err != nil {
			errs = append(errs, fmt.Errorf("disk %d: close %s: %w", i, p, err))
		}
		if own && live {
			if err := os.Remove(p); err != nil {
				errs = append(errs, fmt.Errorf("disk %d: remove %s: %w", i, p, err))
			}
		}
		r.s.ownTop[i] = true
	}
	return errors.Join(errs...)
}

// Abort closes and removes the new tops not swapped in.
func (r *rollback) Abort() {
	for k := len(r.old); k < len(r.fresh); k++ {
		p := r.fresh[k].Path()
		r.fresh[k].Close()
		os.Remove(p)
	}
}

// pathOf is the file path of a disk backend (an Overlay or a Raw), else "".
func pathOf(b any) string {
	if p, ok := b.(interface{ Path() string }); ok {
		return p.Path()
	}
	return ""
}

// absPath is path made absolute ("" stays "").
func absPath(path string) string {
	if path == "" {
		return ""
	}
	if a, err := filepath.Abs(path); err == nil {
		return a
	}
	return path
}

// forkDisks freezes every writable disk under new overlays, one swapped in
// for the parent and one per child (cow/disk ForkInto: child k's in
// childDirs[k], "" beside the parent's disk), and returns, per disk, the
// image each child opens: its overlay, or for a read-only disk the shared
// image. The VM is paused and its transports quiesced; the caller holds
// the set's lock. On an error the disks already forked stay forked (the
// parent runs on its new overlays, which is as good as before) and the
// children's overlay files are removed.
//
// With deferred (Forker.ChildrenMakeDisks) the children's overlays are
// not made (cow/disk ForkDeferred): bases[i] is what child k's overlay
// out[i][k] goes on, and every file of the disk's chain this process owns
// becomes readable by its group (as does a read-only image it owns).
func (s *DiskSet) forkDisks(childDirs []string, deferred bool) (_ [][]string, bases []string, err error) {
	n := len(childDirs)
	out := make([][]string, len(s.disks))
	if deferred {
		bases = make([]string, len(s.disks))
	}
	defer func() {
		if err != nil {
			for _, paths := range out {
				for _, p := range paths {
					if ok, _ := disk.IsOverlay(p); ok {
						os.Remove(p)
					}
				}
			}
		}
	}()
	for i, d := range s.disks {
		if d.ReadOnly {
			for range n {
				out[i] = append(out[i], d.Dev.Path())
			}
			if deferred {
				groupReadable([]string{d.Dev.Path()})
			}
			continue
		}
		cur, err := s.top(i)
		if err != nil {
			return nil, nil, err
		}
		var parent *disk.Overlay
		var children []string
		if deferred {
			groupReadable(disk.Chain(cur))
			parent, children, bases[i], err = disk.ForkDeferred(cur, "", childDirs)
		} else {
			parent, children, err = disk.ForkInto(cur, "", childDirs)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("disk %s: %w", d.Dev.Path(), err)
		}
		if _, err := d.Dev.SwapBackend(parent); err != nil {
			// The parent overlay owns cur now; closing it would close
			// the disk under the device. Leave both; the fork fails.
			return nil, nil, fmt.Errorf("disk %s: %w", d.Dev.Path(), err)
		}
		s.ownTop[i] = true
		out[i] = children
	}
	return out, bases, nil
}

// groupReadable makes each of paths this process owns readable by its
// group, read-only (0640): the frozen layers and images a fork's children,
// members of that group, open. Others' files are left as they are (a
// template's base is readable by all already; an ancestor's layers were
// made readable by its group, the children's too, when it forked).
func groupReadable(paths []string) {
	uid := os.Geteuid()
	for _, p := range paths {
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil && int(st.Uid) == uid && st.Mode&0o777 != 0o640 {
			os.Chmod(p, 0o640)
		}
	}
}
