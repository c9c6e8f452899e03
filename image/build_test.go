package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"

	"github.com/warrenvm/warren/guestinit/imageconfig"
	"github.com/warrenvm/warren/image/internal/tartest"
)

func needE2fsprogs(t *testing.T) {
	t.Helper()
	if _, err := (Tools{}).resolve(); err != nil {
		t.Skip(err)
	}
	if _, err := exec.LookPath("debugfs"); err != nil {
		t.Skip("debugfs not on PATH")
	}
}

// craftedImage has one of everything flatten handles, over four layers.
func craftedImage(t *testing.T) v1.Image {
	return imageOf(t, v1.Config{
		Env: []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}, WorkingDir: "srv/../app/", User: "1000:1000",
		Entrypoint: []string{"/bin/sh", "-c"}, Cmd: []string{"exec app"},
	},
		layerOf(t,
			dir("etc", 0o755), reg("etc/passwd", "root:x:0:0::/root:/bin/sh\n", 0o644), reg("etc/gone", "x", 0o644),
			dir("opq", 0o755), reg("opq/old", "old", 0o644), dir("opq/sub", 0o755), reg("opq/sub/deep", "d", 0o644),
			dir("bin", 0o755), reg("bin/busybox", "BUSYBOX", 0o755), hardlink("bin/sh", "bin/busybox"),
			symlink("lib", "usr/lib"), dir("usr", 0o755), dir("usr/lib", 0o755),
			reg("flip", "first a file", 0o644),
			ent{H: tar.Header{Typeflag: tar.TypeReg, Name: "usr/bin/sudo", Mode: 0o4755, Size: 4, ModTime: testTime}, Data: "sudo"},
			ent{H: tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777, ModTime: testTime}},
			ent{H: tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Mode: 0o666, Devmajor: 1, Devminor: 3, ModTime: testTime}},
			ent{H: tar.Header{Typeflag: tar.TypeBlock, Name: "dev/vdb", Mode: 0o660, Gid: 6, Devmajor: 254, Devminor: 16, ModTime: testTime}},
			ent{H: tar.Header{Typeflag: tar.TypeFifo, Name: "run/initctl", Mode: 0o600, ModTime: testTime}},
		),
		layerOf(t,
			reg("etc/.wh.gone", "", 0o644),
			reg("opq/.wh..wh..opq", "", 0o644), reg("opq/new", "new", 0o600),
			hardlink("usr/bin/sh2", "bin/sh"),
			dir("flip", 0o750), reg("flip/inside", "in a dir now", 0o644),
			ent{H: tar.Header{Typeflag: tar.TypeReg, Name: "home/user/.profile", Mode: 0o640, Uid: 1000, Gid: 1000, Size: 5, ModTime: testTime}, Data: "umask"},
			ent{H: tar.Header{Typeflag: tar.TypeReg, Name: "usr/bin/ping", Mode: 0o755, Size: 4, ModTime: testTime,
				PAXRecords: map[string]string{"SCHILY.xattr.security.capability": "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00", "SCHILY.xattr.user.note": "hi"}}, Data: "ping"},
		),
		// The busybox path is replaced: its links keep the old file.
		layerOf(t, reg("bin/busybox", "NEW BUSYBOX", 0o755), reg(".warren/image.json", `{"evil":1}`, 0o666)),
		layerOf(t, reg("flip", "a file again", 0o600)),
	)
}

