package memsnap

import (
	"os"
	"path/filepath"
)

// atomicFile is a file being written under a temporary name in its
// target's directory: commit makes it durable and renames it into place
// (fsync, rename, fsync of the directory), abort removes it. A crash at
// any point leaves either the old target or the complete new one.
type atomicFile struct {
	*os.File
	path, dir string
}

// createAtomic starts writing what will become path.
func createAtomic(path string) (*atomicFile, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return nil, err
	}
	return &atomicFile{File: f, path: path, dir: dir}, nil
}

// commit fsyncs the file, renames it over the target and fsyncs the
// directory so the rename is durable.
func (a *atomicFile) commit() error {
	if err := a.Sync(); err != nil {
		return err
	}
	if err := a.Close(); err != nil {
		return err
	}
	if err := os.Rename(a.Name(), a.path); err != nil {
		return err
	}
	return syncDir(a.dir)
}

// abort closes and removes the temporary file (after a failed commit too).
func (a *atomicFile) abort() {
	a.Close()
	os.Remove(a.Name())
}
