package main

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// kBFields reads "Name:   123 kB" lines (/proc/meminfo,
// /proc/PID/smaps_rollup) into bytes by name; lines of another shape (the
// mapping header of smaps_rollup) are skipped.
func kBFields(r io.Reader) (map[string]uint64, error) {
	out := map[string]uint64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 || len(f) > 2 || (len(f) == 2 && f[1] != "kB") {
			continue
		}
		v, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) == 2 {
			v *= 1024
		}
		out[strings.TrimSpace(name)] = v
	}
	return out, sc.Err()
}

// meminfo is what the density measurement reads of /proc/meminfo, in
// bytes.
type meminfo struct {
	Total, Available uint64
}

func parseMeminfo(r io.Reader) (meminfo, error) {
	f, err := kBFields(r)
	if err != nil {
		return meminfo{}, err
	}
	total, ok1 := f["MemTotal"]
	avail, ok2 := f["MemAvailable"]
	if !ok1 || !ok2 {
		return meminfo{}, fmt.Errorf("meminfo: no MemTotal or MemAvailable")
	}
	return meminfo{Total: total, Available: avail}, nil
}

func readMeminfo() (meminfo, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return meminfo{}, err
	}
	defer f.Close()
	return parseMeminfo(f)
}

// procMem is a process's memory from /proc/PID/smaps_rollup, in bytes.
type procMem struct {
	Rss uint64 `json:"rss_bytes"`
	Pss uint64 `json:"pss_bytes"`
	// Private is Private_Clean + Private_Dirty: pages no other process
	// maps (a page of a shared memory layer only this process has mapped
	// counts too).
	Private uint64 `json:"private_bytes"`
}

func parseSmapsRollup(r io.Reader) (procMem, error) {
	f, err := kBFields(r)
	if err != nil {
		return procMem{}, err
	}
	pss, ok := f["Pss"]
	if !ok {
		return procMem{}, fmt.Errorf("smaps_rollup: no Pss")
	}
	return procMem{Rss: f["Rss"], Pss: pss, Private: f["Private_Clean"] + f["Private_Dirty"]}, nil
}

func readSmapsRollup(pid int) (procMem, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return procMem{}, err
	}
	defer f.Close()
	m, err := parseSmapsRollup(f)
	if err != nil {
		return m, fmt.Errorf("pid %d: %w", pid, err)
	}
	return m, nil
}

// memSplit is a process's memory from /proc/PID/smaps, split between its
// guest's RAM (the mappings of Warren's guest memfds, "warren-guest-*")
// and everything else the VMM process holds (the Go runtime's heap and
// stacks, the binary, the devices' buffers), in bytes.
type memSplit struct {
	GuestPss     uint64 `json:"guest_pss_bytes"`
	GuestPrivate uint64 `json:"guest_private_bytes"`
	VMMPss       uint64 `json:"vmm_pss_bytes"`
	VMMPrivate   uint64 `json:"vmm_private_bytes"`
}

// parseSmapsSplit reads /proc/PID/smaps: a header line per mapping
// ("START-END PERMS OFFSET DEV INODE [PATH]") followed by "Name: N kB"
// lines; each mapping's Pss and Private_* go to the guest's side when its
// path names a Warren guest memfd.
func parseSmapsSplit(r io.Reader) (memSplit, error) {
	var m memSplit
	guest := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			guest = len(f) >= 6 && strings.Contains(strings.Join(f[5:], " "), "warren-guest-")
			continue
		}
		if len(f) != 3 || f[2] != "kB" {
			continue
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		v *= 1024
		switch f[0] {
		case "Pss:":
			if guest {
				m.GuestPss += v
			} else {
				m.VMMPss += v
			}
		case "Private_Clean:", "Private_Dirty:":
			if guest {
				m.GuestPrivate += v
			} else {
				m.VMMPrivate += v
			}
		}
	}
	return m, sc.Err()
}

func readSmapsSplit(pid int) (memSplit, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return memSplit{}, err
	}
	defer f.Close()
	return parseSmapsSplit(f)
}

// cpuTimes is /proc/stat's first line: busy and total jiffies of all CPUs.
type cpuTimes struct{ busy, total uint64 }

func parseCPUTimes(r io.Reader) (cpuTimes, error) {
	sc := bufio.NewScanner(r)
	if !sc.Scan() {
		return cpuTimes{}, fmt.Errorf("/proc/stat: empty")
	}
	f := strings.Fields(sc.Text())
	if len(f) < 5 || f[0] != "cpu" {
		return cpuTimes{}, fmt.Errorf("/proc/stat: first line %q", sc.Text())
	}
	var t cpuTimes
	// user nice system idle iowait irq softirq steal; guest and
	// guest_nice after them are already counted in user and nice.
	for i, s := range f[1:min(len(f), 9)] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return cpuTimes{}, fmt.Errorf("/proc/stat: %q: %w", s, err)
		}
		t.total += v
		if i != 3 && i != 4 { // idle, iowait
			t.busy += v
		}
	}
	return t, nil
}

func readCPUTimes() (cpuTimes, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return cpuTimes{}, err
	}
	defer f.Close()
	return parseCPUTimes(f)
}

// mapPrivate is one mapping of /proc/PID/smaps and its private bytes.
type mapPrivate struct {
	Name    string `json:"name"` // the path, or [heap], [stack], "" for anonymous
	Private uint64 `json:"private_bytes"`
}

// parseTopPrivate returns the n mappings of /proc/PID/smaps holding the
// most private memory, largest first.
func parseTopPrivate(r io.Reader, n int) ([]mapPrivate, error) {
	var all []mapPrivate
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			name := ""
			if len(f) >= 6 {
				name = strings.Join(f[5:], " ")
			}
			all = append(all, mapPrivate{Name: f[0] + " " + f[1] + " " + name})
			continue
		}
		if len(all) == 0 || len(f) != 3 || f[2] != "kB" || (f[0] != "Private_Clean:" && f[0] != "Private_Dirty:") {
			continue
		}
		if v, err := strconv.ParseUint(f[1], 10, 64); err == nil {
			all[len(all)-1].Private += v * 1024
		}
	}
	slices.SortStableFunc(all, func(a, b mapPrivate) int { return cmp.Compare(b.Private, a.Private) })
	return all[:min(n, len(all))], sc.Err()
}

func readTopPrivate(pid, n int) ([]mapPrivate, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseTopPrivate(f, n)
}
