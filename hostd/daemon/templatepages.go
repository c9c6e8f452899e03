package daemon

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/warrenvm/warren/hostd/pagestore"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/memsnap"
	"github.com/warrenvm/warren/memsnap/vmsnap"
)

// Templates in the page store (issue 20 item 3). A template's memory layer
// is in its tenant's page store namespace, as its sandboxes' snapshots
// are: its chunks are stored once with theirs (a sandbox's full snapshot
// shares every block its guest did not write with the template), counted
// by the store's statistics, and kept while the template exists (its
// reference file names them; deleting the template and sweeping frees
// what nothing else names).
//
// A tenant with a key: in place. The build (or the bundle import) ingests
// the layer before the at-rest hook seals the snapshot's files, so the
// template's layer on disk is a sealed reference file, like the tenant's
// snapshots. Creates restore the template's lasting decrypted copy on the
// tmpfs (atrest.go), in which the reference file is rebuilt from the store
// when the copy is made: nothing else of the template's memory is on disk.
//
// A tenant without a key: beside. Creates restore the template's layer in
// place, lazily (its flattened .wraw mapped by every sandbox, or its
// chunks served by userfaultfd), so the layer stays, as a cache of the
// store: the reference file is SNAPDIR/pages/LAYER (pagestore.CacheRefDir;
// made by hard-linking the layer there and ingesting the link, so the
// layer in place is untouched). A template that has had no create for
// Config.TemplateCacheIdle and none of whose sandboxes has a VMM
// drops its cache (the layer and its .wraw: evictTemplateCaches), after
// checking that the store holds every chunk to rebuild it; its next
// create (or bundle export) rebuilds the layer from the store
// (ensureTemplateLayer: every chunk checked, the layer's hash compared)
// before the VMM starts, and a chunk missing or corrupt fails that create
// with 409 before anything runs. The template's working set stays (it
// names the layer by hash, which the rebuilt layer has).
//
// Locks: the cache is dropped holding the template's mu (no build, no
// delete) and warm (no first restore, and no sealing of the tenant's files
// by postKey, which takes its templates' warm), and only while no create
// is in flight (tplState.creating, counted before warm is taken) and the
// tenant has no key; a drop sets warmed false, so the next create is a
// first one and rebuilds and flattens again under warm.

// templateLayer returns the memory layer file of the template snapshot
// snap (DIR/NAME): a template's snapshot is full, one layer.
func templateLayer(snap string) (string, error) {
	dir, _, state, err := vmsnap.Paths(snap)
	if err != nil {
		return "", err
	}
	chain, _, err := snapshotChain(dir, state)
	if err != nil {
		return "", err
	}
	if len(chain) != 1 {
		return "", fmt.Errorf("template snapshot %s: a chain of %d layers, not one", snap, len(chain))
	}
	return filepath.Join(dir, chain[0]), nil
}

// cacheRef is the reference file of a plain template's layer.
func cacheRef(layer string) string {
	return filepath.Join(filepath.Dir(layer), pagestore.CacheRefDir, filepath.Base(layer))
}

// templateIntoStore puts the memory layer of tenant's new template
// snapshot snap (plaintext: before the at-rest hook) into the tenant's
// namespace, in place or beside (above). A failure is returned; the
// caller logs it (the template stays usable, its layer a plain one).
func (d *Daemon) templateIntoStore(tenant, snap string) error {
	if d.pages == nil {
		return nil
	}
	layer, err := templateLayer(snap)
	if err != nil {
		return err
	}
	ns, err := d.pageNS(tenant)
	if err != nil {
		return err
	}
	if d.encrypts(tenant) {
		_, err := ns.Ingest(layer)
		return err
	}
	ref := cacheRef(layer)
	if pagestore.IsRefFile(ref) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(ref), 0o700); err != nil {
		return err
	}
	os.Remove(ref) // a link an interrupted ingest left
	if err := os.Link(layer, ref); err != nil {
		return err
	}
	rep, err := ns.Ingest(ref)
	if err != nil {
		os.Remove(ref)
		return err
	}
	d.log.Debug("page store: template layer ingested", "layer", layer, "chunks", rep.Chunks, "new", rep.NewChunks, "new_bytes", rep.NewBytes)
	return nil
}

// templatesIntoStore, at start, puts into the store the layers of ready
// templates of tenants without a key that are not there yet (built by a
// daemon before this, or by one killed between the snapshot and the
// ingest). Sealed layers (a tenant with a key) stay as they are.
func (d *Daemon) templatesIntoStore() {
	for _, ts := range d.templateStates() {
		t := ts.view.Load()
		if t == nil || t.Status != store.TemplateReady || d.encrypts(t.Tenant) {
			continue
		}
		layer, err := templateLayer(t.Snapshot)
		if err != nil || pagestore.IsRefFile(layer) {
			continue // sealed, or a tenant's key since gone: as it is
		}
		if err := d.templateIntoStore(t.Tenant, t.Snapshot); err != nil {
			d.log.Warn("page store: template layer not ingested", "template", t.ID, "err", err)
		}
	}
}

