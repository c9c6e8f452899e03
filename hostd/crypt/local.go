package crypt

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/warrenvm/warren/internal/atomicfile"
	"github.com/warrenvm/warren/internal/ident"
)

// ErrKeyExists: Create was asked for a tenant that already has a key.
var ErrKeyExists = errors.New("tenant already has a key")

// ValidTenant checks a tenant name: 1..63 of [a-z0-9-].
func ValidTenant(tenant string) error {
	if !ident.Tenant(tenant) {
		return fmt.Errorf("crypt: invalid tenant name %q: want 1..63 of [a-z0-9-]", tenant)
	}
	return nil
}

// LocalProvider keeps tenant keys in files in Dir:
//
//	DIR/<tenant>.key      32 random bytes, hex (64 digits) or standard
//	                      base64 (44 characters), optional trailing newline;
//	                      a regular file (not a symlink), owned by this
//	                      process's user, mode 0600 or stricter
//	DIR/<tenant>.revoked  marker left by Revoke: "revoked <RFC 3339 time>
//	                      key <key ID>\n"
//
// Dir itself must be a directory (not a symlink) that group and other
// cannot write. Create writes keys as hex.
//
// A tenant with a .revoked marker is revoked whether or not a .key file
// is (still) there: Key returns a *RevokedError and Create refuses until
// Reinstate, which makes a fresh key with a different ID, so files
// written under the old key stay unreadable.
type LocalProvider struct {
	Dir string
	// Now is the clock for revocation times; nil means time.Now.
	Now func() time.Time
}

func (p *LocalProvider) now() time.Time {
	if p.Now != nil {
		return p.Now()
	}
	return time.Now()
}

func (p *LocalProvider) keyPath(t string) string     { return filepath.Join(p.Dir, t+".key") }
func (p *LocalProvider) revokedPath(t string) string { return filepath.Join(p.Dir, t+".revoked") }

// checkDir refuses a missing, symlinked or group/other-writable directory.
func (p *LocalProvider) checkDir() error {
	if p.Dir == "" {
		return errors.New("crypt: LocalProvider.Dir is empty")
	}
	fi, err := os.Lstat(p.Dir)
	if err != nil {
		return fmt.Errorf("crypt: key directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("crypt: key directory %s is not a directory (symlinks are refused)", p.Dir)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("crypt: key directory %s is writable by group or other (mode %v)", p.Dir, fi.Mode().Perm())
	}
	return nil
}

// Key returns the tenant's key, or a *RevokedError (ErrRevoked), or an
// error wrapping ErrNoKey.
func (p *LocalProvider) Key(ctx context.Context, tenant string) (Key, error) {
	if err := ctx.Err(); err != nil {
		return Key{}, err
	}
	if rerr, err := p.checkTenant(tenant); err != nil {
		return Key{}, err
	} else if rerr != nil {
		return Key{}, rerr
	}
	return p.readKey(tenant)
}

// checkTenant begins every operation on a tenant's key: it refuses an
// invalid tenant name or an unsafe key directory (checkDir), then returns
// a *RevokedError if the tenant is revoked (revoked).
func (p *LocalProvider) checkTenant(tenant string) (*RevokedError, error) {
	if err := ValidTenant(tenant); err != nil {
		return nil, err
	}
	if err := p.checkDir(); err != nil {
		return nil, err
	}
	return p.revoked(tenant)
}

// revoked returns a *RevokedError if the tenant's marker exists.
func (p *LocalProvider) revoked(tenant string) (*RevokedError, error) {
	b, err := readSmall(p.revokedPath(tenant), 4096)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	rerr := &RevokedError{Tenant: tenant}
	if err != nil {
		// A marker we cannot read still means revoked.
		return rerr, nil
	}
	if f := strings.Fields(string(b)); len(f) >= 2 && f[0] == "revoked" {
		if t, err := time.Parse(time.RFC3339Nano, f[1]); err == nil {
			rerr.At = t
		}
	}
	return rerr, nil
}

func readSmall(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, max))
}

