package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
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
