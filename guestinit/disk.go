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

// Command-line keys for the data disk.
const (
	// KeyData is where the data disk is mounted (an absolute path), or
	// "none" to leave it alone. Default DefaultDataMount.
	KeyData = "warren.data"
	// KeyDataRO, when true, mounts the data disk read-only.
	KeyDataRO = "warren.data_ro"
)

// The data disk: the first virtio-blk device that is not the root disk
// (DataDevice, or DataDeviceAfterRoot when warren.root is /dev/vda), an
// ext4 file system.
const (
	DataDevice          = "/dev/vda"
	DataDeviceAfterRoot = "/dev/vdb"
	DataFSType          = "ext4"
	DefaultDataMount    = "/mnt/data"
)

// DataDisk is how PID 1 mounts the data disk.
type DataDisk struct {
	Enabled  bool   // false with warren.data=none
	Target   string // mount point
	ReadOnly bool   // warren.data_ro
	Device   string // the block device
}

// DataDiskFromCmdline reads warren.data and warren.data_ro, and picks the
// device: DataDevice, except that the data disk is never the root disk,
// so with warren.root=/dev/vda (or an invalid warren.root, which leaves
// the guest on the initramfs but may still have been meant for /dev/vda)
// it is DataDeviceAfterRoot. An invalid mount point is reported and
// replaced by DefaultDataMount, so a bad command line never stops the
// boot.
func DataDiskFromCmdline(c Cmdline) (DataDisk, error) {
	d := DataDisk{Enabled: true, Target: c.Get(KeyData, DefaultDataMount), ReadOnly: c.Bool(KeyDataRO), Device: DataDevice}
	if root := c.Get(KeyRoot, ""); root == DataDevice || (root != "" && !validDiskDevice(root)) {
		d.Device = DataDeviceAfterRoot
	}
	if d.Target == "none" {
		return DataDisk{}, nil
	}
	err := validOr(&d.Target, KeyData, DefaultDataMount, validMountpoint)
	return d, err
}

// validMountpoint accepts a clean absolute path other than "/" that is
// not inside the pseudo file systems PID 1 mounts.
func validMountpoint(p string) error {
	switch {
	case !filepath.IsAbs(p):
		return errors.New("mount point must be an absolute path")
	case filepath.Clean(p) != p:
		return errors.New("mount point must be a clean path (no //, ., .. or trailing /)")
	case p == "/":
		return errors.New("cannot mount over /")
	}
	for _, sys := range []string{"/dev", "/proc", "/sys"} {
		if p == sys || strings.HasPrefix(p, sys+"/") {
			return fmt.Errorf("mount point inside %s", sys)
		}
	}
	return nil
}

// mountData mounts the data disk as the kernel command line asks, when a
// disk is attached. Failures are reported on the console; the boot goes on.
func mountData(c Cmdline) {
	d, err := DataDiskFromCmdline(c)
	if err != nil {
		report(err)
	}
	if err := d.mount(); err != nil {
		report(err)
	}
}

// mount mounts the disk. No device means no disk attached, which is not an
// error. The device is also mounted read-only when the host attached it
// read-only, rather than failing.
func (d DataDisk) mount() error {
	if !d.Enabled {
		return nil
	}
	fi, err := os.Stat(d.Device)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("data disk: %w", err)
	}
	if fi.Mode()&os.ModeDevice == 0 || fi.Mode()&os.ModeCharDevice != 0 {
		return fmt.Errorf("data disk: %s is not a block device", d.Device)
	}
	var flags uintptr
	if d.ReadOnly || deviceReadOnly(d.Device) {
		flags |= unix.MS_RDONLY
	}
	if err := os.MkdirAll(d.Target, 0o755); err != nil {
		return fmt.Errorf("data disk: %w", err)
	}
	if err := unix.Mount(d.Device, d.Target, DataFSType, flags, ""); err != nil {
		return fmt.Errorf("data disk: mount %s on %s (%s): %w", d.Device, d.Target, DataFSType, err)
	}
	return nil
}
