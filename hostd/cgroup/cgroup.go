// Package cgroup puts a sandbox's VMM process in a cgroup of its own with
// memory and CPU limits, on cgroup v2 (memory.max, cpu.max) or on v1's
// memory and cpu controllers (memory.limit_in_bytes, cpu.cfs_quota_us /
// cpu.cfs_period_us), whichever the host mounts.
package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Limits are one group's limits; zero means unlimited.
type Limits struct {
	MemoryBytes int64
	// CPUs is the CPU bandwidth in CPUs (1.5 = 150 ms per 100 ms).
	CPUs float64
}

// period is the CFS period used for CPU limits, in µs.
const period = 100000

// Manager creates groups under a parent group named by the daemon.
type Manager struct {
	// Version is 1 or 2.
	Version int
	// v2: the parent directory; v1: memory and cpu parent directories.
	v2Dir          string
	memDir, cpuDir string
}

// Detect finds a usable hierarchy under root (normally /sys/fs/cgroup)
// and makes the parent group parent in it. It fails when there is none
// (no cgroupfs, no permission): the caller then runs without cgroups.
func Detect(root, parent string) (*Manager, error) {
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		dir := filepath.Join(root, parent)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup v2: %w", err)
		}
		// Delegate memory and cpu to the parent's children.
		for _, d := range []string{root, dir} {
			if err := os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte("+memory +cpu"), 0); err != nil {
				return nil, fmt.Errorf("cgroup v2: enable memory and cpu in %s: %w", d, err)
			}
		}
		return &Manager{Version: 2, v2Dir: dir}, nil
	}
	mem, cpu := filepath.Join(root, "memory"), filepath.Join(root, "cpu")
	for _, c := range []struct{ dir, file string }{{mem, "memory.limit_in_bytes"}, {cpu, "cpu.cfs_quota_us"}} {
		if _, err := os.Stat(filepath.Join(c.dir, c.file)); err != nil {
			return nil, fmt.Errorf("cgroup: neither v2 at %s nor v1 memory and cpu controllers: %w", root, err)
		}
	}
	m := &Manager{Version: 1, memDir: filepath.Join(mem, parent), cpuDir: filepath.Join(cpu, parent)}
	for _, d := range []string{m.memDir, m.cpuDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup v1: %w", err)
		}
	}
	return m, nil
}

// Roots are the parent group's directories, one per hierarchy: every
// group the manager makes is named directly under each.
func (m *Manager) Roots() []string {
	if m.Version == 2 {
		return []string{m.v2Dir}
	}
	return []string{m.memDir, m.cpuDir}
}

// Group is one sandbox's cgroup (one directory per hierarchy).
type Group struct {
	Dirs    []string
	version int
}

// Open returns the group name without creating it (for one made before a
// daemon restart).
func (m *Manager) Open(name string) *Group {
	if m.Version == 2 {
		return &Group{Dirs: []string{filepath.Join(m.v2Dir, name)}, version: 2}
	}
	return &Group{Dirs: []string{filepath.Join(m.memDir, name), filepath.Join(m.cpuDir, name)}, version: 1}
}

// Create makes the group name with limits l (an existing one is reused
// and its limits set again).
func (m *Manager) Create(name string, l Limits) (*Group, error) {
	if strings.ContainsAny(name, "/.") || name == "" {
		return nil, fmt.Errorf("cgroup: bad name %q", name)
	}
	g := m.Open(name)
	for _, d := range g.Dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup: %w", err)
		}
	}
	if err := g.SetLimits(l); err != nil {
		g.Remove()
		return nil, err
	}
	return g, nil
}