func TestBuildContent(t *testing.T) {
	needE2fsprogs(t)
	w := newWorld(t)
	img := craftedImage(t)
	var steps []string
	b := w.mustBuild(t, img, BuildOptions{Ref: "test/crafted:1", Progress: func(p Progress) {
		if len(steps) == 0 || steps[len(steps)-1] != p.Step {
			steps = append(steps, p.Step)
		}
	}})
	if want := []string{"fetching", "formatting", "done"}; !slices.Contains(steps, want[0]) || !slices.Contains(steps, want[1]) || steps[len(steps)-1] != "done" {
		t.Errorf("progress steps %v", steps)
	}
	if b.Cached || b.Layers != 4 || b.DiskBytes != testDisk {
		t.Errorf("base %+v", b)
	}
	d, _ := img.ConfigName()
	if b.Digest != d.String() {
		t.Errorf("digest %s, want %s", b.Digest, d)
	}
	fi, err := os.Stat(b.Path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o444 || fi.Size() != testDisk {
		t.Errorf("base file mode %v size %d", fi.Mode(), fi.Size())
	}
	fsck(t, b.Path)
	p := b.Path

	check := func(path string, want fileInfo) {
		t.Helper()
		got := stat(t, p, path)
		if got == nil {
			t.Errorf("%s: missing", path)
			return
		}
		for _, f := range []struct{ name, got, want string }{
			{"type", got.typ, want.typ}, {"mode", got.mode, want.mode}, {"uid", got.uid, want.uid}, {"gid", got.gid, want.gid},
			{"size", got.size, want.size}, {"links", got.links, want.links}, {"target", got.target, want.target}, {"dev", got.dev, want.dev},
		} {
			if f.want != "" && f.got != f.want {
				t.Errorf("%s: %s %q, want %q", path, f.name, f.got, f.want)
			}
		}
		for k, v := range want.xattrs {
			if got.xattrs[k] != v {
				t.Errorf("%s: xattr %s = %q, want %q (all: %v)", path, k, got.xattrs[k], v, got.xattrs)
			}
		}
	}
	check("/etc/passwd", fileInfo{typ: "regular", mode: "0644", uid: "0", gid: "0", size: "26", mtime: "0x6553f100"})
	check("/usr/bin/sudo", fileInfo{typ: "regular", mode: "04755"})
	check("/tmp", fileInfo{typ: "directory", mode: "01777"})
	check("/dev/null", fileInfo{typ: "character special", mode: "0666", dev: "01:03"})
	check("/dev/vdb", fileInfo{typ: "block special", mode: "0660", gid: "6", dev: "254:16"})
	check("/run/initctl", fileInfo{typ: "FIFO", mode: "0600"})
	check("/lib", fileInfo{typ: "symlink", target: "usr/lib"})
	check("/home/user/.profile", fileInfo{typ: "regular", mode: "0640", uid: "1000", gid: "1000"})
	check("/usr/bin/ping", fileInfo{typ: "regular", xattrs: map[string]string{"user.note": `"hi"`}})
	if x := debugfs(t, p, "ea_list /usr/bin/ping"); !strings.Contains(x, "security.capability (20)") {
		t.Errorf("ea_list /usr/bin/ping: %s", x)
	}
	// Whiteouts, opaque directories, replaced paths.
	if got := ls(t, p, "/etc"); !slices.Equal(got, []string{"passwd"}) {
		t.Errorf("/etc holds %v", got)
	}
	if got := ls(t, p, "/opq"); !slices.Equal(got, []string{"new"}) {
		t.Errorf("opaque /opq holds %v", got)
	}
	check("/flip", fileInfo{typ: "regular", mode: "0600"})
	if got := cat(t, p, "/flip"); got != "a file again" {
		t.Errorf("/flip holds %q", got)
	}
	// Hard links: bin/sh and usr/bin/sh2 share the old busybox inode.
	sh, sh2, bb := stat(t, p, "/bin/sh"), stat(t, p, "/usr/bin/sh2"), stat(t, p, "/bin/busybox")
	if sh == nil || sh2 == nil || bb == nil || sh.ino != sh2.ino || sh.links != "2" || bb.ino == sh.ino {
		t.Errorf("hard links: sh %+v sh2 %+v busybox %+v", sh, sh2, bb)
	}
	if got := cat(t, p, "/bin/sh"); got != "BUSYBOX" {
		t.Errorf("/bin/sh holds %q, want the old busybox", got)
	}
	if got := cat(t, p, "/bin/busybox"); got != "NEW BUSYBOX" {
		t.Errorf("/bin/busybox holds %q", got)
	}
	// Warren's own file, and nothing else under /.warren.
	if got := ls(t, p, "/.warren"); !slices.Equal(got, []string{"image.json"}) {
		t.Errorf("/.warren holds %v", got)
	}
	check("/.warren/image.json", fileInfo{typ: "regular", mode: "0444", uid: "0", gid: "0"})
	gc, err := imageconfig.Parse([]byte(cat(t, p, imageconfig.Path)))
	if err != nil {
		t.Fatal(err)
	}
	if gc.WorkingDir != "/app" || gc.User != "1000:1000" || gc.Ref != "test/crafted:1" || gc.Digest != b.Digest ||
		!slices.Equal(gc.Env, []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}) || !slices.Equal(gc.Argv(), []string{"/bin/sh", "-c", "exec app"}) {
		t.Errorf("image.json: %+v", gc)
	}
	if !slices.Equal(b.Config.Env, gc.Env) || b.Config.WorkingDir != gc.WorkingDir {
		t.Errorf("Base.Config %+v differs from image.json %+v", b.Config, gc)
	}
	// A normal writable file system with inodes to spare.
	sb := debugfs(t, p, "stats")
	features := ""
	for _, l := range strings.Split(sb, "\n") {
		if strings.HasPrefix(l, "Filesystem features:") {
			features = l
		}
	}
	for _, f := range []string{"has_journal", "dir_index", "extent"} {
		if !strings.Contains(features, f) {
			t.Errorf("superblock lacks %s: %s", f, features)
		}
	}
	if strings.Contains(features, "read-only") {
		t.Errorf("the file system is still read-only: %s", features)
	}
	if b.Inodes < testDisk/(16<<10) || b.FreeInodes < b.Inodes-100 {
		t.Errorf("inodes %d, free %d: want at least one per 16 KiB", b.Inodes, b.FreeInodes)
	}
	want := uuidFor(b.Key)
	if !strings.Contains(sb, want) {
		t.Errorf("UUID is not %s", want)
	}
	// Lookup and List see the same base.
	lb, err := w.store.Lookup(b.Key)
	if err != nil || lb.Path != b.Path || lb.Digest != b.Digest {
		t.Errorf("Lookup: %+v, %v", lb, err)
	}
	all, err := w.store.List()
	if err != nil || len(all) != 1 || all[0].Key != b.Key {
		t.Errorf("List: %v, %v", all, err)
	}
}

