package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenvm/warren/hostd/crypt"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/memsnap"
	"github.com/warrenvm/warren/memsnap/statefile"
	"github.com/warrenvm/warren/memsnap/vmsnap"
)

const fakeMemSize = 1 << 20

// writeFakeSnapshot writes snapshot path (DIR/NAME) in the real formats: a
// memsnap layer (a base, or an incremental one on parentLayer) and a state
// file whose "memory" section names it. The machine state is made up.
func writeFakeSnapshot(path, parentLayer string, fill byte) (layer string, err error) {
	dir, name, state, err := vmsnap.Paths(path)
	if err != nil {
		return "", err
	}
	mem := bytes.Repeat([]byte{fill}, fakeMemSize)
	copy(mem, "fake guest memory of "+name)
	layer = filepath.Join(dir, fmt.Sprintf("%s.%x%s", name, len(name)*int(fill+1), memsnap.Ext))
	opts := memsnap.Options{Fingerprint: []byte("fake-host"), Workers: 1}
	var l *memsnap.Layer
	if parentLayer == "" {
		l, err = memsnap.WriteBase(layer, bytes.NewReader(mem), fakeMemSize, opts)
	} else {
		p, perr := memsnap.Open(parentLayer)
		if perr != nil {
			return "", perr
		}
		dirty := make([]uint64, fakeMemSize/4096/64)
		dirty[0] = 0b1011
		l, err = memsnap.WriteIncremental(layer, bytes.NewReader(mem), fakeMemSize, dirty, p, opts)
		p.Close()
	}
	if err != nil {
		return "", err
	}
	defer l.Close()
	ref, _ := json.Marshal(map[string]any{"layer": filepath.Base(layer), "hash": l.Hash().String(), "size": fakeMemSize})
	meta, _ := json.Marshal(map[string]any{"version": 1, "kind": "full", "name": name})
	f := &statefile.File{Fingerprint: []byte("fake-host"), Sections: []statefile.Section{{Name: "meta", Data: meta}, {Name: "memory", Data: ref}}}
	data, err := f.Encode()
	if err != nil {
		return "", err
	}
	return layer, statefile.WriteAtomic(state, data)
}

func newProvider(t *testing.T) *crypt.LocalProvider {
	dir := filepath.Join(t.TempDir(), "keys")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return &crypt.LocalProvider{Dir: dir}
}

// withKeys is a startDaemon option: at-rest encryption with keys, the
// daemon decrypting into work ("": a new directory for each daemon).
func withKeys(t *testing.T, keys *crypt.LocalProvider, work string) func(*Config) {
	return func(c *Config) {
		c.Keys, c.DecryptDir = keys, work
		if work == "" {
			c.DecryptDir = filepath.Join(t.TempDir(), "decrypted")
		}
	}
}

// sealedAll checks that every file in dir is in the crypt format (no
// plaintext and no temporary file left).
func sealedAll(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) == 0 {
		t.Fatalf("%s is empty", dir)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("%s: a temporary file is left", e.Name())
			continue
		}
		ok, err := isSealed(filepath.Join(dir, e.Name()))
		if err != nil || !ok {
			t.Errorf("%s: not sealed (%v)", e.Name(), err)
		}
	}
}

