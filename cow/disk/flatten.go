package disk

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/warrenvm/warren/internal/atomicfile"
	"golang.org/x/sys/unix"
)

// flattenChunk is the unit Flatten reads and tests for zero; a zero chunk
// is left a hole.
const flattenChunk = 64 << 10

// Flatten writes src's view (an overlay stack, or any Backing) to a new raw
// image at path, which must not exist. The result is sparse: every
// all-zero 64 KiB chunk (unallocated where the base has holes, discarded,
// or written zero) is a hole. The file is synced before Flatten returns;
// on error it is removed. src must not be written meanwhile.
func Flatten(src Backing, path string) (err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("flatten: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("flatten %s: %w", path, cerr)
		}
		if err != nil {
			os.Remove(path)
		}
	}()
	size := src.Size()
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("flatten %s: %w", path, err)
	}
	buf := make([]byte, flattenChunk)
	for off := int64(0); off < size; off += flattenChunk {
		b := buf[:min(flattenChunk, size-off)]
		if err := readFull(src, b, off); err != nil {
			return fmt.Errorf("flatten %s: read at %d: %w", path, off, err)
		}
		if allZero(b) {
			continue
		}
		if _, err := f.WriteAt(b, off); err != nil {
			return fmt.Errorf("flatten %s: %w", path, err)
		}
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("flatten %s: %w", path, err)
	}
	return atomicfile.SyncDir(filepath.Dir(path))
}
