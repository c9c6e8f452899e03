package daemon

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/vmmctl"
)

// Disk layer garbage collection. Every snapshot of a sandbox with writable
// disks freezes its disks' live tops into layers in its directory
// (disk<I>.<unique>.wcow, beside the first overlay disk<I>.overlay), a full
// snapshot merges them into a new one, a rollback or a resume puts the disk
// on a new overlay over a snapshot's layer, and a fork child's overlays go
// into the child's own directory over the parent's frozen layer. A layer
// file is referenced by:
//
//   - the chains of the snapshots in every sandbox's record
//     (store.Snapshot.Disks: the layer and every image under it);
//   - the live chains of every running or paused VMM (GET /v1/disks on its
//     control socket: its tops and the images under them), fork children
//     included, since their chains cross into their parents' directories;
//   - every sandbox's record of its VMM's disks (store.Sandbox.Disks), kept
//     after the VMM is gone until a new one replaces it.
//
// After a change that may leave layers unreferenced (rolling snapshots
// pruned, a rollback, a resume, a sandbox deleted), collectDisksLater
// sweeps the tenant's sandbox directories and deletes exactly the layer
// files nothing references. It never touches a template's directory, and
// never deletes a file it cannot identify as a disk layer: a cow/disk
// overlay whose header it reads, or a file sealed at rest (diskseal.go),
// whose chain it cannot read and so takes from the records. A sandbox whose
// references cannot all be known — an operation holds it past the wait, it
// is being created, its VMM does not answer GET /v1/disks (a VMM from
// before this API), or it has no VMM and its record never learned its
// VMM's disks — has its whole directory kept this time.
//
// Order makes this safe against layers made or referenced meanwhile: the
// candidate files are listed first, then each sandbox is held (its lock)
// while its VMM's live chains and then its record are read. A file made
// after the listing is no candidate; a layer referenced at the listing is
// referenced afterwards by what built on it (a VMM builds only on its live
// chain or a recorded snapshot's layer, and its snapshot freezes, merges,
// rollbacks and forks hold its disks' lock, which GET /v1/disks waits for).
// The deletions run under diskSeal.mu, so a file is never sealed or
// unsealed while it is judged.

// gcState coalesces the sweeps: at most one runs per tenant, and a request
// while it runs makes it run once more. mu guards both maps.
type gcState struct {
	mu      sync.Mutex
	running map[string]bool
	again   map[string]bool
}

// diskGCWait bounds how long a sweep waits for a sandbox's operation
// before keeping its directory whole this time.
const diskGCWait = 2 * time.Minute

// collectDisksLater sweeps tenant's unreferenced disk layers in the
// background (see above); the caller may hold a sandbox's lock (the sweep
// waits for it).
func (d *Daemon) collectDisksLater(tenant string) {
	d.disks.gc.later(d, tenant, func() {
		if removed := d.collectDisks(tenant); len(removed) > 0 {
			d.log.Info("unreferenced disk layers removed", "tenant", tenant, "files", removed)
		}
	})
}

// later runs sweep for tenant in a goroutine of d's (d.wg), unless one
// runs already: then that one runs once more when it ends. Nothing
// starts, and no rerun happens, once d is closing.
func (g *gcState) later(d *Daemon, tenant string, sweep func()) {
	g.mu.Lock()
	if g.running == nil {
		g.running, g.again = map[string]bool{}, map[string]bool{}
	}
	if g.running[tenant] {
		g.again[tenant] = true
		g.mu.Unlock()
		return
	}
	if d.ctx.Err() != nil {
		g.mu.Unlock()
		return
	}
	g.running[tenant] = true
	g.mu.Unlock()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		for {
			sweep()
			g.mu.Lock()
			if !g.again[tenant] || d.ctx.Err() != nil {
				delete(g.running, tenant)
				delete(g.again, tenant)
				g.mu.Unlock()
				return
			}
			delete(g.again, tenant)
			g.mu.Unlock()
		}
	}()
}

