package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"
)

// FromRootfs makes a one-layer linux/amd64 image (OCI media types, an
// otherwise empty config) from a plain root file system:
//
//   - a directory: its tree is read without following any symlink in it
//     (every file is opened relative to its directory's descriptor with
//     O_NOFOLLOW and checked to be the file that was listed), keeping
//     owners, modes (setuid, setgid, sticky), mtimes, xattrs, hard links,
//     symlinks, device nodes and fifos; sockets are left out (a tar cannot
//     hold them). The layer is made each time it is read (a gzip-compressed
//     tar, entries in sorted order, so the same tree gives the same
//     digest): the tree must not change while the image is in use.
//   - a tar file (plain, gzip or zstd): that tar is the layer.
//
// A path that is a symlink is followed once (it is the caller's argument).
func FromRootfs(p string) (v1.Image, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, fmt.Errorf("rootfs: %w", err)
	}
	var layer v1.Layer
	switch {
	case fi.IsDir():
		layer, err = tarball.LayerFromOpener(func() (io.ReadCloser, error) { return treeTar(p), nil }, tarball.WithMediaType(types.OCILayer))
	case fi.Mode().IsRegular():
		mt := types.OCILayer
		if f, err := os.Open(p); err == nil {
			var magic [4]byte
			io.ReadFull(f, magic[:])
			f.Close()
			if bytes.Equal(magic[:], []byte{0x28, 0xb5, 0x2f, 0xfd}) {
				mt = types.OCILayerZStd
			}
		}
		layer, err = tarball.LayerFromFile(p, tarball.WithMediaType(mt))
	default:
		return nil, fmt.Errorf("rootfs %s: neither a directory nor a tar file", p)
	}
	if err != nil {
		return nil, fmt.Errorf("rootfs %s: %w", p, err)
	}
	img, err := mutate.AppendLayers(mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON), layer)
	if err != nil {
		return nil, fmt.Errorf("rootfs %s: %w", p, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = Platform.OS, Platform.Architecture
	return mutate.ConfigFile(img, cf)
}

// treeTar streams the tree at root as a tar; an error reading it ends the
// stream with that error.
func treeTar(root string) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		bw := bufio.NewWriterSize(pw, 1<<20)
		tw := tar.NewWriter(bw)
		err := writeTree(tw, root)
		if err == nil {
			err = tw.Close()
		}
		if err == nil {
			err = bw.Flush()
		}
		pw.CloseWithError(err)
	}()
	return pr
}

type devIno struct{ dev, ino uint64 }

// treeWriter walks one tree; links maps an inode with more than one name
// to the first name written.
type treeWriter struct {
	tw    *tar.Writer
	links map[devIno]string
	buf   []byte
}

func writeTree(tw *tar.Writer, root string) error {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("rootfs %s: %w", root, err)
	}
	defer unix.Close(fd)
	w := &treeWriter{tw: tw, links: map[devIno]string{}, buf: make([]byte, 1<<20)}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	x, err := fdXattrs(fd)
	if err != nil {
		return fmt.Errorf("rootfs %s: %w", root, err)
	}
	if err := tw.WriteHeader(w.header(tar.TypeDir, "./", &st, x)); err != nil {
		return err
	}
	if err := w.dir(fd, ""); err != nil {
		return fmt.Errorf("rootfs %s: %w", root, err)
	}
	return nil
}

func (w *treeWriter) header(typ byte, name string, st *unix.Stat_t, x map[string]string) *tar.Header {
	h := &tar.Header{
		Typeflag: typ, Name: name, Mode: int64(st.Mode & 0o7777), Uid: int(st.Uid), Gid: int(st.Gid),
		ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec), Format: tar.FormatPAX,
	}
	if len(x) > 0 {
		h.PAXRecords = map[string]string{}
		for k, v := range x {
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
	}
	return h
}