// SetLimits writes l into the group.
func (g *Group) SetLimits(l Limits) error {
	quota := int64(-1)
	if l.CPUs > 0 {
		quota = int64(l.CPUs * period)
	}
	var writes [][2]string
	if g.version == 2 {
		mem, cpu := "max", "max "+strconv.Itoa(period)
		if l.MemoryBytes > 0 {
			mem = strconv.FormatInt(l.MemoryBytes, 10)
		}
		if quota > 0 {
			cpu = fmt.Sprintf("%d %d", quota, period)
		}
		writes = [][2]string{{filepath.Join(g.Dirs[0], "memory.max"), mem}, {filepath.Join(g.Dirs[0], "cpu.max"), cpu}}
	} else {
		mem := "-1"
		if l.MemoryBytes > 0 {
			mem = strconv.FormatInt(l.MemoryBytes, 10)
		}
		writes = [][2]string{
			{filepath.Join(g.Dirs[0], "memory.limit_in_bytes"), mem},
			{filepath.Join(g.Dirs[1], "cpu.cfs_period_us"), strconv.Itoa(period)},
			{filepath.Join(g.Dirs[1], "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10)},
		}
	}
	for _, w := range writes {
		if err := os.WriteFile(w[0], []byte(w[1]), 0); err != nil {
			return fmt.Errorf("cgroup: %w", err)
		}
	}
	return nil
}

// ReadLimits reads the group's limits back.
func (g *Group) ReadLimits() (Limits, error) {
	var l Limits
	read := func(p string) (string, error) {
		b, err := os.ReadFile(p)
		return strings.TrimSpace(string(b)), err
	}
	if g.version == 2 {
		mem, err := read(filepath.Join(g.Dirs[0], "memory.max"))
		if err != nil {
			return l, err
		}
		if mem != "max" {
			l.MemoryBytes, _ = strconv.ParseInt(mem, 10, 64)
		}
		cpu, err := read(filepath.Join(g.Dirs[0], "cpu.max"))
		if err != nil {
			return l, err
		}
		if f := strings.Fields(cpu); len(f) == 2 && f[0] != "max" {
			q, _ := strconv.ParseFloat(f[0], 64)
			p, _ := strconv.ParseFloat(f[1], 64)
			if p > 0 {
				l.CPUs = q / p
			}
		}
		return l, nil
	}
	mem, err := read(filepath.Join(g.Dirs[0], "memory.limit_in_bytes"))
	if err != nil {
		return l, err
	}
	if v, _ := strconv.ParseInt(mem, 10, 64); v > 0 && v < 1<<62 {
		l.MemoryBytes = v
	}
	q, err := read(filepath.Join(g.Dirs[1], "cpu.cfs_quota_us"))
	if err != nil {
		return l, err
	}
	p, err := read(filepath.Join(g.Dirs[1], "cpu.cfs_period_us"))
	if err != nil {
		return l, err
	}
	qv, _ := strconv.ParseFloat(q, 64)
	pv, _ := strconv.ParseFloat(p, 64)
	if qv > 0 && pv > 0 {
		l.CPUs = qv / pv
	}
	return l, nil
}

// Add moves the process pid (all its threads) into the group.
func (g *Group) Add(pid int) error {
	for _, d := range g.Dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("cgroup: add %d to %s: %w", pid, d, err)
		}
	}
	return nil
}

// JoinSelf moves the calling process (all its threads) into the groups
// dirs: what a process that starts a VMM does first, so that the VMM is
// born inside its group (warren jail-init --cgroup).
func JoinSelf(dirs []string) error {
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte("0"), 0); err != nil {
			return fmt.Errorf("cgroup: join %s: %w", d, err)
		}
	}
	return nil
}

// Procs lists the group's processes (in its first hierarchy).
func (g *Group) Procs() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(g.Dirs[0], "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			pids = append(pids, p)
		}
	}
	return pids, nil
}

// Remove deletes the group's directories; a group still holding a process
// cannot be removed (rmdir answers EBUSY), so it retries for a moment,
// for a process just killed.
func (g *Group) Remove() error {
	var errs []error
	for _, d := range g.Dirs {
		var err error
		for range 20 {
			if err = os.Remove(d); err == nil || errors.Is(err, os.ErrNotExist) {
				err = nil
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
