package vmmproc

import (
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestRunOptionsRoundTrip(t *testing.T) {
	mac, _ := net.ParseMAC("52:54:00:12:34:56")
	o := vmOptions{memMiB: 512, cpus: 2, rng: true, disks: []diskSpec{{path: "/data/a.img"}, {path: "/data/b.img", readOnly: true}},
		tap: "tap0", mac: mac, vsock: "/run/box.sock", cid: 7}
	raw, err := recordOptions(o)
	if err != nil {
		t.Fatal(err)
	}
	var back vmOptions
	if err := applyOptions(&back, raw); err != nil {
		t.Fatal(err)
	}
	want := vmOptions{memMiB: 512, cpus: 2, rng: true, disks: o.disks, tap: "tap0", mac: mac, vsock: "/run/box.sock", cid: 7}
	if !reflect.DeepEqual(back, want) {
		t.Errorf("options %s came back as %+v, want %+v", raw, back, want)
	}
}

// TestSnapshotVerbsRefuse checks the snapshot verbs' usage errors and that
// `warren restore` refuses a damaged snapshot, saying why, before it needs
// KVM.
func TestSnapshotVerbsRefuse(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad+".wstate", []byte("not a state file"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"snapshot", "api.sock"}, 2, "usage"},
		{[]string{"snapshot", "api.sock", dir + "/.hidden"}, 2, "not DIR/NAME"},
		{[]string{"pause"}, 2, "usage"},
		{[]string{"pause", filepath.Join(dir, "none.sock")}, 1, "control API"},
		{[]string{"restore"}, 2, "usage"},
		{[]string{"restore", "--kvm", "/nonexistent", bad}, 1, "corrupt"},
		{[]string{"restore", "--kvm", "/nonexistent", filepath.Join(dir, "missing")}, 1, "no such file"},
		{[]string{"compact", bad}, 2, "usage"},
		{[]string{"compact", bad, filepath.Join(dir, "new")}, 1, "corrupt"},
	}
	for _, c := range cases {
		code, _, errOut := cli(t, nil, c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("warren %s: exit %d, stderr %q; want %d and %q", strings.Join(c.args, " "), code, errOut, c.code, c.want)
		}
	}
}
