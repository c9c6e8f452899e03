package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/warrenvm/warren/hostd/crypt"
	"github.com/warrenvm/warren/hostd/pagestore"
	"github.com/warrenvm/warren/memsnap"
	"github.com/warrenvm/warren/memsnap/statefile"
	"github.com/warrenvm/warren/memsnap/vmsnap"
)

// At-rest encryption (bring your own key): with Config.Keys, every
// snapshot of a tenant that has a key — its sandboxes' and its templates'
// (templates are per tenant) — is kept on disk in hostd/crypt's chunked,
// authenticated format under the tenant's key.
//
// Writing (Hooks.SnapshotWritten). The VMM writes DIR/NAME as today (the
// NAME.wstate state file and its NAME.<unique>.wsnap layer); then each of
// them is encrypted in place: crypt.EncryptFile writes a temporary DIR/.X
// and digits (internal/atomicfile), fsyncs it, renames it over X and
// fsyncs DIR, so at every instant X is either the whole plaintext or the
// whole ciphertext (a crash leaves at worst a stray temporary file of
// ciphertext), and the rename unlinks the
// plaintext (a VMM that still has it open keeps its inode until it closes
// it). A flattened cache DIR/NAME.*.wraw (plaintext RAM) is removed. The
// snapshot is recorded only once all its files are sealed. Files the
// daemon finds still in plaintext for a tenant with a key (a crash in
// between, snapshots from before the key was created) are sealed when the
// daemon starts and when the key is created (sealTenant).
//
// Restoring (Hooks.BeforeRestore). An encrypted snapshot is decrypted
// (crypt.DecryptFile: every chunk authenticated) into a private working
// directory, Config.DecryptDir (a tmpfs: /run/warren/decrypted by
// default), mode 0700, one per restore: the state file, the layer it
// names and the layers under it (followed by the parent names the layers
// record). The VMM is started on that copy eagerly (`warren restore`
// without --lazy: the chain is decoded into the VMM's own memfd) or
// rolled back onto it (in place, eager too) and, once it has loaded it
// (the guest agent answers, or the rollback call returns), the working
// directory is removed. Nothing decrypted stays on a disk, and nothing
// stays on the tmpfs after the restore.
//
// Secrets: the tenant's secrets file is sealed under the same key, and a
// network sandbox's VMM reads its secrets from a plaintext file in the
// same working directory, removed when that VMM stops for good (see
// secrets.go).
//
// Disks: the tenant's disk files (templates' frozen bases, sandboxes'
// overlays and fork layers) are sealed whenever no VMM needs them and
// unsealed in place before a VMM that needs them starts (diskseal.go).
//
// What stays plaintext: a running sandbox's guest memory (in RAM, in the
// VMM's memfd), a template's working set, beside its decrypted copy on
// the tmpfs (workingset.go), the disk files its VMM may open while it
// runs (its chain:
// its template's base, its overlay, its fork ancestors' layers), the
// secrets file of a running network sandbox's VMM (on the tmpfs), the
// decrypted working copy of a snapshot for the seconds a restore reads
// it, and a fork's transient files (its children's console and log).
//
// Trade-offs of this (hook) design against reading layers through
// crypt.Reader inside the VMM (memsnap's openReader exported, the lazy
// restore's page faults served by ReadAt from a userfaultfd handler): the
// VMM needs no key and no change, but a restore of an encrypted snapshot
// decrypts the whole chain first (~3 GB/s per core). Creates stay lazy:
// they restore the template's lasting decrypted copy (Template copies,
// below), whose flattened .wraw all its sandboxes share, at the price of
// that plaintext copy on the tmpfs while the template exists. A
// sandbox's own snapshots (resume from disk, rollback) are restored
// eagerly: a lazy restore would keep a flattened plaintext file per
// sandbox on the tmpfs, mapped and unreclaimable, for the VMM's life,
// outside its cgroup's reach. And incremental snapshots are taken full
// for a tenant with a key: the VMM opens its previous layer by path to
// chain the next one on it, and that file is now ciphertext (with full
// snapshots pre-copied, a full snapshot's pause is as short as an
// incremental one's; they cost more disk). Reading through crypt.Reader
// in the VMM would remove the last two costs.
//
// Revocation (DELETE /v1/keys): the key is crypto-shredded
// (crypt.LocalProvider.Revoke) and the tenant's running sandboxes are
// stopped (a running VMM holds plaintext memory, and a snapshot it takes
// could not be sealed). From then on creates, resumes from disk, rollbacks,
// template builds and the secrets API of the tenant fail with the
// provider's error (HTTP 403), and its snapshot and secrets files stay on
// disk, unreadable.
type atRest struct {
	keys *crypt.LocalProvider
	// work is where decrypted working copies go.
	work string
	// templateOf returns the template whose snapshot path is, if it is
	// one (the daemon's store layout); nil: none is.
	templateOf func(path string) (tenant, id string, ok bool)
	// tplMu serialises the making of template copies.
	tplMu sync.Mutex
	// pages, when set, is the tenant's page store namespace: a layer
	// decrypted into a working copy that is a reference file is rebuilt
	// from it there (pagestore.go).
	pages func(tenant string) (*pagestore.Namespace, error)
	// rehome, when set, runs before sealTenant seals a tenant's files:
	// it rebuilds the layers in the tenant's plain page store namespace
	// and returns the reference files it could not (left plaintext).
	rehome func(tenant, root string) map[string]bool
}

