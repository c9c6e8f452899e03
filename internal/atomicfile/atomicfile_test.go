package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestWriteReplaces(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "rec.json")
	if err := Write(p, []byte("one"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := Write(p, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	fi, _ := os.Stat(p)
	if err != nil || string(b) != "two" || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%q %v, mode %v", b, err, fi.Mode())
	}
	noTemps(t, dir)
}

// TestFailedFillKeepsOld: a fill that fails, or an Abort, leaves the old
// file and no temporary file.
func TestFailedFillKeepsOld(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "rec.json")
	Write(p, []byte("old"), 0o600)
	boom := errors.New("boom")
	err := WriteFunc(p, 0o600, func(f *os.File) error {
		f.Write([]byte("half"))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("WriteFunc: %v", err)
	}
	f, err := Create(p, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("abandoned"))
	f.Abort()
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Errorf("the target holds %q after a failed fill and an abort", b)
	}
	noTemps(t, dir)
}

// TestTempNamesAndCrash: until Commit the new contents are only in a
// temporary file that IsTemp recognises (what a crash would leave).
func TestTempNamesAndCrash(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state")
	f, err := Create(p, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("new"))
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || !IsTemp(ents[0].Name()) {
		t.Fatalf("before Commit the directory holds %v, want one temporary file", ents)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("the target exists before Commit: %v", err)
	}
	if err := f.Commit(); err != nil {
		t.Fatal(err)
	}
	f.Abort() // after Commit: nothing to do
	if b, _ := os.ReadFile(p); string(b) != "new" {
		t.Errorf("after Commit: %q", b)
	}
	noTemps(t, dir)
	for name, want := range map[string]bool{".state123": true, ".state": false, "state123": false, ".123": false, "x": false} {
		if IsTemp(name) != want {
			t.Errorf("IsTemp(%q) = %v", name, !want)
		}
	}
}

func TestOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: chown needs root")
	}
	p := filepath.Join(t.TempDir(), "secrets.json")
	if err := Write(p, []byte("{}"), 0o600, Owner(4242)); err != nil {
		t.Fatal(err)
	}
	var st = statUID(t, p)
	if st != 4242 {
		t.Errorf("owner %d, want 4242", st)
	}
}

func noTemps(t *testing.T, dir string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if IsTemp(e.Name()) {
			t.Errorf("temporary file %s left", e.Name())
		}
	}
}