// TestBuildReproducible: the same image gives the same bytes.
func TestBuildReproducible(t *testing.T) {
	needE2fsprogs(t)
	img := craftedImage(t)
	var sums []string
	for range 2 {
		w := newWorld(t)
		b := w.mustBuild(t, img, BuildOptions{})
		f, err := os.Open(b.Path)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		io.Copy(h, f)
		f.Close()
		sums = append(sums, hex.EncodeToString(h.Sum(nil)))
	}
	if sums[0] != sums[1] {
		t.Fatalf("two builds differ: %s, %s", sums[0], sums[1])
	}
}

func TestBuildCompressions(t *testing.T) {
	needE2fsprogs(t)
	raw := tartest.Tar(t, reg("a", "plain", 0o644))
	var z bytes.Buffer
	zw, _ := zstd.NewWriter(&z)
	zw.Write(tartest.Tar(t, reg("b", "zstd", 0o644)))
	zw.Close()
	gz := layerOf(t, reg("c", "gzip", 0o644))
	plain := layerFromTar(t, raw, tarball.WithMediaType(types.OCIUncompressedLayer))
	zl := layerFromTar(t, z.Bytes(), tarball.WithMediaType(types.OCILayerZStd))
	w := newWorld(t)
	b := w.mustBuild(t, imageOf(t, v1.Config{}, uncompressedLayer{plain}, zl, gz), BuildOptions{})
	for p, want := range map[string]string{"/a": "plain", "/b": "zstd", "/c": "gzip"} {
		if got := cat(t, b.Path, p); got != want {
			t.Errorf("%s holds %q, want %q", p, got, want)
		}
	}
}

