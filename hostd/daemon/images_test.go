package daemon

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/image"
	"github.com/warrenvm/warren/vmmctl"
)

func TestCheckImageRequest(t *testing.T) {
	d := &Daemon{cfg: Config{Registries: []string{"127.0.0.1:5000"}}}
	for _, tc := range []struct {
		name string
		req  wire.TemplateRequest
		want string // "" when valid
	}{
		{"no image", wire.TemplateRequest{Kernel: "/k"}, ""},
		{"registry", wire.TemplateRequest{Image: "registry.example/r/x:1"}, ""},
		{"upload", wire.TemplateRequest{Image: "upload:up-0123456789abcdef"}, ""},
		{"allowed insecure", wire.TemplateRequest{Image: "127.0.0.1:5000/x:1", InsecureRegistry: true}, ""},
		{"start and ready", wire.TemplateRequest{Image: "r/x", StartCmd: "s", ReadyCmd: "r", ReadyTimeoutS: 60, DiskMiB: 1024}, ""},
		{"image options without image", wire.TemplateRequest{Kernel: "/k", StartCmd: "s"}, "need an image"},
		{"host layout", wire.TemplateRequest{Image: "oci-layout:/etc"}, "does not read host paths"},
		{"host archive", wire.TemplateRequest{Image: "docker-archive:/root/x.tar"}, "does not read host paths"},
		{"bad upload id", wire.TemplateRequest{Image: "upload:../../etc/passwd"}, "bad upload id"},
		{"insecure upload", wire.TemplateRequest{Image: "upload:up-0123456789abcdef", InsecureRegistry: true}, "not uploads"},
		{"insecure unlisted", wire.TemplateRequest{Image: "10.0.0.1:5000/x", InsecureRegistry: true}, "not one the operator allows"},
		{"bad reference", wire.TemplateRequest{Image: "UPPER/Case::x"}, "image"},
		{"both starts", wire.TemplateRequest{Image: "r/x", StartCmd: "s", StartImageCmd: true}, "exclude each other"},
		{"ready without start", wire.TemplateRequest{Image: "r/x", ReadyCmd: "r"}, "needs a start command"},
		{"tiny disk", wire.TemplateRequest{Image: "r/x", DiskMiB: 10}, "disk_mib"},
		{"huge disk", wire.TemplateRequest{Image: "r/x", DiskMiB: maxImageDiskMiB + 1}, "disk_mib"},
		{"long ready timeout", wire.TemplateRequest{Image: "r/x", StartCmd: "s", ReadyTimeoutS: 7200}, "ready_timeout_s"},
		{"nul in start", wire.TemplateRequest{Image: "r/x", StartCmd: "a\x00b"}, "NUL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := d.checkImageRequest(&tc.req)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestPublicAddr(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"8.8.8.8", true}, {"2001:4860:4860::8888", true}, {"151.101.1.1", true},
		{"127.0.0.1", false}, {"::1", false}, {"10.1.2.3", false}, {"172.16.0.1", false}, {"192.168.1.1", false},
		{"169.254.169.254", false}, {"fe80::1", false}, {"fd00::1", false}, {"100.64.0.1", false},
		{"0.0.0.0", false}, {"::", false}, {"224.0.0.1", false}, {"::ffff:127.0.0.1", false}, {"::ffff:10.0.0.1", false},
	} {
		if got := publicAddr(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("publicAddr(%s) = %v, want %v", tc.addr, got, tc.want)
		}
	}
}

// TestPullDialer: a pull's connection to a loopback address is refused
// after resolution (a name resolving to it included), unless the operator
// allowed that registry.
func TestPullDialer(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	_, port, _ := net.SplitHostPort(addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, target := range []string{addr, "localhost:" + port} {
		if c, err := pullDialer(nil).DialContext(ctx, "tcp", target); err == nil || !strings.Contains(err.Error(), "does not pull from") {
			if c != nil {
				c.Close()
			}
			t.Fatalf("dial %s without allowing it: %v, want a refusal", target, err)
		}
	}
	c, err := pullDialer([]string{addr}).DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("dial an allowed registry: %v", err)
	}
	c.Close()
	c, err = pullDialer([]string{"127.0.0.1"}).DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("dial a registry allowed by host: %v", err)
	}
	c.Close()
}

// tinyImageArchive is a one-layer image (a file and a directory) as a
// docker-archive tar, as the CLI uploads it.
func tinyImageArchive(t *testing.T) []byte {
	t.Helper()
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	for _, h := range []*tar.Header{
		{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "etc/hello", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3},
	} {
		h.ModTime = time.Unix(1700000000, 0)
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte("hi\n"))
		}
	}
	tw.Close()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := image.WriteArchive(&out, img, "test/tiny:1"); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// TestImageTemplateFake builds a template from an uploaded image through
