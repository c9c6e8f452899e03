package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// statLine builds a task stat line with comm and guest_time (field 43).
func statLine(tid int, comm string, guest uint64) string {
	f := make([]string, 50) // fields 3..52
	for i := range f {
		f[i] = "0"
	}
	f[0] = "S"
	f[40] = fmt.Sprint(guest)
	return fmt.Sprintf("%d (%s) %s\n", tid, comm, strings.Join(f, " "))
}

func TestParseTaskStat(t *testing.T) {
	for _, tc := range []struct {
		line  string
		comm  string
		guest uint64
		err   bool
	}{
		{statLine(7, "warren", 0), "warren", 0, false},
		{statLine(8, "CPU 0/KVM", 12), "CPU 0/KVM", 12, false},
		{statLine(9, "a (b) c", 3), "a (b) c", 3, false},
		{"9 (x) S 1 2 3", "x", 0, true},
		{"garbage", "", 0, true},
	} {
		comm, guest, err := parseTaskStat(strings.TrimSpace(tc.line))
		if (err != nil) != tc.err || (!tc.err && (comm != tc.comm || guest != tc.guest)) {
			t.Errorf("%q: got %q %d %v", tc.line, comm, guest, err)
		}
	}
}

func TestIsVCPU(t *testing.T) {
	for _, tc := range []struct {
		comm  string
		guest uint64
		want  bool
	}{
		{"warren", 0, false}, {"warren", 5, true}, {"CPU 0/KVM", 0, true}, {"CPU 12/KVM", 0, true},
		{"qemu-system-x86", 0, false}, {"vhost-123", 0, false}, {"CPU x/KVM", 0, false},
	} {
		if got := isVCPU(tc.comm, tc.guest); got != tc.want {
			t.Errorf("%q guest %d: got %v", tc.comm, tc.guest, got)
		}
	}
}

// fakeTask writes dir/stat and dir/schedstat.
func fakeTask(t *testing.T, dir string, tid int, comm string, guest, runtime uint64) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "stat"), []byte(statLine(tid, comm, guest)), 0o644)
	os.WriteFile(filepath.Join(dir, "schedstat"), []byte(fmt.Sprintf("%d 100 3\n", runtime)), 0o644)
	os.WriteFile(filepath.Join(dir, "comm"), []byte(comm+"\n"), 0o644)
}

func TestThreadsAndVMMCPU(t *testing.T) {
	root := t.TempDir()
	task := func(tid int) string { return filepath.Join(root, "100", "task", fmt.Sprint(tid)) }
	// QEMU-like: main thread, a vCPU, an I/O thread; vhost worker outside.
	fakeTask(t, task(100), 100, "qemu-system-x86", 0, 1000)
	fakeTask(t, task(101), 101, "CPU 0/KVM", 0, 5000)
	fakeTask(t, task(102), 102, "warren", 9, 7000) // guest_time makes it a vCPU
	fakeTask(t, filepath.Join(root, "200"), 200, "vhost-100", 0, 300)
	fakeTask(t, filepath.Join(root, "201"), 201, "vhost-999", 0, 300)
	fakeTask(t, filepath.Join(root, "202"), 202, "kworker/0:1", 0, 300)
	p := procfs(root)
	out, err := p.vhostWorkers(100)
	if err != nil || !slices.Equal(out, []int{200}) {
		t.Fatalf("vhostWorkers: %v %v", out, err)
	}
	before, err := p.threads(100, out)
	if err != nil {
		t.Fatal(err)
	}
	if len(before) != 4 || !before[101].VCPU || !before[102].VCPU || before[100].VCPU || !before[200].Outside {
		t.Fatalf("before: %+v", before)
	}
	// The call: everyone runs; a new thread appears.
	fakeTask(t, task(100), 100, "qemu-system-x86", 0, 1500)
	fakeTask(t, task(101), 101, "CPU 0/KVM", 0, 9000)
	fakeTask(t, task(102), 102, "warren", 9, 9000)
	fakeTask(t, task(103), 103, "worker", 0, 40)
	fakeTask(t, filepath.Join(root, "200"), 200, "vhost-100", 0, 500)
	after, err := p.threads(100, out)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := vmmCPU(before, after), uint64(500+40+200); got != want {
		t.Errorf("vmmCPU %d, want %d", got, want)
	}
	// A thread that became a vCPU between the samples is left out too.
	after[100] = thread{Comm: "x", Runtime: 99999, Guest: 1, VCPU: true}
	if got, want := vmmCPU(before, after), uint64(40+200); got != want {
		t.Errorf("vmmCPU with a new vCPU %d, want %d", got, want)
	}
}