// Template copies. Creates restore a template's snapshot, the hot path:
// for a tenant with a key, its decrypted copy is made once, in
// WORK/tpl.TENANT.ID (mode 0700), and kept while the template exists, so
// that each create restores it lazily (`warren restore --lazy`, as for a
// tenant without a key): the first flattens the chain into the copy's
// .wraw (zero pages as holes), and every later one maps that file
// copy-on-write, sharing its page cache with the template's other
// sandboxes. (With Config.RestoreMemory "uffd" creates restore the copy
// by userfaultfd instead, and the template's working set lives beside
// the copy: workingset.go.) The copy is plaintext on the tmpfs (RAM, never a disk, as the
// running guests' memory is); it is removed when the template is deleted,
// when the tenant's key is revoked (BeforeRestore asks the provider before
// every use, so a key revoked elsewhere stops creates too) and when the
// daemon starts. A sandbox's own snapshots (resume, rollback) are restored
// eagerly from a working copy made for that restore and removed after it.
const tplCopyPrefix = "tpl."

// templateCopyDir is the directory of tenant's template id's copy.
func (e *atRest) templateCopyDir(tenant, id string) string {
	return filepath.Join(e.work, tplCopyPrefix+tenant+"."+id)
}

// dropTemplateCopies removes tenant's template copies: template id's, or
// all of them when id is "".
func (e *atRest) dropTemplateCopies(tenant, id string) {
	if id != "" {
		os.RemoveAll(e.templateCopyDir(tenant, id))
		return
	}
	dirs, _ := filepath.Glob(filepath.Join(e.work, tplCopyPrefix+tenant+".*"))
	for _, d := range dirs {
		os.RemoveAll(d)
	}
}

// templateCopy returns the snapshot path in the copy of template id's
// snapshot dir/name, making the copy if there is none.
func (e *atRest) templateCopy(tenant, id, dir, name string) (string, error) {
	final := e.templateCopyDir(tenant, id)
	use := filepath.Join(final, name)
	if _, err := os.Stat(use + vmsnap.StateExt); err == nil {
		return use, nil
	}
	e.tplMu.Lock()
	defer e.tplMu.Unlock()
	if _, err := os.Stat(use + vmsnap.StateExt); err == nil {
		return use, nil
	}
	tmp, err := os.MkdirTemp(e.work, ".tpl-tmp-")
	if err != nil {
		return "", err
	}
	if err := e.materialize(tenant, dir, tmp, name); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	os.RemoveAll(final) // an incomplete one
	if err := os.Rename(tmp, final); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	return use, nil
}

