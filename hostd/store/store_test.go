package store

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenvm/warren/internal/atomicfile"
)

func TestSaveLoadRestart(t *testing.T) {
	root := t.TempDir()
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	tp := &Template{ID: "tp-0123456789ab", Tenant: "alice", Status: TemplateReady, Kernel: "/k", MemMiB: 256, CPUs: 1}
	sb := &Sandbox{ID: "sb-0123456789ab", Tenant: "alice", Template: tp.ID, Status: Running, PID: 42, StartTime: 7,
		Snapshots: []Snapshot{{Name: "one", Path: "/x/one", Kind: "full"}}}
	other := &Sandbox{ID: "sb-aaaaaaaaaaaa", Tenant: "bob", Status: Paused}
	for _, err := range []error{s.SaveTemplate(tp), s.SaveSandbox(sb), s.SaveSandbox(other)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	sb.Status = Paused
	if err := s.SaveSandbox(sb); err != nil {
		t.Fatal(err)
	}
	// No temporary files are left behind.
	ents, _ := os.ReadDir(s.SandboxDir("alice", sb.ID))
	for _, e := range ents {
		if atomicfile.IsTemp(e.Name()) {
			t.Errorf("leftover %s", e.Name())
		}
	}
	// A half-made directory (no record) and a torn temp file are ignored.
	os.MkdirAll(s.SandboxDir("alice", "sb-bbbbbbbbbbbb"), 0o700)
	os.WriteFile(filepath.Join(s.SandboxDir("alice", "sb-bbbbbbbbbbbb"), ".sandbox.json.tmp-1"), []byte("{"), 0o600)

	// "Restart": a new Store on the same root.
	s2, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	tpls, sbs, errs := s2.Load()
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	if len(tpls) != 1 || tpls[0].ID != tp.ID || tpls[0].MemMiB != 256 {
		t.Fatalf("templates %+v", tpls)
	}
	if len(sbs) != 2 {
		t.Fatalf("sandboxes %+v", sbs)
	}
	for _, x := range sbs {
		if x.ID == sb.ID && (x.Status != Paused || x.PID != 42 || x.StartTime != 7 || x.Latest().Name != "one") {
			t.Fatalf("reloaded %+v", x)
		}
	}
	if err := s2.RemoveSandbox("alice", sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s2.SandboxDir("alice", sb.ID)); !os.IsNotExist(err) {
		t.Fatalf("dir still there: %v", err)
	}
	// A corrupt record is reported, not fatal.
	os.WriteFile(filepath.Join(s2.SandboxDir("bob", other.ID), "sandbox.json"), []byte("{garbage"), 0o600)
	_, sbs, errs = s2.Load()
	if len(errs) != 1 || len(sbs) != 0 {
		t.Fatalf("corrupt: sbs %v errs %v", sbs, errs)
	}
}

func TestValid(t *testing.T) {
	for _, n := range []string{"a", "tenant-1", strings.Repeat("a", 63)} {
		if !ValidTenant(n) {
			t.Errorf("%q refused", n)
		}
	}
	for _, n := range []string{"", "A", "a_b", "../x", strings.Repeat("a", 64)} {
		if ValidTenant(n) {
			t.Errorf("%q accepted", n)
		}
	}
	if !ValidID("sb-0123456789ab") || ValidID("sb-../../etc") {
		t.Error("ValidID")
	}
}

// TestRecordlessSandboxes: a sandbox directory without its record is
// listed; one with a record, readable or not, is not, nor a stray file.
func TestRecordlessSandboxes(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SaveSandbox(&Sandbox{ID: "sb-aaaaaaaaaaaa", Tenant: "alice", Status: Running}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"sb-bbbbbbbbbbbb", "sb-cccccccccccc"} {
		if err := os.MkdirAll(s.SandboxDir("alice", id), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(s.SandboxDir("alice", "sb-cccccccccccc"), sandboxFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(s.SandboxDir("alice", "x")), "stray"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	got := s.RecordlessSandboxes()
	if len(got) != 1 || got[0] != (SandboxRef{"alice", "sb-bbbbbbbbbbbb"}) {
		t.Fatalf("recordless: %v, want [alice sb-bbbbbbbbbbbb]", got)
	}
	if err := s.RemoveSandbox("alice", "sb-bbbbbbbbbbbb"); err != nil {
		t.Fatal(err)
	}
	if got := s.RecordlessSandboxes(); len(got) != 0 {
		t.Fatalf("recordless after the remove: %v", got)
	}
}
