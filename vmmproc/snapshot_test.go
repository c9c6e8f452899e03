package vmmproc

import (
	"fmt"
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

// TestRunOptionsVersions: run options recorded by the warren before
// versions (version 1: these two were copied from snapshots it took, a
// template with a writable disk and a sandbox's overlay on its base) are
// read as they were; today's carry their version and round-trip; a newer
// version and an unknown field are refused, naming the version.
func TestRunOptionsVersions(t *testing.T) {
	for _, c := range []struct {
		raw  string
		want vmOptions
	}{
		{`{"mem_mib":256,"cpus":1,"disks":[{"path":"/tmp/hostd-disks-1774487735/tenants/tenant-d-plain/templates/tp-c7840983dc95/disk0.base"}],"rng":true,"vsock":"/tmp/hostd-disks-1774487735/run/tp-c7840983dc95.vsock","cid":3}`,
			vmOptions{memMiB: 256, cpus: 1, rng: true, cid: 3, vsock: "/tmp/hostd-disks-1774487735/run/tp-c7840983dc95.vsock",
				disks: []diskSpec{{path: "/tmp/hostd-disks-1774487735/tenants/tenant-d-plain/templates/tp-c7840983dc95/disk0.base"}}}},
		{`{"mem_mib":256,"cpus":1,"disks":[{"path":"/tmp/hostd-disks-1774487735/tenants/tenant-d-plain/sandboxes/sb-be57df45cc06/disk0.overlay","name":"/tmp/hostd-disks-1774487735/tenants/tenant-d-plain/templates/tp-c7840983dc95/disk0.base"}],"rng":true,"vsock":"/tmp/hostd-disks-1774487735/run/sb-be57df45cc06.vsock","cid":3}`,
			vmOptions{memMiB: 256, cpus: 1, rng: true, cid: 3, vsock: "/tmp/hostd-disks-1774487735/run/sb-be57df45cc06.vsock",
				disks: []diskSpec{{path: "/tmp/hostd-disks-1774487735/tenants/tenant-d-plain/sandboxes/sb-be57df45cc06/disk0.overlay",
					name: "/tmp/hostd-disks-1774487735/tenants/tenant-d-plain/templates/tp-c7840983dc95/disk0.base"}}}},
	} {
		var o vmOptions
		if err := applyOptions(&o, []byte(c.raw)); err != nil {
			t.Fatalf("version 1 options %s: %v", c.raw, err)
		}
		if !reflect.DeepEqual(o, c.want) {
			t.Errorf("version 1 options %s read as %+v, want %+v", c.raw, o, c.want)
		}
		raw, err := recordOptions(o)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(raw), fmt.Sprintf(`"version":%d`, runOptionsVersion)) {
			t.Errorf("recorded options %s carry no version", raw)
		}
	}
	for _, c := range []struct{ raw, want string }{
		{`{"version":3,"mem_mib":256,"cpus":1}`, "version 3; this warren reads versions 1 to 2"},
		{`{"version":2,"mem_mib":256,"cpus":1,"virtio_mem":true}`, `version 2): json: unknown field "virtio_mem"`},
	} {
		var o vmOptions
		if err := applyOptions(&o, []byte(c.raw)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("options %s: %v, want an error saying %q", c.raw, err, c.want)
		}
	}
	// Version 1 as that warren read it: a field it had dropped (an
	// older egress "policy") is ignored.
	var o vmOptions
	if err := applyOptions(&o, []byte(`{"mem_mib":128,"cpus":1,"egress":{"policy":{},"sandbox":"sb-1"}}`)); err != nil || o.egress == nil || o.egress.Sandbox != "sb-1" {
		t.Errorf("version 1 options with a dropped field: %+v, %v", o.egress, err)
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
		{[]string{"describe"}, 2, "usage"},
		{[]string{"describe", bad}, 1, "corrupt"},
	}
	for _, c := range cases {
		code, _, errOut := cli(t, nil, c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("warren %s: exit %d, stderr %q; want %d and %q", strings.Join(c.args, " "), code, errOut, c.code, c.want)
		}
	}
}