// the API (fake VMMs; the base is real: package image and e2fsprogs):
// the upload, the base per digest, the template's overlay over it, the
// guest's root on its command line, the image list, deletions refused
// while in use, an upload that serves one build.
func TestImageTemplateFake(t *testing.T) {
	for _, tool := range []string{"e2fsck", "tune2fs", "resize2fs", "debugfs"} {
		if _, err := lookTool(tool); err != nil {
			t.Skipf("skipped: %s not found (apt-get install e2fsprogs)", tool)
		}
	}
	f := newFakeLauncher(t)
	kernel := fakeKernel(t)
	td := startDaemon(t, t.TempDir(), f, func(c *Config) { c.GuestKernel = kernel; c.ImageDiskMiB = 64; c.MaxUploadBytes = 16 << 20 })
	c := td.client(t, "alice")
	arc := tinyImageArchive(t)

	var up wire.ImageUpload
	c.ok(201, "POST", "/v1/images?ref=docker-archive:tiny.tar", arc, &up)
	if !strings.HasPrefix(up.Ref, "upload:up-") || up.Bytes != int64(len(arc)) {
		t.Fatalf("upload: %+v", up)
	}
	var tp store.Template
	c.ok(201, "POST", "/v1/templates", map[string]any{"image": up.Ref, "mem_mib": 128}, &tp)
	if tp.Status != store.TemplateReady || tp.Image == nil || tp.Image.Digest == "" || tp.Kernel != kernel || len(tp.DiskBases) != 1 {
		t.Fatalf("template: %+v", tp)
	}
	if r := f.lastRun; len(r.Disks) == 0 || r.Disks[0] != (vmmctl.Disk{Path: tp.DiskBases[0]}) || !strings.Contains(r.Cmdline, "warren.root=/dev/vda") {
		t.Fatalf("the build VMM %+v: want disk 0 and warren.root", r)
	}
	// Disk 0 is the template's own overlay over the shared base.
	o, err := disk.OpenChain(tp.DiskBases[0], true)
	if err != nil {
		t.Fatal(err)
	}
	chainBottom := o.Header().BasePath
	o.Close()
	if chainBottom != tp.Image.Path {
		t.Fatalf("the template's overlay is over %q, want the base %q", chainBottom, tp.Image.Path)
	}
	var il wire.ImageList
	c.ok(200, "GET", "/v1/images", nil, &il)
	if len(il.Images) != 1 || il.Images[0].Key != tp.Image.Base || il.Images[0].Ref != "docker-archive:tiny.tar (uploaded)" ||
		!slices.Equal(il.Images[0].Templates, []string{tp.ID}) {
		t.Fatalf("images: %+v", il)
	}
	// The upload served its build.
	if st, b := c.do("POST", "/v1/templates", map[string]any{"image": up.Ref}); st != 404 {
		t.Fatalf("a second build from the same upload: %d %s", st, b)
	}
	// Another tenant sees no image and cannot use this one's upload.
	bob := td.client(t, "bob")
	c.ok(201, "POST", "/v1/images", arc, &up)
	if st, _ := bob.do("POST", "/v1/templates", map[string]any{"image": up.Ref}); st != 404 {
		t.Fatalf("bob builds from alice's upload: %d", st)
	}
	bob.ok(200, "GET", "/v1/images", nil, &il)
	if len(il.Images) != 0 {
		t.Fatalf("bob sees %+v", il)
	}
	// A second template of the same image shares the base.
	var tp2 store.Template
	c.ok(201, "POST", "/v1/templates", map[string]any{"image": up.Ref}, &tp2)
	if !tp2.Image.Cached || tp2.Image.Base != tp.Image.Base {
		t.Fatalf("second template: %+v", tp2.Image)
	}
	sb := c.create(tp.ID)
	if st, _ := c.do("DELETE", "/v1/images/"+tp.Image.Base, nil); st != 409 {
		t.Fatalf("deleting a base in use: %d", st)
	}
	c.ok(200, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
	c.ok(200, "DELETE", "/v1/templates/"+tp.ID, nil, nil)
	c.ok(200, "DELETE", "/v1/templates/"+tp2.ID, nil, nil)
	c.ok(204, "DELETE", "/v1/images/"+tp.Image.Base, nil, nil)
	if _, err := os.Stat(tp.Image.Path); !os.IsNotExist(err) {
		t.Fatalf("the deleted base is still there: %v", err)
	}
	if st, _ := c.do("DELETE", "/v1/images/"+tp.Image.Base, nil); st != 404 {
		t.Fatalf("deleting it again: %d", st)
	}

	// Bounds: an upload over the daemon's limit, a start_image_cmd for an
	// image without one, a bad upload.
	if st, _ := c.do("POST", "/v1/images", make([]byte, 17<<20)); st != 413 {
		t.Fatalf("an oversized upload: %d, want 413", st)
	}
	c.ok(201, "POST", "/v1/images", arc, &up)
	if st, b := c.do("POST", "/v1/templates", map[string]any{"image": up.Ref, "start_image_cmd": true}); st != 400 || !strings.Contains(string(b), "no Entrypoint or Cmd") {
		t.Fatalf("start_image_cmd without one: %d %s", st, b)
	}
	c.ok(201, "POST", "/v1/images", []byte("not a tar"), &up)
	if st, b := c.do("POST", "/v1/templates", map[string]any{"image": up.Ref}); st != 400 {
		t.Fatalf("a build from garbage: %d %s", st, b)
	}
}

// lookTool finds an e2fsprogs tool as package image does (PATH, then sbin).
func lookTool(name string) (string, error) {
	for _, dir := range []string{"/usr/sbin", "/sbin"} {
		if _, err := os.Stat(dir + "/" + name); err == nil {
			return dir + "/" + name, nil
		}
	}
	return name, os.ErrNotExist
}
