package vmmproc

import (
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmmctl"
)

// TestLaunchRoundTrip: a vmmctl.Launch, encoded (Launch.Args) and parsed
// by the warren binary's own decoder (ParseRunArgs, ParseRestoreArgs),
// gives back the same Run or Restore, with every flag only a person
// gives at its default.
func TestLaunchRoundTrip(t *testing.T) {
	runs := []vmmctl.Run{
		{KernelFD: 4, MemMiB: 256, CPUs: 1},
		{KernelFD: 4, InitramfsFD: 5, MemMiB: 512, CPUs: 2, Cmdline: "warren.root=/dev/vda quiet",
			Disks: []vmmctl.Disk{{Path: "/s/tp/base-0.raw"}, {Path: "/s/tp/base-1.raw", ReadOnly: true}},
			Vsock: "/s/run/tp.vsock", API: "/s/run/tp.api", Console: "/s/tp/console.log"},
		{KernelFD: 5, MemMiB: 256, CPUs: 1, Vsock: "/v", API: "/a", Console: "/c",
			Tap: "wt0", PrivateNet: true, HostIP: "10.200.0.1/24", GuestIP: "10.200.0.2",
			Egress: "/s/tp/egress-template.json", Audit: "/s/tp/egress.jsonl", Hosts: "/etc/warren/hosts",
			DNSUpstream: "192.0.2.53:53", UpstreamCA: "/etc/warren/ca.pem", UpstreamAllow: "10.0.0.0/8,192.0.2.1",
			WildcardCredentials: true, Jail: "vmm,root=/s/jail/tp,user=100000:100000"},
		{KernelFD: 4, MemMiB: 1024, CPUs: 2, API: "/s/run/tp.api", Balloon: true},
	}
	for _, r := range runs {
		got, args := roundTrip(t, vmmctl.Launch{Run: &r}, r, ParseRunArgs)
		if !reflect.DeepEqual(got.Run, r) {
			t.Errorf("%q:\n got %+v\nwant %+v", args, got.Run, r)
		}
		want := RunArgs{Run: r, LocalArgs: LocalArgs{KVMPath: "/dev/kvm"}, CID: 3, EgressAttach: "auto"}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%q: the person's flags\n got %+v\nwant %+v", args, got, want)
		}
	}
	restores := []vmmctl.Restore{
		{Snapshot: "/s/tp/snap/base"},
		{Snapshot: "/s/tp/snap/base", Lazy: true, API: "/s/run/sb.api", Vsock: "/s/run/sb.vsock", Console: "/s/sb/console.log",
			DiskPaths: map[int]string{0: "/s/sb/overlay-0.wdisk", 2: "/s/sb/overlay-2.wdisk"}},
		{Snapshot: "/tmp/plain/-base", API: "/a", Vsock: "/v", Console: "/c",
			Egress: "/s/sb/egress.json", Secrets: "/s/sb/secrets.json", Audit: "/s/sb/egress.jsonl", Jail: "strict"},
		{Snapshot: "/s/tp/snap/base", LazyMode: vmsnap.Uffd, API: "/s/run/sb.api",
			RecordWorkingSet: "/s/tp/snap/base.wset", Prefetch: "/s/tp/snap/old.wset"},
		{Snapshot: "/s/tp/snap/base", LazyMode: vmsnap.Mmap},
		{Snapshot: "/s/tp/snap/base", LazyMode: vmsnap.Eager},
	}
	for _, r := range restores {
		got, args := roundTrip(t, vmmctl.Launch{Restore: &r}, r, ParseRestoreArgs)
		want := RestoreArgs{Restore: r, LocalArgs: LocalArgs{KVMPath: "/dev/kvm"}}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%q:\n got %+v\nwant %+v", args, got, want)
		}
	}
}

// roundTrip encodes l, whose Run or Restore is v, checks that its verb
// comes first, and decodes the rest with parse; it returns what parse
// gave and the encoding.
func roundTrip[T any](t *testing.T, l vmmctl.Launch, v any, parse func([]string, io.Writer) (T, error)) (T, []string) {
	t.Helper()
	args, err := l.Args()
	if err != nil {
		t.Fatalf("%+v: %v", v, err)
	}
	if verb := l.Verb(); args[0] != verb {
		t.Fatalf("%q: the verb %s is not first", args, verb)
	}
	var stderr strings.Builder
	got, err := parse(args[1:], &stderr)
	if err != nil {
		t.Fatalf("%q: %v (%s)", args, err, stderr.String())
	}
	return got, args
}