func TestAtRestRoundTrip(t *testing.T) {
	keys := newProvider(t)
	if _, err := keys.Create("acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := keys.Create("other"); err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(t.TempDir(), "decrypted")
	at := &atRest{keys: keys, work: work}
	dir := filepath.Join(t.TempDir(), "snapshots")
	os.Mkdir(dir, 0o700)

	// A full snapshot and an incremental one on it, each sealed once written.
	baseLayer, err := writeFakeSnapshot(filepath.Join(dir, "base"), "", 1)
	if err != nil {
		t.Fatal(err)
	}
	plain := map[string][]byte{}
	for _, f := range []string{baseLayer, filepath.Join(dir, "base.wstate")} {
		plain[filepath.Base(f)], _ = os.ReadFile(f)
	}
	os.WriteFile(filepath.Join(dir, "base.1234.wraw"), []byte("flattened plaintext"), 0o600)
	if err := at.SnapshotWritten("acme", filepath.Join(dir, "base")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "base.1234.wraw")); !os.IsNotExist(err) {
		t.Fatalf("the .wraw cache survived: %v", err)
	}
	sealedAll(t, dir)
	// The VMM writes the next layer on a plaintext parent: the test does
	// that from a decrypted copy, as the daemon takes incremental ones
	// full for a tenant with a key.
	tmp := t.TempDir()
	if err := crypt.DecryptFile(filepath.Join(tmp, filepath.Base(baseLayer)), baseLayer, keys, "acme"); err != nil {
		t.Fatal(err)
	}
	incLayer, err := writeFakeSnapshot(filepath.Join(tmp, "inc"), filepath.Join(tmp, filepath.Base(baseLayer)), 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{incLayer, filepath.Join(tmp, "inc.wstate")} {
		b, _ := os.ReadFile(f)
		plain[filepath.Base(f)] = b
		os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o600)
	}
	if err := at.SnapshotWritten("acme", filepath.Join(dir, "inc")); err != nil {
		t.Fatal(err)
	}
	sealedAll(t, dir)
	// Sealing again changes nothing.
	before, _ := os.ReadFile(filepath.Join(dir, "inc.wstate"))
	if err := at.SnapshotWritten("acme", filepath.Join(dir, "inc")); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "inc.wstate")); !bytes.Equal(before, after) {
		t.Fatal("sealed twice")
	}

	// Restoring inc decrypts it and its whole chain into a private copy.
	use, done, err := at.BeforeRestore("acme", filepath.Join(dir, "inc"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(use, work+"/") || filepath.Base(use) != "inc" {
		t.Fatalf("restore path %s, want under %s", use, work)
	}
	if fi, err := os.Stat(filepath.Dir(use)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("working dir: %v %v", fi, err)
	}
	for name, want := range plain {
		if name == "base.wstate" { // not part of inc
			continue
		}
		got, err := os.ReadFile(filepath.Join(filepath.Dir(use), name))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: decrypted copy differs (%v)", name, err)
		}
	}
	snap, err := vmsnapChain(use)
	if err != nil {
		t.Fatal(err)
	}
	if snap != 2 {
		t.Fatalf("chain of %d layers, want 2", snap)
	}
	done()
	if _, err := os.Stat(filepath.Dir(use)); !os.IsNotExist(err) {
		t.Fatalf("working copy left after done: %v", err)
	}

	// Another tenant's key opens none of it.
	if _, _, err := at.BeforeRestore("other", filepath.Join(dir, "inc")); !errors.Is(err, crypt.ErrWrongKey) {
		t.Fatalf("other tenant: %v, want ErrWrongKey", err)
	}
	if _, err := crypt.Open(context.Background(), baseLayer, keys, "other"); !errors.Is(err, crypt.ErrWrongKey) {
		t.Fatalf("other tenant opens the layer: %v", err)
	}
	// A tenant with no key cannot either.
	if _, _, err := at.BeforeRestore("nokey", filepath.Join(dir, "inc")); !errors.Is(err, crypt.ErrNoKey) {
		t.Fatalf("no key: %v", err)
	}

	// Revoked: restores fail with the provider's message, files stay unreadable.
	if err := keys.Revoke("acme"); err != nil {
		t.Fatal(err)
	}
	_, _, err = at.BeforeRestore("acme", filepath.Join(dir, "inc"))
	if !errors.Is(err, crypt.ErrRevoked) || !strings.Contains(err.Error(), "key revoked") {
		t.Fatalf("after revoke: %v", err)
	}
	if _, err := crypt.Open(context.Background(), baseLayer, keys, "acme"); !errors.Is(err, crypt.ErrRevoked) {
		t.Fatalf("after revoke, open: %v", err)
	}
	// A snapshot written after the revocation is not kept in plaintext.
	if _, err := writeFakeSnapshot(filepath.Join(dir, "late"), "", 3); err != nil {
		t.Fatal(err)
	}
	if err := at.SnapshotWritten("acme", filepath.Join(dir, "late")); !errors.Is(err, crypt.ErrRevoked) {
		t.Fatalf("snapshot after revoke: %v", err)
	}
	sealedAll(t, dir)
	if m, _ := filepath.Glob(filepath.Join(dir, "late*")); len(m) != 0 {
		t.Fatalf("plaintext left: %v", m)
	}
}

// vmsnapChain opens the memory chain of the snapshot at path as vmsnap
// would and returns its length.
func vmsnapChain(path string) (int, error) {
	_, _, state, _ := vmsnap.Paths(path)
	f, err := statefile.Read(state)
	if err != nil {
		return 0, err
	}
	b, _ := f.Section("memory")
	var ref struct{ Layer string }
	json.Unmarshal(b, &ref)
	c, err := memsnap.OpenChain(filepath.Join(filepath.Dir(state), ref.Layer), memsnap.Dir(filepath.Dir(state)))
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if err := c.Verify(); err != nil {
		return 0, err
	}
	return len(c.Layers()), nil
}