// workDirRE matches the working directories BeforeRestore makes.
var workDirRE = regexp.MustCompile(`^[a-z0-9-]{1,63}-[0-9]+$`)

// isSealed reports whether the file at path is in hostd/crypt's format.
func isSealed(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	b := make([]byte, len(crypt.Magic))
	n, err := io.ReadFull(f, b)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return false, err
	}
	return string(b[:n]) == crypt.Magic, nil
}

// key returns tenant's key; ok is false (and err nil) when the tenant has
// none, i.e. its snapshots are not encrypted.
func (e *atRest) key(tenant string) (k crypt.Key, ok bool, err error) {
	k, err = e.keys.Key(context.Background(), tenant)
	if errors.Is(err, crypt.ErrNoKey) {
		return crypt.Key{}, false, nil
	}
	if err != nil {
		return crypt.Key{}, false, err
	}
	return k, true, nil
}

// snapshotFiles lists the files of snapshot DIR/NAME: its layers first,
// then its state file.
func snapshotFiles(path string) (dir, name string, files []string, err error) {
	dir, name, state, err := vmsnap.Paths(path)
	if err != nil {
		return "", "", nil, err
	}
	layers, _ := filepath.Glob(filepath.Join(dir, name+".*"+memsnap.Ext))
	files = append(layers, state)
	return dir, name, files, nil
}

// SnapshotWritten seals the snapshot at path (see above). A tenant with
// no key: nothing to do. A revoked tenant: the plaintext just written is
// removed and the error returned.
func (e *atRest) SnapshotWritten(tenant, path string) error {
	dir, name, files, err := snapshotFiles(path)
	if err != nil {
		return err
	}
	key, ok, err := e.key(tenant)
	if err != nil {
		for _, f := range files {
			if sealed, _ := isSealed(f); !sealed {
				os.Remove(f)
			}
		}
		return err
	}
	if !ok {
		return nil
	}
	for _, f := range files {
		if err := sealFile(f, key); err != nil {
			return err
		}
	}
	raws, _ := filepath.Glob(filepath.Join(dir, name+".*"+vmsnap.RawExt))
	for _, r := range raws {
		os.Remove(r)
	}
	return nil
}

// sealFile encrypts path in place unless it is already.
func sealFile(path string, key crypt.Key) error {
	sealed, err := isSealed(path)
	if err != nil || sealed {
		return err
	}
	return crypt.EncryptFile(path, path, key)
}

// BeforeRestore returns the snapshot path the VMM is to restore for
// tenant's snapshot path, and what to call once the VMM has loaded it. A
// snapshot in plaintext is restored where it is; a template's, from its
// lasting copy (done is nil: see Template copies); any other, from a
// working copy that done removes.
func (e *atRest) BeforeRestore(tenant, path string) (string, func(), error) {
	dir, name, state, err := vmsnap.Paths(path)
	if err != nil {
		return "", nil, err
	}
	sealed, err := isSealed(state)
	if err != nil {
		return "", nil, err
	}
	if !sealed {
		return path, nil, nil
	}
	// The provider's answer first: a revoked tenant gets its clear error.
	if _, err := e.keys.Key(context.Background(), tenant); err != nil {
		return "", nil, err
	}
	if err := os.MkdirAll(e.work, 0o700); err != nil {
		return "", nil, err
	}
	if e.templateOf != nil {
		if t, id, ok := e.templateOf(path); ok && t == tenant {
			use, err := e.templateCopy(tenant, id, dir, name)
			return use, nil, err
		}
	}
	work, err := os.MkdirTemp(e.work, tenant+"-")
	if err != nil {
		return "", nil, err
	}
	done := func() { os.RemoveAll(work) }
	if err := e.materialize(tenant, dir, work, name); err != nil {
		done()
		return "", nil, err
	}
	return filepath.Join(work, name), done, nil
}

