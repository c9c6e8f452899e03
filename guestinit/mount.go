//go:build linux

package guestinit

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// mount is one file system PID 1 mounts.
type mount struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
	mode                   os.FileMode // of the mount point, if PID 1 creates it
	// optional mounts are skipped silently when the kernel lacks the
	// file system (ENODEV) or the mount point's parent.
	optional bool
}

// devMount comes first so that the console can be opened from it.
var devMount = mount{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755", 0o755, false}

// earlyMounts follow devMount, in order, before the command line is read
// (from /proc); they move into an image root with /dev (pseudoMounts).
var earlyMounts = []mount{
	{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", 0o555, false},
	{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", 0o555, false},
}

// initramfsMounts complete the initramfs when the guest stays on it (an
// image root gets imageMounts instead).
var initramfsMounts = []mount{
	{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", 0o1777, false},
	{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620", 0o755, true},
}

// do mounts m. A file system already mounted there (EBUSY) is not an error.
func (m mount) do() error {
	if err := os.Mkdir(m.target, m.mode); err != nil && !errors.Is(err, os.ErrExist) {
		if m.optional {
			return nil
		}
		return fmt.Errorf("mount %s: %w", m.target, err)
	}
	err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data)
	switch {
	case err == nil, err == unix.EBUSY:
		return nil
	case err == unix.ENODEV && m.optional:
		return nil
	}
	return fmt.Errorf("mount %s (%s): %w", m.target, m.fstype, err)
}
