package crypt

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var ctx = context.Background()

func newLocal(t *testing.T) *LocalProvider {
	dir := filepath.Join(t.TempDir(), "keys")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return &LocalProvider{Dir: dir, Now: func() time.Time {
		return time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	}}
}

func TestLocalRevoke(t *testing.T) {
	lp := newLocal(t)
	key, err := lp.Create("acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lp.Create("acme"); !errors.Is(err, ErrKeyExists) {
		t.Fatalf("second Create: %v", err)
	}
	fi, err := os.Stat(filepath.Join(lp.Dir, "acme.key"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi.Mode(), err)
	}
	got, err := lp.Key(ctx, "acme")
	if err != nil || got.ID() != key.ID() || !bytes.Equal(got.material(), key.material()) {
		t.Fatalf("Key: %v %v", got, err)
	}
	keyText, _ := os.ReadFile(filepath.Join(lp.Dir, "acme.key"))

	work := t.TempDir()
	plain := filepath.Join(work, "plain")
	data := randBytes(11, 200000)
	os.WriteFile(plain, data, 0o600)
	enc := filepath.Join(work, "snapshot.wlayer")
	if err := EncryptFile(enc, plain, key); err != nil {
		t.Fatal(err)
	}
	if err := DecryptFile(filepath.Join(work, "out"), enc, lp, "acme"); err != nil {
		t.Fatal(err)
	}
	// A reader opened before revocation keeps working (the daemon holds
	// the key while the sandbox runs); new opens fail.
	before, err := Open(ctx, enc, lp, "acme")
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close()

	// Hold the key file open to see that Revoke overwrote its bytes.
	held, err := os.Open(filepath.Join(lp.Dir, "acme.key"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := lp.Revoke("acme"); err != nil {
		t.Fatal(err)
	}
	shredded, _ := io.ReadAll(held)
	if len(shredded) != len(keyText) || !bytes.Equal(shredded, make([]byte, len(keyText))) {
		t.Fatalf("key file bytes after revoke: %q", shredded)
	}
	if _, err := os.Lstat(filepath.Join(lp.Dir, "acme.key")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("key file still there: %v", err)
	}
	ents, _ := os.ReadDir(lp.Dir)
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(lp.Dir, e.Name()))
		if bytes.Contains(b, bytes.TrimSpace(keyText)) || bytes.Contains(b, key.material()) {
			t.Fatalf("%s holds the key", e.Name())
		}
	}

	_, err = lp.Key(ctx, "acme")
	const msg = "tenant acme: key revoked at 2026-12-01T12:00:00Z: its snapshots and disks can no longer be read"
	if !errors.Is(err, ErrRevoked) || errors.Is(err, ErrNoKey) || err.Error() != msg {
		t.Fatalf("Key after revoke: %v", err)
	}
	_, err = Open(ctx, enc, lp, "acme")
	if !errors.Is(err, ErrRevoked) || err.Error() != "snapshot.wlayer: "+msg {
		t.Fatalf("Open after revoke: %v", err)
	}
	out := filepath.Join(work, "out2")
	if err := DecryptFile(out, enc, lp, "acme"); !errors.Is(err, ErrRevoked) {
		t.Fatalf("DecryptFile after revoke: %v", err)
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("DecryptFile after revoke created its output")
	}
	if b := make([]byte, 10); true {
		if _, err := before.ReadAt(b, 100000); err != nil {
			t.Fatalf("reader opened before revoke: %v", err)
		}
	}

	// Revoked stays revoked: Create refuses, Revoke again is a no-op.
	if _, err := lp.Create("acme"); !errors.Is(err, ErrRevoked) {
		t.Fatalf("Create while revoked: %v", err)
	}
	if err := lp.Revoke("acme"); err != nil {
		t.Fatalf("second Revoke: %v", err)
	}
	// Reinstate makes a new key that does not open the old files.
	if _, err := lp.Reinstate("other"); err == nil {
		t.Fatal("Reinstate of a tenant that was never revoked")
	}
	nk, err := lp.Reinstate("acme")
	if err != nil {
		t.Fatal(err)
	}
	if nk.ID() == key.ID() {
		t.Fatal("reinstated key has the old ID")
	}
	if _, err := Open(ctx, enc, lp, "acme"); !errors.Is(err, ErrWrongKey) {
		t.Fatalf("old file under the new key: %v", err)
	}
	if err := EncryptFile(enc, plain, nk); err != nil {
		t.Fatal(err)
	}
	if err := DecryptFile(out, enc, lp, "acme"); err != nil {
		t.Fatal(err)
	}

	if err := lp.Revoke("nobody"); !errors.Is(err, ErrNoKey) {
		t.Fatalf("Revoke without key: %v", err)
	}
	if _, err := lp.Key(ctx, "nobody"); !errors.Is(err, ErrNoKey) || errors.Is(err, ErrRevoked) {
		t.Fatalf("Key without key: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := lp.Key(cctx, "acme"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

// TestLocalRevokeInterrupted: a crash after the marker but before the key
// file's removal still reads as revoked, and Revoke finishes the job.
func TestLocalRevokeInterrupted(t *testing.T) {
	lp := newLocal(t)
	if _, err := lp.Create("acme"); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(lp.Dir, "acme.revoked"), []byte("revoked 2026-12-01T12:00:00Z\n"), 0o600)
	if _, err := lp.Key(ctx, "acme"); !errors.Is(err, ErrRevoked) {
		t.Fatalf("Key: %v", err)
	}
	if err := lp.Revoke("acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(lp.Dir, "acme.key")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("key file survived")
	}
}

func TestLocalPermissions(t *testing.T) {
	lp := newLocal(t)
	m := randBytes(77, KeySize)
	write := func(text string, mode os.FileMode) {
		t.Helper()
		path := filepath.Join(lp.Dir, "acme.key")
		os.Remove(path)
		if err := os.WriteFile(path, []byte(text), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(path, mode)
	}
	for _, text := range []string{hex.EncodeToString(m), hex.EncodeToString(m) + "\n", strings.ToUpper(hex.EncodeToString(m)), base64.StdEncoding.EncodeToString(m) + "\n"} {
		write(text, 0o600)
		k, err := lp.Key(ctx, "acme")
		if err != nil || !bytes.Equal(k.material(), m) || k.ID() != Fingerprint(m) {
			t.Fatalf("%q: %v", text, err)
		}
	}
	write(hex.EncodeToString(m), 0o400)
	if _, err := lp.Key(ctx, "acme"); err != nil {
		t.Fatalf("mode 0400: %v", err)
	}
	for _, mode := range []os.FileMode{0o640, 0o604, 0o644, 0o660, 0o606} {
		write(hex.EncodeToString(m), mode)
		if _, err := lp.Key(ctx, "acme"); err == nil || !strings.Contains(err.Error(), "group or other") {
			t.Fatalf("mode %v accepted: %v", mode, err)
		}
	}
	for _, text := range []string{"", "00", hex.EncodeToString(m)[:62], hex.EncodeToString(append(m, 1)), strings.Repeat("zz", 32), base64.StdEncoding.EncodeToString(m[:31])} {
		write(text, 0o600)
		if _, err := lp.Key(ctx, "acme"); err == nil {
			t.Fatalf("key text %q accepted", text)
		}
	}
	// Symlink to a good key file.
	target := filepath.Join(t.TempDir(), "real.key")
	os.WriteFile(target, []byte(hex.EncodeToString(m)), 0o600)
	os.Remove(filepath.Join(lp.Dir, "acme.key"))
	if err := os.Symlink(target, filepath.Join(lp.Dir, "acme.key")); err != nil {
		t.Fatal(err)
	}
	if _, err := lp.Key(ctx, "acme"); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Fatalf("symlink: %v", err)
	}
	// Revoking it removes the link and leaves the target alone.
	if err := lp.Revoke("acme"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(target); string(b) != hex.EncodeToString(m) {
		t.Fatal("revoke wrote through a symlink")
	}
	// A directory named like a key.
	os.Mkdir(filepath.Join(lp.Dir, "dirk.key"), 0o700)
	if _, err := lp.Key(ctx, "dirk"); err == nil {
		t.Fatal("directory accepted as key file")
	}

	for _, bad := range []string{"", "Acme", "a_b", "a/b", "../x", "a.b", strings.Repeat("a", 64), "acme\n"} {
		if _, err := lp.Key(ctx, bad); err == nil || !strings.Contains(err.Error(), "invalid tenant") {
			t.Errorf("tenant %q: %v", bad, err)
		}
		if _, err := lp.Create(bad); err == nil {
			t.Errorf("Create(%q) accepted", bad)
		}
		if err := lp.Revoke(bad); err == nil {
			t.Errorf("Revoke(%q) accepted", bad)
		}
	}
	if _, err := lp.Create(strings.Repeat("a", 63)); err != nil {
		t.Errorf("63-char tenant: %v", err)
	}

	// The directory: group-writable or a symlink is refused.
	os.Chmod(lp.Dir, 0o770)
	if _, err := lp.Create("newt"); err == nil {
		t.Error("group-writable key directory accepted")
	}
	os.Chmod(lp.Dir, 0o700)
	link := filepath.Join(t.TempDir(), "keys-link")
	os.Symlink(lp.Dir, link)
	if _, err := (&LocalProvider{Dir: link}).Create("newt"); err == nil {
		t.Error("symlinked key directory accepted")
	}
	if _, err := (&LocalProvider{}).Key(ctx, "acme"); err == nil {
		t.Error("empty Dir accepted")
	}
}

func TestKeyRedaction(t *testing.T) {
	m := randBytes(5, KeySize)
	k, err := NewKey("", m)
	if err != nil {
		t.Fatal(err)
	}
	type holder struct {
		k   Key
		Pub Key
		p   *Key
	}
	h := holder{k: k, Pub: k, p: &k}
	var outs []string
	for _, f := range []string{"%v", "%+v", "%#v", "%s", "%x", "%X", "%q", "%d"} {
		outs = append(outs, fmt.Sprintf(f, k), fmt.Sprintf(f, h), fmt.Sprintf(f, &k), fmt.Sprintf(f, []Key{k}))
	}
	outs = append(outs, fmt.Sprint(k), fmt.Sprintln(h), k.String(), k.GoString())
	var logBuf bytes.Buffer
	slog.New(slog.NewJSONHandler(&logBuf, nil)).Info("key", "key", k, "h", h)
	slog.New(slog.NewTextHandler(&logBuf, nil)).Info("key", "key", k)
	outs = append(outs, logBuf.String())
	js, _ := json.Marshal(h)
	outs = append(outs, string(js))
	forms := []string{hex.EncodeToString(m), strings.ToUpper(hex.EncodeToString(m)), base64.StdEncoding.EncodeToString(m), string(m), fmt.Sprint(m), fmt.Sprintf("%v", m[:4])}
	for _, o := range outs {
		for _, f := range forms {
			if strings.Contains(o, f) {
				t.Fatalf("key material printed: %q", o)
			}
		}
	}
	if !strings.Contains(fmt.Sprint(k), k.ID()) || !strings.Contains(logBuf.String(), k.ID()) {
		t.Errorf("ID not printed: %v / %s", k, logBuf.String())
	}
	if _, err := NewKey("", m[:31]); err == nil {
		t.Error("short key accepted")
	}
	if _, err := NewKey("has space", m); err == nil {
		t.Error("bad key ID accepted")
	}
	if _, err := NewKey(strings.Repeat("x", 65), m); err == nil {
		t.Error("long key ID accepted")
	}
}
