//go:build linux && amd64

package jail

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// RootOptions describe the directory a VMM pivot_roots into (Config.Root):
// a fresh tmpfs on Dir, in the VMM's own mount namespace, holding only
// Binds (each at its own path, so the paths the VMM was given keep
// working), Devices (device nodes made there, owned by Owner) and a /proc
// of its pid namespace. Nothing of the host's tree is reachable from it
// but what Binds name.
type RootOptions struct {
	// Dir is an existing, empty directory of the host: the jail's root.
	// The tmpfs mounted on it lives in the VMM's mount namespace only,
	// so the host sees Dir empty; /proc/PID/root of the VMM is that tmpfs.
	Dir string
	// Binds are the host paths visible inside, bind-mounted at the same
	// path, nosuid and nodev, read-only unless Writable, noexec unless
	// Exec.
	Binds []Bind
	// Devices are made in the jail (mknod, mode 0660, owned by Owner and
	// its group; 0666 for DevNull): a VMM that has left root can still
	// open them, where the host's nodes (root:kvm 0660) would refuse it,
	// and so can its fork children, uids of their own in its group.
	Devices []Device
	// Owner owns Devices (nil: root).
	Owner *User

	// pivot, when set, stands in for pivot_root(2) (a test makes it
	// fail as on an initramfs root).
	pivot func(newroot, putold string) error
}

// Bind is a host path made visible in the jail at the same path.
type Bind struct {
	Path     string
	Writable bool
	// Exec allows executing files of the bind (the warren binary that a
	// fork API starts its children from).
	Exec bool
}

// Device is a character device node made in the jail at Path.
type Device struct {
	Path         string
	Major, Minor uint32
	Mode         uint32 // permission bits; 0 means 0660
}

// The devices a VMM opens after its setup: fork children open /dev/kvm and
// (with a tap) /dev/net/tun by path.
var (
	DevKVM  = Device{Path: "/dev/kvm", Major: 10, Minor: 232}
	DevTun  = Device{Path: "/dev/net/tun", Major: 10, Minor: 200}
	DevNull = Device{Path: "/dev/null", Major: 1, Minor: 3, Mode: 0o666}
)

// PivotRoot moves the calling process (which must be in a mount namespace
// of its own, with private mounts: PrepareMounts, and still privileged)
// into the jail described by o. Afterwards "/" is the read-only tmpfs on
// o.Dir, the old root is detached (or, where the root is an initramfs that
// pivot_root cannot move, covered by the jail's mount and left behind by a
// chroot), and the working directory is "/".
//
// It must run before the capabilities are dropped (mount, mknod and
// pivot_root need CAP_SYS_ADMIN and CAP_MKNOD) and before the seccomp
// filter, which refuses all three.
func PivotRoot(o RootOptions) error {
	if !filepath.IsAbs(o.Dir) {
		return fmt.Errorf("jail: root %q is not absolute", o.Dir)
	}
	root := filepath.Clean(o.Dir)
	if err := unix.Mount("warren-jail", root, "tmpfs", unix.MS_NOSUID, "mode=0755,size=1m,nr_inodes=4096"); err != nil {
		return fmt.Errorf("jail: mount a tmpfs on %s: %w", root, err)
	}
	for _, b := range o.Binds {
		if err := bindInto(root, b); err != nil {
			return err
		}
	}
	for _, d := range o.Devices {
		if err := mknodInto(root, d, o.Owner); err != nil {
			return err
		}
	}
	if err := os.Mkdir(filepath.Join(root, "proc"), 0o555); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("jail: %w", err)
	}
	if err := unix.Mount("proc", filepath.Join(root, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("jail: mount /proc in the jail: %w", err)
	}
	// pivot_root(".", "."): the old root ends up mounted on top of the
	// new one, and is detached at once.
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("jail: chdir %s: %w", root, err)
	}
	pivot := o.pivot
	if pivot == nil {
		pivot = unix.PivotRoot
	}
	switch perr := pivot(".", "."); {
	case errors.Is(perr, unix.EINVAL):
		// The root is the initramfs's rootfs, which pivot_root cannot
		// move (a host booted into its initramfs, as the nested KVM
		// host is): move the jail over it and chroot there, as
		// switch_root does. The old tree is then under the jail's
		// mount, out of reach by path; getting out would take chroot
		// (no capability left, and the filter refuses it) or a
		// directory descriptor from before (the VMM keeps none).
		if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("jail: pivot_root %s: %v; move it over /: %w", root, perr, err)
		}
		if err := unix.Chroot("."); err != nil {
			return fmt.Errorf("jail: chroot %s: %w", root, err)
		}
	case perr != nil:
		return fmt.Errorf("jail: pivot_root %s: %w", root, perr)
	default:
		if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
			return fmt.Errorf("jail: detach the old root: %w", err)
		}
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("jail: chdir /: %w", err)
	}
	// The tmpfs itself (mount points, device nodes) becomes read-only;
	// the binds keep their own flags.
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID, ""); err != nil {
		return fmt.Errorf("jail: make the jail's root read-only: %w", err)
	}
	return nil
}

// checkPath refuses relative paths, "..", and the root itself.
func checkPath(p string) (string, error) {
	if !filepath.IsAbs(p) || strings.Contains(p, "\x00") {
		return "", fmt.Errorf("jail: %q is not an absolute path", p)
	}
	c := filepath.Clean(p)
	if c == "/" || c != p && c+"/" != p {
		return "", fmt.Errorf("jail: %q is not a clean path", p)
	}
	return c, nil
}

// bindInto bind-mounts b.Path at the same path under root.
func bindInto(root string, b Bind) error {
	src, err := checkPath(b.Path)
	if err != nil {
		return err
	}
	fi, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("jail: bind %s: %w", src, err)
	}
	dst := filepath.Join(root, src)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("jail: bind %s: %w", src, err)
	}
	if fi.IsDir() {
		err = os.Mkdir(dst, 0o755)
	} else {
		var f *os.File
		if f, err = os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o444); err == nil {
			f.Close()
		}
	}
	if err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("jail: bind %s: %w", src, err)
	}
	// Not MS_REC: mounts below src stay out of the jail.
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("jail: bind %s: %w", src, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV)
	if !b.Writable {
		flags |= unix.MS_RDONLY
	}
	if !b.Exec {
		flags |= unix.MS_NOEXEC
	}
	if err := unix.Mount("", dst, "", flags, ""); err != nil {
		return fmt.Errorf("jail: remount %s (writable %v, exec %v): %w", src, b.Writable, b.Exec, err)
	}
	return nil
}

// mknodInto makes the device d under root, owned by owner.
func mknodInto(root string, d Device, owner *User) error {
	p, err := checkPath(d.Path)
	if err != nil {
		return err
	}
	dst := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("jail: device %s: %w", p, err)
	}
	mode := d.Mode
	if mode == 0 {
		mode = 0o660
	}
	if err := unix.Mknod(dst, unix.S_IFCHR|mode, int(unix.Mkdev(d.Major, d.Minor))); err != nil {
		return fmt.Errorf("jail: mknod %s: %w", p, err)
	}
	if err := unix.Chmod(dst, mode); err != nil { // past the umask
		return fmt.Errorf("jail: device %s: %w", p, err)
	}
	if owner != nil {
		if err := unix.Chown(dst, owner.UID, owner.GID); err != nil {
			return fmt.Errorf("jail: device %s: %w", p, err)
		}
	}
	return nil
}
