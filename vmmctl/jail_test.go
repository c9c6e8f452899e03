package vmmctl

import (
	"reflect"
	"strings"
	"testing"
)

// TestJailRoundTrip: a Jail encodes to the --jail value ParseJail reads
// back as the same Jail, and values that break the contract are refused
// by both sides with a message naming what is wrong.
func TestJailRoundTrip(t *testing.T) {
	for _, j := range []Jail{
		{},
		{Profile: "strict"},
		{Profile: "vmm", Mode: "log"},
		{Profile: "vmm", Mode: "kill", Root: "/s/jail/sb", Devices: []string{"kvm", "null"}},
		{Profile: "vmm", Root: "/s/jail/sb", Devices: []string{"kvm", "null"}, UID: 1000001, GID: 1000001, Groups: []int{1000000, 999999},
			Binds: []Bind{{Path: "/s/sb", Writable: true}, {Path: "/usr/bin/warren", Exec: true}, {Path: "/sys/module"}}},
	} {
		v, err := j.Encode()
		if err != nil {
			t.Fatalf("%+v: %v", j, err)
		}
		got, err := ParseJail(v)
		if err != nil {
			t.Fatalf("%q: %v", v, err)
		}
		if !reflect.DeepEqual(got, j) {
			t.Errorf("%q: parsed %+v, want %+v", v, got, j)
		}
	}
	for _, c := range []struct {
		j    Jail
		want string
	}{
		{Jail{Profile: "root"}, "profile"},
		{Jail{Profile: "vmm", Mode: "trap"}, "mode"},
		{Jail{Mode: "log"}, "without a profile"},
		{Jail{Profile: "vmm", Root: "relative"}, "root"},
		{Jail{Profile: "vmm", Root: "/a,b"}, "root"},
		{Jail{Profile: "vmm", Devices: []string{"kvm"}}, "need a root"},
		{Jail{Profile: "vmm", Root: "/j", Devices: []string{"mem"}}, "device"},
		{Jail{Profile: "vmm", Root: "/j", Binds: []Bind{{Path: "/a/../etc"}}}, "bind"},
		{Jail{Profile: "vmm", Root: "/j", Binds: []Bind{{Path: "/a:rw"}}}, "bind"},
		{Jail{Profile: "vmm", Root: "/j", Binds: []Bind{{Path: "/"}}}, "bind"},
		{Jail{Profile: "vmm", UID: 5}, "user"},
		{Jail{Profile: "vmm", Groups: []int{5}}, "groups want a user"},
		{Jail{Profile: "vmm", UID: 5, GID: 5, Groups: []int{0}}, "root's"},
		{Jail{Profile: "vmm", UID: 5, GID: 5, Groups: make([]int, MaxJailGroups+1)}, "groups"},
	} {
		if v, err := c.j.Encode(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v encoded as %q (%v), want refused (%s)", c.j, v, err, c.want)
		}
	}
	for _, bad := range []string{
		"off,log", "none,root=/x", "vmm,log,kill", "vmm,root=/a,root=/b", "vmm,user=0:0", "vmm,user=1:1,user=2:2",
		"vmm,groups=5", "vmm,user=1:1,groups=0", "vmm,bind=/x", "vmm,root=/j,bind=/x:ro", "vmm,root=/j,dev=mem",
		"vmm,color=red", "vmm,root=/j,log",
	} {
		if j, err := ParseJail(bad); err == nil {
			t.Errorf("ParseJail(%q) accepted: %+v", bad, j)
		}
	}
}

// TestJailInitArgs: a JailInit encodes its flags, then "--", its program
// and the VMM's own arguments; what breaks the contract is refused.
func TestJailInitArgs(t *testing.T) {
	vmm := Launch{Restore: &Restore{Snapshot: "/s/snap/base", Jail: "vmm"}}
	j := JailInit{ReportFD: 3, PassFDs: 2, NetHelper: true, Spawn: true, CgroupRoots: []string{"/sys/fs/cgroup/warren"},
		Cgroups: []string{"/sys/fs/cgroup/warren/sb"}, Program: "/usr/bin/warren", VMM: vmm}
	got, err := j.Args()
	if err != nil {
		t.Fatal(err)
	}
	want := "jail-init --report-fd 3 --pass-fds 2 --net-helper --spawn --cgroup-root /sys/fs/cgroup/warren --cgroup /sys/fs/cgroup/warren/sb -- /usr/bin/warren restore --jail vmm /s/snap/base"
	if strings.Join(got, " ") != want {
		t.Errorf("args %q\nwant %q", strings.Join(got, " "), want)
	}
	for _, c := range []struct {
		change func(*JailInit)
		want   string
	}{
		{func(j *JailInit) { j.ReportFD = 1 }, "report descriptor"},
		{func(j *JailInit) { j.PassFDs = MaxPassFDs + 1 }, "to pass"},
		{func(j *JailInit) { j.Spawn = false }, "without --spawn"},
		{func(j *JailInit) { j.Cgroups = []string{"rel"} }, "absolute"},
		{func(j *JailInit) { j.Program = "warren" }, "absolute"},
		{func(j *JailInit) { j.VMM = Launch{} }, "exactly one"},
	} {
		bad := j
		c.change(&bad)
		if args, err := bad.Args(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %q, %v; want refused (%s)", bad, args, err, c.want)
		}
	}
}
