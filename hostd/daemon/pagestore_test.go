package daemon

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenvm/warren/hostd/crypt"
	"github.com/warrenvm/warren/hostd/pagestore"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/memsnap"
)

// pageDaemon is the part of a Daemon the page store code uses, on a
// state directory of its own; keys, when set, turns on at-rest encryption.
func pageDaemon(t *testing.T, keys *crypt.LocalProvider) *Daemon {
	t.Helper()
	root := t.TempDir()
	st, err := store.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	ps, err := pagestore.Open(st.PageStoreDir())
	if err != nil {
		t.Fatal(err)
	}
	d := &Daemon{cfg: Config{State: root, Keys: keys}, store: st, log: slog.New(slog.NewTextHandler(io.Discard, nil)), pages: &pageStore{st: ps}}
	if keys != nil {
		d.atRest = &atRest{keys: keys, work: filepath.Join(t.TempDir(), "decrypted"), pages: d.pageNS, rehome: d.rehomePages}
	}
	return d
}

// restoredMemory opens the chain of the snapshot the restore hook gave
// (use) and returns its memory.
func restoredMemory(t *testing.T, use string) []byte {
	t.Helper()
	layers, _ := filepath.Glob(use + ".*" + memsnap.Ext)
	if len(layers) != 1 {
		t.Fatalf("%s: %d layers", use, len(layers))
	}
	c, err := memsnap.OpenChain(layers[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Verify(); err != nil {
		t.Fatal(err)
	}
	mem := make([]byte, c.MemSize())
	if err := c.Restore(mem); err != nil {
		t.Fatal(err)
	}
	return mem
}

// TestPageStorePlain: a plain tenant's snapshot layers go into the store
// (all but the VMM's next parent), a restore gets a working copy that
// restores the same memory, a corrupt chunk fails it with 409, and
// deleting the snapshots frees every chunk.
func TestPageStorePlain(t *testing.T) {
	d := pageDaemon(t, nil)
	dir := filepath.Join(d.store.SandboxDir("acme", "sb-1"), "snapshots")
	os.MkdirAll(dir, 0o700)
	base, err := writeFakeSnapshot(filepath.Join(dir, "s1"), "", 1)
	if err != nil {
		t.Fatal(err)
	}
	inc, err := writeFakeSnapshot(filepath.Join(dir, "s2"), base, 2)
	if err != nil {
		t.Fatal(err)
	}
	// The restore before anything is in the store: in place.
	use, done, err := d.restoreHook(nil)("acme", filepath.Join(dir, "s2"))
	if err != nil || done != nil || use != filepath.Join(dir, "s2") {
		t.Fatalf("restore of plain layers: %q, %v", use, err)
	}
	want := restoredMemory(t, use)

	d.ingestSnapshots("acme", dir, "s2")
	if !pagestore.IsRefFile(base) || pagestore.IsRefFile(inc) {
		t.Fatalf("after ingesting all but s2: base in store %v, s2's layer in store %v", pagestore.IsRefFile(base), pagestore.IsRefFile(inc))
	}
	use, done, err = d.restoreHook(nil)("acme", filepath.Join(dir, "s2"))
	if err != nil || done == nil || !strings.HasPrefix(filepath.Base(filepath.Dir(use)), materializedPrefix) {
		t.Fatalf("restore from the store: %q, done %v, %v", use, done != nil, err)
	}
	if got := restoredMemory(t, use); !bytes.Equal(got, want) {
		t.Error("memory restored from the store differs")
	}
	done()
	if ws, _ := filepath.Glob(filepath.Join(dir, materializedPrefix+"*")); len(ws) != 0 {
		t.Errorf("working copies left: %v", ws)
	}

	// A damaged chunk: the restore fails before any VMM, with 409.
	ns, _ := d.pageNS("acme")
	var chunk string
	filepath.WalkDir(filepath.Join(d.pages.st.Root(), "acme"), func(p string, de os.DirEntry, err error) error {
		if err == nil && de.Type().IsRegular() && chunk == "" {
			chunk = p
		}
		return nil
	})
	good, _ := os.ReadFile(chunk)
	os.WriteFile(chunk, append(bytes.Clone(good[:len(good)-1]), good[len(good)-1]^1), 0o600)
	_, _, err = d.restoreHook(nil)("acme", filepath.Join(dir, "s2"))
	var ae *apiError
	if !errors.As(err, &ae) || ae.status != 409 || !errors.Is(err, pagestore.ErrCorrupt) && !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("restore with a corrupt chunk: %v", err)
	}
	os.WriteFile(chunk, good, 0o600)

	// Stats, then deletion and a sweep.
	d.ingestSnapshots("acme", dir, "")
	st, err := d.storeStats("acme")
	if err != nil || len(st.Namespaces) != 1 || st.Namespaces[0].Refs != 2 || st.Namespaces[0].Chunks == 0 || st.LogicalBytes == 0 {
		t.Fatalf("stats %+v, %v", st, err)
	}
	removeSnapshotFiles(filepath.Join(dir, "s2"))
	removeSnapshotFiles(filepath.Join(dir, "s1"))
	d.sweepPages("acme")
	if s, err := ns.Stats(d.tenantDir("acme")); err != nil || s.Chunks != 0 {
		t.Errorf("after deleting every snapshot: %+v, %v", s, err)
	}
}

// TestPageStoreKeyed: a tenant with a key gets its layers into its keyed
// namespace before they are sealed (reference files sealed, chunks
// sealed), restores through the decrypted working copy, and a plain
// tenant that gets a key has its store-backed layers rebuilt and sealed
// whole, its plain chunks swept.
func TestPageStoreKeyed(t *testing.T) {
	keys := newProvider(t)
	d := pageDaemon(t, keys)
	dir := filepath.Join(d.store.SandboxDir("acme", "sb-1"), "snapshots")
	os.MkdirAll(dir, 0o700)
	if _, err := writeFakeSnapshot(filepath.Join(dir, "s1"), "", 3); err != nil {
		t.Fatal(err)
	}
	want := restoredMemory(t, filepath.Join(dir, "s1"))
	// Without a key first: into the plain namespace.
	d.ingestSnapshots("acme", dir, "")
	layers, _ := filepath.Glob(filepath.Join(dir, "s1.*"+memsnap.Ext))
	if len(layers) != 1 || !pagestore.IsRefFile(layers[0]) {
		t.Fatal("not ingested")
	}
	// The key: sealTenant rebuilds the layer and seals it whole.
	if _, err := keys.Create("acme"); err != nil {
		t.Fatal(err)
	}
	if err := d.atRest.sealTenant("acme", d.tenantDir("acme")); err != nil {
		t.Fatal(err)
	}
	sealedAll(t, dir)
	if c, _, _ := d.pages.st.Usage(pagestore.NamespaceDir{Tenant: "acme", Name: pagestore.PlainNamespace}); c != 0 {
		t.Errorf("%d plaintext chunks left after the tenant got a key", c)
	}
	use, done, err := d.restoreHook(d.atRest.BeforeRestore)("acme", filepath.Join(dir, "s1"))
	if err != nil {
		t.Fatal(err)
	}
	if got := restoredMemory(t, use); !bytes.Equal(got, want) {
		t.Error("rehomed snapshot restores other memory")
	}
	if done != nil {
		done()
	}

	// A new snapshot of the keyed tenant: ingested, then sealed.
	if _, err := writeFakeSnapshot(filepath.Join(dir, "s2"), "", 3); err != nil {
		t.Fatal(err)
	}
	want = restoredMemory(t, filepath.Join(dir, "s2"))
	d.ingestSnapshots("acme", dir, "")
	if err := d.atRest.SnapshotWritten("acme", filepath.Join(dir, "s2")); err != nil {
		t.Fatal(err)
	}
	sealedAll(t, dir)
	ns, err := d.pageNS("acme")
	if err != nil || !ns.Keyed() {
		t.Fatalf("namespace %v, %v", ns, err)
	}
	st, err := ns.Stats(d.tenantDir("acme"))
	if err != nil || st.Refs != 1 || st.Chunks == 0 {
		t.Fatalf("keyed stats %+v, %v", st, err)
	}
	filepath.WalkDir(filepath.Join(d.pages.st.Root(), "acme", ns.Name(), "chunks"), func(p string, de os.DirEntry, err error) error {
		if err == nil && de.Type().IsRegular() {
			if ok, _ := isSealed(p); !ok {
				t.Errorf("chunk %s is not sealed", p)
			}
		}
		return nil
	})
	use, done, err = d.restoreHook(d.atRest.BeforeRestore)("acme", filepath.Join(dir, "s2"))
	if err != nil {
		t.Fatal(err)
	}
	if got := restoredMemory(t, use); !bytes.Equal(got, want) {
		t.Error("keyed store-backed snapshot restores other memory")
	}
	if done != nil {
		done()
	}
	// Another tenant cannot use acme's snapshot (its key opens nothing).
	if _, err := keys.Create("other"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.restoreHook(d.atRest.BeforeRestore)("other", filepath.Join(dir, "s2")); !errors.Is(err, crypt.ErrWrongKey) {
		t.Errorf("another tenant's restore: %v", err)
	}
}