// ensureTemplateLayer rebuilds from the store the layer of plain template
// t when its cache was dropped (caller holds ts.warm). A layer that cannot
// be rebuilt is a 409.
func (d *Daemon) ensureTemplateLayer(t *store.Template) error {
	if d.pages == nil || d.encrypts(t.Tenant) {
		return nil
	}
	dir, _, state, err := vmsnap.Paths(t.Snapshot)
	if err != nil {
		return err
	}
	name, err := stateLayer(state)
	if err != nil || name != filepath.Base(name) || !strings.HasSuffix(name, memsnap.Ext) {
		return nil // the restore says what is wrong
	}
	layer := filepath.Join(dir, name)
	if fi, err := os.Lstat(layer); err == nil && fi.Mode().IsRegular() {
		return nil
	}
	ref := cacheRef(layer)
	if !pagestore.IsRefFile(ref) {
		return nil // nothing to rebuild it from: the restore says it is missing
	}
	ns, err := d.pageNS(t.Tenant)
	if err != nil {
		return cryptStatus(err)
	}
	start := time.Now()
	if err := ns.Materialize(ref, layer, -1); err != nil {
		return &apiError{status: 409, msg: fmt.Sprintf("template %s: its memory could not be rebuilt from the page store: %v", t.ID, err)}
	}
	d.log.Info("template cache rebuilt from the page store", "tenant", t.Tenant, "template", t.ID, "ms", time.Since(start).Milliseconds())
	return nil
}

// templateStates returns the daemon's templates.
func (d *Daemon) templateStates() []*tplState {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Collect(maps.Values(d.templates))
}

// evictTemplateCaches drops the caches of the plain templates idle since
// before now minus idle (above) and returns how many it dropped.
func (d *Daemon) evictTemplateCaches(now time.Time, idle time.Duration) int {
	if d.pages == nil || idle < 0 {
		return 0
	}
	n := 0
	for _, ts := range d.templateStates() {
		if d.evictTemplateCache(ts, now, idle) {
			n++
		}
	}
	return n
}

// evictTemplateCache drops ts's cache when it may (above).
func (d *Daemon) evictTemplateCache(ts *tplState, now time.Time, idle time.Duration) bool {
	t := ts.view.Load()
	if t == nil || t.Status != store.TemplateReady || d.encrypts(t.Tenant) ||
		now.Sub(time.Unix(0, ts.lastUsed.Load())) < idle || ts.creating.Load() > 0 {
		return false
	}
	if !ts.mu.TryLock() {
		return false
	}
	defer ts.mu.Unlock()
	if !ts.warm.TryLock() {
		return false
	}
	defer ts.warm.Unlock()
	if ts.creating.Load() > 0 || d.encrypts(t.Tenant) {
		// (A key is created before postKey takes warm to seal the
		// tenant's files, which drops the reference file.)
		return false
	}
	for _, s := range d.allSandboxes() {
		v := s.view.Load()
		if v != nil && v.Tenant == t.Tenant && v.Template == t.ID && v.PID != 0 {
			// Its VMM may map the template's memory: a create's does,
			// and so may a fork child's, over its parent's.
			return false
		}
	}
	dir, name, _, err := vmsnap.Paths(t.Snapshot)
	if err != nil {
		return false
	}
	layer, err := templateLayer(t.Snapshot)
	if err != nil {
		return false // dropped already, or never cached
	}
	ref := cacheRef(layer)
	if !pagestore.IsRefFile(ref) {
		return false // not in the store: the layer is all there is
	}
	ns, err := d.pageNS(t.Tenant)
	if err == nil {
		err = ns.Check(ref)
	}
	if err != nil {
		d.log.Warn("template cache kept: the page store cannot rebuild it", "tenant", t.Tenant, "template", t.ID, "err", err)
		return false
	}
	var freed int64
	raws, _ := filepath.Glob(filepath.Join(dir, name+".*"+vmsnap.RawExt))
	for _, p := range append([]string{layer}, raws...) {
		if fi, err := os.Lstat(p); err == nil {
			if os.Remove(p) == nil {
				freed += allocatedBytes(fi)
			}
		}
	}
	ts.warmed = false
	d.log.Info("template cache dropped (rebuilt from the page store at its next create)", "tenant", t.Tenant, "template", t.ID,
		"idle", now.Sub(time.Unix(0, ts.lastUsed.Load())).Round(time.Second), "bytes", freed)
	return true
}

// templateCaches drops idle templates' caches every period until the
// daemon closes.
func (d *Daemon) templateCaches(period time.Duration) {
	defer d.wg.Done()
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case now := <-t.C:
			d.evictTemplateCaches(now, d.cfg.TemplateCacheIdle)
		}
	}
}

// allocatedBytes is the bytes fi's file takes on disk (a .wraw is sparse).
func allocatedBytes(fi os.FileInfo) int64 {
	if s, ok := fi.Sys().(*syscall.Stat_t); ok {
		return s.Blocks * 512
	}
	return fi.Size()
}
