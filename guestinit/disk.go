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

// The data disk: the first virtio-blk device, an ext4 file system.
const (
	DataDevice       = "/dev/vda"
	DataFSType       = "ext4"
	DefaultDataMount = "/mnt/data"
	// dataROSysfs says "1" when the block device itself is read-only
	// (VIRTIO_BLK_F_RO).
	dataROSysfs = "/sys/block/vda/ro"
)

// DataDisk is how PID 1 mounts the data disk.
type DataDisk struct {
	Enabled  bool   // false with warren.data=none
	Target   string // mount point
	ReadOnly bool   // warren.data_ro
}

// DataDiskFromCmdline reads warren.data and warren.data_ro. An invalid
// mount point is reported and replaced by DefaultDataMount, so a bad
// command line never stops the boot.
func DataDiskFromCmdline(c Cmdline) (DataDisk, error) {
	d := DataDisk{Enabled: true, Target: c.Get(KeyData, DefaultDataMount), ReadOnly: c.Bool(KeyDataRO)}
	if d.Target == "none" {
		return DataDisk{}, nil
	}
	if err := validMountpoint(d.Target); err != nil {
		bad := d.Target
		d.Target = DefaultDataMount
		return d, fmt.Errorf("%s=%q: %w", KeyData, bad, err)
	}
	return d, nil
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
	fi, err := os.Stat(DataDevice)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("data disk: %w", err)
	}
	if fi.Mode()&os.ModeDevice == 0 || fi.Mode()&os.ModeCharDevice != 0 {
		return fmt.Errorf("data disk: %s is not a block device", DataDevice)
	}
	var flags uintptr
	if ro, _ := os.ReadFile(dataROSysfs); d.ReadOnly || strings.TrimSpace(string(ro)) == "1" {
		flags |= unix.MS_RDONLY
	}
	if err := os.MkdirAll(d.Target, 0o755); err != nil {
		return fmt.Errorf("data disk: %w", err)
	}
	if err := unix.Mount(DataDevice, d.Target, DataFSType, flags, ""); err != nil {
		return fmt.Errorf("data disk: mount %s on %s (%s): %w", DataDevice, d.Target, DataFSType, err)
	}
	return nil
}
