package image

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/warrenvm/warren/image/internal/tartest"
)

func configDigest(t *testing.T, img v1.Image) string {
	t.Helper()
	d, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func smallImage(t *testing.T, content string) v1.Image {
	return imageOf(t, v1.Config{Cmd: []string{"/bin/true"}}, layerOf(t, reg("file", content, 0o644)))
}

// platformIndex is an index of imgs, each under the platform it is given.
func platformIndex(imgs map[string]v1.Image) v1.ImageIndex {
	var adds []mutate.IndexAddendum
	for p, img := range imgs {
		plat, _ := v1.ParsePlatform(p)
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: plat}})
	}
	return mutate.AppendManifests(empty.Index, adds...)
}

func TestOpenLayout(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "lay")
	a, b := smallImage(t, "a"), smallImage(t, "b")
	if err := Pack(a, dir, "a"); err != nil {
		t.Fatal(err)
	}
	if err := Pack(b, dir, "b"); err != nil {
		t.Fatal(err)
	}
	for tag, want := range map[string]v1.Image{"a": a, "b": b} {
		img, err := Open(ctx, LayoutPrefix+dir+":"+tag, OpenOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got, w := configDigest(t, img), configDigest(t, want); got != w {
			t.Errorf("tag %s: %s, want %s", tag, got, w)
		}
	}
	// Pack replaces a tag.
	a2 := smallImage(t, "a2")
	if err := Pack(a2, dir, "a"); err != nil {
		t.Fatal(err)
	}
	if img, err := Open(ctx, LayoutPrefix+dir+":a", OpenOptions{}); err != nil || configDigest(t, img) != configDigest(t, a2) {
		t.Fatalf("replaced tag: %v", err)
	}
	for _, tc := range []struct{ ref, want string }{
		{LayoutPrefix + dir, "holds 2 images"},
		{LayoutPrefix + dir + ":c", `no image tagged "c"`},
		{LayoutPrefix + filepath.Join(dir, "nope"), "not an OCI layout"},
	} {
		if _, err := Open(ctx, tc.ref, OpenOptions{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%s) = %v, want an error with %q", tc.ref, err, tc.want)
		}
	}
	// One image: no tag needed.
	one := filepath.Join(t.TempDir(), "one")
	if err := Pack(a, one, "only"); err != nil {
		t.Fatal(err)
	}
	if img, err := Open(ctx, LayoutPrefix+one, OpenOptions{}); err != nil || configDigest(t, img) != configDigest(t, a) {
		t.Fatalf("untagged open of a one-image layout: %v", err)
	}
}

func TestOpenPlatforms(t *testing.T) {
	ctx := context.Background()
	amd, arm, s390 := smallImage(t, "amd64"), withPlatform(t, smallImage(t, "arm64"), "linux", "arm64"), withPlatform(t, smallImage(t, "s390x"), "linux", "s390x")
	dir := filepath.Join(t.TempDir(), "lay")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	add := func(tag string, v any) {
		t.Helper()
		var err error
		switch v := v.(type) {
		case v1.ImageIndex:
			err = p.AppendIndex(v, layout.WithAnnotations(map[string]string{RefNameAnnotation: tag}))
		case v1.Image:
			err = p.AppendImage(v, layout.WithAnnotations(map[string]string{RefNameAnnotation: tag}))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	add("multi", platformIndex(map[string]v1.Image{"linux/arm64": arm, "linux/amd64": amd}))
	add("noamd", platformIndex(map[string]v1.Image{"linux/arm64": arm, "linux/s390x": s390}))
	add("nested", mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: platformIndex(map[string]v1.Image{"linux/amd64": amd})}))
	add("arm", arm)
	for tag, want := range map[string]string{"multi": configDigest(t, amd), "nested": configDigest(t, amd)} {
		img, err := Open(ctx, LayoutPrefix+dir+":"+tag, OpenOptions{})
		if err != nil {
			t.Fatalf("%s: %v", tag, err)
		}
		if got := configDigest(t, img); got != want {
			t.Errorf("%s: picked %s, want the linux/amd64 image %s", tag, got, want)
		}
	}
	_, err = Open(ctx, LayoutPrefix+dir+":noamd", OpenOptions{})
	if err == nil || !strings.Contains(err.Error(), "no linux/amd64 image") || !strings.Contains(err.Error(), "linux/arm64") || !strings.Contains(err.Error(), "linux/s390x") {
		t.Errorf("an index without linux/amd64: %v", err)
	}
	if _, err := Open(ctx, LayoutPrefix+dir+":arm", OpenOptions{}); err == nil || !strings.Contains(err.Error(), "an image for linux/arm64") {
		t.Errorf("an arm64 image: %v", err)
	}
}

