package image

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/warrenvm/warren/image/internal/tartest"
)

// testDisk is the disk size the tests build (small: quick to check).
const testDisk = 128 << 20

// ent is one entry of a crafted layer.
type ent = tartest.Ent

var testTime = time.Unix(1700000000, 0)

func reg(name, data string, mode int64) ent {
	return ent{H: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: testTime}, Data: data}
}
func dir(name string, mode int64) ent {
	return ent{H: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, ModTime: testTime}}
}
func symlink(name, target string) ent {
	return ent{H: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: testTime}}
}
func hardlink(name, target string) ent {
	return ent{H: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, ModTime: testTime}}
}

// layerOf is a gzip layer of the entries.
func layerOf(t testing.TB, ents ...ent) v1.Layer {
	t.Helper()
	return layerFromTar(t, tartest.Tar(t, ents...))
}

func layerFromTar(t testing.TB, b []byte, opts ...tarball.LayerOption) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// imageOf is an image of the layers, with a linux/amd64 config and cfg.
func imageOf(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON), layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", "amd64", cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// withPlatform is img with its config's platform replaced.
func withPlatform(t testing.TB, img v1.Image, os, arch string) v1.Image {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = os, arch
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// world is a test's directories: a store under parent, and a sentinel
// directory beside it that no build may touch.
type world struct {
	parent, sentinel string
	store            *Store
}

func newWorld(t testing.TB) *world {
	t.Helper()
	parent := t.TempDir()
	w := &world{parent: parent, sentinel: filepath.Join(parent, "sentinel"), store: &Store{Dir: filepath.Join(parent, "store")}}
	if err := os.Mkdir(w.sentinel, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(w.sentinel, "keep"), []byte("sentinel"), 0o644); err != nil {
		t.Fatal(err)
	}
	return w
}

func (w *world) build(t testing.TB, img v1.Image, opts BuildOptions) (*Base, error) {
	t.Helper()
	if opts.DiskBytes == 0 {
		opts.DiskBytes = testDisk
	}
	return w.store.Build(context.Background(), img, opts)
}

func (w *world) mustBuild(t testing.TB, img v1.Image, opts BuildOptions) *Base {
	t.Helper()
	b, err := w.build(t, img, opts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkUntouched fails unless the parent holds only the store and the
// sentinel, the sentinel is as made, and the store has no base and no
// leftover build.
func (w *world) checkUntouched(t testing.TB) {
	t.Helper()
	ents, err := os.ReadDir(w.parent)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != "sentinel,store" && strings.Join(names, ",") != "sentinel" {
		t.Errorf("the build directory's parent holds %v", names)
	}
	sents, _ := os.ReadDir(w.sentinel)
	if len(sents) != 1 {
		t.Errorf("the sentinel directory holds %d entries", len(sents))
	}
	if b, _ := os.ReadFile(filepath.Join(w.sentinel, "keep")); string(b) != "sentinel" {
		t.Errorf("the sentinel file holds %q", b)
	}
	for _, d := range []string{"bases", "tmp"} {
		if ents, _ := os.ReadDir(filepath.Join(w.store.Dir, d)); len(ents) != 0 {
			t.Errorf("store/%s holds %d entries after a failed build", d, len(ents))
		}
	}
}

// debugfs runs a read-only debugfs request on an ext4 image.
func debugfs(t testing.TB, img, req string) string {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", req, img).CombinedOutput()
	if err != nil {
		t.Fatalf("debugfs -R %q: %v: %s", req, err, out)
	}
	s := string(out)
	if i := strings.IndexByte(s, '\n'); i >= 0 && strings.HasPrefix(s, "debugfs ") {
		s = s[i+1:]
	}
	return s
}

// fileInfo is what debugfs stat says of a path.
type fileInfo struct {
	typ, mode          string
	ino, uid, gid      string
	size, links, mtime string
	target, dev        string
	xattrs             map[string]string
}

var (
	statInode  = regexp.MustCompile(`Inode: (\d+)\s+Type: (.+?)\s+Mode:\s+(\d+)`)
	statUser   = regexp.MustCompile(`User:\s+(\d+)\s+Group:\s+(\d+)\s+(?:Project:\s+\d+\s+)?Size: (\d+)`)
	statLinks  = regexp.MustCompile(`Links: (\d+)`)
	statMtime  = regexp.MustCompile(`mtime: (0x[0-9a-f]+)`)
	statTarget = regexp.MustCompile(`Fast link dest: "(.*)"`)
	statDev    = regexp.MustCompile(`Device major/minor number: (\S+)`)
	statXattr  = regexp.MustCompile(`^\s+(\S+) \(\d+\) = (.*)$`)
)

func stat(t testing.TB, img, p string) *fileInfo {
	t.Helper()
	out := debugfs(t, img, "stat "+p)
	m := statInode.FindStringSubmatch(out)
	if m == nil {
		return nil
	}
	fi := &fileInfo{ino: m[1], typ: m[2], mode: m[3], xattrs: map[string]string{}}
	if u := statUser.FindStringSubmatch(out); u != nil {
		fi.uid, fi.gid, fi.size = u[1], u[2], u[3]
	}
	if l := statLinks.FindStringSubmatch(out); l != nil {
		fi.links = l[1]
	}
	if l := statMtime.FindStringSubmatch(out); l != nil {
		fi.mtime = l[1]
	}
	if l := statTarget.FindStringSubmatch(out); l != nil {
		fi.target = l[1]
	}
	if l := statDev.FindStringSubmatch(out); l != nil {
		fi.dev = l[1]
	}
	inX := false
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "Extended attributes:") {
			inX = true
			continue
		}
		if inX {
			x := statXattr.FindStringSubmatch(l)
			if x == nil {
				inX = false
				continue
			}
			fi.xattrs[x[1]] = x[2]
		}
	}
	return fi
}

// ls lists a directory's names (without . and ..), sorted.
func ls(t testing.TB, img, p string) []string {
	t.Helper()
	out := debugfs(t, img, "ls "+p)
	var names []string
	for _, f := range strings.Fields(out) {
		// "ls" prints "INODE (RECLEN) NAME" triples.
		names = append(names, f)
	}
	var out2 []string
	for i := 2; i < len(names); i += 3 {
		if n := names[i]; n != "." && n != ".." {
			out2 = append(out2, n)
		}
	}
	sort.Strings(out2)
	return out2
}

func cat(t testing.TB, img, p string) string {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", "cat "+p, img).Output()
	if err != nil {
		t.Fatalf("debugfs cat %s: %v", p, err)
	}
	return string(out)
}

// fsck fails unless e2fsck finds the image clean.
func fsck(t testing.TB, img string) {
	t.Helper()
	if out, err := exec.Command("e2fsck", "-fn", img).CombinedOutput(); err != nil {
		t.Fatalf("e2fsck -fn: %v: %s", err, out)
	}
}