// uncompressedLayer serves a layer's uncompressed tar as its blob (an
// application/vnd.oci.image.layer.v1.tar layer).
type uncompressedLayer struct{ v1.Layer }

func (u uncompressedLayer) Compressed() (io.ReadCloser, error) { return u.Uncompressed() }
func (u uncompressedLayer) Digest() (v1.Hash, error)           { return u.DiffID() }
func (u uncompressedLayer) Size() (int64, error) {
	rc, err := u.Uncompressed()
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	return io.Copy(io.Discard, rc)
}
func (u uncompressedLayer) MediaType() (types.MediaType, error) {
	return types.OCIUncompressedLayer, nil
}

// TestBuildRefusesHostile: every hostile layer is refused with a clear
// error, and nothing is written outside the build directory.
func TestBuildRefusesHostile(t *testing.T) {
	needE2fsprogs(t)
	escape := filepath.Join(os.TempDir(), "warren-image-escape-"+randHex())
	rel := strings.Repeat("../", 20) + strings.TrimPrefix(escape, "/")
	for _, tc := range []struct {
		name   string
		layers [][]ent
		want   string
	}{
		{"dot-dot name", [][]ent{{reg(rel, "x", 0o644)}}, `".." component`},
		{"absolute dot-dot", [][]ent{{reg("/"+rel, "x", 0o644)}}, `".." component`},
		{"symlink parent out of the tree", [][]ent{{symlink("out", filepath.Dir(escape))}, {reg("out/"+filepath.Base(escape), "x", 0o644)}}, `parent "out" is a symlink`},
		{"symlink parent in the tree", [][]ent{{dir("etc", 0o755), symlink("e", "etc"), reg("e/shadow", "x", 0o644)}}, `parent "e" is a symlink`},
		{"hard link out of the tree", [][]ent{{hardlink("passwd", "../../../../etc/passwd")}}, `".." component`},
		{"hard link to an absent file", [][]ent{{hardlink("passwd", "/etc/passwd")}}, "does not exist"},
		{"file then children", [][]ent{{reg("f", "x", 0o644)}, {reg("f/child", "x", 0o644)}}, `parent "f" is not a directory`},
		{"long name", [][]ent{{reg(strings.Repeat("a/", 2100)+"b", "x", 0o644)}}, "more than 4096"},
		{"long component", [][]ent{{reg(strings.Repeat("n", 300), "x", 0o644)}}, "component of 300 bytes"},
		{"oversized xattr", [][]ent{{ent{H: tar.Header{Typeflag: tar.TypeReg, Name: "x", PAXRecords: map[string]string{"SCHILY.xattr.user.a": strings.Repeat("v", 5000)}}}}}, "xattrs of more than"},
		{"acl", [][]ent{{ent{H: tar.Header{Typeflag: tar.TypeReg, Name: "x", PAXRecords: map[string]string{"SCHILY.xattr.system.posix_acl_access": "v"}}}}}, "ACLs"},
		{"odd entry type", [][]ent{{ent{H: tar.Header{Typeflag: 'V', Name: "volume"}}}}, "tar entry type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			var ls []v1.Layer
			for _, l := range tc.layers {
				ls = append(ls, layerOf(t, l...))
			}
			_, err := w.build(t, imageOf(t, v1.Config{}, ls...), BuildOptions{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
			w.checkUntouched(t)
			if _, err := os.Lstat(escape); err == nil {
				os.RemoveAll(escape)
				t.Fatalf("%s was written", escape)
			}
		})
	}
	t.Run("too many entries", func(t *testing.T) {
		var ents []ent
		for i := range 1001 {
			ents = append(ents, reg(fmt.Sprintf("d%d/%d", i/100, i), "", 0o644))
		}
		w := newWorld(t)
		_, err := w.build(t, imageOf(t, v1.Config{}, layerOf(t, ents...)), BuildOptions{MaxEntries: 1000})
		if err == nil || !strings.Contains(err.Error(), "more than 1000 entries") {
			t.Fatalf("got %v", err)
		}
		w.checkUntouched(t)
	})
}

// imageWithManifest serves another manifest for a real image (what a
// hostile registry or layout could say), with LayerByDigest following it.
type imageWithManifest struct {
	v1.Image
	m      *v1.Manifest
	layers map[v1.Hash]v1.Layer
}

func (i imageWithManifest) Manifest() (*v1.Manifest, error)           { return i.m, nil }
func (i imageWithManifest) LayerByDigest(h v1.Hash) (v1.Layer, error) { return i.layers[h], nil }

// lying returns img with its manifest's layer descriptors changed by
// edit.
func lying(t *testing.T, img v1.Image, edit func(d *v1.Descriptor)) v1.Image {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	m = m.DeepCopy()
	layers := map[v1.Hash]v1.Layer{}
	for i := range m.Layers {
		l, err := img.LayerByDigest(m.Layers[i].Digest)
		if err != nil {
			t.Fatal(err)
		}
		edit(&m.Layers[i])
		layers[m.Layers[i].Digest] = l
	}
	return imageWithManifest{Image: img, m: m, layers: layers}
}

func TestBuildRefusesBadBlobs(t *testing.T) {
	needE2fsprogs(t)
	img := imageOf(t, v1.Config{}, layerOf(t, reg("a", strings.Repeat("x", 10000), 0o644)))
	for _, tc := range []struct {
		name string
		img  v1.Image
		opts BuildOptions
		want string
	}{
		{"digest mismatch", lying(t, img, func(d *v1.Descriptor) { d.Digest.Hex = strings.Repeat("0", 64) }), BuildOptions{}, "digest mismatch"},
		{"longer than declared", lying(t, img, func(d *v1.Descriptor) { d.Size -= 10 }), BuildOptions{}, "longer than the"},
		{"shorter than declared", lying(t, img, func(d *v1.Descriptor) { d.Size += 10 }), BuildOptions{}, "the manifest declares"},
		{"unknown media type", lying(t, img, func(d *v1.Descriptor) { d.MediaType = "application/x-evil" }), BuildOptions{}, "not a layer type"},
		{"gzip bomb", imageOf(t, v1.Config{}, layerOf(t, reg("zeros", strings.Repeat("\x00", 8<<20), 0o644))), BuildOptions{MaxUncompressed: 1 << 20}, "more than 1048576 bytes (the MaxUncompressed limit)"},
		{"blobs larger than the limit", imageOf(t, v1.Config{}, layerOf(t, reg("noise", randomString(t, 2<<20), 0o644))), BuildOptions{MaxUncompressed: 100}, "uncompressed limit"},
		{"diff_id mismatch", wrongDiffID(t, img), BuildOptions{}, "diff_id mismatch"},
		{"arm64", withPlatform(t, img, "linux", "arm64"), BuildOptions{}, "an image for linux/arm64"},
		{"windows", withPlatform(t, img, "windows", "amd64"), BuildOptions{}, "an image for windows/amd64"},
		{"disk too small", imageOf(t, v1.Config{}, layerOf(t, reg("big", strings.Repeat("b", 80<<20), 0o644))), BuildOptions{DiskBytes: 64 << 20}, "too small for this image"},
		{"disk size out of range", img, BuildOptions{DiskBytes: 1 << 20}, "want 67108864 to"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			_, err := w.build(t, tc.img, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
			w.checkUntouched(t)
		})
	}
}

func randomString(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// wrongDiffID is img with a config whose diff_id does not match its layer.
func wrongDiffID(t *testing.T, img v1.Image) v1.Image {
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.RootFS.DiffIDs[0].Hex = strings.Repeat("1", 64)
	out, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestStoreCache(t *testing.T) {
	needE2fsprogs(t)
	w := newWorld(t)
	img := imageOf(t, v1.Config{}, layerOf(t, reg("a", "x", 0o644)))
	b1 := w.mustBuild(t, img, BuildOptions{})
	fi1, _ := os.Stat(b1.Path)
	b2 := w.mustBuild(t, img, BuildOptions{})
	fi2, _ := os.Stat(b2.Path)
	if b1.Cached || !b2.Cached || b1.Key != b2.Key || b1.Path != b2.Path || !os.SameFile(fi1, fi2) || !fi1.ModTime().Equal(fi2.ModTime()) {
		t.Fatalf("second build: %+v after %+v", b2, b1)
	}
	// Another size is another base.
	b3 := w.mustBuild(t, img, BuildOptions{DiskBytes: 2 * testDisk})
	if b3.Cached || b3.Key == b1.Key || b3.DiskBytes != 2*testDisk {
		t.Fatalf("another size: %+v", b3)
	}
	if all, _ := w.store.List(); len(all) != 2 {
		t.Fatalf("List: %d bases", len(all))
	}
	if err := w.store.Remove(b3.Key); err != nil {
		t.Fatal(err)
	}
	if _, err := w.store.Lookup(b3.Key); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Lookup after Remove: %v", err)
	}
	if err := w.store.Remove(b3.Key); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("second Remove: %v", err)
	}
	if err := w.store.Remove("../../etc"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Remove of a bad key: %v", err)
	}
	l, err := tryLock(w.store.lockPath(b1.Key))
	if err != nil || l == nil {
		t.Fatal(err)
	}
	if err := w.store.Remove(b1.Key); !errors.Is(err, ErrBusy) {
		t.Fatalf("Remove of a locked key: %v", err)
	}
	l.Close()
	if all, _ := w.store.List(); len(all) != 1 {
		t.Fatalf("List: %d bases", len(all))
	}
}

func TestStoreConcurrentBuilds(t *testing.T) {
	needE2fsprogs(t)
	w := newWorld(t)
	img := craftedImage(t)
	// Two other processes and four goroutines build the same image,
	// through an OCI layout the processes can read.
	lay := filepath.Join(w.parent, "layout")
	if err := Pack(img, lay, "x"); err != nil {
		t.Fatal(err)
	}
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for range 2 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperBuild$")
		cmd.Env = append(os.Environ(), "WARREN_IMAGE_HELPER=build", "WARREN_IMAGE_LAYOUT="+lay+":x", "WARREN_IMAGE_STORE="+w.store.Dir)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds, outs = append(cmds, cmd), append(outs, &out)
	}
	limg, err := Open(context.Background(), LayoutPrefix+lay+":x", OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		results []string
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := w.build(t, limg, BuildOptions{})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				results = append(results, "error: "+err.Error())
				return
			}
			results = append(results, fmt.Sprintf("cached=%v key=%s", b.Cached, b.Key))
		}()
	}
	wg.Wait()
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatalf("helper process: %v: %s", err, outs[i])
		}
		for _, l := range strings.Split(outs[i].String(), "\n") {
			if strings.HasPrefix(l, "cached=") {
				results = append(results, l)
			}
		}
	}
	built := 0
	for _, r := range results {
		if strings.HasPrefix(r, "error") {
			t.Fatal(r)
		}
		if strings.HasPrefix(r, "cached=false") {
			built++
		}
	}
	if len(results) != 6 || built != 1 {
		t.Fatalf("six builds, %d of them built: %v", built, results)
	}
	if ents, _ := os.ReadDir(filepath.Join(w.store.Dir, "tmp")); len(ents) != 0 {
		t.Fatalf("store/tmp holds %d entries", len(ents))
	}
}

