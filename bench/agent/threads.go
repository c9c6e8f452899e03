package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// A VMM's own host CPU time, split from its vCPUs' time, read per thread
// from procfs:
//
//	/proc/PID/task/TID/schedstat  first field: ns the thread ran on a CPU
//	/proc/PID/task/TID/stat       comm (field 2), guest_time (field 43)
//
// schedstat's runtime is exact (ns, from the scheduler's clock), unlike
// the tick-sampled utime/stime, so it resolves single calls of tens of
// microseconds.

// thread is one task of a VMM at one moment.
type thread struct {
	Comm    string `json:"comm"`
	Runtime uint64 `json:"runtime_ns"` // schedstat field 1
	Guest   uint64 `json:"guest_ticks"`
	VCPU    bool   `json:"vcpu"`
	Outside bool   `json:"outside,omitempty"` // a kernel thread outside the process (vhost-PID)
}

// qemuVCPUComm is how QEMU names its vCPU threads ("CPU 0/KVM").
var qemuVCPUComm = regexp.MustCompile(`^CPU \d+/KVM$`)

// isVCPU reports whether a thread runs a vCPU: it has run guest code
// (guest_time > 0; the kernel accounts it to the thread in KVM_RUN) or it
// is named like QEMU's vCPU threads.
func isVCPU(comm string, guestTicks uint64) bool {
	return guestTicks > 0 || qemuVCPUComm.MatchString(comm)
}

// procfs reads threads under a procfs root ("/proc"; tests use a copy).
type procfs string

// parseTaskStat returns comm (field 2) and guest_time (field 43) of a
// /proc/PID/task/TID/stat line. comm may hold spaces and parentheses: it
// runs from the first '(' to the last ')'.
func parseTaskStat(s string) (comm string, guestTicks uint64, err error) {
	i, j := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if i < 0 || j < i {
		return "", 0, fmt.Errorf("malformed stat line %q", s)
	}
	comm = s[i+1 : j]
	f := strings.Fields(s[j+1:]) // f[0] is field 3
	if len(f) < 41 {
		return comm, 0, fmt.Errorf("stat line of %d fields, want 43 or more", len(f)+2)
	}
	guestTicks, err = strconv.ParseUint(f[40], 10, 64)
	if err != nil {
		return comm, 0, fmt.Errorf("stat guest_time: %w", err)
	}
	return comm, guestTicks, nil
}

// parseSchedstat returns the first field of a schedstat line: the ns the
// task ran on a CPU.
func parseSchedstat(s string) (uint64, error) {
	f := strings.Fields(s)
	if len(f) < 1 {
		return 0, fmt.Errorf("empty schedstat")
	}
	return strconv.ParseUint(f[0], 10, 64)
}

// task reads one task directory (…/task/TID).
func (p procfs) task(dir string) (thread, error) {
	st, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return thread{}, err
	}
	comm, guest, err := parseTaskStat(strings.TrimSpace(string(st)))
	if err != nil {
		return thread{}, fmt.Errorf("%s: %w", dir, err)
	}
	ss, err := os.ReadFile(filepath.Join(dir, "schedstat"))
	if err != nil {
		return thread{}, err
	}
	rt, err := parseSchedstat(string(ss))
	if err != nil {
		return thread{}, fmt.Errorf("%s/schedstat: %w", dir, err)
	}
	return thread{Comm: comm, Runtime: rt, Guest: guest, VCPU: isVCPU(comm, guest)}, nil
}

// threads returns the tasks of pid and of the outside kernel threads
// (by pid) keyed by their tid. A task that exits while it is read is left
// out.
func (p procfs) threads(pid int, outside []int) (map[int]thread, error) {
	dir := filepath.Join(string(p), strconv.Itoa(pid), "task")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	m := make(map[int]thread, len(ents)+len(outside))
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		t, err := p.task(filepath.Join(dir, e.Name()))
		if os.IsNotExist(err) {
			continue
		} else if err != nil {
			return nil, err
		}
		m[tid] = t
	}
	for _, k := range outside {
		t, err := p.task(filepath.Join(string(p), strconv.Itoa(k)))
		if err != nil {
			return nil, fmt.Errorf("outside thread %d: %w", k, err)
		}
		t.Outside = true
		m[k] = t
	}
	return m, nil
}

// vmmCPU is the CPU time, in ns, the threads that are not vCPUs (in
// either sample) used between two samples. A thread new in after counts
// from zero; one gone from after (exited) is lost.
func vmmCPU(before, after map[int]thread) uint64 {
	var sum uint64
	for tid, a := range after {
		b, ok := before[tid]
		if a.VCPU || (ok && b.VCPU) {
			continue
		}
		if a.Runtime > b.Runtime {
			sum += a.Runtime - b.Runtime
		}
	}
	return sum
}

// vhostWorkers returns the pids of kernel threads named vhost-<pid>: the
// workers of the vhost devices a QEMU process opened (kernels before 6.4;
// later ones make them threads of the process itself, found by threads).
func (p procfs) vhostWorkers(pid int) ([]int, error) {
	ents, err := os.ReadDir(string(p))
	if err != nil {
		return nil, err
	}
	want := fmt.Sprintf("vhost-%d", pid)
	var out []int
	for _, e := range ents {
		k, err := strconv.Atoi(e.Name())
		if err != nil || k == pid {
			continue
		}
		b, err := os.ReadFile(filepath.Join(string(p), e.Name(), "comm"))
		if err != nil {
			continue
		}
		if strings.TrimSpace(string(b)) == want {
			out = append(out, k)
		}
	}
	return out, nil
}
