package disk

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/warrenvm/warren/internal/atomicfile"
	"golang.org/x/sys/unix"
)

// maxChain bounds the depth of a stack OpenChain follows (and so breaks
// a loop of base paths).
const maxChain = 64

// OpenChain opens the overlay at path and, below it, the chain of bases
// recorded in the headers (relative base paths are taken relative to the
// directory of the overlay that records them): overlays, opened read-only,
// down to a raw image, opened read-only. The top overlay is writable
// unless readOnly. It owns the chain: Close closes every layer.
//
// Every layer holds a flock (shared below the top), so a base that some
// process has open for writing is refused, and it cannot be opened for
// writing while the chain is open.
func OpenChain(path string, readOnly bool) (*Overlay, error) {
	return openChain(path, readOnly, 0)
}

func openChain(path string, readOnly bool, depth int) (*Overlay, error) {
	if depth >= maxChain {
		return nil, fmt.Errorf("open overlay chain at %s: more than %d layers (a loop?)", path, maxChain)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open overlay chain: %w", err)
	}
	h, err := readHeader(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("open overlay chain at %s: %w", path, err)
	}
	if h.BasePath == "" {
		return nil, fmt.Errorf("open overlay chain at %s: no base path recorded", path)
	}
	bp := h.BasePath
	if !filepath.IsAbs(bp) {
		bp = filepath.Join(filepath.Dir(path), bp)
	}
	base, closeBase, err := openLayer(bp, depth+1)
	if err != nil {
		return nil, fmt.Errorf("open overlay chain at %s: base: %w", path, err)
	}
	o, err := Open(path, base, Options{ReadOnly: readOnly})
	if err != nil {
		closeBase()
		return nil, err
	}
	o.closeBase = closeBase
	return o, nil
}

// openLayer opens the image at path read-only, as an overlay chain if it
// is an overlay, else as a raw image.
func openLayer(path string, depth int) (Backing, func() error, error) {
	ok, err := IsOverlay(path)
	if err != nil {
		return nil, nil, err
	}
	if ok {
		o, err := openChain(path, true, depth)
		if err != nil {
			return nil, nil, err
		}
		return o, o.Close, nil
	}
	r, err := OpenRaw(path, false)
	if err != nil {
		return nil, nil, err
	}
	return r, r.Close, nil
}

// IsOverlay reports whether the file at path starts with Magic.
func IsOverlay(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	var m [len(Magic)]byte
	n, _ := f.ReadAt(m[:], 0)
	return n == len(m) && string(m[:]) == Magic, nil
}

// CloneKind says how Clone made its copy.
type CloneKind int

const (
	// Reflinked: dst is a raw image sharing src's extents (FICLONE); it is
	// independent of src from now on.
	Reflinked CloneKind = iota + 1
	// Overlaid: the file system cannot reflink; dst is an overlay over src
	// (its recorded base path is src's absolute path), to be opened with
	// OpenChain, and src must stay unchanged while dst exists.
	Overlaid
)

func (k CloneKind) String() string {
	switch k {
	case Reflinked:
		return "reflink"
	case Overlaid:
		return "overlay"
	}
	return fmt.Sprintf("CloneKind(%d)", int(k))
}

// Clone makes dst (which must not exist) a copy-on-write copy of the raw
// image or overlay at src: a reflinked copy where the file system supports
// FICLONE (btrfs, XFS with reflink), else a new overlay over src. src must
// be quiet (synced, no writer) while Clone runs; a reflinked overlay src
// still needs its own bases.
func Clone(src, dst string) (CloneKind, error) {
	if err := reflink(src, dst); err == nil {
		return Reflinked, nil
	} else if !errors.Is(err, errNoReflink) {
		return 0, fmt.Errorf("clone %s: %w", src, err)
	}
	abs, err := filepath.Abs(src)
	if err != nil {
		return 0, fmt.Errorf("clone %s: %w", src, err)
	}
	base, closeBase, err := openLayer(abs, 0)
	if err != nil {
		return 0, fmt.Errorf("clone %s: %w", src, err)
	}
	defer closeBase()
	o, err := Create(dst, base, CreateOptions{BasePath: abs})
	if err != nil {
		return 0, fmt.Errorf("clone %s: %w", src, err)
	}
	if err := o.Close(); err != nil {
		return 0, fmt.Errorf("clone %s: %w", src, err)
	}
	return Overlaid, nil
}

// errNoReflink: the file system cannot reflink src to dst.
var errNoReflink = errors.New("reflink not supported")

// reflink clones src into a new file dst with FICLONE; it removes dst and
// returns errNoReflink when the file system cannot.
func reflink(src, dst string) error {
	s, err := os.Open(src)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := flock(s, unix.LOCK_SH); err != nil {
		return err
	}
	d, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	err = control(d, func(dfd int) error {
		return control(s, func(sfd int) error { return unix.IoctlFileClone(dfd, sfd) })
	})
	switch {
	case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOTTY), errors.Is(err, unix.EXDEV),
		errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS):
		err = errNoReflink
	case err == nil:
		err = d.Sync()
	}
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst)
		return err
	}
	return atomicfile.SyncDir(filepath.Dir(dst))
}
