package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// What a restored VMM had brought in of guest memory when its agent first
// answered, read from /proc while it runs.

// pageSize is the guest and host page size.
const pageSize = 4096

// procFaults returns the page faults of process pid so far, minor plus
// major (/proc/PID/stat fields 10 and 12): every thread's, live or exited,
// which counts the faults KVM takes on guest memory for vCPUs (through
// get_user_pages) as well as the VMM's own (Go heap and stacks, binary).
func procFaults(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatFaults(b)
}

// parseStatFaults reads minflt + majflt from the text of /proc/PID/stat.
// The command name (field 2, in parentheses) may hold spaces and
// parentheses: the fields are counted from after its last ')'.
func parseStatFaults(b []byte) (uint64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc stat %q: no command name", b)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): minflt is field 10, majflt field 12.
	if len(f) < 10 {
		return 0, fmt.Errorf("/proc stat: %d fields after the command name", len(f))
	}
	minflt, err1 := strconv.ParseUint(f[7], 10, 64)
	majflt, err2 := strconv.ParseUint(f[9], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc stat: minflt %q, majflt %q", f[7], f[9])
	}
	return minflt + majflt, nil
}

// guestRAMResident returns the pages of Warren's guest RAM mapping that
// are resident in process pid (/proc/PID/smaps Rss): the memfd
// (warren-guest-ram: eager and uffd restores) or the flattened image
// mapped copy-on-write (a *.wraw file: mmap restores). Each page was
// brought in by a decode (eager), a fault or fault-around (mmap) or an
// install by the fault server (uffd).
func guestRAMResident(pid int) (uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return parseSmapsRAM(f)
}

// parseSmapsRAM sums the Rss of the guest RAM mappings in smaps text, in
// pages.
func parseSmapsRAM(r io.Reader) (uint64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var kib uint64
	in := false
	for sc.Scan() {
		l := sc.Text()
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if !strings.HasSuffix(f[0], ":") { // a mapping's first line: range perms offset dev inode [path]
			path := ""
			if len(f) >= 6 {
				path = strings.Join(f[5:], " ")
			}
			in = isGuestRAM(path)
			continue
		}
		if in && f[0] == "Rss:" && len(f) >= 2 {
			n, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("smaps: Rss %q", f[1])
			}
			kib += n
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return kib * 1024 / pageSize, nil
}

// isGuestRAM reports whether an smaps path is Warren's guest RAM: its
// memfd (guestmem.New names it warren-guest-ram; the kernel shows
// "/memfd:warren-guest-ram (deleted)") or a flattened image (*.wraw).
func isGuestRAM(path string) bool {
	path = strings.TrimSuffix(path, " (deleted)")
	return strings.HasPrefix(path, "/memfd:warren-guest-ram") || strings.HasSuffix(path, ".wraw")
}
