package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/hostd/crypt"
	"github.com/warrenvm/warren/hostd/store"
)

// Disks at rest. For a tenant with a key, every disk file of the tenant —
// its templates' frozen bases (TEMPLATEDIR/disk<I>.base), its sandboxes'
// overlays (SANDBOXDIR/disk<I>.overlay) and every layer made after them
// (SANDBOXDIR/disk<I>.<unique>.wcow: the layers snapshots and forks froze,
// merged layers, the overlays rollbacks and resumes put on a snapshot's
// layer, a fork child's own overlays in its directory) — is sealed (crypt.EncryptSparseFile: the file's data extents,
// holes left out, chunked and authenticated as a whole under the tenant's
// key) whenever no VMM needs it, and is plaintext, where it is, only while
// one does. A VMM opens its disk chain by the paths recorded in the
// overlays, so a disk in use is unsealed in place rather than copied.
//
// Who needs what (diskNeeds): a sandbox's VMM may read every disk file of
// its template, of its own directory, and of its fork ancestors'
// directories (its chain's layers are among them: a fork puts the
// children's overlays and the frozen layers in the forking sandbox's
// directory). A sandbox needs them while it is running, paused (in
// memory) or being created, and while a start of its VMM is under way
// (acquireDisks pins it); a template while it is being built, and while
// its bundle is exported (acquireTemplateDisks pins it).
//
// When: acquireDisks unseals what a VMM is about to need before it is
// started (create, resume from disk); sealIdleDisks seals everything else
// after a VMM stopped (pause to disk, exit, deletion, revocation), after a
// template build, when a key is created and when the daemon starts (what
// a crash left in plaintext). Both run under diskSeal.mu, so a file is
// never sealed while a start that needs it is under way, and never sealed
// under a VMM that has it open (its status says running until it is gone).
//
// Revocation: the key is read before it is shredded and the tenant's
// disks are sealed with it once its VMMs are stopped; a disk found in
// plaintext for a revoked tenant later (a crash in between) is removed,
// as a snapshot written after revocation is: the tenant's data is meant
// to be unreadable from then on.
//
// What this does not hide: a disk in use is plaintext on the host's disk
// for as long as its VMM runs, and the blocks of a plaintext file replaced
// by its sealed form are freed, not overwritten (as for snapshots).
type diskSeal struct {
	mu sync.Mutex
	// pins counts, per sandbox ID, the VMM starts under way, and per
	// template ID the exports of its bundle under way (mu).
	pins map[string]int
	// gc coalesces the sweeps of unreferenced disk layers (diskgc.go),
	// which delete under mu.
	gc gcState
}

// isDiskFile reports whether name is a disk file the daemon seals.
func isDiskFile(name string) bool {
	if !strings.HasPrefix(name, "disk") {
		return false
	}
	return strings.HasSuffix(name, ".base") || strings.HasSuffix(name, ".overlay") || strings.HasSuffix(name, disk.Ext)
}

