package daemon

import (
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/cow/disk"
)

// Guest files. A template request never names a host path: its kernel,
// initramfs and disk images are files of the operator's guest directory
// (warren-hostd --guest-dir), named by their base names, or come from an
// image (images.go). The daemon, not the VMM, opens them:
//
//   - the name is checked first (no '/', no "." or "..", a short run of
//     [A-Za-z0-9._+-] not starting with '.'); a request naming a host
//     path, absolute or relative, is refused (400) before anything is
//     opened;
//   - the directory must be the operator's: owned by root or by the
//     daemon's user, not writable by group or others (a tenant with a
//     local account could otherwise plant a link in it);
//   - the name is resolved with openat2 under the directory with
//     RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS, first as
//     an O_PATH descriptor (which opens nothing: a FIFO's open would block,
//     a device's open may act on the device), whose fstat must say a
//     regular file; only then is it opened for reading, and the second
//     descriptor must be the same inode;
//   - the read-only descriptor is what the VMM gets (a kernel and an
//     initramfs: LaunchSpec.ExtraFiles, `warren run --kernel-fd`), or
//     what the daemon copies a disk image from into the template's own
//     directory (disks.go): the VMM never sees a path of the guest
//     directory.
//
// The operator's own defaults for image templates (--guest-kernel,
// --guest-initramfs) may be names in the guest directory or paths of the
// operator's; the daemon opens those too, regular files only, and passes
// descriptors the same way.

// guestNameRE is what a guest file's name may be.
var guestNameRE = regexp.MustCompile(`^[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,127}$`)

// maxBootFile bounds a kernel's or initramfs's size: the VMM reads it
// whole into its memory.
const maxBootFile = 512 << 20

// checkGuestName refuses (400) a template's file name that is not a plain
// name of the guest directory; what says which input it is ("kernel").
func checkGuestName(what, name string) error {
	if strings.ContainsRune(name, '/') {
		return errf(400, "%s %q is a host path: templates name files of the daemon's guest directory (warren-hostd --guest-dir) by name, or take their root file system from an image", what, name)
	}
	if !guestNameRE.MatchString(name) {
		return errf(400, "%s %q: not a file name of the daemon's guest directory (letters, digits and ._+- only, not starting with '.')", what, name)
	}
	return nil
}

// openGuestDir opens the guest directory dir as an O_PATH descriptor and
// checks that it is the operator's.
func openGuestDir(dir string) (int, error) {
	if dir == "" {
		return -1, errf(400, "this daemon has no guest directory (warren-hostd --guest-dir): templates can only be made from images")
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("guest directory: %w", err)
	}
	if err := checkOperatorDir(fd); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("guest directory %s: %w", dir, err)
	}
	return fd, nil
}

// checkOperatorDir checks that the directory fd is owned by root or by
// the daemon's user and writable by nobody else.
func checkOperatorDir(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return errors.New("not a directory")
	}
	if st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("owned by uid %d, neither root nor the daemon's user", st.Uid)
	}
	if st.Mode&0o022 != 0 {
		return fmt.Errorf("mode %#o: writable by group or others", st.Mode&0o7777)
	}
	return nil
}

// CheckGuestDir checks, at the daemon's start, that dir can be its guest
// directory (see openGuestDir).
func CheckGuestDir(dir string) error {
	fd, err := openGuestDir(dir)
	if err != nil {
		return err
	}
	unix.Close(fd)
	return nil
}

// openGuestFile opens the regular file name of the guest directory dir
// read-only (see the comment at the top of this file); what names the
// input in errors. A name that is refused gets a 400.
func openGuestFile(dir, what, name string) (*os.File, error) {
	if err := checkGuestName(what, name); err != nil {
		return nil, err
	}
	dfd, err := openGuestDir(dir)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dfd)
	return openBeneath(dfd, what, name)
}