func (p *LocalProvider) readKey(tenant string) (Key, error) {
	path := p.keyPath(tenant)
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return Key{}, fmt.Errorf("tenant %s: %w (no %s)", tenant, ErrNoKey, path)
	}
	if errors.Is(err, syscall.ELOOP) {
		return Key{}, fmt.Errorf("crypt: tenant %s: key file %s is a symlink: refused", tenant, path)
	}
	if err != nil {
		return Key{}, fmt.Errorf("crypt: tenant %s: %w", tenant, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Key{}, fmt.Errorf("crypt: tenant %s: %w", tenant, err)
	}
	if err := checkKeyFile(path, fi); err != nil {
		return Key{}, fmt.Errorf("crypt: tenant %s: %w", tenant, err)
	}
	b, err := io.ReadAll(io.LimitReader(f, 1024))
	if err != nil {
		return Key{}, fmt.Errorf("crypt: tenant %s: %w", tenant, err)
	}
	defer clear(b)
	m, err := parseKeyFile(b)
	if err != nil {
		return Key{}, fmt.Errorf("crypt: tenant %s: key file %s: %w", tenant, path, err)
	}
	defer clear(m)
	return NewKey("", m)
}

// checkKeyFile refuses anything but a regular file of ours, mode 0600 or
// stricter.
func checkKeyFile(path string, fi fs.FileInfo) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("key file %s is not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("key file %s is accessible by group or other (mode %v, want 0600): refused", path, perm)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("key file %s is owned by uid %d, not %d: refused", path, st.Uid, os.Geteuid())
	}
	return nil
}

// parseKeyFile decodes 32 bytes from hex or standard base64.
func parseKeyFile(b []byte) ([]byte, error) {
	s := bytes.TrimSpace(b)
	switch len(s) {
	case 2 * KeySize:
		m := make([]byte, KeySize)
		if _, err := hex.Decode(m, s); err == nil {
			return m, nil
		}
	case base64.StdEncoding.EncodedLen(KeySize):
		m := make([]byte, base64.StdEncoding.DecodedLen(len(s)))
		if n, err := base64.StdEncoding.Decode(m, s); err == nil && n == KeySize {
			return m[:n], nil
		}
	}
	return nil, fmt.Errorf("want %d bytes as hex (%d digits) or base64 (%d characters)", KeySize, 2*KeySize, base64.StdEncoding.EncodedLen(KeySize))
}

// Create makes a new random key for a tenant that has none. It refuses
// (ErrKeyExists) if the tenant has a key, and (ErrRevoked) if the
// tenant's key was revoked: use Reinstate for that. The key is written to
// a temporary file, fsynced and linked into place (never replacing an
// existing key), then the directory is fsynced.
func (p *LocalProvider) Create(tenant string) (Key, error) {
	if rerr, err := p.checkTenant(tenant); err != nil {
		return Key{}, err
	} else if rerr != nil {
		return Key{}, fmt.Errorf("crypt: create: %w (Reinstate makes a new key)", rerr)
	}
	return p.create(tenant)
}

func (p *LocalProvider) create(tenant string) (Key, error) {
	if _, err := os.Lstat(p.keyPath(tenant)); err == nil {
		return Key{}, fmt.Errorf("crypt: tenant %s: %w", tenant, ErrKeyExists)
	}
	m := make([]byte, KeySize)
	defer clear(m)
	if _, err := rand.Read(m); err != nil {
		return Key{}, err
	}
	text := make([]byte, 2*KeySize+1)
	defer clear(text)
	hex.Encode(text, m)
	text[2*KeySize] = '\n'

	f, err := os.CreateTemp(p.Dir, "."+tenant+".key.tmp-*")
	if err != nil {
		return Key{}, fmt.Errorf("crypt: create key: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	err = f.Chmod(0o600)
	if err == nil {
		_, err = f.Write(text)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Key{}, fmt.Errorf("crypt: create key: %w", err)
	}
	// Link, unlike rename, never replaces an existing key.
	if err := os.Link(tmp, p.keyPath(tenant)); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return Key{}, fmt.Errorf("crypt: tenant %s: %w", tenant, ErrKeyExists)
		}
		return Key{}, fmt.Errorf("crypt: create key: %w", err)
	}
	os.Remove(tmp)
	if err := atomicfile.SyncDir(p.Dir); err != nil {
		return Key{}, fmt.Errorf("crypt: create key: %w", err)
	}
	return NewKey("", m)
}

