package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/warrenvm/warren/hostd/crypt"
	"github.com/warrenvm/warren/hostd/pagestore"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/internal/atomicfile"
	"github.com/warrenvm/warren/memsnap"
	"github.com/warrenvm/warren/memsnap/statefile"
	"github.com/warrenvm/warren/memsnap/vmsnap"
)

// The page store (hostd/pagestore, STATE/pagestore): the memory layers of
// sandboxes' snapshots (their own, rolling, suspend, fork children's) are
// kept as reference files into one content-addressed store per tenant and
// key, so a block of guest memory that did not change is stored once
// however many snapshots hold it. Templates' layers are in it too
// (templatepages.go): for a tenant with a key as sealed reference files,
// for one without as reference files beside the layer, which every create
// restores in place, lazily, and which is a cache of the store (dropped
// when the template is idle, rebuilt by its next create).
//
// Ingesting. After the VMM wrote a snapshot (takeSnapshot), the plain
// layers of the sandbox's snapshots directory go into the store, except
// the one the VMM will chain its next incremental snapshot on (it opens
// that layer by path): for a tenant without a key, the newest snapshot's;
// for a tenant with a key, none (its snapshots are all full, and the store
// must take the layer before at-rest encryption seals the snapshot's
// files: the reference file is then sealed as the layer was). A suspend
// ingests the newest too, once the VMM has stopped; so does the daemon's
// start for every sandbox (no VMM chains on a layer of a previous daemon's
// time), before it seals what a crash left plaintext.
//
// Restoring. A resume from disk or a rollback to a snapshot whose chain
// holds reference files gets a working copy: for a tenant without a key,
// DIR/.materialized-NNN in the snapshot's directory (the VMM's own
// directory, so a confined VMM reads it; files the store rebuilds are
// given to the directory's owner, plain layers and the state file are
// hard links), restored eagerly and removed once loaded; for a tenant with
// a key, atRest's decrypted working copy, in which the decrypted reference
// files are rebuilt. A chunk that is missing or fails its check fails the
// restore (409) before a VMM is started or rolled back.
//
// Deleting. Rolling snapshots that go and deleted sandboxes' directories
// leave chunks nothing names; a sweep of the tenant's namespaces follows
// (sweepPagesLater, coalesced like the disk sweeps), and another runs at
// every start. See hostd/pagestore for why a crash at any point leaves
// only garbage.
type pageStore struct {
	st *pagestore.Store
	gc gcState // coalesces sweeps, as for disks
}

// materializedPrefix starts the names of the working copies restores make
// in a plain tenant's snapshot directory.
const materializedPrefix = ".materialized-"

// pageNS returns tenant's current namespace: under its key when it has
// one, else the plain one.
func (d *Daemon) pageNS(tenant string) (*pagestore.Namespace, error) {
	if d.atRest != nil {
		if _, ok, err := d.atRest.key(tenant); err != nil {
			return nil, err
		} else if ok {
			return d.pages.st.Keyed(context.Background(), tenant, d.cfg.Keys)
		}
	}
	return d.pages.st.Plain(tenant)
}

