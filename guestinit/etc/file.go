//go:build linux

package etc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// ErrTooLarge is wrapped by ReadFile's refusal of a file over its bound.
var ErrTooLarge = errors.New("file too large")

// ReadFile reads the regular file at path, at most max bytes of it: a
// larger file is an error wrapping ErrTooLarge, and anything but a regular
// file (a FIFO, a device, a directory) is refused before it is read. The
// file is opened non-blocking, so a FIFO in its place cannot stall the
// caller. A missing file is an error wrapping fs.ErrNotExist.
func ReadFile(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s)", path, fi.Mode().Type())
	}
	if fi.Size() > max {
		return nil, fmt.Errorf("%s: %d bytes, more than %d: %w", path, fi.Size(), max, ErrTooLarge)
	}
	// The size may change under us: read one byte more than allowed to
	// notice a file that grew.
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s: more than %d bytes: %w", path, max, ErrTooLarge)
	}
	return b, nil
}

// WriteFile replaces path with data, with permission bits perm, so that a
// crash at any point leaves either the old file or the whole new one: a
// temporary file in the same directory, fsync, rename over path. A symlink
// at path is replaced, not followed. The directory must exist.
//
// The directory is not fsynced: the rename is durable at the file
// system's next journal commit (ext4: within 5 s), and a crash before
// that leaves the old file, whole. Every fsync is a journal commit and a
// virtio-blk flush, which cost seconds of emulated guest kernel time on a
// PVM host at boot, where PID 1 writes these files.
//
// A file that already holds exactly data with mode perm is left alone.
func WriteFile(path string, data []byte, perm fs.FileMode) error {
	if fi, err := os.Lstat(path); err == nil && fi.Mode().IsRegular() && fi.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) == perm && fi.Size() == int64(len(data)) {
		if old, err := ReadFile(path, int64(len(data))); err == nil && bytes.Equal(old, data) {
			return nil
		}
	}
	return WriteFileFrom(path, bytes.NewReader(data), perm)
}

// WriteFileFrom is WriteFile with the contents copied from r (always
// written).
func WriteFileFrom(path string, r io.Reader, perm fs.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".warren-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	fail := func(err error) error {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		return fail(err)
	}
	if err := f.Chmod(perm); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// WriteHostname writes the hostname files of the /etc directory dir for
// hostname: dir/hostname holds it, and dir/hosts is edited by EditHosts
// (its other lines kept). With create false a file that does not exist is
// left absent (the agent updating an image root that PID 1 set up,
// without creating files in a root that never had them); with create
// true it is made. Both files are replaced atomically (WriteFile) with
// mode 0644.
func WriteHostname(dir, hostname string, create bool) error {
	hostnamePath, hostsPath := filepath.Join(dir, "hostname"), filepath.Join(dir, "hosts")
	var errs []error
	if _, err := os.Lstat(hostnamePath); err == nil || create {
		if err := WriteFile(hostnamePath, HostnameFile(hostname), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("write %s: %w", hostnamePath, err))
		}
	}
	old, err := ReadFile(hostsPath, MaxFile)
	switch {
	case errors.Is(err, fs.ErrNotExist) && !create:
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		errs = append(errs, err)
	default:
		b, err := EditHosts(old, hostname)
		if err == nil {
			err = WriteFile(hostsPath, b, 0o644)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("write %s: %w", hostsPath, err))
		}
	}
	return errors.Join(errs...)
}
