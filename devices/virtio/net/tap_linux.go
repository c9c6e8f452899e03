package vnet

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// OpenTap attaches to the tap interface name, creating it when it does not
// exist (an empty name lets the kernel pick "tapN"), configured for
// virtio-net: no packet-information prefix, a HeaderLen-byte
// virtio_net_hdr_v1 in front of every frame, and no offloads. The returned
// file is non-blocking and served by the Go runtime's poller, so read and
// write deadlines work; its Name is the interface name.
//
// An existing interface must be a tap this process may attach to (one
// made with `ip tuntap add mode tap` with a matching owner, or a
// multi-queue tap); a tap created here vanishes when the file is closed.
func OpenTap(name string) (*os.File, error) {
	return OpenTapAt(unix.AT_FDCWD, "/dev/net/tun", name)
}

// OpenTapAt is OpenTap with the tun device at path relative to the
// directory descriptor dir (unix.AT_FDCWD: the working directory): a
// process whose root has changed since (a jail's pivot_root) opens it
// through a descriptor of /dev/net taken before.
func OpenTapAt(dir int, path, name string) (*os.File, error) {
	fd, err := unix.Openat(dir, path, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("tap %q: open %s: %w", name, path, err)
	}
	ok := false
	defer func() {
		if !ok {
			unix.Close(fd)
		}
	}()
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return nil, fmt.Errorf("tap %q: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return nil, fmt.Errorf("tap %q: TUNSETIFF: %w", name, err)
	}
	name = ifr.Name()
	if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, HeaderLen); err != nil {
		return nil, fmt.Errorf("tap %q: TUNSETVNETHDRSZ %d: %w", name, HeaderLen, err)
	}
	// No checksum or segmentation offloads: the kernel completes checksums
	// and segments before frames reach us, matching the features offered.
	if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, 0); err != nil {
		return nil, fmt.Errorf("tap %q: TUNSETOFFLOAD: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	ok = true
	// os.NewFile registers a non-blocking descriptor with the poller; a
	// deadline is refused when that failed, and Reset relies on deadlines.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, fmt.Errorf("tap %q: not pollable: %w", name, err)
	}
	return f, nil
}
