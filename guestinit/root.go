//go:build linux

package guestinit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Command-line keys for the root file system.
const (
	// KeyRoot names the virtio-blk device holding the ext4 file system
	// PID 1 moves into as its root: warren.root=/dev/vda. Without it the
	// guest stays on the initramfs.
	KeyRoot = "warren.root"
	// KeyRootRO, when true, mounts the root read-only.
	KeyRootRO = "warren.root_ro"
)

// RootFSType is the only root file system type PID 1 mounts.
const RootFSType = "ext4"

// newRootDir is where the root is mounted on the initramfs before the
// move.
const newRootDir = "/newroot"

// rootMountData is the root's ext4 mount options (see switchRoot).
const rootMountData = "noinit_itable"

// RootDisk is the root file system the kernel command line asks for.
type RootDisk struct {
	// Device is the block device ("" means stay on the initramfs).
	Device string
	// ReadOnly mounts it read-only (warren.root_ro, or a device the host
	// attached read-only).
	ReadOnly bool
}

// RootDiskFromCmdline reads warren.root and warren.root_ro. The device
// must be a whole virtio-blk disk, /dev/vd followed by one to three
// letters; anything else is an error and the guest stays on the
// initramfs.
func RootDiskFromCmdline(c Cmdline) (RootDisk, error) {
	dev := c.Get(KeyRoot, "")
	if dev == "" {
		return RootDisk{}, nil
	}
	if !validDiskDevice(dev) {
		return RootDisk{}, fmt.Errorf("%s=%q: not a virtio-blk disk (/dev/vda, /dev/vdb, ...)", KeyRoot, dev)
	}
	return RootDisk{Device: dev, ReadOnly: c.Bool(KeyRootRO)}, nil
}

// validDiskDevice accepts /dev/vd followed by one to three lowercase
// letters: the names the virtio-blk driver gives whole disks.
func validDiskDevice(dev string) bool {
	name, ok := strings.CutPrefix(dev, "/dev/vd")
	if !ok || name == "" || len(name) > 3 {
		return false
	}
	for i := 0; i < len(name); i++ {
		if name[i] < 'a' || name[i] > 'z' {
			return false
		}
	}
	return true
}

// deviceReadOnly reports whether the host attached the disk dev read-only
// (VIRTIO_BLK_F_RO: /sys/block/NAME/ro is 1).
func deviceReadOnly(dev string) bool {
	ro, _ := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "ro"))
	return strings.TrimSpace(string(ro)) == "1"
}

// pseudoMounts are the file systems PID 1 mounted on the initramfs that
// move with it into the new root, in order.
var pseudoMounts = []string{"/dev", "/proc", "/sys"}

// switchRoot mounts the root disk and makes it the root of PID 1, with
// switch_root's semantics for an initramfs (pivot_root does not work on
// rootfs): mount the disk at newRootDir, move /dev, /proc and /sys into
// it, move it onto / and chroot there. It reports whether the root is
// mounted read-only.
//
// Unlike switch_root it does not delete the initramfs's files: nearly all
// of its memory is the one u-root binary that PID 1 itself runs from (and
// keeps mapped, so its pages would stay), and deleting the rest costs
// seconds of emulated guest kernel time on a PVM host for a few KiB.
//
// Failures before the move of the disk onto / undo what was done, so the
// guest is still on a working initramfs when it returns an error.
func (r RootDisk) switchRoot() (readOnly bool, err error) {
	fi, err := os.Stat(r.Device)
	if err != nil {
		return false, fmt.Errorf("root %s: %w", r.Device, err)
	}
	if fi.Mode()&os.ModeDevice == 0 || fi.Mode()&os.ModeCharDevice != 0 {
		return false, fmt.Errorf("root %s: not a block device", r.Device)
	}
	readOnly = r.ReadOnly || deviceReadOnly(r.Device)
	// noatime: the root is a copy-on-write overlay of an image whose
	// files all have old times; relatime would write each file's inode on
	// its first read after boot, copying inode table blocks into the
	// sandbox's overlay for nothing. noinit_itable: no background thread
	// zeroing inode tables an image builder left uninitialised (emulated
	// guest kernel time, and writes into the overlay); ext4 knows which
	// are uninitialised without it.
	flags := uintptr(unix.MS_NOATIME)
	if readOnly {
		flags |= unix.MS_RDONLY
	}
	if err := os.Mkdir(newRootDir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return false, fmt.Errorf("root: %w", err)
	}
	if err := unix.Mount(r.Device, newRootDir, RootFSType, flags, rootMountData); err != nil {
		return false, fmt.Errorf("root: mount %s on %s (%s): %w", r.Device, newRootDir, RootFSType, err)
	}
	undo := func() { _ = unix.Unmount(newRootDir, unix.MNT_DETACH) }
	for _, m := range pseudoMounts {
		if err := ensureDir(newRootDir+m, readOnly); err != nil {
			undo()
			return false, fmt.Errorf("root: %w", err)
		}
	}
	for i, m := range pseudoMounts {
		if err := unix.Mount(m, newRootDir+m, "", unix.MS_MOVE, ""); err != nil {
			for _, back := range pseudoMounts[:i] {
				_ = unix.Mount(newRootDir+back, back, "", unix.MS_MOVE, "")
			}
			undo()
			return false, fmt.Errorf("root: move %s: %w", m, err)
		}
	}
	if err := moveOnto(newRootDir); err != nil {
		for _, back := range pseudoMounts {
			_ = unix.Mount(newRootDir+back, back, "", unix.MS_MOVE, "")
		}
		undo()
		return false, fmt.Errorf("root: %w", err)
	}
	return readOnly, nil
}

// moveOnto moves the mount at dir onto / and makes it PID 1's root and
// working directory.
func moveOnto(dir string) error {
	if err := unix.Chdir(dir); err != nil {
		return fmt.Errorf("chdir %s: %w", dir, err)
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		_ = unix.Chdir("/")
		return fmt.Errorf("move %s onto /: %w", dir, err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return unix.Chdir("/")
}

// ensureDir makes sure dir is a directory, creating it (mode 0755) when
// the root is writable.
func ensureDir(dir string, readOnly bool) error {
	fi, err := os.Stat(dir)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		return fmt.Errorf("%s is not a directory", dir)
	case !errors.Is(err, os.ErrNotExist) || readOnly:
		return err
	}
	return os.Mkdir(dir, 0o755)
}
