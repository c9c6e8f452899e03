//go:build linux && amd64

package jail

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// lastCap is the highest capability the running kernel knows.
func lastCap() uintptr {
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n >= 0 && n < 64 {
			return uintptr(n)
		}
	}
	return unix.CAP_LAST_CAP
}

// CapMask is the 64-bit capability set of keep.
func CapMask(keep []uintptr) uint64 {
	var m uint64
	for _, c := range keep {
		if c < 64 {
			m |= 1 << c
		}
	}
	return m
}

// DropCapabilities leaves the process with the capabilities in keep (say
// unix.CAP_NET_ADMIN) and no others, on every thread (capabilities are per
// thread in Linux, and a Go process runs goroutines on any thread):
//
//  1. every capability not kept leaves the bounding set (PR_CAPBSET_DROP;
//     needs CAP_SETPCAP, so this comes first), so no execve can regain it;
//  2. the ambient set is cleared;
//  3. capset(2) (v3) sets permitted, effective and inheritable to keep.
//
// Each step runs on all threads with syscall.AllThreadsSyscall, which is
// unavailable in cgo binaries: there DropCapabilities returns an error
// wrapping ENOTSUP and must not be relied on.
func DropCapabilities(keep []uintptr) error {
	mask := CapMask(keep)
	if err := dropBounding(mask); err != nil {
		return err
	}
	return setCaps(mask)
}

// dropBounding removes every capability not in mask from the bounding set
// and clears the ambient set, on all threads. Permitted and effective are
// untouched (dropping from the bounding set needs CAP_SETPCAP effective).
func dropBounding(mask uint64) error {
	for c := uintptr(0); c <= lastCap(); c++ {
		if mask&(1<<c) != 0 {
			continue
		}
		if err := allThreads(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, c, 0); err != nil {
			if err == unix.EINVAL { // capability unknown to this kernel
				continue
			}
			return fmt.Errorf("jail: prctl(PR_CAPBSET_DROP, %d): %w", c, err)
		}
	}
	if err := allThreads(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); err != nil && err != unix.EINVAL {
		return fmt.Errorf("jail: prctl(PR_CAP_AMBIENT_CLEAR_ALL): %w", err)
	}
	return nil
}

// setCaps sets permitted, effective and inheritable to mask on all threads.
// The header's pid 0 means "the calling thread", which is what every
// thread running the AllThreadsSyscall wants.
func setCaps(mask uint64) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	for i := range data {
		v := uint32(mask >> (32 * i))
		data[i] = unix.CapUserData{Effective: v, Permitted: v, Inheritable: v}
	}
	if err := allThreads(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); err != nil {
		return fmt.Errorf("jail: capset: %w", err)
	}
	return nil
}

// SetUser switches every thread to uid and gid with the supplementary
// groups given, none by default (setgroups, setresgid, setresuid, in that order, each with
// syscall.AllThreadsSyscall). Leaving uid 0 clears the permitted and
// effective capabilities (the kernel does it; SECBIT_KEEP_CAPS is not
// set), so call it after anything that needs privileges, and before the
// seccomp filter (ProfileStrict refuses setresuid).
func SetUser(uid, gid int, groups ...int) error {
	gs := make([]uint32, len(groups)+1) // never empty: its address is passed
	for i, g := range groups {
		gs[i] = uint32(g)
	}
	err := allThreads(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(unsafe.Pointer(&gs[0])), 0)
	runtime.KeepAlive(gs)
	if err != nil {
		return fmt.Errorf("jail: setgroups: %w", err)
	}
	if err := allThreads(unix.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)); err != nil {
		return fmt.Errorf("jail: setresgid(%d): %w", gid, err)
	}
	if err := allThreads(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); err != nil {
		return fmt.Errorf("jail: setresuid(%d): %w", uid, err)
	}
	return nil
}

// raiseAmbient adds the capabilities of mask (which must be permitted and
// inheritable) to the ambient set on all threads: a process that is not
// root keeps its ambient capabilities across execve.
func raiseAmbient(mask uint64) error {
	for c := uintptr(0); c < 64; c++ {
		if mask&(1<<c) == 0 {
			continue
		}
		if err := allThreads(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, c); err != nil {
			return fmt.Errorf("jail: prctl(PR_CAP_AMBIENT_RAISE, %d): %w", c, err)
		}
	}
	return nil
}

// BPFNeedsCap reports whether bpf(2) on a map's or a program's descriptor
// needs CAP_BPF here: before Linux 6.5 every bpf(2) command is refused
// without it while kernel.unprivileged_bpf_disabled is set (Debian's and
// most distributions' default); from 6.5 on, only creating maps and
// loading programs are.
func BPFNeedsCap() bool {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return true
	}
	major, minor, ok := kernelVersion(unix.ByteSliceToString(u.Release[:]))
	if ok && (major > 6 || major == 6 && minor >= 5) {
		return false
	}
	b, err := os.ReadFile("/proc/sys/kernel/unprivileged_bpf_disabled")
	return err != nil || strings.TrimSpace(string(b)) != "0"
}

// kernelVersion parses the major and minor numbers of a kernel release
// ("6.1.0-27-amd64").
func kernelVersion(release string) (major, minor int, ok bool) {
	f := strings.SplitN(release, ".", 3)
	if len(f) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(f[0])
	minorStr := f[1]
	if i := strings.IndexFunc(minorStr, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minorStr = minorStr[:i]
	}
	minor, err2 := strconv.Atoi(minorStr)
	return major, minor, err1 == nil && err2 == nil
}