// TestLaunchArgsRefused: Launch.Args refuses what the VMM would not read
// as meant: neither or both verbs, a relative path (which could read as a
// flag), a missing kernel, snapshot or size, a disk path with a comma,
// and network or egress settings without what they need.
func TestLaunchArgsRefused(t *testing.T) {
	ok := vmmctl.Run{KernelFD: 4, MemMiB: 256, CPUs: 1}
	run := func(f func(r *vmmctl.Run)) vmmctl.Launch {
		r := ok
		f(&r)
		return vmmctl.Launch{Run: &r}
	}
	restore := func(r vmmctl.Restore) vmmctl.Launch { return vmmctl.Launch{Restore: &r} }
	for name, l := range map[string]vmmctl.Launch{
		"neither":             {},
		"both":                {Run: &ok, Restore: &vmmctl.Restore{Snapshot: "/s"}},
		"no kernel":           run(func(r *vmmctl.Run) { r.KernelFD = 0 }),
		"kernel on stderr":    run(func(r *vmmctl.Run) { r.KernelFD = 2 }),
		"negative initramfs":  run(func(r *vmmctl.Run) { r.InitramfsFD = -1 }),
		"no memory":           run(func(r *vmmctl.Run) { r.MemMiB = 0 }),
		"no vCPU":             run(func(r *vmmctl.Run) { r.CPUs = 0 }),
		"relative api":        run(func(r *vmmctl.Run) { r.API = "run/x.api" }),
		"relative console":    run(func(r *vmmctl.Run) { r.Console = "-v" }),
		"relative disk":       run(func(r *vmmctl.Run) { r.Disks = []vmmctl.Disk{{Path: "a.raw"}} }),
		"disk with a comma":   run(func(r *vmmctl.Run) { r.Disks = []vmmctl.Disk{{Path: "/a,ro"}} }),
		"empty disk":          run(func(r *vmmctl.Run) { r.Disks = []vmmctl.Disk{{}} }),
		"host ip without tap": run(func(r *vmmctl.Run) { r.HostIP = "10.0.0.1/24" }),
		"bad host ip":         run(func(r *vmmctl.Run) { r.Tap, r.HostIP = "t", "10.0.0.1" }),
		"guest ip alone":      run(func(r *vmmctl.Run) { r.Tap, r.GuestIP = "t", "10.0.0.2" }),
		"private net alone":   run(func(r *vmmctl.Run) { r.PrivateNet = true }),
		"egress alone":        run(func(r *vmmctl.Run) { r.Egress = "/p.json" }),
		"audit alone":         run(func(r *vmmctl.Run) { r.Audit = "/a.jsonl" }),
		"no snapshot":         restore(vmmctl.Restore{API: "/a"}),
		"relative snapshot":   restore(vmmctl.Restore{Snapshot: "snap/base"}),
		"relative secrets":    restore(vmmctl.Restore{Snapshot: "/s", Secrets: "secrets.json"}),
		"relative disk path":  restore(vmmctl.Restore{Snapshot: "/s", DiskPaths: map[int]string{0: "o.wdisk"}}),
		"empty disk path":     restore(vmmctl.Restore{Snapshot: "/s", DiskPaths: map[int]string{0: ""}}),
		"negative disk":       restore(vmmctl.Restore{Snapshot: "/s", DiskPaths: map[int]string{-1: "/o"}}),
		"lazy and a mode":     restore(vmmctl.Restore{Snapshot: "/s", Lazy: true, LazyMode: vmsnap.Uffd}),
		"unknown mode":        restore(vmmctl.Restore{Snapshot: "/s", LazyMode: "fast"}),
		"record without uffd": restore(vmmctl.Restore{Snapshot: "/s", Lazy: true, RecordWorkingSet: "/w"}),
		"prefetch eagerly":    restore(vmmctl.Restore{Snapshot: "/s", Prefetch: "/w"}),
		"relative prefetch":   restore(vmmctl.Restore{Snapshot: "/s", LazyMode: vmsnap.Uffd, Prefetch: "w"}),
	} {
		if args, err := l.Args(); err == nil {
			t.Errorf("%s: encoded as %q", name, args)
		}
	}
}

// TestLaunchWithJail: WithJail sets the copy's --jail and leaves the
// original's alone.
func TestLaunchWithJail(t *testing.T) {
	l := vmmctl.Launch{Restore: &vmmctl.Restore{Snapshot: "/s"}}
	j := l.WithJail("vmm")
	if l.Restore.Jail != "" || j.Restore.Jail != "vmm" {
		t.Fatalf("original %q, copy %q", l.Restore.Jail, j.Restore.Jail)
	}
	args, err := j.Args()
	if err != nil || strings.Join(args, " ") != "restore --jail vmm /s" {
		t.Fatalf("%q, %v", args, err)
	}
}

// TestParseArgsRefused: the decoder refuses what `warren run` and `warren
// restore` refuse before they look at a value: unknown flags, stray
// operands, a descriptor below 3, and not exactly one snapshot.
func TestParseArgsRefused(t *testing.T) {
	for _, args := range [][]string{{"--bogus"}, {"extra"}, {"--kernel-fd", "0"}, {"--initramfs-fd", "-1"}, {"--disk", "a,fast"}} {
		if _, err := ParseRunArgs(args, io.Discard); err == nil {
			t.Errorf("run %q accepted", args)
		}
	}
	for _, args := range [][]string{{}, {"/a", "/b"}, {"--bogus", "/a"}, {"--disk-path", "x=/o", "/a"}, {"--disk-path", "0=/o", "--disk-path", "0=/p", "/a"}} {
		if _, err := ParseRestoreArgs(args, io.Discard); err == nil {
			t.Errorf("restore %q accepted", args)
		}
	}
}