// materialize puts the plaintext of snapshot dir/name and its memory
// chain into work.
func (e *atRest) materialize(tenant, dir, work, name string) error {
	if err := e.open(tenant, filepath.Join(dir, name+vmsnap.StateExt), filepath.Join(work, name+vmsnap.StateExt)); err != nil {
		return err
	}
	sf, err := statefile.Read(filepath.Join(work, name+vmsnap.StateExt))
	if err != nil {
		return err
	}
	b, ok := sf.Section("memory")
	if !ok {
		return fmt.Errorf("%s: no memory section", name+vmsnap.StateExt)
	}
	var ref struct {
		Layer string `json:"layer"`
	}
	if err := json.Unmarshal(b, &ref); err != nil {
		return fmt.Errorf("%s: memory section: %w", name+vmsnap.StateExt, err)
	}
	layer := ref.Layer
	for range 4096 {
		if layer == "" || layer != filepath.Base(layer) || strings.HasPrefix(layer, ".") {
			return fmt.Errorf("%s: bad layer name %q", name, layer)
		}
		dst := filepath.Join(work, layer)
		if _, err := os.Stat(dst); err == nil {
			return nil
		}
		if err := e.open(tenant, filepath.Join(dir, layer), dst); err != nil {
			return err
		}
		if e.pages != nil && pagestore.IsRefFile(dst) {
			ns, err := e.pages(tenant)
			if err != nil {
				return err
			}
			if err := ns.Materialize(dst, dst, -1); err != nil {
				return &apiError{status: 409, msg: fmt.Sprintf("snapshot %s: %v", name, err)}
			}
		}
		l, err := memsnap.Open(dst)
		if err != nil {
			return err
		}
		h := l.Header()
		l.Close()
		if h.Parent.IsZero() {
			return nil
		}
		layer = h.ParentName
	}
	return fmt.Errorf("%s: memory chain too long", name)
}

// open decrypts src (or copies it, if it is plaintext) to dst.
func (e *atRest) open(tenant, src, dst string) error {
	sealed, err := isSealed(src)
	if err != nil {
		return err
	}
	if sealed {
		return crypt.DecryptFile(dst, src, e.keys, tenant)
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// sealTenant seals every plaintext snapshot file under root (a tenant's
// directory) and removes its flattened .wraw caches and its working sets
// (.wset: workingset.go); for a tenant without a key it does nothing.
func (e *atRest) sealTenant(tenant, root string) error {
	key, ok, err := e.key(tenant)
	if err != nil || !ok {
		return err
	}
	var keepPlain map[string]bool
	if e.rehome != nil {
		keepPlain = e.rehome(tenant, root)
	}
	var errs []error
	filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
		if err != nil || !de.Type().IsRegular() || strings.HasPrefix(de.Name(), ".") || keepPlain[p] {
			return nil
		}
		switch filepath.Ext(p) {
		case vmsnap.StateExt, memsnap.Ext:
			if err := sealFile(p, key); err != nil {
				errs = append(errs, err)
			}
		case vmsnap.RawExt, workingSetExt:
			os.Remove(p)
		}
		return nil
	})
	return errors.Join(errs...)
}

// cryptStatus maps a key or file error to the API's status: 403 for a
// revoked or missing key, 409 for a file that is not this tenant's or
// fails authentication.
func cryptStatus(err error) error {
	var ae *apiError
	if err == nil || errors.As(err, &ae) {
		return err
	}
	switch {
	case errors.Is(err, crypt.ErrRevoked), errors.Is(err, crypt.ErrNoKey):
		return &apiError{status: 403, msg: err.Error()}
	case errors.Is(err, crypt.ErrWrongKey), errors.Is(err, crypt.ErrAuth), errors.Is(err, crypt.ErrFormat):
		return &apiError{status: 409, msg: err.Error()}
	}
	return err
}
