package image

import (
	"archive/tar"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// makeTree makes a root file system with one of everything FromRootfs
// keeps (device nodes and other owners need root).
func makeTree(t *testing.T) (root string, xattrs bool) {
	t.Helper()
	root = filepath.Join(t.TempDir(), "root")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"etc", "bin", "tmp", "dev", "home/user"} {
		must(os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	must(os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\n"), 0o644))
	must(os.WriteFile(filepath.Join(root, "bin/prog"), []byte("PROG"), 0o755))
	must(unix.Chmod(filepath.Join(root, "bin/prog"), 0o4755))
	must(os.Link(filepath.Join(root, "bin/prog"), filepath.Join(root, "bin/hard")))
	must(unix.Chmod(filepath.Join(root, "tmp"), 0o1777))
	must(os.Symlink("/etc/passwd", filepath.Join(root, "abs-link")))
	// A symlink out of the tree: stored as a symlink, never followed.
	must(os.Symlink("../../../../../../etc", filepath.Join(root, "escape")))
	must(unix.Mkfifo(filepath.Join(root, "fifo"), 0o600))
	mt := time.Unix(1600000000, 0)
	must(os.Chtimes(filepath.Join(root, "etc/passwd"), mt, mt))
	if err := unix.Setxattr(filepath.Join(root, "etc/passwd"), "user.test", []byte("value"), 0); err == nil {
		xattrs = true
	} else if !errors.Is(err, unix.ENOTSUP) {
		t.Fatal(err)
	}
	// A socket is left out.
	l, err := net.Listen("unix", filepath.Join(root, "sock"))
	must(err)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	if os.Geteuid() == 0 {
		must(unix.Mknod(filepath.Join(root, "dev/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
		must(unix.Chmod(filepath.Join(root, "dev/null"), 0o666))
		must(os.WriteFile(filepath.Join(root, "home/user/.profile"), []byte("x"), 0o640))
		must(os.Lchown(filepath.Join(root, "home/user/.profile"), 1000, 1001))
		must(os.Lchown(filepath.Join(root, "home/user"), 1000, 1001))
	}
	return root, xattrs
}

func TestFromRootfs(t *testing.T) {
	needE2fsprogs(t)
	root, xattrs := makeTree(t)
	img, err := FromRootfs(root)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil || cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Fatalf("config %+v, %v", cf, err)
	}
	// The same tree gives the same image.
	img2, _ := FromRootfs(root)
	if configDigest(t, img) != configDigest(t, img2) {
		t.Fatal("two reads of one tree differ")
	}
	// The layer's tar: sorted, no socket, the hard link a link.
	ls, _ := img.Layers()
	rc, _ := ls[0].Uncompressed()
	tr := tar.NewReader(rc)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		// Entries are in sorted order: bin/hard is the file's first name.
		if h.Name == "bin/hard" && h.Typeflag != tar.TypeReg || h.Name == "bin/prog" && (h.Typeflag != tar.TypeLink || h.Linkname != "bin/hard") {
			t.Errorf("%s: type %q link %q", h.Name, h.Typeflag, h.Linkname)
		}
	}
	rc.Close()
	if slices.Contains(names, "sock") || len(names) == 0 || names[0] != "./" {
		t.Errorf("layer entries %v", names)
	}

	w := newWorld(t)
	b := w.mustBuild(t, img, BuildOptions{})
	p := b.Path
	fsck(t, p)
	if fi := stat(t, p, "/bin/prog"); fi == nil || fi.mode != "04755" || fi.links != "2" {
		t.Errorf("/bin/prog: %+v", fi)
	}
	if a, c := stat(t, p, "/bin/prog"), stat(t, p, "/bin/hard"); a == nil || c == nil || a.ino != c.ino {
		t.Errorf("hard link lost: %+v %+v", a, c)
	}
	if fi := stat(t, p, "/tmp"); fi == nil || fi.mode != "01777" {
		t.Errorf("/tmp: %+v", fi)
	}
	if fi := stat(t, p, "/escape"); fi == nil || fi.typ != "symlink" || fi.target != "../../../../../../etc" {
		t.Errorf("/escape: %+v", fi)
	}
	if fi := stat(t, p, "/abs-link"); fi == nil || fi.target != "/etc/passwd" {
		t.Errorf("/abs-link: %+v", fi)
	}
	if fi := stat(t, p, "/fifo"); fi == nil || fi.typ != "FIFO" || fi.mode != "0600" {
		t.Errorf("/fifo: %+v", fi)
	}
	if fi := stat(t, p, "/sock"); fi != nil {
		t.Errorf("/sock is in the image: %+v", fi)
	}
	fi := stat(t, p, "/etc/passwd")
	if fi == nil || fi.mtime != "0x5f5e1000" {
		t.Errorf("/etc/passwd: %+v", fi)
	}
	if v := fi.xattrs["user.test"]; xattrs && v != `"value"` {
		t.Errorf("/etc/passwd xattr user.test = %s", v)
	}
	if os.Geteuid() == 0 {
		if fi := stat(t, p, "/dev/null"); fi == nil || fi.dev != "01:03" || fi.mode != "0666" {
			t.Errorf("/dev/null: %+v", fi)
		}
		if fi := stat(t, p, "/home/user/.profile"); fi == nil || fi.uid != "1000" || fi.gid != "1001" || fi.mode != "0640" {
			t.Errorf("/home/user/.profile: %+v", fi)
		}
	}

	// The same tree as a tar file is the same image.
	tarPath := filepath.Join(t.TempDir(), "root.tar")
	f, err := os.Create(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	rc = treeTar(root)
	io.Copy(f, rc)
	rc.Close()
	f.Close()
	timg, err := FromRootfs(tarPath)
	if err != nil {
		t.Fatal(err)
	}
	if configDigest(t, timg) != configDigest(t, img) {
		t.Fatal("the tar of the tree gives another image")
	}
	if _, err := FromRootfs(filepath.Join(root, "fifo")); err == nil || !strings.Contains(err.Error(), "neither a directory nor a tar") {
		t.Fatalf("FromRootfs of a fifo: %v", err)
	}
}