// blobPath is where a layout keeps a blob.
func blobPath(dir string, h v1.Hash) string { return filepath.Join(dir, "blobs", h.Algorithm, h.Hex) }

func TestOpenLayoutCorrupt(t *testing.T) {
	needE2fsprogs(t)
	ctx := context.Background()
	img := imageOf(t, v1.Config{}, layerOf(t, reg("a", strings.Repeat("a", 5000), 0o644)))
	m, _ := img.Manifest()
	fresh := func(t *testing.T) string {
		dir := filepath.Join(t.TempDir(), "lay")
		if err := Pack(img, dir, "x"); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	appendTo := func(p string, b []byte) {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.Write(b)
		f.Close()
	}
	flip := func(p string) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 0x55
		os.Chmod(p, 0o644)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("config longer than declared", func(t *testing.T) {
		dir := fresh(t)
		appendTo(blobPath(dir, m.Config.Digest), []byte("  "))
		if _, err := Open(ctx, LayoutPrefix+dir+":x", OpenOptions{}); err == nil || !strings.Contains(err.Error(), "its descriptor says") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("manifest altered", func(t *testing.T) {
		dir := fresh(t)
		d, _ := img.Digest()
		p := blobPath(dir, d)
		b, _ := os.ReadFile(p)
		alt := bytes.Replace(b, []byte("image.config.v1+json"), []byte("image.config.v2+json"), 1)
		if bytes.Equal(alt, b) {
			t.Fatalf("no config media type in %s", b)
		}
		os.WriteFile(p, alt, 0o644)
		if _, err := Open(ctx, LayoutPrefix+dir+":x", OpenOptions{}); err == nil || !strings.Contains(err.Error(), "digest mismatch") {
			t.Fatalf("got %v", err)
		}
	})
	// A bad layer opens (layers are read by the build) and fails the
	// build, which leaves nothing behind.
	for _, tc := range []struct {
		name    string
		corrupt func(path string)
		want    string
	}{
		{"layer longer than declared", func(p string) { appendTo(p, make([]byte, 100)) }, "longer than the"},
		{"layer altered", flip, "digest mismatch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := fresh(t)
			tc.corrupt(blobPath(dir, m.Layers[0].Digest))
			w := newWorld(t)
			limg, err := Open(ctx, LayoutPrefix+dir+":x", OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.build(t, limg, BuildOptions{}); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v", err)
			}
			w.checkUntouched(t)
		})
	}
}

func TestArchive(t *testing.T) {
	needE2fsprogs(t)
	ctx := context.Background()
	img := craftedImage(t)
	file := filepath.Join(t.TempDir(), "img.tar")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteArchive(f, img, "warren/upload:latest"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, ref := range []string{ArchivePrefix + file, ArchivePrefix + file + ":warren/upload:latest", ArchivePrefix + file + ":index.docker.io/warren/upload"} {
		openSame(t, ref, img, OpenOptions{})
	}
	got, _ := Open(ctx, ArchivePrefix+file, OpenOptions{})
	w := newWorld(t)
	b := w.mustBuild(t, got, BuildOptions{})
	if cat(t, b.Path, "/bin/sh") != "BUSYBOX" || b.Digest != configDigest(t, img) {
		t.Fatalf("base from the archive: %+v", b)
	}
	if _, err := Open(ctx, ArchivePrefix+file+":other/tag:1", OpenOptions{}); err == nil || !strings.Contains(err.Error(), `no image tagged "other/tag:1"`) {
		t.Fatalf("wrong tag: %v", err)
	}
	arm := filepath.Join(t.TempDir(), "arm.tar")
	f, _ = os.Create(arm)
	WriteArchive(f, withPlatform(t, smallImage(t, "x"), "linux", "arm64"), "")
	f.Close()
	if _, err := Open(ctx, ArchivePrefix+arm, OpenOptions{}); err == nil || !strings.Contains(err.Error(), "an image for linux/arm64") {
		t.Fatalf("arm64 archive: %v", err)
	}
}

// archiveOf writes a tar of the given files (in order).
func archiveOf(t *testing.T, files ...ent) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "a.tar")
	if err := os.WriteFile(p, tartest.Tar(t, files...), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestOpenArchiveRefuses(t *testing.T) {
	ctx := context.Background()
	man := func(cfg string, layers ...string) string {
		b, _ := json.Marshal([]tarball.Descriptor{{Config: cfg, RepoTags: []string{"a/b:c"}, Layers: layers}})
		return string(b)
	}
	two, _ := json.Marshal([]tarball.Descriptor{{Config: "c"}, {Config: "c"}})
	for _, tc := range []struct {
		name  string
		files []ent
		want  string
	}{
		{"no manifest", []ent{reg("x", "y", 0o644)}, "no manifest.json"},
		{"huge manifest", []ent{reg("manifest.json", strings.Repeat(" ", MaxManifestBytes+1), 0o644)}, "manifest.json of"},
		{"manifest is a link", []ent{symlink("manifest.json", "/etc/passwd")}, "not a file"},
		{"bad manifest", []ent{reg("manifest.json", "{", 0o644)}, "manifest.json:"},
		{"two images", []ent{reg("manifest.json", string(two), 0o644), reg("c", "{}", 0o644)}, "holds 2 images"},
		{"missing config", []ent{reg("manifest.json", man("cfg.json"), 0o644)}, `config "cfg.json": not in the archive`},
		{"huge config", []ent{reg("manifest.json", man("cfg.json"), 0o644), reg("cfg.json", strings.Repeat(" ", MaxConfigBytes+1), 0o644)}, "config of"},
		{"huge config first", []ent{reg("manifest.json", man("cfg.json"), 0o644), reg("cfg.json", strings.Repeat(" ", MaxConfigBytes+1), 0o644), reg("cfg.json", "{}", 0o644)}, "config of"},
		{"config link loop", []ent{reg("manifest.json", man("a"), 0o644), symlink("a", "b"), symlink("b", "a")}, "links"},
		{"missing layer", []ent{reg("manifest.json", man("cfg.json", "l.tar"), 0o644), reg("cfg.json", "{}", 0o644)}, `layer "l.tar": not in the archive`},
		{"layer is a directory", []ent{reg("manifest.json", man("cfg.json", "l"), 0o644), reg("cfg.json", "{}", 0o644), dir("l", 0o755)}, "not a file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Open(ctx, ArchivePrefix+archiveOf(t, tc.files...), OpenOptions{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// testRegistry serves go-containerregistry's registry on loopback; dial
// sends every registry connection to it, whatever the name.
func testRegistry(t *testing.T, tlsOn bool) (*httptest.Server, *http.Transport) {
	t.Helper()
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	var srv *httptest.Server
	if tlsOn {
		srv = httptest.NewUnstartedServer(h)
		srv.Config.ErrorLog = log.New(io.Discard, "", 0)
		srv.StartTLS()
	} else {
		srv = httptest.NewServer(h)
	}
	t.Cleanup(srv.Close)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if tlsOn {
		tr = srv.Client().Transport.(*http.Transport).Clone()
	}
	addr := srv.Listener.Addr().String()
	tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	return srv, tr
}

func push(t *testing.T, ref string, v any, tr http.RoundTripper, opts ...name.Option) {
	t.Helper()
	r, err := name.ParseReference(ref, opts...)
	if err != nil {
		t.Fatal(err)
	}
	switch v := v.(type) {
	case v1.Image:
		err = remote.Write(r, v, remote.WithTransport(tr))
	case v1.ImageIndex:
		err = remote.WriteIndex(r, v, remote.WithTransport(tr))
	}
	if err != nil {
		t.Fatal(err)
	}
}

func TestOpenRegistry(t *testing.T) {
	needE2fsprogs(t)
	ctx := context.Background()
	srv, tr := testRegistry(t, false)
	host := strings.TrimPrefix(srv.URL, "http://")
	img := craftedImage(t)
	push(t, host+"/test/crafted:1", img, tr)
	got, err := Open(ctx, host+"/test/crafted:1", OpenOptions{Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(t)
	b := w.mustBuild(t, got, BuildOptions{Ref: host + "/test/crafted:1"})
	if b.Digest != configDigest(t, img) || cat(t, b.Path, "/bin/busybox") != "NEW BUSYBOX" || b.Config.Ref != host+"/test/crafted:1" {
		t.Fatalf("base from the registry: %+v", b)
	}
	// By digest.
	d, _ := img.Digest()
	if got, err := Open(ctx, host+"/test/crafted@"+d.String(), OpenOptions{Transport: tr}); err != nil || configDigest(t, got) != configDigest(t, img) {
		t.Fatalf("by digest: %v", err)
	}
	// A multi-platform index.
	amd, arm := smallImage(t, "amd"), withPlatform(t, smallImage(t, "arm"), "linux", "arm64")
	push(t, host+"/test/multi:1", platformIndex(map[string]v1.Image{"linux/amd64": amd, "linux/arm64": arm}), tr)
	if got, err := Open(ctx, host+"/test/multi:1", OpenOptions{Transport: tr}); err != nil || configDigest(t, got) != configDigest(t, amd) {
		t.Fatalf("multi-platform index: %v", err)
	}
	push(t, host+"/test/armonly:1", platformIndex(map[string]v1.Image{"linux/arm64": arm}), tr)
	if _, err := Open(ctx, host+"/test/armonly:1", OpenOptions{Transport: tr}); err == nil || !strings.Contains(err.Error(), "no linux/amd64 image (it has linux/arm64)") {
		t.Fatalf("an index without linux/amd64: %v", err)
	}
	push(t, host+"/test/arm:1", arm, tr)
	if _, err := Open(ctx, host+"/test/arm:1", OpenOptions{Transport: tr}); err == nil || !strings.Contains(err.Error(), "an image for linux/arm64") {
		t.Fatalf("an arm64 image: %v", err)
	}
	if _, err := Open(ctx, host+"/test/absent:1", OpenOptions{Transport: tr}); err == nil {
		t.Fatal("an absent image opened")
	}
}

// openSame opens ref with opts and checks that it is img.
func openSame(t *testing.T, ref string, img v1.Image, opts OpenOptions) {
	t.Helper()
	got, err := Open(context.Background(), ref, opts)
	if err != nil {
		t.Fatalf("%s: %v", ref, err)
	}
	if configDigest(t, got) != configDigest(t, img) {
		t.Fatalf("%s: another image", ref)
	}
}

// TestOpenRegistryInsecure: a registry that is not on loopback is reached
// over plain HTTP only with Insecure.
func TestOpenRegistryInsecure(t *testing.T) {
	ctx := context.Background()
	_, tr := testRegistry(t, false)
	ref := "registry.warren.test:5000/test/img:1"
	img := smallImage(t, "x")
	push(t, ref, img, tr, name.Insecure)
	if _, err := Open(ctx, ref, OpenOptions{Transport: tr}); err == nil {
		t.Fatal("a plain-HTTP registry opened without Insecure")
	}
	openSame(t, ref, img, OpenOptions{Transport: tr, Insecure: true})
}

// TestOpenRegistryTLS: a registry over verified TLS (the test server's
// certificate names example.com).
func TestOpenRegistryTLS(t *testing.T) {
	ctx := context.Background()
	_, tr := testRegistry(t, true)
	ref := "example.com:443/test/img:1"
	img := smallImage(t, "tls")
	push(t, ref, img, tr)
	openSame(t, ref, img, OpenOptions{Transport: tr})
	// Without the server's CA the certificate does not verify.
	plain := http.DefaultTransport.(*http.Transport).Clone()
	plain.DialContext = tr.DialContext
	if _, err := Open(ctx, ref, OpenOptions{Transport: plain}); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("an unverified certificate: %v", err)
	}
}

func TestWriteArchiveTar(t *testing.T) {
	// The archive is a plain tar with manifest.json.
	var b bytes.Buffer
	if err := WriteArchive(&b, smallImage(t, "x"), ""); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&b)
	found := false
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if h.Name == "manifest.json" {
			raw, _ := io.ReadAll(tr)
			found = strings.Contains(string(raw), DefaultArchiveTag)
		}
	}
	if !found {
		t.Fatal("no manifest.json with the default tag")
	}
	if err := WriteArchive(io.Discard, smallImage(t, "x"), "Bad Tag!"); err == nil {
		t.Fatal("a bad tag was accepted")
	}
}
