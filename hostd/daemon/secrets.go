package daemon

// Tenant secrets at rest, and where a sandbox's VMM reads its own.
//
// The tenant's file. Without Config.Keys, or for a tenant without a key,
// <state>/tenants/<tenant>/secrets.json is plaintext JSON (mode 0600, see
// hostd/store). For a tenant with a key it is sealed under that key in
// hostd/crypt's format, written whole and atomically (encrypted in
// memory, then a temporary file, fsync, rename, fsync of the directory)
// and read by decrypting it. A plaintext file of a tenant that got its key
// afterwards is sealed when the key is created, when the daemon starts
// (sealSecrets) and on its next write. Once the key is revoked every read
// and write fails with the provider's error (HTTP 403) and the sealed file
// stays on disk, unreadable.
//
// A sandbox's file. Every start of a network sandbox's VMM writes the
// secrets the sandbox names to a plaintext file its credential proxy reads
// per request (sandboxSecretsPath): for a tenant with a key in the
// decrypt working directory (Config.DecryptDir, a tmpfs) as
// <id>.secrets.json, otherwise in the sandbox's directory as secrets.json.
// Rotation (refreshSecrets) rewrites whichever of them exists. A fork
// child's VMM reads its parent's file (the VMM passes its settings on), so
// a file is in use while a VMM of its sandbox or of a descendant runs. A
// file in the decrypt directory is removed once its VMM has stopped for
// good (delete, pause to disk, revocation, a stop the monitor notices, a
// failed start) and no descendant's VMM uses it; for a tenant without a
// key the file in the sandbox's directory stays until the sandbox is
// deleted (as it always did), for one with a key (a file written before
// the key existed) it goes when its VMM stops.
//
// Locks: d.secretsMu serialises all of these files' reads and writes; it
// is taken after a sandbox's mu, never before.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"

	"github.com/warrenvm/warren/hostd/crypt"
	"github.com/warrenvm/warren/hostd/store"
)

// maxSecretsFile bounds the decrypted tenant's secrets file.
const maxSecretsFile = 256 << 20

// workSecretsSuffix names a sandbox's secrets file in the decrypt
// directory: <id>.secrets.json.
const workSecretsSuffix = ".secrets.json"

var workSecretsRE = regexp.MustCompile(`^([a-z]{2,3}-[0-9a-f]{12})\.secrets\.json$`)

// loadSecrets returns tenant's secrets, decrypting them if they are
// sealed (caller holds d.secretsMu).
func (d *Daemon) loadSecrets(tenant string) (map[string]string, error) {
	path := d.store.SecretsPath(tenant)
	if d.atRest == nil {
		return d.store.LoadSecrets(tenant)
	}
	if _, _, err := d.atRest.key(tenant); err != nil {
		return nil, cryptStatus(err)
	}
	sealed, err := isSealed(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return map[string]string{}, nil
	case err != nil:
		return nil, err
	case !sealed:
		return d.store.LoadSecrets(tenant)
	}
	b, err := d.atRest.readSealed(tenant, path, maxSecretsFile)
	if err != nil {
		return nil, cryptStatus(fmt.Errorf("secrets: %w", err))
	}
	return store.ParseSecrets(b)
}

// saveSecrets replaces tenant's secrets: sealed under its key if it has
// one, plaintext otherwise (caller holds d.secretsMu).
func (d *Daemon) saveSecrets(tenant string, m map[string]string) error {
	if d.atRest == nil {
		return d.store.SaveSecrets(tenant, m)
	}
	key, ok, err := d.atRest.key(tenant)
	if err != nil {
		return cryptStatus(err)
	}
	if !ok {
		return d.store.SaveSecrets(tenant, m)
	}
	b, err := store.EncodeSecrets(m)
	if err != nil {
		return err
	}
	sealed, err := sealBytes(b, key)
	if err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	return store.WriteFileAtomic(d.store.SecretsPath(tenant), sealed, 0o600)
}

