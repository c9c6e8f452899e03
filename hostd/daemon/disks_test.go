package daemon

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/vmmctl"
)

// TestTemplateWritableDisks: a template's writable disk is cloned into its
// directory, attached writable to the build and frozen after it; each
// sandbox restores the template's snapshot with an overlay of its own over
// that clone (--disk-path), which its later restores do not need and its
// delete removes. A ",ro" disk is copied into the template's directory
// too, read-only, and shared read-only by its sandboxes. The disks are
// files of the guest directory, named by name.
func TestTemplateWritableDisks(t *testing.T) {
	state := t.TempDir()
	f := newFakeLauncher(t)
	data := bytes.Repeat([]byte("warren disk\n"), 300000) // 3.6 MB: both Identity windows differ from zeros
	src := guestDir(t, map[string]string{"rw.img": string(data), "ro.img": string(data)})
	td := startDaemon(t, state, f, func(c *Config) { c.GuestDir = src })
	c := td.client(t, "alice")
	rw := filepath.Join(src, "rw.img")

	var tp store.Template
	c.ok(201, "POST", "/v1/templates", map[string]any{"kernel": fakeKernel(t), "mem_mib": 128, "disks": []string{"rw.img", "ro.img,ro"}}, &tp)
	if tp.Status != store.TemplateReady {
		t.Fatalf("template %+v", tp)
	}
	tdir := filepath.Join(state, "tenants", "alice", "templates", tp.ID)
	base := filepath.Join(tdir, "disk0.base")
	if !reflect.DeepEqual(tp.DiskBases, []string{base, ""}) {
		t.Fatalf("disk bases %q, want [%s \"\"]", tp.DiskBases, base)
	}
	f.mu.Lock()
	run := f.lastRun
	f.mu.Unlock()
	roCopy := filepath.Join(tdir, "disk1.ro")
	if want := []vmmctl.Disk{{Path: base}, {Path: roCopy, ReadOnly: true}}; !reflect.DeepEqual(run.Disks, want) {
		t.Errorf("build disks %+v, want %+v", run.Disks, want)
	}
	if b, err := os.ReadFile(roCopy); err != nil || !bytes.Equal(b, data) {
		t.Errorf("the read-only disk's copy: %v", err)
	}
	if fi, err := os.Stat(roCopy); err != nil || fi.Mode().Perm()&0o222 != 0 {
		t.Errorf("the read-only disk's copy: %v, %v; want read-only", fi.Mode(), err)
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
	want := vmmctl.Restore{Snapshot: tp.Snapshot, Lazy: true, API: sb.API, Vsock: sb.Vsock, Console: sb.Console,
		DiskPaths: map[int]string{0: ov}}
	if got := f.lastRestoreSpec; !reflect.DeepEqual(got, want) {
		t.Errorf("create's restore\n got %+v\nwant %+v", got, want)
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
	o := openReading(t, ov, data)
	if _, err := o.WriteAt([]byte("sandbox"), 0); err != nil {
		t.Errorf("write to the sandbox's overlay: %v", err)
	}
	o.Close()
	if b, _ := os.ReadFile(rw); !bytes.Equal(b, data) {
		t.Error("a write to the sandbox's overlay reached the template's source disk")
	}

	// A resume from disk restores the sandbox's own snapshot: no --disk-path.
	c.suspendResume(sb.ID)
	if got := f.lastRestoreSpec; got.Snapshot == tp.Snapshot || got.DiskPaths != nil {
		t.Errorf("resume from disk: %+v", got)
	}

	c.ok(200, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
	if _, err := os.Stat(ov); !os.IsNotExist(err) {
		t.Errorf("the overlay outlived its sandbox: %v", err)
	}

	// Only ",ro" disks: no base, and creates restore exactly as without disks.
	var rot store.Template
	c.ok(201, "POST", "/v1/templates", map[string]any{"kernel": fakeKernel(t), "mem_mib": 128, "disks": []string{"ro.img,ro"}}, &rot)
	if rot.Status != store.TemplateReady || rot.DiskBases != nil {
		t.Fatalf("template %+v", rot)
	}
	sb2 := c.create(rot.ID)
	want = vmmctl.Restore{Snapshot: rot.Snapshot, Lazy: true, API: sb2.API, Vsock: sb2.Vsock, Console: sb2.Console}
	if got := f.lastRestoreSpec; !reflect.DeepEqual(got, want) {
		t.Errorf("create of a read-only-disk template\n got %+v\nwant %+v", got, want)
	}

	// A bad disk option is refused before anything is built.
	if st, b := c.do("POST", "/v1/templates", map[string]any{"kernel": fakeKernel(t), "disks": []string{"rw.img,rx"}}); st != 400 {
		t.Errorf("disk option rx: %d %s", st, b)
	}
}

// TestDeleteDiskParentRefused: a sandbox with writable disks cannot be
// deleted while its fork children (whose overlays sit on its layers) are
// there; once they are gone it can. A sandbox without writable disks is
// not held back by its children.
func TestDeleteDiskParentRefused(t *testing.T) {
	state := t.TempDir()
	gd := guestDir(t, map[string]string{"rw.img": strings.Repeat("warren disk\n", 300000)})
	td := startDaemon(t, state, newFakeLauncher(t), func(c *Config) { c.GuestDir = gd })
	c := td.client(t, "alice")
	var tp store.Template
	c.ok(201, "POST", "/v1/templates", map[string]any{"kernel": fakeKernel(t), "mem_mib": 128, "disks": []string{"rw.img"}}, &tp)
	sb := c.create(tp.ID)
	fr := c.fork(sb.ID, 1)
	if st, b := c.do("DELETE", "/v1/sandboxes/"+sb.ID, nil); st != 409 || !bytes.Contains(b, []byte(fr.Children[0].ID)) {
		t.Fatalf("delete of a disk parent with a child: %d %s", st, b)
	}
	c.ok(200, "DELETE", "/v1/sandboxes/"+fr.Children[0].ID, nil, nil)
	c.ok(200, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)

	plain := c.create(c.template(fakeKernel(t)).ID)
	c.fork(plain.ID, 1)
	c.ok(200, "DELETE", "/v1/sandboxes/"+plain.ID, nil, nil)
}

// openReading opens the sandbox overlay ov read-write and checks that it
// reads as data, the template's disk.
func openReading(t *testing.T, ov string, data []byte) *disk.Overlay {
	t.Helper()
	o, err := disk.OpenChain(ov, false)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if _, err := o.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the overlay does not read as the template's disk: %v", err)
	}
	return o
}