// dir writes the entries of the directory open at fd (rel is its path in
// the tree, "" for the root), recursively, in sorted order.
func (w *treeWriter) dir(fd int, rel string) error {
	dup, err := unix.Dup(fd)
	if err != nil {
		return err
	}
	df := os.NewFile(uintptr(dup), rel)
	names, err := df.Readdirnames(-1)
	df.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	sort.Strings(names)
	for _, n := range names {
		p := path.Join(rel, n)
		if err := w.entry(fd, n, p); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

func (w *treeWriter) entry(dirfd int, name, p string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	typ := st.Mode & unix.S_IFMT
	if typ != unix.S_IFDIR && st.Nlink > 1 {
		k := devIno{st.Dev, st.Ino}
		if first, ok := w.links[k]; ok {
			return w.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeLink, Name: p, Linkname: first, Format: tar.FormatPAX})
		}
		w.links[k] = p
	}
	switch typ {
	case unix.S_IFDIR:
		fd, err := openChecked(dirfd, name, unix.O_DIRECTORY, &st)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		x, err := fdXattrs(fd)
		if err != nil {
			return err
		}
		if err := w.tw.WriteHeader(w.header(tar.TypeDir, p+"/", &st, x)); err != nil {
			return err
		}
		return w.dir(fd, p)
	case unix.S_IFREG:
		fd, err := openChecked(dirfd, name, 0, &st)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), p)
		defer f.Close()
		x, err := fdXattrs(fd)
		if err != nil {
			return err
		}
		h := w.header(tar.TypeReg, p, &st, x)
		h.Size = st.Size
		if err := w.tw.WriteHeader(h); err != nil {
			return err
		}
		n, err := io.CopyBuffer(w.tw, io.LimitReader(f, st.Size), w.buf)
		if err == nil && n != st.Size {
			err = errors.New("the file shrank while it was read")
		}
		return err
	case unix.S_IFLNK:
		target, err := readlinkat(dirfd, name)
		if err != nil {
			return err
		}
		x, err := pathXattrs(dirfd, name)
		if err != nil {
			return err
		}
		h := w.header(tar.TypeSymlink, p, &st, x)
		h.Linkname = target
		return w.tw.WriteHeader(h)
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO:
		x, err := pathXattrs(dirfd, name)
		if err != nil {
			return err
		}
		t := map[uint32]byte{unix.S_IFCHR: tar.TypeChar, unix.S_IFBLK: tar.TypeBlock, unix.S_IFIFO: tar.TypeFifo}[typ]
		h := w.header(t, p, &st, x)
		if typ != unix.S_IFIFO {
			h.Devmajor, h.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		}
		return w.tw.WriteHeader(h)
	case unix.S_IFSOCK:
		return nil
	}
	return fmt.Errorf("file type %#o", typ)
}

// openChecked opens name in dirfd without following a symlink, and checks
// it is the file st describes (not one swapped in since).
func openChecked(dirfd int, name string, flags int, st *unix.Stat_t) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK|flags, 0)
	if err != nil {
		return -1, err
	}
	var got unix.Stat_t
	if err := unix.Fstat(fd, &got); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if got.Dev != st.Dev || got.Ino != st.Ino || got.Mode&unix.S_IFMT != st.Mode&unix.S_IFMT {
		unix.Close(fd)
		return -1, errors.New("changed while the tree was read")
	}
	return fd, nil
}

func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; size <= 1<<16; size *= 4 {
		b := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, b)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(b[:n]), nil
		}
	}
	return "", errors.New("symlink target too long")
}

// fdXattrs reads the xattrs of an open file.
func fdXattrs(fd int) (map[string]string, error) {
	return readXattrs(
		func(b []byte) (int, error) { return unix.Flistxattr(fd, b) },
		func(n string, b []byte) (int, error) { return unix.Fgetxattr(fd, n, b) })
}

// pathXattrs reads the xattrs of name in dirfd, not following it (through
// /proc/self/fd, as there is no *at form of lgetxattr).
func pathXattrs(dirfd int, name string) (map[string]string, error) {
	p := "/proc/self/fd/" + strconv.Itoa(dirfd) + "/" + name
	return readXattrs(
		func(b []byte) (int, error) { return unix.Llistxattr(p, b) },
		func(n string, b []byte) (int, error) { return unix.Lgetxattr(p, n, b) })
}

func readXattrs(list func([]byte) (int, error), get func(string, []byte) (int, error)) (map[string]string, error) {
	n, err := list(nil)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, fmt.Errorf("listxattr: %w", err)
	}
	if n == 0 {
		return nil, nil
	}
	b := make([]byte, n)
	if n, err = list(b); err != nil {
		return nil, fmt.Errorf("listxattr: %w", err)
	}
	out := map[string]string{}
	for _, name := range strings.Split(strings.TrimRight(string(b[:n]), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		sz, err := get(name, nil)
		if err != nil {
			if errors.Is(err, unix.ENODATA) {
				continue
			}
			return nil, fmt.Errorf("getxattr %s: %w", name, err)
		}
		v := make([]byte, sz)
		if sz, err = get(name, v); err != nil {
			return nil, fmt.Errorf("getxattr %s: %w", name, err)
		}
		out[name] = string(v[:sz])
	}
	return out, nil
}
