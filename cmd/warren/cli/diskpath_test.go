package cli

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
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
	if err := replaceDisks(o.disks, diskPaths{0: ov}); err != nil {
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
	d := diskPaths{}
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
