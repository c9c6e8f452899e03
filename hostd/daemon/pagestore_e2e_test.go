package daemon

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/hostd/pagestore"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/memsnap"
)

// TestE2EPageStore drives real VMs through the daemon with the page
// store: two sandboxes of one template take snapshots (full, then
// incremental); all but each one's newest layer go into the store, whose
// statistics show chunks shared; a rollback to a snapshot in the store
// brings the guest's file back; a corrupt chunk makes a rollback fail
// with 409 while the guest runs on; a pause to disk and resume restores
// from the store; deleting the sandboxes frees every chunk. Jailed and
// confined VMMs, a tenant without a key (TestE2E covers one with a key:
// its pause to disk, rolling snapshots and rollback go through the
// store too). Needs what TestE2E needs.
func TestE2EPageStore(t *testing.T) {
	warren, kernel, initrd := e2ePaths(t)
	state, step := e2eState(t, "hostd-pagestore-")
	launcher := &ExecLauncher{Warren: warren}
	var err error
	if launcher.Prepare, err = JailPrepare("vmm"); err != nil {
		t.Fatal(err)
	}
	uids, err := ParseUIDRange(DefaultUIDRange)
	if err != nil {
		t.Fatal(err)
	}
	td := startDaemon(t, state, launcher, func(c *Config) {
		c.VMMUIDs = uids
		c.CgroupRoot = ""
		c.MonitorInterval = 500 * time.Millisecond
		c.BootTimeout, c.RestoreTimeout = 4*time.Minute, 2*time.Minute
		c.Log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	a := td.client(t, "tenant-p")
	var all []store.Sandbox
	defer func() {
		for _, sb := range all {
			stopProc(sb.PID, sb.StartTime, time.Second)
		}
	}()
	var tp store.Template
	a.ok(201, "POST", "/v1/templates", map[string]any{"kernel": kernel, "initramfs": initrd, "mem_mib": 256, "cpus": 1}, &tp)
	step("template %s ready in %.0f ms", tp.ID, tp.BuildMS)
	// Its layer is in the store (templatepages.go), beside its cache.
	var ss wire.StoreStats
	a.ok(200, "GET", "/v1/store", nil, &ss)
	if len(ss.Namespaces) != 1 || ss.Namespaces[0].Refs != 1 || ss.Namespaces[0].Caches != 1 || ss.Namespaces[0].Layers != 0 {
		t.Fatalf("store after the template's build: %+v", ss)
	}
	tplChunks := ss.Namespaces[0].Chunks
	step("template's layer in the store: %d chunks, %d bytes; its cache %d bytes", tplChunks, ss.Namespaces[0].ChunkBytes, ss.CacheBytes)

	snapshot := func(id, name string, incremental bool) store.Snapshot {
		var s store.Snapshot
		a.ok(201, "POST", "/v1/sandboxes/"+id+"/snapshots", map[string]any{"name": name, "incremental": incremental}, &s)
		return s
	}
	layerOf := func(sb store.Sandbox, name string) string {
		m, _ := filepath.Glob(filepath.Join(td.store.SandboxDir(sb.Tenant, sb.ID), "snapshots", name+".*"+memsnap.Ext))
		if len(m) != 1 {
			t.Fatalf("%s: snapshot %s has layers %v", sb.ID, name, m)
		}
		return m[0]
	}
	var sbs []store.Sandbox
	for i := range 2 {
		sb := a.create(tp.ID)
		all, sbs = append(all, sb), append(sbs, sb)
		a.exec(sb.ID, "sh", "-c", "echo first > /root/mark")
		snapshot(sb.ID, "s1", false)
		a.exec(sb.ID, "sh", "-c", "echo second > /root/mark")
		snapshot(sb.ID, "s2", true)
		s3 := snapshot(sb.ID, "s3", true)
		if s3.Kind != "incremental" {
			t.Fatalf("%s: third snapshot %s", sb.ID, s3.Kind)
		}
		for name, want := range map[string]bool{"s1": true, "s2": true, "s3": false} {
			if got := pagestore.IsRefFile(layerOf(sb, name)); got != want {
				t.Errorf("sandbox %d: snapshot %s in the store: %v, want %v", i, name, got, want)
			}
		}
	}
	a.ok(200, "GET", "/v1/store", nil, &ss)
	if len(ss.Namespaces) != 1 {
		t.Fatalf("store stats %+v", ss)
	}
	ns := ss.Namespaces[0]
	step("store: %d layers in it, logical %d bytes, %d chunks (%d bytes) for %d chunk references; tenant total logical %d, stored %d",
		ns.Refs, ns.LogicalBytes, ns.Chunks, ns.ChunkBytes, ns.ChunkRefs, ss.LogicalBytes, ss.StoredBytes)
	if ns.Refs != 5 || ns.Chunks >= ns.ChunkRefs || ns.ChunkBytes >= ns.LogicalBytes || ns.Unreferenced != 0 {
		t.Errorf("no sharing in the store: %+v", ns)
	}

	// Rollback to s1, in the store: the guest's file as it was.
	sb := sbs[0]
	a.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/rollback", map[string]any{"snapshot": "s1"}, nil)
	if out, _, _ := a.exec(sb.ID, "cat", "/root/mark"); out != "first\n" {
		t.Fatalf("after rollback to s1: %q", out)
	}
	step("rollback to s1 (rebuilt from the store) ok")
	if ws, _ := filepath.Glob(filepath.Join(td.store.SandboxDir(sb.Tenant, sb.ID), "snapshots", materializedPrefix+"*")); len(ws) != 0 {
		t.Errorf("working copies left: %v", ws)
	}

	// A corrupt chunk: the rollback is refused before the VMM loads
	// anything, and the guest runs on.
	b, _ := os.ReadFile(layerOf(sb, "s2"))
	ref, err := pagestore.ParseRef("s2", b)
	if err != nil {
		t.Fatal(err)
	}
	h := ref.Names[0].String()
	ref.Close()
	chunk := filepath.Join(td.store.PageStoreDir(), sb.Tenant, pagestore.PlainNamespace, "chunks", h[:2], h)
	good, err := os.ReadFile(chunk)
	if err != nil {
		t.Fatal(err)
	}
	bad := append([]byte(nil), good...)
	bad[len(bad)/2] ^= 0x40
	os.WriteFile(chunk, bad, 0o600)
	st, body := a.do("POST", "/v1/sandboxes/"+sb.ID+"/rollback", map[string]any{"snapshot": "s2"})
	if st != 409 || !strings.Contains(string(body), "corrupt") {
		t.Errorf("rollback onto a corrupt chunk: %d %s", st, body)
	}
	if out, _, _ := a.exec(sb.ID, "cat", "/root/mark"); out != "first\n" {
		t.Fatalf("after the refused rollback: %q", out)
	}
	os.WriteFile(chunk, good, 0o600)
	step("rollback onto a corrupt chunk refused (%d), guest runs on", st)

	// Pause to disk and resume: restored from the store.
	other := sbs[1]
	var rec store.Sandbox
	a.ok(200, "POST", "/v1/sandboxes/"+other.ID+"/pause?to_disk=true", nil, &rec)
	if !pagestore.IsRefFile(layerOf(other, rec.Latest().Name)) {
		t.Errorf("the suspend snapshot's layer is not in the store once its VMM stopped")
	}
	a.ok(200, "POST", "/v1/sandboxes/"+other.ID+"/resume", nil, &rec)
	all = append(all, rec)
	if out, _, _ := a.exec(other.ID, "cat", "/root/mark"); out != "second\n" {
		t.Fatalf("after resume from disk: %q", out)
	}
	step("pause to disk and resume from the store ok")

	for _, s := range sbs {
		a.ok(200, "DELETE", "/v1/sandboxes/"+s.ID, nil, nil)
	}
	kvmtest.WaitFor(t, 30*time.Second, "the store swept", func() bool {
		a.ok(200, "GET", "/v1/store", nil, &ss)
		return len(ss.Namespaces) == 1 && ss.Namespaces[0].Chunks == tplChunks
	})
	step("sandboxes deleted: every chunk but the template's freed")

	// The template idle: its cache dropped, and rebuilt from the store by
	// the next create, whose guest runs.
	if n := td.evictTemplateCaches(time.Now().Add(2*time.Hour), time.Hour); n != 1 {
		t.Fatalf("dropped %d template caches, want 1", n)
	}
	sb = a.create(tp.ID)
	all = append(all, sb)
	if out, _, _ := a.exec(sb.ID, "sh", "-c", "echo rebuilt"); out != "rebuilt\n" {
		t.Fatalf("a create from the rebuilt template: %q", out)
	}
	step("template cache dropped and rebuilt from the store by a create; its guest answers")
	a.ok(200, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
	a.ok(200, "DELETE", "/v1/templates/"+tp.ID, nil, nil)
	kvmtest.WaitFor(t, 30*time.Second, "the store swept", func() bool {
		a.ok(200, "GET", "/v1/store", nil, &ss)
		return len(ss.Namespaces) == 1 && ss.Namespaces[0].Chunks == 0
	})
	step("template deleted: every chunk freed")
}