// collectDisks is one sweep of tenant's sandbox directories; it returns
// the files it removed.
func (d *Daemon) collectDisks(tenant string) []string {
	var sbs []*sbState
	for _, s := range d.allSandboxes() {
		if s.rec.Tenant == tenant { // (Tenant never changes)
			sbs = append(sbs, s)
		}
	}
	// The candidates first.
	cands := map[string][]string{}
	for _, s := range sbs {
		dir := d.store.SandboxDir(tenant, s.rec.ID)
		cands[dir] = diskFiles(dir)
	}
	refs, keep := map[string]bool{}, map[string]bool{}
	for _, s := range sbs {
		dir := d.store.SandboxDir(tenant, d.snapshotRec(s).ID)
		if !lockWithin(d.ctx, &s.mu, diskGCWait) {
			keep[dir] = true
			addRecordRefs(refs, d.snapshotRec(s))
			continue
		}
		if s.deleted {
			s.mu.Unlock()
			continue
		}
		rec := copyRec(s.rec)
		switch rec.Status {
		case store.Creating:
			keep[dir] = true
		case store.Running, store.Paused:
			live, err := vmmDisks(d.ctx, rec.API)
			if err != nil {
				d.log.Warn("disk sweep: the VMM's disks are unknown; its directory is kept whole", "sandbox", rec.ID, "err", err)
				keep[dir] = true
			}
			for _, ld := range live {
				refs[ld.Top] = true
				for _, p := range ld.Chain {
					refs[p] = true
				}
			}
		default:
			// No VMM to ask: the record is all there is. One that never
			// learned its VMM's disks (a VMM that did not answer GET
			// /v1/disks) cannot say which files its next resume needs.
			if len(rec.Disks) == 0 {
				keep[dir] = true
			}
		}
		addRecordRefs(refs, rec)
		s.mu.Unlock()
	}
	d.disks.mu.Lock()
	defer d.disks.mu.Unlock()
	var removed []string
	for dir, files := range cands {
		if keep[dir] {
			continue
		}
		for _, f := range files {
			if refs[f] || !isLayerFile(f) {
				continue
			}
			if err := os.Remove(f); err != nil {
				if !os.IsNotExist(err) {
					d.log.Warn("disk sweep: remove", "file", f, "err", err)
				}
				continue
			}
			removed = append(removed, f)
		}
	}
	slices.Sort(removed)
	return removed
}

// addRecordRefs adds the disk files rec references: its snapshots'
// chains and its VMM's tops and chains as last recorded.
func addRecordRefs(refs map[string]bool, rec store.Sandbox) {
	for _, sn := range rec.Snapshots {
		for _, dl := range sn.Disks {
			refs[dl.Layer] = true
			for _, p := range dl.Chain {
				refs[p] = true
			}
		}
	}
	for _, ld := range rec.Disks {
		refs[ld.Top] = true
		for _, p := range ld.Chain {
			refs[p] = true
		}
	}
}

// isLayerFile reports whether the file at path is one the sweep may delete
// when nothing references it: a cow/disk overlay whose header parses, or
// a file sealed at rest. Anything else (unreadable, a file made but not yet
// headed by its VMM, a raw image) is left alone.
func isLayerFile(path string) bool {
	if sealed, err := isSealed(path); err != nil {
		return false
	} else if sealed {
		return true
	}
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, disk.HeaderSize)
	n, _ := f.ReadAt(b, 0)
	_, err = disk.ParseHeader(b[:n])
	return err == nil
}

// vmmDisks asks the VMM at sock for its live disks (GET /v1/disks).
func vmmDisks(ctx context.Context, sock string) ([]store.LiveDisk, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var rep vmmctl.DisksReply
	if err := vmmCall(ctx, sock, http.MethodGet, "disks", nil, &rep); err != nil {
		return nil, err
	}
	return liveDisks(rep.Disks), nil
}

// refreshDisks records s's VMM's live disks (caller holds s.mu); a VMM
// that cannot say leaves the record as it was.
func (d *Daemon) refreshDisks(s *sbState) {
	live, err := vmmDisks(d.ctx, s.rec.API)
	if err != nil {
		d.log.Debug("the VMM's disks are unknown", "sandbox", s.rec.ID, "err", err)
		return
	}
	s.rec.Disks = live
}

// lockWithin takes mu, waiting at most timeout (or until ctx ends).
func lockWithin(ctx context.Context, mu *sync.Mutex, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for !mu.TryLock() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// snapshotOverlays makes, in the sandbox directory dir, a new overlay over
// each of snap's disk layers, and returns the restore's disk paths that
// attach them (vmmctl.Restore.DiskPaths: I to OVERLAY) and the files made; none for a
// snapshot without disk layers (from before snapshots held disks: its
// disks reopen as it recorded them). A resume so gets the files exactly as
// at the snapshot, on an overlay of its own; the layer is never written.
// The caller has the layers unsealed (acquireDisks). On an error the
// overlays made are removed.
func snapshotOverlays(dir string, snap store.Snapshot) (paths map[int]string, made []string, err error) {
	defer func() {
		if err != nil {
			for _, p := range made {
				os.Remove(p)
			}
			made = nil
		}
	}()
	for _, dl := range snap.Disks {
		if !filepath.IsAbs(dl.Layer) {
			return nil, nil, errf(500, "snapshot %s: disk %d's layer %q is not an absolute path", snap.Name, dl.Index, dl.Layer)
		}
		p := disk.NewLayerPath(dir, dl.Layer)
		if err := disk.CreateOn(p, dl.Layer); err != nil {
			return nil, nil, err
		}
		made = append(made, p)
		if paths == nil {
			paths = map[int]string{}
		}
		paths[dl.Index] = p
	}
	return paths, made, nil
}
