package daemon

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/hostd/store"
)

// TestTemplateWritableDisks: a template's writable disk is cloned into its
// directory, attached writable to the build and frozen after it; each
// sandbox restores the template's snapshot with an overlay of its own over
// that clone (--disk-path), which its later restores do not need and its
// delete removes. A ",ro" disk stays shared read-only.
func TestTemplateWritableDisks(t *testing.T) {
	state := t.TempDir()
	f := newFakeLauncher(t)
	td := startDaemon(t, state, f)
	c := td.client(t, "alice")

	src := t.TempDir()
	data := bytes.Repeat([]byte("warren disk\n"), 300000) // 3.6 MB: both Identity windows differ from zeros
	rw, ro := filepath.Join(src, "rw.img"), filepath.Join(src, "ro.img")
	for _, p := range []string{rw, ro} {
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var tp store.Template
	c.ok(201, "POST", "/v1/templates", map[string]any{"kernel": fakeKernel(t), "mem_mib": 128, "disks": []string{rw, ro + ",ro"}}, &tp)
	if tp.Status != store.TemplateReady {
		t.Fatalf("template %+v", tp)
	}
	tdir := filepath.Join(state, "tenants", "alice", "templates", tp.ID)
	base := filepath.Join(tdir, "disk0.base")
	if !reflect.DeepEqual(tp.DiskBases, []string{base, ""}) {
		t.Fatalf("disk bases %q, want [%s \"\"]", tp.DiskBases, base)
	}
	f.mu.Lock()
	run := f.lastRunArgs
	f.mu.Unlock()
	var disks []string
	for i := range run {
		if run[i] == "--disk" && i+1 < len(run) {
			disks = append(disks, run[i+1])
		}
	}
	if want := []string{base, ro + ",ro"}; !reflect.DeepEqual(disks, want) {
		t.Errorf("build disks %q, want %q (in %q)", disks, want, run)
	}
	fi, err := os.Stat(base)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm()&0o222 != 0 {
		t.Errorf("the template's base is %v after the build, want read-only", fi.Mode())
	}
	if b, _ := os.ReadFile(rw); !bytes.Equal(b, data) {
		t.Error("the template's source disk changed")
	}

	sb := c.create(tp.ID)
	sdir := filepath.Join(state, "tenants", "alice", "sandboxes", sb.ID)
	ov := filepath.Join(sdir, "disk0.overlay")
	want := []string{"restore", "--lazy", "--api", sb.API, "--vsock", sb.Vsock, "--console", sb.Console,
		"--disk-path", "0=" + ov, tp.Snapshot}
	if !reflect.DeepEqual(f.lastArgs, want) {
		t.Errorf("create's restore\n got %q\nwant %q", f.lastArgs, want)
	}
	if ok, err := disk.IsOverlay(ov); !ok || err != nil {
		t.Fatalf("%s: overlay %v, %v", ov, ok, err)
	}
	hb := make([]byte, disk.HeaderSize)
	if fh, err := os.Open(ov); err != nil {
		t.Fatal(err)
	} else {
		fh.ReadAt(hb, 0)
		fh.Close()
	}
	if h, err := disk.ParseHeader(hb); err != nil || h.BasePath != base {
		t.Errorf("overlay header %+v, %v; want base %s", h, err, base)
	}
	o, err := disk.OpenChain(ov, false)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if _, err := o.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Errorf("the overlay does not read as the template's disk: %v", err)
	}
	if _, err := o.WriteAt([]byte("sandbox"), 0); err != nil {
		t.Errorf("write to the sandbox's overlay: %v", err)
	}
	o.Close()
	if b, _ := os.ReadFile(rw); !bytes.Equal(b, data) {
		t.Error("a write to the sandbox's overlay reached the template's source disk")
	}

	// A resume from disk restores the sandbox's own snapshot: no --disk-path.
	c.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/pause?to_disk=true", nil, nil)
	c.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/resume", nil, nil)
	if f.lastArgs[len(f.lastArgs)-1] == tp.Snapshot || slices.Contains(f.lastArgs, "--disk-path") {
		t.Errorf("resume from disk: %q", f.lastArgs)
	}

	c.ok(200, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
	if _, err := os.Stat(ov); !os.IsNotExist(err) {
		t.Errorf("the overlay outlived its sandbox: %v", err)
	}

	// Only ",ro" disks: no clone, and creates restore exactly as without disks.
	var rot store.Template
	c.ok(201, "POST", "/v1/templates", map[string]any{"kernel": fakeKernel(t), "mem_mib": 128, "disks": []string{ro + ",ro"}}, &rot)
	if rot.Status != store.TemplateReady || rot.DiskBases != nil {
		t.Fatalf("template %+v", rot)
	}
	sb2 := c.create(rot.ID)
	want = []string{"restore", "--lazy", "--api", sb2.API, "--vsock", sb2.Vsock, "--console", sb2.Console, rot.Snapshot}
	if !reflect.DeepEqual(f.lastArgs, want) {
		t.Errorf("create of a read-only-disk template\n got %q\nwant %q", f.lastArgs, want)
	}

	// A bad disk option is refused before anything is built.
	if st, b := c.do("POST", "/v1/templates", map[string]any{"kernel": fakeKernel(t), "disks": []string{rw + ",rx"}}); st != 400 {
		t.Errorf("disk option rx: %d %s", st, b)
	}
}

// TestDeleteDiskParentRefused: a sandbox with writable disks cannot be
// deleted while its fork children (whose overlays sit on its layers) are
// there; once they are gone it can. A sandbox without writable disks is
// not held back by its children.
func TestDeleteDiskParentRefused(t *testing.T) {
	state := t.TempDir()
	td := startDaemon(t, state, newFakeLauncher(t))
	c := td.client(t, "alice")
	img := filepath.Join(t.TempDir(), "rw.img")
	if err := os.WriteFile(img, bytes.Repeat([]byte("warren disk\n"), 300000), 0o600); err != nil {
		t.Fatal(err)
	}
	var tp store.Template
	c.ok(201, "POST", "/v1/templates", map[string]any{"kernel": fakeKernel(t), "mem_mib": 128, "disks": []string{img}}, &tp)
	sb := c.create(tp.ID)
	var fr struct{ Children []store.Sandbox }
	c.ok(201, "POST", "/v1/sandboxes/"+sb.ID+"/fork", map[string]any{"n": 1}, &fr)
	if st, b := c.do("DELETE", "/v1/sandboxes/"+sb.ID, nil); st != 409 || !bytes.Contains(b, []byte(fr.Children[0].ID)) {
		t.Fatalf("delete of a disk parent with a child: %d %s", st, b)
	}
	c.ok(200, "DELETE", "/v1/sandboxes/"+fr.Children[0].ID, nil, nil)
	c.ok(200, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)

	plain := c.create(c.template(fakeKernel(t)).ID)
	c.ok(201, "POST", "/v1/sandboxes/"+plain.ID+"/fork", map[string]any{"n": 1}, &fr)
	c.ok(200, "DELETE", "/v1/sandboxes/"+plain.ID, nil, nil)
}
