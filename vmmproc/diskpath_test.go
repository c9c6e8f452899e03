package vmmproc

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/memsnap/vmsnap"
)

// TestReplaceDisks checks `warren restore --disk-path`'s rewriting of the
// snapshot's disks: the new image path, the saved-state name kept (the
// original path, or the name a fork child's disk already had) and the
// read-only flag kept; a bad index, a read-only disk and a missing file
// refused.
func TestReplaceDisks(t *testing.T) {
	dir := t.TempDir()
	ov := filepath.Join(dir, "disk0.overlay")
	if err := os.WriteFile(ov, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	snapDisks := func() []diskSpec {
		return []diskSpec{{path: "/tpl/disk0.img"}, {path: "/tpl/ro.img", readOnly: true}, {path: "/p/child.wcow", name: "/tpl/disk2.img"}}
	}
	cases := []struct {
		name  string
		paths map[int]string
		want  []diskSpec
		err   string
	}{
		{"none", nil, snapDisks(), ""},
		{"first", map[int]string{0: ov}, []diskSpec{{path: ov, name: "/tpl/disk0.img"}, snapDisks()[1], snapDisks()[2]}, ""},
		{"named", map[int]string{2: ov}, []diskSpec{snapDisks()[0], snapDisks()[1], {path: ov, name: "/tpl/disk2.img"}}, ""},
		{"index", map[int]string{3: ov}, nil, "the snapshot has 3 disks"},
		{"read-only", map[int]string{1: ov}, nil, "is read-only"},
		{"missing", map[int]string{0: filepath.Join(dir, "none")}, nil, "no such file"},
		{"not a file", map[int]string{0: dir}, nil, "not a regular file"},
	}
	for _, c := range cases {
		disks := snapDisks()
		err := replaceDisks(disks, c.paths)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err %v, want %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
		} else if !reflect.DeepEqual(disks, c.want) {
			t.Errorf("%s: disks %+v, want %+v", c.name, disks, c.want)
		}
	}
}

// TestReplaceDisksRecorded checks that a disk given its own image is
// recorded, in the options of the VM's own snapshots, at that image and
// under its saved-state name: restoring those needs no --disk-path.
func TestReplaceDisksRecorded(t *testing.T) {
	dir := t.TempDir()
	ov := filepath.Join(dir, "disk0.overlay")
	if err := os.WriteFile(ov, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	raw, err := recordOptions(vmOptions{memMiB: 128, cpus: 1, disks: []diskSpec{{path: "/tpl/disk0.img"}, {path: "/tpl/ro.img", readOnly: true}}})
	if err != nil {
		t.Fatal(err)
	}
	var o vmOptions
	if err := applyOptions(&o, raw); err != nil {
		t.Fatal(err)
	}
	if err := replaceDisks(o.disks, DiskPaths{0: ov}); err != nil {
		t.Fatal(err)
	}
	if raw, err = recordOptions(o); err != nil {
		t.Fatal(err)
	}
	var back vmOptions
	if err := applyOptions(&back, raw); err != nil {
		t.Fatal(err)
	}
	want := []diskSpec{{path: ov, name: "/tpl/disk0.img"}, {path: "/tpl/ro.img", readOnly: true}}
	if !reflect.DeepEqual(back.disks, want) {
		t.Errorf("recorded disks %+v, want %+v", back.disks, want)
	}
}

func TestDiskPathsFlag(t *testing.T) {
	d := DiskPaths{}
	for _, v := range []string{"0=/a", "2=/b=c"} {
		if err := d.Set(v); err != nil {
			t.Errorf("Set(%q): %v", v, err)
		}
	}
	if got := d.String(); got != "0=/a 2=/b=c" {
		t.Errorf("String() = %q", got)
	}
	for _, v := range []string{"0=/again", "/a", "x=/a", "-1=/a", "1=", "=/a"} {
		if err := d.Set(v); err == nil {
			t.Errorf("Set(%q) accepted", v)
		}
	}
	// A malformed flag is a usage error, before the snapshot is read.
	code, _, errOut := cli(t, nil, "restore", "--disk-path", "zero=/a", filepath.Join(t.TempDir(), "snap"))
	if code != 2 || !strings.Contains(errOut, "is not I=PATH") {
		t.Errorf("restore --disk-path zero=/a: exit %d, stderr %q", code, errOut)
	}
}

// TestRestoreDisks checks how a restore settles the snapshot's writable
// disks: a version 1 snapshot (no disk state) reopens them as recorded; a
// version 2 one puts each on a new overlay beside its layer (the device
// keeping its saved name), or checks the --disk-path image's chain; a
// snapshot missing a writable disk's layer, or recording one for a
// read-only disk, is refused and leaves no file behind.
func TestRestoreDisks(t *testing.T) {
	dir := t.TempDir()
	layer := filepath.Join(dir, "disk0.img")
	if err := os.WriteFile(layer, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := func() vmOptions {
		return vmOptions{disks: []diskSpec{{path: "/old/disk0.overlay", name: "/tpl/disk0.base"}, {path: "/ro.img", readOnly: true}}}
	}
	l0 := vmsnap.DiskLayer{Index: 0, Layer: layer, Chain: []string{layer}}

	o := opts()
	if _, err := restoreDisks(&o, &vmsnap.Snapshot{Meta: vmsnap.Meta{Version: 1}}, nil); err != nil || !reflect.DeepEqual(o.disks, opts().disks) || o.diskChains != nil {
		t.Errorf("version 1: %v, disks %+v", err, o.disks)
	}

	o = opts()
	undo, err := restoreDisks(&o, &vmsnap.Snapshot{Meta: vmsnap.Meta{Version: 2}, Disks: []vmsnap.DiskLayer{l0}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := o.disks[0]
	if filepath.Dir(d.path) != dir || d.name != "/tpl/disk0.base" || !o.ownDisks[0] || !reflect.DeepEqual(o.diskChains[0], l0.Chain) {
		t.Errorf("version 2: disk %+v, own %v, chain %v", d, o.ownDisks, o.diskChains)
	}
	if ok, err := disk.IsOverlay(d.path); !ok || err != nil {
		t.Errorf("%s is not an overlay: %v", d.path, err)
	}
	undo()
	if _, err := os.Stat(d.path); !os.IsNotExist(err) {
		t.Errorf("undo left %s", d.path)
	}

	// --disk-path: the caller's image is used, its chain checked at open.
	o = opts()
	if _, err := restoreDisks(&o, &vmsnap.Snapshot{Meta: vmsnap.Meta{Version: 2}, Disks: []vmsnap.DiskLayer{l0}}, DiskPaths{0: "/given.wcow"}); err != nil ||
		o.disks[0].path != "/old/disk0.overlay" || !reflect.DeepEqual(o.diskChains[0], l0.Chain) {
		t.Errorf("--disk-path: %v, %+v %v", err, o.disks[0], o.diskChains)
	}

	for name, layers := range map[string][]vmsnap.DiskLayer{
		"missing":   {},
		"read-only": {l0, {Index: 1, Layer: "/ro.img", Chain: []string{"/ro.img"}}},
	} {
		o = opts()
		if _, err := restoreDisks(&o, &vmsnap.Snapshot{Path: "/s/x.wstate", Meta: vmsnap.Meta{Version: 2}, Disks: layers}, nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 1 {
			t.Errorf("%s: a refused restore left files: %v", name, ents)
		}
	}
}