// ingestSnapshots puts the plain layers of the snapshot directory dir
// into tenant's namespace, except those of snapshot keep ("" for none).
// Failures are logged: a layer not ingested stays a valid plain layer.
func (d *Daemon) ingestSnapshots(tenant, dir, keep string) {
	if d.pages == nil {
		return
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	var ns *pagestore.Namespace
	for _, e := range ents {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasSuffix(name, memsnap.Ext) || atomicfile.IsTemp(name) ||
			(keep != "" && strings.HasPrefix(name, keep+".")) {
			continue
		}
		p := filepath.Join(dir, name)
		if sealed, err := isSealed(p); err != nil || sealed || pagestore.IsRefFile(p) {
			continue // sealed before the store (kept so), or in it
		}
		if ns == nil {
			if ns, err = d.pageNS(tenant); err != nil {
				d.log.Warn("page store: no namespace", "tenant", tenant, "err", err)
				return
			}
		}
		rep, err := ns.Ingest(p)
		if err != nil {
			d.log.Warn("page store: layer not ingested", "layer", p, "err", err)
			continue
		}
		d.log.Debug("page store: layer ingested", "layer", p, "chunks", rep.Chunks, "new", rep.NewChunks, "new_bytes", rep.NewBytes, "layer_bytes", rep.LayerSize)
	}
}

// ingestAllPages, at start, ingests every sandbox's snapshot layers and
// removes working copies a restore left behind.
func (d *Daemon) ingestAllPages() {
	tenants, _ := os.ReadDir(filepath.Join(d.cfg.State, "tenants"))
	for _, t := range tenants {
		if !t.IsDir() || !store.ValidTenant(t.Name()) {
			continue
		}
		sbs, _ := os.ReadDir(filepath.Join(d.tenantDir(t.Name()), "sandboxes"))
		for _, sb := range sbs {
			snaps := filepath.Join(d.tenantDir(t.Name()), "sandboxes", sb.Name(), "snapshots")
			if ws, _ := filepath.Glob(filepath.Join(snaps, materializedPrefix+"*")); len(ws) > 0 {
				for _, w := range ws {
					os.RemoveAll(w)
				}
			}
			d.ingestSnapshots(t.Name(), snaps, "")
		}
		d.sweepPagesLater(t.Name())
	}
}

// sweepPagesLater sweeps tenant's namespaces in the background: at most
// one sweep per tenant runs, and a request while it runs makes it run
// once more.
func (d *Daemon) sweepPagesLater(tenant string) {
	if d.pages == nil {
		return
	}
	d.pages.gc.later(d, tenant, func() { d.sweepPages(tenant) })
}

// namespaces returns tenant's namespaces that exist on disk and that the
// daemon can read: the plain one, and the one of its current key.
func (d *Daemon) namespaces(tenant string) []*pagestore.Namespace {
	var out []*pagestore.Namespace
	if _, err := os.Stat(filepath.Join(d.pages.st.Root(), tenant, pagestore.PlainNamespace)); err == nil {
		if ns, err := d.pages.st.Plain(tenant); err == nil {
			out = append(out, ns)
		}
	}
	if d.atRest != nil {
		if k, ok, err := d.atRest.key(tenant); err == nil && ok {
			if _, err := os.Stat(filepath.Join(d.pages.st.Root(), tenant, k.ID())); err == nil {
				if ns, err := d.pages.st.Keyed(context.Background(), tenant, d.cfg.Keys); err == nil {
					out = append(out, ns)
				}
			}
		}
	}
	return out
}

// sweepPages is one sweep of tenant's namespaces.
func (d *Daemon) sweepPages(tenant string) {
	for _, ns := range d.namespaces(tenant) {
		n, b, err := ns.Sweep(d.tenantDir(tenant))
		if err != nil {
			d.log.Warn("page store: sweep", "tenant", tenant, "namespace", ns.Name(), "err", err)
			continue
		}
		if n > 0 {
			d.log.Info("page store: unreferenced chunks removed", "tenant", tenant, "namespace", ns.Name(), "chunks", n, "bytes", b)
		}
	}
}

// rehomePages, before a tenant's files are sealed under a new key,
// rebuilds in place the layers that are in its plain namespace (whose
// chunks are plaintext), so that they are sealed whole like any layer,
// and sweeps the plain namespace. It reports the reference files it could
// not rebuild: those must not be sealed (their chunks would look
// unreferenced to the plain namespace's sweep).
func (d *Daemon) rehomePages(tenant, root string) (keepPlain map[string]bool) {
	if d.pages == nil {
		return nil
	}
	if _, err := os.Stat(filepath.Join(d.pages.st.Root(), tenant, pagestore.PlainNamespace)); err != nil {
		return nil
	}
	ns, err := d.pages.st.Plain(tenant)
	if err != nil {
		return nil
	}
	keepPlain = map[string]bool{}
	filepath.WalkDir(root, func(p string, de os.DirEntry, err error) error {
		if err != nil || !de.Type().IsRegular() || !strings.HasSuffix(p, memsnap.Ext) || !pagestore.IsRefFile(p) {
			return nil
		}
		r, err := ns.ReadRef(p)
		if err != nil {
			keepPlain[p] = true
			return nil
		}
		keyed := r.Keyed
		r.Close()
		if keyed {
			return nil // the keyed namespace's, not sealed yet
		}
		fi, _ := de.Info()
		uid := -1
		if fi != nil {
			uid, _ = fileOwner(fi)
		}
		if filepath.Base(filepath.Dir(p)) == pagestore.CacheRefDir {
			// A template's (templatepages.go): its layer, rebuilt where
			// its cache was dropped, is sealed whole; the reference
			// file goes.
			twin := filepath.Join(filepath.Dir(filepath.Dir(p)), filepath.Base(p))
			if tfi, err := os.Lstat(twin); err != nil || !tfi.Mode().IsRegular() || pagestore.IsRefFile(twin) {
				if err := ns.Materialize(p, twin, uid); err != nil {
					d.log.Error("page store: template layer not rebuilt before sealing; its reference kept", "layer", twin, "err", err)
					keepPlain[p] = true
					return nil
				}
			}
			os.Remove(p)
			os.Remove(filepath.Dir(p)) // when empty
			return nil
		}
		if err := ns.Materialize(p, p, uid); err != nil {
			d.log.Error("page store: layer not rebuilt before sealing; left plaintext", "layer", p, "err", err)
			keepPlain[p] = true
		}
		return nil
	})
	if len(keepPlain) == 0 {
		if _, _, err := ns.Sweep(root); err != nil {
			d.log.Warn("page store: sweep", "tenant", tenant, "err", err)
		}
	}
	return keepPlain
}

// restoreHook wraps inner (at-rest decryption, or nil) with the page
// store's working copies (see above).
func (d *Daemon) restoreHook(inner func(tenant, path string) (string, func(), error)) func(tenant, path string) (string, func(), error) {
	return func(tenant, path string) (string, func(), error) {
		var innerDone func()
		if inner != nil {
			use, done, err := inner(tenant, path)
			if err != nil || use != path {
				return use, done, err
			}
			innerDone = done
		}
		use, done, err := d.materializeSnapshot(tenant, path)
		switch {
		case err != nil:
			if innerDone != nil {
				innerDone()
			}
			return "", nil, err
		case done == nil:
			return use, innerDone, nil
		case innerDone == nil:
			return use, done, nil
		}
		return use, func() { done(); innerDone() }, nil
	}
}

// materializeSnapshot returns path when the memory chain of snapshot path
// holds no reference file; else a working copy in which it does not, and
// what removes it.
func (d *Daemon) materializeSnapshot(tenant, path string) (string, func(), error) {
	dir, name, state, err := vmsnap.Paths(path)
	if err != nil {
		return "", nil, err
	}
	chain, refs, err := snapshotChain(dir, state)
	if err != nil || refs == 0 {
		return path, nil, nil // nothing of the store's; the VMM says what is wrong, if anything
	}
	ns, err := d.pageNS(tenant)
	if err != nil {
		return "", nil, cryptStatus(err)
	}
	work, err := os.MkdirTemp(dir, materializedPrefix)
	if err != nil {
		return "", nil, err
	}
	done := func() { os.RemoveAll(work) }
	uid := dirOwner(dir)
	if d.cfg.VMMUIDs == nil || !d.cfg.VMMUIDs.has(uid) {
		uid = -1
	}
	if uid >= 0 {
		os.Chown(work, uid, uid)
	}
	if err := linkOrCopy(state, filepath.Join(work, name+vmsnap.StateExt)); err != nil {
		done()
		return "", nil, err
	}
	for _, layer := range chain {
		src, dst := filepath.Join(dir, layer), filepath.Join(work, layer)
		if pagestore.IsRefFile(src) {
			err = ns.Materialize(src, dst, uid)
		} else {
			err = linkOrCopy(src, dst)
		}
		if err != nil {
			done()
			return "", nil, &apiError{status: 409, msg: fmt.Sprintf("snapshot %s: %v", name, err)}
		}
	}
	return filepath.Join(work, name), done, nil
}

// snapshotChain lists the layer files (base names in dir) of the memory
// chain of the plaintext state file state, top first, and how many of
// them are reference files.
func snapshotChain(dir, state string) (chain []string, refs int, err error) {
	layer, err := stateLayer(state)
	if err != nil {
		return nil, 0, err
	}
	for range memsnap.MaxChainDepth {
		if layer == "" || layer != filepath.Base(layer) || strings.HasPrefix(layer, ".") {
			return nil, 0, fmt.Errorf("%s: bad layer name %q", state, layer)
		}
		chain = append(chain, layer)
		p := filepath.Join(dir, layer)
		var h memsnap.Header
		if pagestore.IsRefFile(p) {
			refs++
			b, err := os.ReadFile(p)
			if err != nil {
				return nil, 0, err
			}
			r, err := pagestore.ParseRef(p, b)
			if err != nil {
				return nil, 0, err
			}
			h = r.Layer.Header()
			r.Close()
		} else {
			l, err := memsnap.Open(p)
			if err != nil {
				return nil, 0, err
			}
			h = l.Header()
			l.Close()
		}
		if h.Parent.IsZero() {
			return chain, refs, nil
		}
		layer = h.ParentName
	}
	return nil, 0, fmt.Errorf("%s: memory chain too long", state)
}

// stateLayer returns the name of the top memory layer that the plaintext
// state file state names (not checked: snapshotChain checks it).
func stateLayer(state string) (string, error) {
	sf, err := statefile.Read(state)
	if err != nil {
		return "", err
	}
	b, ok := sf.Section("memory")
	if !ok {
		return "", fmt.Errorf("%s: no memory section", state)
	}
	var mem struct {
		Layer string `json:"layer"`
	}
	if err := json.Unmarshal(b, &mem); err != nil {
		return "", fmt.Errorf("%s: memory section: %w", state, err)
	}
	return mem.Layer, nil
}

// linkOrCopy hard-links src to dst, or copies it (another file system).
func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o600)
}

// storeStats is the tenant's part of the page store (GET /v1/store).
func (d *Daemon) storeStats(tenant string) (*wire.StoreStats, error) {
	out := &wire.StoreStats{Tenant: tenant, Namespaces: []wire.StoreNamespace{}}
	if d.pages == nil {
		return out, nil
	}
	for _, ns := range d.namespaces(tenant) {
		st, err := ns.Stats(d.tenantDir(tenant))
		if err != nil {
			return nil, err
		}
		out.Namespaces = append(out.Namespaces, st)
	}
	out.Sum()
	return out, nil
}

// getStore answers GET /v1/store.
func (d *Daemon) getStore(w http.ResponseWriter, r *http.Request, tenant string) {
	st, err := d.storeStats(tenant)
	if err != nil {
		if errors.Is(err, crypt.ErrRevoked) || errors.Is(err, crypt.ErrWrongKey) {
			err = cryptStatus(err)
		}
		writeErr(w, err)
		return
	}
	writeJSON(w, 200, st)
}

// fileOwner returns the owner of the file fi describes.
func fileOwner(fi os.FileInfo) (int, bool) {
	if s, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(s.Uid), true
	}
	return -1, false
}