// diskFiles lists the disk files in dir.
func diskFiles(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		if e.Type().IsRegular() && isDiskFile(e.Name()) {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out
}

// tenantRecs returns tenant's sandbox records as last saved, by ID.
func (d *Daemon) tenantRecs(tenant string) map[string]store.Sandbox {
	recs := map[string]store.Sandbox{}
	for _, s := range d.allSandboxes() {
		if r := d.snapshotRec(s); r.Tenant == tenant {
			recs[r.ID] = r
		}
	}
	return recs
}

// diskNeeds lists the disk files rec's VMM may open (see above).
func (d *Daemon) diskNeeds(rec store.Sandbox, recs map[string]store.Sandbox) []string {
	files := diskFiles(d.store.TemplateDir(rec.Tenant, rec.Template))
	seen := map[string]bool{}
	for id := rec.ID; id != "" && !seen[id]; id = recs[id].Parent {
		seen[id] = true
		files = append(files, diskFiles(d.store.SandboxDir(rec.Tenant, id))...)
	}
	return files
}

// acquireDisks makes the disk files rec's VMM needs plaintext and keeps
// them so until release is called; the last release for rec then seals
// what is idle. A
// tenant without a key: nothing to do. A revoked key: its error.
func (d *Daemon) acquireDisks(rec store.Sandbox) (release func(), err error) {
	if d.atRest == nil {
		return func() {}, nil
	}
	d.disks.mu.Lock()
	defer d.disks.mu.Unlock()
	_, ok, err := d.atRest.key(rec.Tenant)
	if err != nil {
		return nil, err
	}
	if !ok {
		return func() {}, nil
	}
	recs := d.tenantRecs(rec.Tenant)
	recs[rec.ID] = rec
	for _, f := range d.diskNeeds(rec, recs) {
		sealed, err := isSealed(f)
		if err != nil {
			return nil, err
		}
		if !sealed {
			continue
		}
		if err := crypt.DecryptSparseFile(f, f, d.atRest.keys, rec.Tenant); err != nil {
			return nil, fmt.Errorf("disk %s: %w", filepath.Base(f), err)
		}
	}
	d.disks.pins[rec.ID]++
	var once sync.Once
	return func() {
		once.Do(func() {
			d.disks.mu.Lock()
			d.disks.pins[rec.ID]--
			last := d.disks.pins[rec.ID] <= 0
			if last {
				delete(d.disks.pins, rec.ID)
			}
			d.disks.mu.Unlock()
			// A nested acquisition (a create's, around its startVMM's)
			// leaves the sweep to the outermost release.
			if last {
				d.sealIdleDisks(rec.Tenant)
			}
		})
	}, nil
}

// acquireTemplateDisks makes the disk files of tenant's template id
// plaintext and keeps them so until release is called (an export of its
// bundle reads them); the last release then seals what is idle. A tenant
// without a key: nothing to do.
func (d *Daemon) acquireTemplateDisks(tenant, id string) (release func(), err error) {
	if d.atRest == nil {
		return func() {}, nil
	}
	d.disks.mu.Lock()
	defer d.disks.mu.Unlock()
	_, ok, err := d.atRest.key(tenant)
	if err != nil {
		return nil, err
	}
	if !ok {
		return func() {}, nil
	}
	for _, f := range diskFiles(d.store.TemplateDir(tenant, id)) {
		sealed, err := isSealed(f)
		if err != nil {
			return nil, err
		}
		if sealed {
			if err := crypt.DecryptSparseFile(f, f, d.atRest.keys, tenant); err != nil {
				return nil, fmt.Errorf("disk %s: %w", filepath.Base(f), err)
			}
		}
	}
	d.disks.pins[id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			d.disks.mu.Lock()
			d.disks.pins[id]--
			last := d.disks.pins[id] <= 0
			if last {
				delete(d.disks.pins, id)
			}
			d.disks.mu.Unlock()
			if last {
				d.sealIdleDisks(tenant)
			}
		})
	}, nil
}

// sealIdleDisks seals the tenant's disk files no VMM needs, with its
// current key; errors are logged (the file stays as it was and the next
// call tries again).
func (d *Daemon) sealIdleDisks(tenant string) {
	if d.atRest == nil {
		return
	}
	key, ok, err := d.atRest.key(tenant)
	if err != nil && !errors.Is(err, crypt.ErrRevoked) {
		d.log.Error("sealing disks: no key", "tenant", tenant, "err", err)
		return
	}
	if err == nil && !ok {
		return
	}
	d.sealIdleDisksWith(tenant, key) // an invalid key (revoked): plaintext is removed
}

// sealIdleDisksWith is sealIdleDisks with key; !key.Valid() means the
// tenant's key is revoked, and idle plaintext disks are removed.
func (d *Daemon) sealIdleDisksWith(tenant string, key crypt.Key) {
	d.disks.mu.Lock()
	defer d.disks.mu.Unlock()
	recs := d.tenantRecs(tenant)
	needed := map[string]bool{}
	for id, r := range recs {
		switch {
		case d.disks.pins[id] > 0, r.Status == store.Running, r.Status == store.Paused, r.Status == store.Creating:
			for _, f := range d.diskNeeds(r, recs) {
				needed[f] = true
			}
		}
	}
	root := d.tenantDir(tenant)
	var all []string
	d.mu.Lock()
	for _, ts := range d.templates {
		if t := ts.view.Load(); t != nil && t.Tenant == tenant && (t.Status == store.TemplateBuilding || d.disks.pins[t.ID] > 0) {
			for _, f := range diskFiles(d.store.TemplateDir(tenant, t.ID)) {
				needed[f] = true
			}
		}
	}
	d.mu.Unlock()
	for _, kind := range []string{"templates", "sandboxes"} {
		dirs, _ := os.ReadDir(filepath.Join(root, kind))
		for _, de := range dirs {
			if de.IsDir() {
				all = append(all, diskFiles(filepath.Join(root, kind, de.Name()))...)
			}
		}
	}
	for _, f := range all {
		if needed[f] {
			continue
		}
		sealed, err := isSealed(f)
		if err != nil || sealed {
			continue
		}
		if !key.Valid() {
			d.log.Warn("removing a plaintext disk of a tenant whose key is revoked", "tenant", tenant, "file", f)
			os.Remove(f)
			continue
		}
		if err := crypt.EncryptSparseFile(f, f, key); err != nil {
			d.log.Error("sealing a disk", "tenant", tenant, "file", f, "err", err)
		}
	}
}
