package cgroup

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"testing"
)

// TestGroupOnHost runs on this host's hierarchy (v1 or v2) as root.
func TestGroupOnHost(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root")
	}
	parent := fmt.Sprintf("warren-test-%d", os.Getpid())
	m, err := Detect("/sys/fs/cgroup", parent)
	if err != nil {
		t.Skipf("skipped: no usable cgroup hierarchy: %v", err)
	}
	defer m.Open("").Remove() // the parent directories
	t.Logf("cgroup v%d", m.Version)
	g, err := m.Create("sb-test", Limits{MemoryBytes: 256 << 20, CPUs: 1.5})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	if err := g.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	l, err := g.ReadLimits()
	if err != nil {
		t.Fatal(err)
	}
	if l.MemoryBytes != 256<<20 || l.CPUs != 1.5 {
		t.Fatalf("limits read back %+v", l)
	}
	pids, err := g.Procs()
	if err != nil || !slices.Contains(pids, cmd.Process.Pid) {
		t.Fatalf("procs %v %v, want %d", pids, err, cmd.Process.Pid)
	}
	for _, d := range g.Dirs {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cmd.Process.Pid))
		t.Logf("%s; /proc/PID/cgroup:\n%s", d, b)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, d := range g.Dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s still there", d)
		}
	}
}