func TestDiskFlag(t *testing.T) {
	var d diskFlag
	for _, v := range []string{"a.img", "b.img,ro", "c.img,rw"} {
		if err := d.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	if len(d) != 3 || d[0].ReadOnly || !d[1].ReadOnly || d[2].ReadOnly || d[1].Path != "b.img" {
		t.Fatalf("parsed %+v", d)
	}
	for _, bad := range []string{"", ",ro", "x.img,fast"} {
		if err := d.Set(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestJailInitRoundTrip: a vmmctl.JailInit, encoded and parsed by the
// warren binary's decoder (ParseJailInitArgs), gives back its flags, the
// descriptors to pass by number, and the VMM's command line as encoded.
func TestJailInitRoundTrip(t *testing.T) {
	vmm := vmmctl.Launch{Restore: &vmmctl.Restore{Snapshot: "/s/snap/base", Lazy: true, Jail: "vmm,root=/s/jail/sb"}}
	for _, j := range []vmmctl.JailInit{
		{ReportFD: 3, Program: "/usr/bin/warren", VMM: vmm},
		{ReportFD: 3, PassFDs: 3, NetHelper: true, Spawn: true, CgroupRoots: []string{"/c/cpu/w", "/c/memory/w"},
			Cgroups: []string{"/c/cpu/w/sb", "/c/memory/w/sb"}, Program: "/usr/bin/warren", VMM: vmm},
	} {
		args, err := j.Args()
		if err != nil {
			t.Fatal(err)
		}
		if args[0] != vmmctl.JailInitVerb {
			t.Fatalf("verb %q", args[0])
		}
		a, err := ParseJailInitArgs(args[1:], io.Discard)
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		vmmArgs, _ := j.VMM.Args()
		want := JailInitArgs{InitSpec: InitSpec{ReportFD: j.ReportFD, NetHelper: j.NetHelper, Spawn: j.Spawn,
			CgroupRoots: j.CgroupRoots, Command: append([]string{j.Program}, vmmArgs...)}, Cgroups: j.Cgroups}
		for i := range j.PassFDs {
			want.PassFDs = append(want.PassFDs, 4+i)
		}
		if !reflect.DeepEqual(a, want) {
			t.Errorf("%q:\nparsed %+v\nwant   %+v", args, a, want)
		}
	}
	for _, bad := range [][]string{{"--pass-fds", "65", "--", "/w"}, {"--report-fd", "3"}, {"--bogus", "--", "/w"}} {
		if a, err := ParseJailInitArgs(bad, io.Discard); err == nil {
			t.Errorf("%q accepted: %+v", bad, a)
		}
	}
}

// TestRestoreLazyFlag: --lazy alone is the mmap mode, as it always was;
// --lazy=MODE names a mode; no --lazy is eager; the working-set flags need
// the uffd mode; a mode that does not exist is refused.
func TestRestoreLazyFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want vmsnap.MemoryMode
	}{
		{[]string{"/s/snap"}, vmsnap.Eager},
		{[]string{"--lazy", "/s/snap"}, vmsnap.Mmap},
		{[]string{"--lazy=true", "/s/snap"}, vmsnap.Mmap},
		{[]string{"--lazy=false", "/s/snap"}, vmsnap.Eager},
		{[]string{"--lazy=mmap", "/s/snap"}, vmsnap.Mmap},
		{[]string{"--lazy=eager", "/s/snap"}, vmsnap.Eager},
		{[]string{"--lazy=uffd", "--prefetch", "/w", "--record-working-set", "/r", "/s/snap"}, vmsnap.Uffd},
	} {
		a, err := ParseRestoreArgs(c.args, io.Discard)
		if err != nil {
			t.Errorf("%q: %v", c.args, err)
			continue
		}
		if a.Mode() != c.want {
			t.Errorf("%q: mode %s, want %s", c.args, a.Mode(), c.want)
		}
		s, err := a.Spec(io.Discard, io.Discard)
		if err != nil || s.Memory != c.want {
			t.Errorf("%q: spec memory %s (%v), want %s", c.args, s.Memory, err, c.want)
		}
	}
	for _, args := range [][]string{
		{"--lazy=fast", "/s/snap"},
		{"--lazy", "--prefetch", "/w", "/s/snap"},
		{"--record-working-set", "/w", "/s/snap"},
	} {
		if a, err := ParseRestoreArgs(args, io.Discard); err == nil {
			t.Errorf("%q: parsed as %+v", args, a)
		}
	}
}
