package agentclient

// Copying files between the host and a guest (`warren cp`): the guest
// side through the agent's file API, the host side here too, so that
// every copier (the CLI's VM level, the daemon's client) reads and
// writes host files the same way.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"github.com/warrenvm/warren/internal/atomicfile"
)

// Copy copies between the host and a guest: src and dst are read by
// ParseTarget, and exactly one of them must be VM:/guest/path. A host
// side of "-" is stdin (copying in) or stdout (copying out). See CopyIn
// and CopyOut.
func Copy(ctx context.Context, src, dst string, stdin io.Reader, stdout io.Writer) error {
	s, err := ParseTarget(src)
	if err != nil {
		return err
	}
	d, err := ParseTarget(dst)
	if err != nil {
		return err
	}
	if s.InGuest() == d.InGuest() {
		return fmt.Errorf("exactly one of %s and %s must be VM:/guest/path", s, d)
	}
	if d.InGuest() {
		return CopyIn(ctx, s.Path, d, stdin)
	}
	return CopyOut(ctx, s, d.Path, stdout)
}

// CopyIn copies the host file hostPath (or stdin for "-") to the guest
// file dst, keeping its permission bits (0644 for stdin); into a guest
// directory it keeps the base name.
func CopyIn(ctx context.Context, hostPath string, dst Target, stdin io.Reader) error {
	c := New(dst.VM)
	defer c.Close()
	r, mode, done, err := OpenCopySource(hostPath, stdin)
	if err != nil {
		return err
	}
	defer done()
	guestPath := dst.Path
	if fi, err := c.Stat(ctx, guestPath); err == nil && fi.IsDir && hostPath != "-" {
		guestPath = path.Join(guestPath, filepath.Base(hostPath))
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	_, err = c.WriteFile(ctx, guestPath, r, mode)
	return err
}

// CopyOut copies the guest file src to the host file hostPath (or stdout
// for "-") as WriteHostCopy writes it.
func CopyOut(ctx context.Context, src Target, hostPath string, stdout io.Writer) error {
	c := New(src.VM)
	defer c.Close()
	return WriteHostCopy(hostPath, src.Path, stdout, func(w io.Writer) (fs.FileMode, error) {
		return c.ReadFile(ctx, src.Path, w)
	})
}

// OpenCopySource opens what a copy into a guest reads: the host file
// hostPath with its permission bits, or stdin (mode 0644) for "-". A
// directory is refused. done closes the file.
func OpenCopySource(hostPath string, stdin io.Reader) (r io.Reader, mode fs.FileMode, done func(), err error) {
	if hostPath == "-" {
		return stdin, 0o644, func() {}, nil
	}
	f, err := os.Open(hostPath)
	if err != nil {
		return nil, 0, nil, err
	}
	fi, err := f.Stat()
	if err == nil && fi.IsDir() {
		err = fmt.Errorf("%s is a directory; warren cp copies files", hostPath)
	}
	if err != nil {
		f.Close()
		return nil, 0, nil, err
	}
	return f, fi.Mode(), func() { f.Close() }, nil
}

// WriteHostCopy is the host side of copying a guest file out: read(w)
// writes the guest file guestPath into w and returns its mode. To "-" it
// goes to stdout; otherwise into a temporary file renamed into place only
// when complete (internal/atomicfile), with the guest file's permission
// bits, and into a host directory under its base name. A failed copy
// leaves hostPath as it was.
func WriteHostCopy(hostPath, guestPath string, stdout io.Writer, read func(io.Writer) (fs.FileMode, error)) error {
	if hostPath == "-" {
		_, err := read(stdout)
		return err
	}
	if fi, err := os.Stat(hostPath); err == nil && fi.IsDir() {
		hostPath = filepath.Join(hostPath, path.Base(guestPath))
	}
	f, err := atomicfile.Create(hostPath, 0o600)
	if err != nil {
		return err
	}
	mode, err := read(f.File)
	if err == nil {
		err = f.Chmod(mode.Perm())
	}
	if err != nil {
		f.Abort()
		return err
	}
	return f.Commit()
}
