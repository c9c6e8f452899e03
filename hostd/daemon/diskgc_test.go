package daemon

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/hostd/crypt"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/internal/kvmtest"
)

// TestCollectDisks builds, with real cow/disk files, a tenant's disks as
// snapshots, forks and rollbacks leave them — a template's base, a
// sandbox's layers referenced by its snapshots, by its last live top, and
// by its fork child's chain, layers nothing references any more, a sealed
// unreferenced layer, a file with no header yet, and a sandbox being
// created — and checks that a sweep deletes exactly the unreferenced layer
// files of sandbox directories, and nothing of the template's, of the
// creating sandbox's, or anything it cannot identify as a layer.
func TestCollectDisks(t *testing.T) {
	state := t.TempDir()
	const tenant = "alice"
	st, err := store.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	tdir := st.TemplateDir(tenant, "tp-000000000001")
	os.MkdirAll(tdir, 0o700)
	base := filepath.Join(tdir, "disk0.base")
	if err := os.WriteFile(base, bytes.Repeat([]byte("base"), 1<<18), 0o400); err != nil {
		t.Fatal(err)
	}
	tplJunk := filepath.Join(tdir, "disk0.18ed0000-00000001.wcow") // unreferenced, but a template's
	layer(t, tplJunk, base)

	sbDir := func(id string) string { d := st.SandboxDir(tenant, id); os.MkdirAll(d, 0o700); return d }
	pa, kid, busy, mute := "sb-00000000000a", "sb-00000000000b", "sb-00000000000c", "sb-00000000000d"
	a := sbDir(pa)
	ov := filepath.Join(a, "disk0.overlay")                  // snapshot s1's layer
	l2 := filepath.Join(a, "disk0.18ed0000-00000002.wcow")   // s2's layer (over ov)
	gone := filepath.Join(a, "disk0.18ed0000-00000003.wcow") // a pruned snapshot's layer
	top := filepath.Join(a, "disk0.18ed0000-00000004.wcow")  // the live top, over l2
	p := filepath.Join(a, "disk0.18ed0000-00000005.wcow")    // frozen by a fork: only the child stands on it
	oldTop := filepath.Join(a, "disk0.18ed0000-00000006.wcow")
	layer(t, ov, base)
	layer(t, l2, ov)
	layer(t, gone, l2)
	layer(t, top, l2)
	layer(t, p, l2)
	layer(t, oldTop, l2)
	headless := filepath.Join(a, "disk0.18ed0000-00000007.wcow") // made, not yet headed by its VMM
	os.WriteFile(headless, make([]byte, 8192), 0o600)
	sealedGone := filepath.Join(a, "disk0.18ed0000-00000008.wcow")
	layer(t, sealedGone, l2)
	keys := &crypt.LocalProvider{Dir: t.TempDir()}
	key, err := keys.Create(tenant)
	if err != nil {
		t.Fatal(err)
	}
	if err := crypt.EncryptSparseFile(sealedGone, sealedGone, key); err != nil {
		t.Fatal(err)
	}
	k := sbDir(kid)
	kidTop := filepath.Join(k, "disk0.18ed0000-00000009.wcow")
	layer(t, kidTop, p)
	kidGone := filepath.Join(k, "disk0.18ed0000-0000000a.wcow")
	layer(t, kidGone, p)
	b := sbDir(busy)
	busyOv := filepath.Join(b, "disk0.overlay") // a create's overlay, not yet recorded
	layer(t, busyOv, base)
	m := sbDir(mute)
	muteOv := filepath.Join(m, "disk0.overlay") // its VMM never said its disks; now stopped
	layer(t, muteOv, base)

	now := time.Now().UTC()
	recs := []*store.Sandbox{
		{ID: pa, Tenant: tenant, Template: "tp-000000000001", Status: store.Suspended, Created: now,
			Snapshots: []store.Snapshot{
				{Name: "s1", Path: filepath.Join(a, "snapshots", "s1"), Disks: []store.DiskLayer{{Index: 0, Layer: ov, Chain: []string{ov, base}}}},
				{Name: "s2", Path: filepath.Join(a, "snapshots", "s2"), Disks: []store.DiskLayer{{Index: 0, Layer: l2, Chain: []string{l2, ov, base}}}},
			},
			Disks: []store.LiveDisk{{Index: 0, Top: top, Chain: []string{l2, ov, base}}}},
		{ID: kid, Tenant: tenant, Template: "tp-000000000001", Status: store.Stopped, Parent: pa, Created: now,
			Disks: []store.LiveDisk{{Index: 0, Top: kidTop, Chain: []string{p, l2, ov, base}}}},
		{ID: busy, Tenant: tenant, Template: "tp-000000000001", Status: store.Creating, Created: now},
		{ID: mute, Tenant: tenant, Template: "tp-000000000001", Status: store.Stopped, Created: now},
	}
	for _, r := range recs {
		if err := st.SaveSandbox(r); err != nil {
			t.Fatal(err)
		}
	}
	// (A daemon marks a record still creating at its start failed: the
	// third one is made creating again once the daemon runs.)
	td := startDaemon(t, state, newFakeLauncher(t))
	s := td.sandbox(tenant, busy)
	s.mu.Lock()
	s.rec.Status = store.Creating
	td.save(s)
	s.mu.Unlock()

	removed := td.collectDisks(tenant)
	want := []string{gone, oldTop, sealedGone, kidGone}
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Errorf("removed %q\nwant    %q", removed, want)
	}
	for _, f := range []string{base, tplJunk, ov, l2, top, p, headless, kidTop, busyOv, muteOv} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("%s was removed: %v", f, err)
		}
	}
	// Once the child is gone, the layer only it stood on goes too; the
	// busy sandbox's directory is kept whole while it is being created.
	c := td.client(t, tenant)
	c.ok(200, "DELETE", "/v1/sandboxes/"+kid, nil, nil)
	kvmtest.WaitFor(t, 10*time.Second, "the fork parent's layer to be collected", func() bool {
		_, err := os.Stat(p)
		return os.IsNotExist(err)
	})
	if removed := td.collectDisks(tenant); len(removed) != 0 {
		t.Errorf("a second sweep removed %q", removed)
	}
	if _, err := os.Stat(busyOv); err != nil {
		t.Errorf("the creating sandbox's overlay was removed: %v", err)
	}
}

// layer makes a cow/disk overlay at path over the image at base.
func layer(t *testing.T, path, base string) {
	t.Helper()
	if err := disk.CreateOn(path, base); err != nil {
		t.Fatal(err)
	}
}
