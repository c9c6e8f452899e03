package credproxy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFileStore(t *testing.T) {
	p := filepath.Join(t.TempDir(), "secrets.json")
	if err := os.WriteFile(p, []byte(`{"API_KEY":"sk-one"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	s := FileStore{Path: p}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Secret("API_KEY"); err != nil || v != "sk-one" {
		t.Fatalf("Secret: %q, %v", v, err)
	}
	if _, err := s.Secret("NOPE"); !errors.Is(err, ErrNoSecret) {
		t.Fatalf("missing: %v", err)
	}
	// Rotation: the next lookup reads the new file.
	if err := os.WriteFile(p, []byte(`{"API_KEY":"sk-two-rotated"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Secret("API_KEY"); v != "sk-two-rotated" {
		t.Fatalf("after rotation: %q", v)
	}
}

func TestFileStoreRefusesOpenPermissions(t *testing.T) {
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604, 0o660} {
		p := filepath.Join(t.TempDir(), "secrets.json")
		if err := os.WriteFile(p, []byte(`{"API_KEY":"sk-secret-value"}`), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		_, err := FileStore{Path: p}.Secret("API_KEY")
		if err == nil || !strings.Contains(err.Error(), "group or others") {
			t.Fatalf("mode %#o: %v", mode, err)
		}
		if strings.Contains(err.Error(), "sk-secret-value") {
			t.Fatal("error holds the secret")
		}
	}
}

func TestFileStoreBadJSONDoesNotLeak(t *testing.T) {
	p := filepath.Join(t.TempDir(), "secrets.json")
	os.WriteFile(p, []byte(`{"API_KEY": sk-unquoted-secret}`), 0o600)
	err := FileStore{Path: p}.Check()
	if err == nil || strings.Contains(err.Error(), "sk-unquoted") {
		t.Fatalf("bad JSON: %v", err)
	}
	os.WriteFile(p, []byte(`["x"]`), 0o600)
	if err := (FileStore{Path: p}).Check(); err == nil {
		t.Fatal("array: no error")
	}
	if err := (FileStore{Path: filepath.Dir(p)}).Check(); err == nil {
		t.Fatal("directory: no error")
	}
}

func TestEnvStore(t *testing.T) {
	if got := EnvVar("api-key.v2"); got != "WARREN_SECRET_API_KEY_V2" {
		t.Fatalf("EnvVar: %s", got)
	}
	t.Setenv("WARREN_SECRET_API_KEY", "sk-env")
	if v, err := (EnvStore{}).Secret("api_key"); err != nil || v != "sk-env" {
		t.Fatalf("%q, %v", v, err)
	}
	if _, err := (EnvStore{}).Secret("absent_one"); !errors.Is(err, ErrNoSecret) {
		t.Fatalf("missing: %v", err)
	}
	if _, err := (MapStore{}).Secret("x"); !errors.Is(err, ErrNoSecret) {
		t.Fatalf("MapStore missing: %v", err)
	}
}