// sealBytes encrypts b under key in hostd/crypt's format.
func sealBytes(b []byte, key crypt.Key) ([]byte, error) {
	var buf bytes.Buffer
	w, err := crypt.NewWriter(&buf, key, nil)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(b); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// readSealed decrypts the sealed file at path, of at most max plaintext
// bytes.
func (e *atRest) readSealed(tenant, path string, max int64) ([]byte, error) {
	r, err := crypt.Open(context.Background(), path, e.keys, tenant)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if r.Size() > max {
		return nil, fmt.Errorf("%s: %d bytes, more than %d", filepath.Base(path), r.Size(), max)
	}
	return io.ReadAll(r)
}

// sealSecrets seals tenant's secrets file if it has a key and the file is
// still plaintext, and removes the plaintext secrets files left in the
// directories of its sandboxes that no VMM reads (caller holds
// d.secretsMu).
func (d *Daemon) sealSecrets(tenant string) error {
	if d.atRest == nil {
		return nil
	}
	key, ok, err := d.atRest.key(tenant)
	if err != nil || !ok {
		return err
	}
	var errs []error
	path := d.store.SecretsPath(tenant)
	if _, err := os.Stat(path); err == nil {
		if err := sealFile(path, key); err != nil {
			errs = append(errs, fmt.Errorf("secrets: %w", err))
		}
	}
	for _, s := range d.tenantSandboxes(tenant) {
		if !d.secretsInUse(s.rec.ID) {
			if err := os.Remove(d.diskSecretsPath(tenant, s.rec.ID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// diskSecretsPath is the secrets file of sandbox id in its directory.
func (d *Daemon) diskSecretsPath(tenant, id string) string {
	return filepath.Join(d.store.SandboxDir(tenant, id), sbSecretsFile)
}

// workSecretsPath is the secrets file of sandbox id in the decrypt
// directory ("" without Config.Keys).
func (d *Daemon) workSecretsPath(id string) string {
	if d.atRest == nil {
		return ""
	}
	return filepath.Join(d.atRest.work, id+workSecretsSuffix)
}

// sandboxSecretsPath is where the next VMM of sandbox id reads its
// secrets (see the top of this file); for a tenant with a key it makes
// the decrypt directory.
func (d *Daemon) sandboxSecretsPath(tenant, id string) (string, error) {
	if !d.encrypts(tenant) {
		return d.diskSecretsPath(tenant, id), nil
	}
	if err := os.MkdirAll(d.atRest.work, 0o700); err != nil {
		return "", err
	}
	return d.workSecretsPath(id), nil
}

// keyed reports whether tenant has, or had, a key: its secrets must not
// stay in plaintext on disk.
func (d *Daemon) keyed(tenant string) bool {
	if d.atRest == nil {
		return false
	}
	_, ok, err := d.atRest.key(tenant)
	return ok || err != nil
}

// secretsInUse reports whether a running VMM reads the secrets file of
// sandbox id: its own, or a fork descendant's (which reads its ancestor's).
func (d *Daemon) secretsInUse(id string) bool {
	views := map[string]store.Sandbox{}
	for _, s := range d.allSandboxes() {
		v := d.snapshotRec(s)
		views[v.ID] = v
	}
	for _, v := range views {
		if !alive(v.PID, v.StartTime) {
			continue
		}
		// v's VMM reads the file of v or of one of its ancestors.
		x := v
		for range 64 {
			if x.ID == id || x.Parent == id {
				return true
			}
			p, ok := views[x.Parent]
			if x.Parent == "" || !ok {
				break
			}
			x = p
		}
	}
	return false
}

// dropSecrets removes the secrets files that sb's VMM read, now that it
// has stopped for good (caller holds the sandbox's mu, and the VMM is
// gone): its own, and those of its fork ancestors, unless another VMM
// still reads them. The file in the sandbox's directory goes only for a
// tenant with a key, or when deleting.
func (d *Daemon) dropSecrets(sb *store.Sandbox, deleting bool) {
	if !sb.Network {
		return
	}
	keyed := d.keyed(sb.Tenant)
	d.secretsMu.Lock()
	d.releaseSecrets(sb.Tenant, sb.ID, keyed || deleting)
	d.secretsMu.Unlock()
	for id, n := sb.Parent, 0; id != "" && n < 64; n++ {
		a := d.sandbox(sb.Tenant, id)
		if a == nil {
			// Deleted: its directory went with it.
			d.secretsMu.Lock()
			d.releaseSecrets(sb.Tenant, id, false)
			d.secretsMu.Unlock()
			return
		}
		// An ancestor with an operation under way (a start writing its
		// file) is left alone: its own stop releases its file.
		if a.mu.TryLock() {
			d.secretsMu.Lock()
			d.releaseSecrets(sb.Tenant, id, keyed)
			d.secretsMu.Unlock()
			id = a.rec.Parent
			a.mu.Unlock()
		} else {
			id = d.snapshotRec(a).Parent
		}
	}
}

// releaseSecrets removes sandbox id's secrets file in the decrypt
// directory, and with disk the one in its directory, unless a VMM reads
// them (caller holds d.secretsMu).
func (d *Daemon) releaseSecrets(tenant, id string, disk bool) {
	if d.secretsInUse(id) {
		return
	}
	paths := []string{d.workSecretsPath(id)}
	if disk {
		paths = append(paths, d.diskSecretsPath(tenant, id))
	}
	for _, p := range paths {
		if p == "" {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			d.log.Warn("remove a sandbox's secrets file", "tenant", tenant, "sandbox", id, "err", err)
		}
	}
}

// sweepWorkSecrets removes the sandboxes' secrets files in the decrypt
// directory that no VMM reads (a daemon that died before removing them).
// It runs once, when the daemon starts.
func (d *Daemon) sweepWorkSecrets() {
	if d.atRest == nil {
		return
	}
	ents, _ := os.ReadDir(d.atRest.work)
	d.secretsMu.Lock()
	defer d.secretsMu.Unlock()
	for _, e := range ents {
		m := workSecretsRE.FindStringSubmatch(e.Name())
		if m == nil || !e.Type().IsRegular() || d.secretsInUse(m[1]) {
			continue
		}
		os.Remove(filepath.Join(d.atRest.work, e.Name()))
	}
}