// openBeneath opens name under the directory dfd as openGuestFile does.
func openBeneath(dfd int, what, name string) (*os.File, error) {
	how := unix.OpenHow{Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	how.Flags = unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC
	pfd, err := unix.Openat2(dfd, name, &how)
	if err != nil {
		return nil, guestOpenErr(what, name, err)
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, fmt.Errorf("%s %q: %w", what, name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, errf(400, "%s %q: not a regular file of the guest directory (%s)", what, name, fileKind(st.Mode))
	}
	// Now read-only, for real; O_NONBLOCK|O_NOCTTY in case the name was
	// swapped for a FIFO or a terminal since (only the operator can).
	how.Flags = unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK | unix.O_NOCTTY
	fd, err := unix.Openat2(dfd, name, &how)
	if err != nil {
		return nil, guestOpenErr(what, name, err)
	}
	var st2 unix.Stat_t
	if err := unix.Fstat(fd, &st2); err != nil || st2.Dev != st.Dev || st2.Ino != st.Ino || st2.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, errf(409, "%s %q changed while it was opened", what, name)
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err == nil {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl&^unix.O_NONBLOCK)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%s %q: %w", what, name, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// guestOpenErr turns openat2's refusals into 400s that say why.
func guestOpenErr(what, name string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return errf(400, "%s %q: no such file in the guest directory", what, name)
	case errors.Is(err, unix.ELOOP):
		return errf(400, "%s %q: a symbolic link (the guest directory's files are used only as they are)", what, name)
	case errors.Is(err, unix.EXDEV):
		return errf(400, "%s %q: outside the guest directory", what, name)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM), errors.Is(err, unix.ENOTDIR):
		return errf(400, "%s %q: %v", what, name, err)
	case errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("%s %q: this kernel has no openat2 (Linux 5.6 or later is needed): %w", what, name, err)
	}
	return fmt.Errorf("%s %q: %w", what, name, err)
}

// fileKind names the type in mode.
func fileKind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFLNK:
		return "a symbolic link"
	}
	return fmt.Sprintf("type %#o", mode&unix.S_IFMT)
}

// openOperatorFile opens an operator's default (--guest-kernel,
// --guest-initramfs): a name of the guest directory, or a path of the
// operator's own, opened read-only and refused unless a regular file.
func openOperatorFile(dir, what, v string) (*os.File, error) {
	if !strings.ContainsRune(v, '/') {
		return openGuestFile(dir, what, v)
	}
	f, err := os.OpenFile(v, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("the daemon's %s: %w", what, err)
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = errors.New("not a regular file")
	}
	if err == nil {
		err = clearNonblock(f)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("the daemon's %s %s: %w", what, v, err)
	}
	return f, nil
}

// clearNonblock clears O_NONBLOCK on f's descriptor.
func clearNonblock(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	err = rc.Control(func(fd uintptr) {
		var fl int
		if fl, ferr = unix.FcntlInt(fd, unix.F_GETFL, 0); ferr == nil {
			_, ferr = unix.FcntlInt(fd, unix.F_SETFL, fl&^unix.O_NONBLOCK)
		}
	})
	if err != nil {
		return err
	}
	return ferr
}

// checkBootFile checks a kernel's or initramfs's size (the VMM reads it
// whole).
func checkBootFile(f *os.File, what, name string) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() > maxBootFile {
		return errf(400, "%s %q: %d bytes, more than a %s may be (%d MiB)", what, name, fi.Size(), what, maxBootFile>>20)
	}
	return nil
}

// checkRawImage refuses (400) a guest directory's disk image that is a
// cow/disk overlay: its header names a base by path, which the daemon and
// the VMM would open. The guest directory's images are raw.
func checkRawImage(f *os.File, name string) error {
	var m [len(disk.Magic)]byte
	n, err := f.ReadAt(m[:], 0)
	if err != nil && err != io.EOF {
		return fmt.Errorf("disk %q: %w", name, err)
	}
	if n == len(m) && string(m[:]) == disk.Magic {
		return errf(400, "disk %q: a copy-on-write overlay, not a raw image (its base would be opened by path)", name)
	}
	return nil
}