// TestKeysAPI drives encryption through the API with the fake VMM: the
// template's and the sandbox's snapshots are sealed, restores get a
// plaintext copy, and after DELETE /v1/keys the tenant's sandboxes are
// stopped and create and resume fail with the provider's message (403).
func TestKeysAPI(t *testing.T) {
	fl := newFakeLauncher(t)
	keys := newProvider(t)
	state := t.TempDir()
	td := startDaemon(t, state, fl, withKeys(t, keys, ""))
	a := td.client(t, "acme")
	b := td.client(t, "other")

	var ki KeyInfo
	a.ok(201, "POST", "/v1/keys", nil, &ki)
	if ki.KeyID == "" || ki.Tenant != "acme" {
		t.Fatalf("key: %+v", ki)
	}
	if st, body := a.do("POST", "/v1/keys", nil); st != 409 {
		t.Fatalf("second create: %d %s", st, body)
	}
	a.ok(200, "GET", "/v1/keys", nil, &ki)
	if st, _ := b.do("GET", "/v1/keys", nil); st != 404 {
		t.Fatalf("other tenant's key: %d", st)
	}

	tp := a.template(fakeKernel(t))
	sealedAll(t, filepath.Dir(tp.Snapshot))
	// A create restores the template's lasting decrypted copy, lazily.
	decrypted := filepath.Join(td.cfg.DecryptDir)
	lazy := func() bool {
		fl.mu.Lock()
		defer fl.mu.Unlock()
		return fl.lastRestoreSpec.Lazy
	}
	sb := a.create(tp.ID)
	tplCopy := filepath.Dir(fl.restored())
	if fl.restored() == "" || strings.HasPrefix(fl.restored(), state) || filepath.Dir(tplCopy) != decrypted {
		t.Fatalf("the VMM restored %q, want a decrypted copy in %s", fl.restored(), decrypted)
	}
	if !lazy() {
		t.Fatal("a create from the template's copy was not lazy")
	}
	if _, err := os.Stat(tplCopy); err != nil {
		t.Fatalf("the template's copy is gone after a create: %v", err)
	}
	// It is made once: a second create uses it as it is.
	stamp := filepath.Join(tplCopy, "stamp")
	os.WriteFile(stamp, nil, 0o600)
	sbX := a.create(tp.ID)
	if filepath.Dir(fl.restored()) != tplCopy {
		t.Fatalf("second create restored %q, want the copy in %s", fl.restored(), tplCopy)
	}
	if _, err := os.Stat(stamp); err != nil {
		t.Fatal("the template's copy was made again")
	}
	a.ok(200, "DELETE", "/v1/sandboxes/"+sbX.ID, nil, nil)
	var snap store.Snapshot
	a.ok(201, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", map[string]any{"name": "s1"}, &snap)
	a.ok(201, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", map[string]any{"name": "s2", "incremental": true}, &snap)
	if snap.Kind != "full" {
		t.Fatalf("incremental snapshot of a tenant with a key: %s, want full", snap.Kind)
	}
	sealedAll(t, filepath.Dir(snap.Path))
	a.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/rollback", map[string]any{"snapshot": "s1"}, nil)
	var rec store.Sandbox
	a.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/pause?to_disk=true", nil, &rec)
	sealedAll(t, filepath.Dir(snap.Path))
	a.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/resume", nil, &rec)
	if rec.Status != store.Running {
		t.Fatalf("resume: %+v", rec)
	}
	// A sandbox's own snapshot: an eager restore from a working copy,
	// removed once the VMM has it.
	if lazy() || filepath.Dir(fl.restored()) == tplCopy || strings.HasPrefix(fl.restored(), state) {
		t.Fatalf("resume from disk restored %q (lazy %v), want an eager working copy", fl.restored(), lazy())
	}
	if _, err := os.Stat(filepath.Dir(fl.restored())); !os.IsNotExist(err) {
		t.Fatalf("working copy left after the resume: %v", err)
	}
	// A second sandbox, suspended when the key goes.
	sb2 := a.create(tp.ID)
	a.ok(200, "POST", "/v1/sandboxes/"+sb2.ID+"/pause?to_disk=true", nil, nil)

	// Another tenant cannot revoke acme's key (it is its own request).
	if st, _ := b.do("DELETE", "/v1/keys", nil); st != 404 {
		t.Fatalf("other tenant's revoke: %d", st)
	}
	a.ok(200, "DELETE", "/v1/keys", nil, &ki)
	if !ki.Revoked || len(ki.Stopped) != 1 || ki.Stopped[0] != sb.ID {
		t.Fatalf("revoke: %+v", ki)
	}
	if got := a.get(sb.ID); got.Status != store.Stopped || alive(rec.PID, rec.StartTime) {
		t.Fatalf("after revoke the sandbox is %+v", got)
	}
	for _, c := range []struct{ method, path string }{
		{"POST", "/v1/sandboxes"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/resume"},
		{"POST", "/v1/sandboxes/" + sb2.ID + "/resume"},
		{"POST", "/v1/templates"},
	} {
		var body any = map[string]any{"template": tp.ID}
		if c.path == "/v1/templates" {
			body = map[string]any{"kernel": fakeKernel(t)}
		}
		st, out := a.do(c.method, c.path, body)
		if st != 403 || !strings.Contains(string(out), "tenant acme: key revoked at") || !strings.Contains(string(out), "can no longer be read") {
			t.Fatalf("%s %s after revoke: %d %s", c.method, c.path, st, out)
		}
	}
	if _, err := os.Stat(tplCopy); !os.IsNotExist(err) {
		t.Fatalf("the template's decrypted copy outlived the revocation: %v", err)
	}
	// The files are still there, and unreadable.
	sealedAll(t, filepath.Dir(snap.Path))
	if _, err := crypt.Open(context.Background(), snap.Path+".wstate", keys, "acme"); !errors.Is(err, crypt.ErrRevoked) {
		t.Fatalf("open after revoke: %v", err)
	}
	if st, _ := a.do("POST", "/v1/keys", nil); st != 409 {
		t.Fatalf("create after revoke: %d", st)
	}
}

// TestKeysAPIUnconfigured: without --keys the key API says so.
func TestKeysAPIUnconfigured(t *testing.T) {
	td := startDaemon(t, t.TempDir(), newFakeLauncher(t))
	if st, out := td.client(t, "acme").do("POST", "/v1/keys", nil); st != 501 || !strings.Contains(string(out), "--keys") {
		t.Fatalf("%d %s", st, out)
	}
}

// TestKeyCreatedSealsExisting: snapshots written before the tenant had a
// key are sealed when it gets one.
func TestKeyCreatedSealsExisting(t *testing.T) {
	keys := newProvider(t)
	td := startDaemon(t, t.TempDir(), newFakeLauncher(t), withKeys(t, keys, ""))
	a := td.client(t, "acme")
	tp := a.template(fakeKernel(t))
	if ok, _ := isSealed(tp.Snapshot + ".wstate"); ok {
		t.Fatal("sealed without a key")
	}
	a.ok(201, "POST", "/v1/keys", nil, nil)
	sealedAll(t, filepath.Dir(tp.Snapshot))
	a.create(tp.ID)
}

// TestTemplateCopyLifetime: a template's decrypted copy is made by its
// first create, swept when the daemon starts (remade by the next
// create), and removed with the template.
func TestTemplateCopyLifetime(t *testing.T) {
	fl := newFakeLauncher(t)
	keys := newProvider(t)
	state, decrypted := t.TempDir(), filepath.Join(t.TempDir(), "decrypted")
	cfg := withKeys(t, keys, decrypted)
	td := startDaemon(t, state, fl, cfg)
	a := td.client(t, "acme")
	a.ok(201, "POST", "/v1/keys", nil, nil)
	tp := a.template(fakeKernel(t))
	cp := td.atRest.templateCopyDir("acme", tp.ID)
	if _, err := os.Stat(cp); !os.IsNotExist(err) {
		t.Fatalf("a copy before any create: %v", err)
	}
	sb := a.create(tp.ID)
	a.ok(200, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
	if _, err := os.Stat(cp); err != nil {
		t.Fatalf("no copy after a create: %v", err)
	}
	td.Close()
	<-td.done
	td = startDaemon(t, state, fl, cfg)
	a = td.client(t, "acme")
	if _, err := os.Stat(cp); !os.IsNotExist(err) {
		t.Fatalf("the copy survived a daemon start: %v", err)
	}
	sb = a.create(tp.ID)
	if filepath.Dir(fl.restored()) != cp {
		t.Fatalf("create after the restart restored %q", fl.restored())
	}
	a.ok(200, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
	a.ok(200, "DELETE", "/v1/templates/"+tp.ID, nil, nil)
	if _, err := os.Stat(cp); !os.IsNotExist(err) {
		t.Fatalf("the copy outlived its template: %v", err)
	}
}
