// Package atomicfile is the one way this module replaces a file so that a
// crash at any instant leaves either the old file or the complete new one:
// the new contents go to a temporary file beside the target (in the same
// directory, so on the same file system), which is fsynced, renamed over
// the target, and then the directory is fsynced so that the rename itself
// is durable. The file part is github.com/google/renameio/v2's
// PendingFile; the directory's fsync, which renameio leaves to its
// callers, is added here.
//
// A crash before the rename can leave the temporary file: its name is the
// target's with a dot in front and digits after (".NAME123..."); IsTemp
// tells such names, for sweeps and tests.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/renameio/v2"
)

// File is a replacement of a file being written. Write to it (it is an
// *os.File), then Commit; Abort, or a Commit that failed, leaves the
// target untouched and removes the temporary file.
type File struct {
	*renameio.PendingFile
	path string
	uid  int
}

// Option tunes Create and Write.
type Option func(*File)

// Owner makes the new file owned by uid (and the group of the same
// number) before it takes the target's name: a reader of that uid can
// open it from the moment it appears. Needs CAP_CHOWN.
func Owner(uid int) Option { return func(f *File) { f.uid = uid } }

// Create starts replacing path with a file of mode perm (exactly: the
// umask does not apply).
func Create(path string, perm os.FileMode, opts ...Option) (*File, error) {
	dir := filepath.Dir(path)
	pf, err := renameio.NewPendingFile(path, renameio.WithTempDir(dir), renameio.WithStaticPermissions(perm))
	if err != nil {
		return nil, fmt.Errorf("atomicfile: %s: %w", path, err)
	}
	f := &File{PendingFile: pf, path: path, uid: -1}
	for _, o := range opts {
		o(f)
	}
	return f, nil
}

// Commit makes the written contents the target's: fsync, rename, fsync of
// the directory.
func (f *File) Commit() error {
	if f.uid >= 0 {
		if err := f.Chown(f.uid, f.uid); err != nil {
			f.Abort()
			return fmt.Errorf("atomicfile: %s: %w", f.path, err)
		}
	}
	if err := f.CloseAtomicallyReplace(); err != nil {
		f.Abort()
		return fmt.Errorf("atomicfile: %s: %w", f.path, err)
	}
	return SyncDir(filepath.Dir(f.path))
}

// Abort gives up the replacement: the temporary file is closed and
// removed. It may be called after Commit (a no-op then).
func (f *File) Abort() { f.Cleanup() }

// Write replaces path with data (Create, write, Commit).
func Write(path string, data []byte, perm os.FileMode, opts ...Option) error {
	return WriteFunc(path, perm, func(w *os.File) error {
		_, err := w.Write(data)
		return err
	}, opts...)
}

// WriteFunc replaces path with what fill writes.
func WriteFunc(path string, perm os.FileMode, fill func(*os.File) error, opts ...Option) error {
	f, err := Create(path, perm, opts...)
	if err != nil {
		return err
	}
	if err := fill(f.File); err != nil {
		f.Abort()
		return fmt.Errorf("atomicfile: write %s: %w", path, err)
	}
	return f.Commit()
}

// SyncDir fsyncs directory dir, so that the names made, renamed or removed
// in it are durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("atomicfile: fsync %s: %w", dir, err)
	}
	return nil
}

// IsTemp reports whether name (a base name) is one of this package's
// temporary files: a dot, the target's name, then digits.
func IsTemp(name string) bool {
	if !strings.HasPrefix(name, ".") || len(name) < 3 {
		return false
	}
	trimmed := strings.TrimRight(name, "0123456789")
	return len(trimmed) < len(name) && len(trimmed) > 1
}