// Revoke destroys a tenant's key (crypto-shredding): it overwrites the
// key file with zeros and fsyncs it, writes the .revoked marker with the
// time (temporary file, fsync, rename), removes the key file and fsyncs
// the directory. From then on Key returns a *RevokedError, so nothing
// encrypted under the key can be opened. Revoking a revoked tenant is a
// no-op (or finishes an interrupted Revoke); a tenant with no key gives
// ErrNoKey.
//
// Overwriting in place destroys the bytes on ordinary filesystems; on
// copy-on-write or log-structured filesystems and on flash the old blocks
// may survive until reused, and backups are beyond reach: keep key
// directories out of backups and snapshots.
func (p *LocalProvider) Revoke(tenant string) error {
	rerr, err := p.checkTenant(tenant)
	if err != nil {
		return err
	}
	path := p.keyPath(tenant)
	f, err := os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW|syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		if rerr != nil {
			return nil
		}
		return fmt.Errorf("crypt: revoke: tenant %s: %w", tenant, ErrNoKey)
	}
	var keyID string
	switch {
	case err == nil:
		err = shred(f, &keyID)
		f.Close()
		if err != nil {
			return fmt.Errorf("crypt: revoke: tenant %s: %w", tenant, err)
		}
	case errors.Is(err, syscall.ELOOP):
		// A symlink: do not write through it, but revoke and remove it.
	default:
		return fmt.Errorf("crypt: revoke: %w", err)
	}
	if rerr == nil {
		if err := p.writeMarker(tenant, keyID); err != nil {
			return err
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("crypt: revoke: %w", err)
	}
	return atomicfile.SyncDir(p.Dir)
}

// shred records the key's ID (if the file parses) and overwrites the
// file's bytes with zeros, fsyncing them.
func shred(f *os.File, keyID *string) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return nil
	}
	size := fi.Size()
	if size <= 1024 {
		b := make([]byte, size)
		if _, err := io.ReadFull(f, b); err == nil {
			if m, err := parseKeyFile(b); err == nil {
				*keyID = Fingerprint(m)
				clear(m)
			}
		}
		clear(b)
	}
	zero := make([]byte, 4096)
	for off := int64(0); off < size; off += int64(len(zero)) {
		n := min(int64(len(zero)), size-off)
		if _, err := f.WriteAt(zero[:n], off); err != nil {
			return err
		}
	}
	return f.Sync()
}

func (p *LocalProvider) writeMarker(tenant, keyID string) error {
	text := "revoked " + p.now().UTC().Format(time.RFC3339Nano)
	if keyID != "" {
		text += " key " + keyID
	}
	text += "\n"
	if err := atomicfile.Write(p.revokedPath(tenant), []byte(text), 0o600); err != nil {
		return fmt.Errorf("crypt: revoke: %w", err)
	}
	return nil
}

// Reinstate lifts a revocation and creates a fresh key for the tenant,
// with a new ID: files encrypted under the revoked key stay unreadable.
// It refuses a tenant that is not revoked.
func (p *LocalProvider) Reinstate(tenant string) (Key, error) {
	rerr, err := p.checkTenant(tenant)
	if err != nil {
		return Key{}, err
	}
	if rerr == nil {
		return Key{}, fmt.Errorf("crypt: reinstate: tenant %s is not revoked", tenant)
	}
	// Finish an interrupted Revoke before lifting the marker.
	if _, err := os.Lstat(p.keyPath(tenant)); err == nil {
		if err := p.Revoke(tenant); err != nil {
			return Key{}, err
		}
	}
	if err := os.Remove(p.revokedPath(tenant)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Key{}, fmt.Errorf("crypt: reinstate: %w", err)
	}
	if err := atomicfile.SyncDir(p.Dir); err != nil {
		return Key{}, fmt.Errorf("crypt: reinstate: %w", err)
	}
	return p.create(tenant)
}
