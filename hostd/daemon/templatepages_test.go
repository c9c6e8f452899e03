package daemon

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/hostd/pagestore"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/memsnap"
)

// plainNS returns the page store statistics of tenant's plain namespace.
func plainNS(t *testing.T, c *client) wire.StoreNamespace {
	t.Helper()
	var ss wire.StoreStats
	c.ok(200, "GET", "/v1/store", nil, &ss)
	for _, n := range ss.Namespaces {
		if n.Namespace == pagestore.PlainNamespace {
			return n
		}
	}
	t.Fatalf("no plain namespace in %+v", ss)
	return wire.StoreNamespace{}
}

// TestTemplatePagesPlain: a plain tenant's template layer is in the page
// store (its reference file beside it, its chunks shared with a sandbox's
// snapshot), its cache is dropped only when idle with no VMM restored
// from it, and only when the store can rebuild it; a create rebuilds it
// byte for byte; a corrupt chunk fails the create with 409 before any VMM
// starts; deleting the template frees its chunks.
func TestTemplatePagesPlain(t *testing.T) {
	td, fl, a := aliceDaemon(t)
	tp := a.template(fakeKernel(t))
	layer, err := templateLayer(tp.Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	ref := cacheRef(layer)
	if !pagestore.IsRefFile(ref) {
		t.Fatalf("%s is not a reference file after the build", ref)
	}
	want, err := os.ReadFile(layer)
	if err != nil || pagestore.IsRef(want) {
		t.Fatalf("the template's layer (the cache) after the build: %v", err)
	}
	n := plainNS(t, a)
	if n.Refs != 1 || n.Chunks == 0 || n.Caches != 1 || n.CacheBytes != int64(len(want)) || n.Layers != 0 || n.LogicalBytes != int64(len(want)) {
		t.Fatalf("store after the build: %+v (layer %d bytes)", n, len(want))
	}
	tplChunks := n.Chunks

	// A sandbox's full snapshot shares the template's unchanged blocks.
	sb := a.create(tp.ID)
	a.ok(201, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", map[string]any{"name": "s1"}, nil)
	a.ok(201, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", map[string]any{"name": "s2"}, nil)
	n = plainNS(t, a)
	if n.Refs < 2 || n.Chunks > tplChunks+2 {
		t.Fatalf("a sandbox's snapshots added %d chunks to the template's %d: %+v", n.Chunks-tplChunks, tplChunks, n)
	}

	// Not dropped while a VMM restored from it runs, nor before it is idle.
	later := time.Now().Add(2 * time.Hour)
	if got := td.evictTemplateCaches(later, time.Hour); got != 0 {
		t.Fatalf("dropped %d caches while a sandbox of the template runs", got)
	}
	a.ok(200, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
	if got := td.evictTemplateCaches(time.Now(), time.Hour); got != 0 {
		t.Fatalf("dropped %d caches of a template used just now", got)
	}
	raw := strings.TrimSuffix(layer, filepath.Ext(layer)) + ".0123456789abcdef.wraw"
	os.WriteFile(raw, []byte("flattened"), 0o600)
	if got := td.evictTemplateCaches(later, time.Hour); got != 1 {
		t.Fatalf("dropped %d caches of an idle template, want 1", got)
	}
	for _, p := range []string{layer, raw} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("%s after the drop: %v", p, err)
		}
	}
	if n := plainNS(t, a); n.Caches != 0 || n.Refs != 1 {
		t.Fatalf("store after the drop: %+v", n)
	}

	// The next create rebuilds it, byte for byte.
	sb = a.create(tp.ID)
	if got, err := os.ReadFile(layer); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the rebuilt layer differs from the built one (%v)", err)
	}
	a.ok(200, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
	// A chunk gone bad: the cache is kept while it is there, and a create
	// after it was dropped fails before any VMM starts.
	nsDir := filepath.Join(td.pages.st.Root(), "alice", pagestore.PlainNamespace, "chunks")
	var chunk string
	filepath.WalkDir(nsDir, func(p string, de os.DirEntry, err error) error {
		if err == nil && de.Type().IsRegular() && chunk == "" {
			chunk = p
		}
		return nil
	})
	good, _ := os.ReadFile(chunk)
	os.WriteFile(chunk, good[:len(good)-1], 0o600)
	if got := td.evictTemplateCaches(later, time.Hour); got != 0 {
		t.Fatalf("dropped a cache the store cannot rebuild (a chunk cut short)")
	}
	os.WriteFile(chunk, good, 0o600)
	if got := td.evictTemplateCaches(later, time.Hour); got != 1 {
		t.Fatalf("dropped %d caches, want 1", got)
	}
	bad := bytes.Clone(good)
	bad[len(bad)/2] ^= 0xff
	os.WriteFile(chunk, bad, 0o600)
	starts := fl.starts.Load()
	st, b := a.do("POST", "/v1/sandboxes", map[string]any{"template": tp.ID})
	if st != 409 || !strings.Contains(string(b), "page store") {
		t.Fatalf("create over a corrupt chunk: %d %s", st, b)
	}
	if fl.starts.Load() != starts {
		t.Fatalf("a VMM started over a template the store could not rebuild")
	}
	os.WriteFile(chunk, good, 0o600)
	sb = a.create(tp.ID)
	a.ok(200, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)

	// Deleting the template and its sandboxes (the failed one too) frees
	// every chunk.
	var sbs []store.Sandbox
	a.ok(200, "GET", "/v1/sandboxes", nil, &sbs)
	for _, s := range sbs {
		a.ok(200, "DELETE", "/v1/sandboxes/"+s.ID, nil, nil)
	}
	a.ok(200, "DELETE", "/v1/templates/"+tp.ID, nil, nil)
	kvmtest.WaitFor(t, time.Minute, "the sweep after the template's delete", func() bool {
		n := plainNS(t, a)
		return n.Chunks == 0 && n.Refs == 0
	})
}

// TestTemplatePagesAtStart: a template whose layer is not in the store (a
// daemon from before, or one killed before it ingested) is put there when
// the daemon starts.
func TestTemplatePagesAtStart(t *testing.T) {
	fl := newFakeLauncher(t)
	state := t.TempDir()
	td := startDaemon(t, state, fl)
	a := td.client(t, "alice")
	tp := a.template(fakeKernel(t))
	layer, err := templateLayer(tp.Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	td.Close()
	<-td.done
	os.RemoveAll(filepath.Dir(cacheRef(layer)))
	os.RemoveAll(filepath.Join(state, "pagestore"))
	td = startDaemon(t, state, fl)
	a = td.client(t, "alice")
	if !pagestore.IsRefFile(cacheRef(layer)) {
		t.Fatal("the template's layer was not put into the store at start")
	}
	if n := plainNS(t, a); n.Refs != 1 || n.Chunks == 0 || n.Unreferenced != 0 {
		t.Fatalf("store after the start: %+v", n)
	}
	a.create(tp.ID)
}

// TestTemplatePagesKeyed: a tenant with a key has its template's layer in
// its keyed namespace in place (a sealed reference file, no plaintext or
// plain layer on disk), and creates restore the template's decrypted copy
// rebuilt from the store.
func TestTemplatePagesKeyed(t *testing.T) {
	fl := newFakeLauncher(t)
	keys := newProvider(t)
	td := startDaemon(t, t.TempDir(), fl, withKeys(t, keys, filepath.Join(t.TempDir(), "decrypted")))
	a := td.client(t, "acme")
	a.ok(201, "POST", "/v1/keys", nil, nil)
	tp := a.template(fakeKernel(t))
	layers, _ := filepath.Glob(filepath.Join(filepath.Dir(tp.Snapshot), "*"+memsnap.Ext))
	if len(layers) != 1 {
		t.Fatalf("template layers %v", layers)
	}
	if sealed, err := isSealed(layers[0]); err != nil || !sealed {
		t.Fatalf("the template's layer is not sealed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(tp.Snapshot), pagestore.CacheRefDir)); !os.IsNotExist(err) {
		t.Fatalf("a keyed template has a cache reference directory: %v", err)
	}
	var ss wire.StoreStats
	a.ok(200, "GET", "/v1/store", nil, &ss)
	if len(ss.Namespaces) != 1 || !ss.Namespaces[0].Keyed || ss.Namespaces[0].Refs != 1 || ss.Namespaces[0].Chunks == 0 || ss.Namespaces[0].Layers != 0 {
		t.Fatalf("store after the build: %+v", ss)
	}
	sb := a.create(tp.ID)
	cp := td.atRest.templateCopyDir("acme", tp.ID)
	copied, _ := filepath.Glob(filepath.Join(cp, "*"+memsnap.Ext))
	if len(copied) != 1 || pagestore.IsRefFile(copied[0]) {
		t.Fatalf("the template's copy holds %v, not its rebuilt layer", copied)
	}
	if _, err := memsnap.Open(copied[0]); err != nil {
		t.Fatalf("the copy's layer: %v", err)
	}
	a.ok(200, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
}

// TestTemplatePagesExport: exporting a template whose cache was dropped
// rebuilds its layer from the store first.
func TestTemplatePagesExport(t *testing.T) {
	f := newTemplateBundleFixture(t)
	snap := f.td.template("alice", f.id).view.Load().Snapshot
	// (The fixture wrote the template's snapshot anew, after the build.)
	if err := f.td.templateIntoStore("alice", snap); err != nil {
		t.Fatal(err)
	}
	layer, err := templateLayer(snap)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(layer)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.td.evictTemplateCaches(time.Now().Add(2*time.Hour), time.Hour); got != 1 {
		t.Fatalf("dropped %d caches, want 1", got)
	}
	if _, err := os.Stat(layer); !os.IsNotExist(err) {
		t.Fatalf("the layer after the drop: %v", err)
	}
	f.export(t)
	if got, err := os.ReadFile(layer); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the layer the export rebuilt differs from the one it had (%v)", err)
	}
}

// TestTemplatePagesKeyAfterDrop: a plain tenant whose template's cache was
// dropped gets a key: the layer is rebuilt from the store and sealed whole,
// its reference file goes, and creates restore it.
func TestTemplatePagesKeyAfterDrop(t *testing.T) {
	fl := newFakeLauncher(t)
	keys := newProvider(t)
	td := startDaemon(t, t.TempDir(), fl, withKeys(t, keys, filepath.Join(t.TempDir(), "decrypted")))
	a := td.client(t, "acme")
	tp := a.template(fakeKernel(t))
	layer, err := templateLayer(tp.Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	if got := td.evictTemplateCaches(time.Now().Add(2*time.Hour), time.Hour); got != 1 {
		t.Fatalf("dropped %d caches, want 1", got)
	}
	a.ok(201, "POST", "/v1/keys", nil, nil)
	sealedAll(t, filepath.Dir(tp.Snapshot))
	if sealed, err := isSealed(layer); err != nil || !sealed {
		t.Fatalf("the template's layer after the key: %v", err)
	}
	if got := td.evictTemplateCaches(time.Now().Add(4*time.Hour), time.Hour); got != 0 {
		t.Fatalf("dropped %d caches of a tenant with a key", got)
	}
	a.create(tp.ID)
}

// TestTemplatePagesKeyedBundle: a template imported by a tenant with a key
// has its layer in place in the keyed namespace (a sealed reference file),
// and exporting it again gives back the memory that was imported.
func TestTemplatePagesKeyedBundle(t *testing.T) {
	f := newTemplateBundleFixture(t)
	b := f.export(t)
	td := startDaemon(t, t.TempDir(), newFakeLauncher(t), withKeys(t, newProvider(t), ""))
	c := td.client(t, "alice")
	c.ok(201, "POST", "/v1/keys", nil, nil)
	var rec store.Template
	c.ok(201, "POST", "/v1/templates/import", b, &rec)
	layers, _ := filepath.Glob(filepath.Join(filepath.Dir(rec.Snapshot), "*"+memsnap.Ext))
	if len(layers) != 1 {
		t.Fatalf("imported template's layers %v", layers)
	}
	ns, err := td.pageNS("alice")
	if err != nil {
		t.Fatal(err)
	}
	if sealed, err := isSealed(layers[0]); err != nil || !sealed {
		t.Fatalf("the imported layer is not sealed: %v", err)
	}
	if r, err := ns.ReadRef(layers[0]); err != nil {
		t.Fatalf("the imported layer is not a reference file of the keyed namespace: %v", err)
	} else {
		r.Close()
	}
	st, again := c.do("GET", "/v1/templates/"+rec.ID+"/bundle", nil)
	if st != 200 {
		t.Fatalf("export of the imported template: %d %.300s", st, again)
	}
	var back store.Template
	td.client(t, "bob").ok(201, "POST", "/v1/templates/import", again, &back)
	use, done, err := td.cfg.Hooks.BeforeRestore("bob", back.Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	if done != nil {
		defer done()
	}
	if !bytes.Equal(restoredMemory(t, use), f.mem) {
		t.Fatal("the memory exported from the store differs from the imported")
	}
}