// TestHelperBuild is run by other tests as a separate process.
func TestHelperBuild(t *testing.T) {
	switch os.Getenv("WARREN_IMAGE_HELPER") {
	case "build", "die":
	default:
		t.Skip("a helper process of other tests")
	}
	img, err := Open(context.Background(), LayoutPrefix+os.Getenv("WARREN_IMAGE_LAYOUT"), OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := &Store{Dir: os.Getenv("WARREN_IMAGE_STORE")}
	opts := BuildOptions{DiskBytes: testDisk}
	if os.Getenv("WARREN_IMAGE_HELPER") == "die" {
		opts.Progress = func(p Progress) {
			if p.Step == "formatting" {
				// Killed mid-build, as by the OOM killer.
				p, _ := os.FindProcess(os.Getpid())
				p.Kill()
				select {}
			}
		}
	}
	b, err := s.Build(context.Background(), img, opts)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("cached=%v key=%s\n", b.Cached, b.Key)
}

func TestBuildInterrupted(t *testing.T) {
	needE2fsprogs(t)
	w := newWorld(t)
	img := craftedImage(t)
	for _, step := range []string{"fetching", "reading", "unpacking", "formatting"} {
		t.Run("cancelled at "+step, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, err := w.store.Build(ctx, img, BuildOptions{DiskBytes: testDisk, Progress: func(p Progress) {
				if p.Step == step {
					cancel()
				}
			}})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("got %v, want context.Canceled", err)
			}
			if all, _ := w.store.List(); len(all) != 0 {
				t.Fatalf("a cancelled build left %d bases", len(all))
			}
			if ents, _ := os.ReadDir(filepath.Join(w.store.Dir, "tmp")); len(ents) != 0 {
				t.Fatalf("a cancelled build left %d entries in store/tmp", len(ents))
			}
		})
	}
	t.Run("process killed", func(t *testing.T) {
		lay := filepath.Join(w.parent, "layout")
		if err := Pack(img, lay, "x"); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperBuild$")
		cmd.Env = append(os.Environ(), "WARREN_IMAGE_HELPER=die", "WARREN_IMAGE_LAYOUT="+lay+":x", "WARREN_IMAGE_STORE="+w.store.Dir)
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("the helper was not killed: %s", out)
		}
		left, _ := os.ReadDir(filepath.Join(w.store.Dir, "tmp"))
		if len(left) != 1 {
			t.Fatalf("the killed build left %d entries in store/tmp (want its build directory)", len(left))
		}
		if all, _ := w.store.List(); len(all) != 0 {
			t.Fatalf("a killed build left %d bases", len(all))
		}
		b := w.mustBuild(t, img, BuildOptions{})
		if b.Cached {
			t.Fatal("the base after a killed build is Cached")
		}
		fsck(t, b.Path)
		if ents, _ := os.ReadDir(filepath.Join(w.store.Dir, "tmp")); len(ents) != 0 {
			t.Fatalf("store/tmp still holds %d entries", len(ents))
		}
	})
}

// BenchmarkBuildCached is a Build that finds its base (a Lookup).
func BenchmarkBuildCached(b *testing.B) {
	if _, err := (Tools{}).resolve(); err != nil {
		b.Skip(err)
	}
	w := newWorld(b)
	img := imageOf(b, v1.Config{}, layerOf(b, reg("a", "x", 0o644)))
	w.mustBuild(b, img, BuildOptions{})
	b.ResetTimer()
	for b.Loop() {
		if base := w.mustBuild(b, img, BuildOptions{}); !base.Cached {
			b.Fatal("not cached")
		}
	}
}

// TestJournalBytes: e2fsprogs' default journal sizes, at the edges of
// each row of journalSizes.
func TestJournalBytes(t *testing.T) {
	const blk = 4096
	for _, tc := range []struct{ blocks, journal int64 }{
		{0, 1024}, {32767, 1024}, {32768, 4096}, {256*1024 - 1, 4096}, {256 * 1024, 8192},
		{512 * 1024, 16384}, {4096 * 1024, 32768}, {8192 * 1024, 65536}, {16384 * 1024, 131072},
		{32768*1024 - 1, 131072}, {32768 * 1024, 262144}, {1 << 40, 262144},
	} {
		if got := journalBytes(tc.blocks * blk); got != tc.journal*blk {
			t.Errorf("journalBytes(%d blocks) = %d blocks, want %d", tc.blocks, got/blk, tc.journal)
		}
	}
}
