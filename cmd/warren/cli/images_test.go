package cli

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/warrenvm/warren/image"
)

// TestTemplatesCreateImage: `warren templates create --image` sends a
// registry reference to the daemon as it is, and reads a local image
// (an OCI layout, a plain tree) itself and uploads it as a docker-archive
// that holds the same image, naming the upload in the template request.
func TestTemplatesCreateImage(t *testing.T) {
	stub := stubDaemon(t)
	run := func(want int, args ...string) (string, string) { t.Helper(); return expect(t, want, "", args...) }

	run(0, "templates", "create", "--image", "registry.example/team/app:1", "--start-cmd", "serve", "--ready-cmd", "probe", "--disk-mib", "2048")
	req := stub.LastTemplateRequest()
	if req.Image != "registry.example/team/app:1" || req.StartCmd != "serve" || req.ReadyCmd != "probe" || req.DiskMiB != 2048 || req.Kernel != "" {
		t.Fatalf("a registry reference: the request %+v", req)
	}

	// A tree, as --rootfs and as an OCI layout of it.
	tree := t.TempDir()
	os.MkdirAll(filepath.Join(tree, "etc"), 0o755)
	os.WriteFile(filepath.Join(tree, "etc", "motd"), []byte("from the tree\n"), 0o644)
	img, err := image.FromRootfs(tree)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{Env: []string{"A=1"}, WorkingDir: "/etc"})
	if err != nil {
		t.Fatal(err)
	}
	layout := filepath.Join(t.TempDir(), "layout")
	if err := image.Pack(img, layout, "v1"); err != nil {
		t.Fatal(err)
	}
	want, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--image", "oci-layout:" + layout + ":v1"}, {"--rootfs", tree}} {
		_, progress := run(0, append([]string{"templates", "create"}, args...)...)
		req := stub.LastTemplateRequest()
		id, ok := strings.CutPrefix(req.Image, "upload:")
		if !ok {
			t.Fatalf("%v: the request names %q, not an upload", args, req.Image)
		}
		body, ok := stub.Upload(id)
		if !ok {
			t.Fatalf("%v: no upload %s", args, id)
		}
		up, err := tarball.Image(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }, nil)
		if err != nil {
			t.Fatalf("%v: the upload is not a docker-archive: %v", args, err)
		}
		cfg, err := up.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if args[0] == "--image" {
			got, _ := up.ConfigName()
			if got != want || cfg.Config.WorkingDir != "/etc" {
				t.Fatalf("the upload of the layout is image %s (%+v), want %s", got, cfg.Config, want)
			}
		}
		ls, err := up.Layers()
		if err != nil || len(ls) != 1 {
			t.Fatalf("%v: the upload's layers: %d %v", args, len(ls), err)
		}
		if !strings.Contains(progress, "uploaded ") {
			t.Errorf("%v: no upload progress in %q", args, progress)
		}
	}
	if out, _ := run(0, "images"); !strings.Contains(out, "registry.example/team/app:1") {
		t.Errorf("images: %q", out)
	}
	// Bad sources fail here, before anything reaches the daemon.
	n := len(stub.TemplateRequests)
	run(1, "templates", "create", "--image", "oci-layout:"+filepath.Join(t.TempDir(), "none"))
	run(1, "templates", "create", "--rootfs", filepath.Join(t.TempDir(), "none"))
	run(2, "templates", "create", "--image", "r/x", "--rootfs", tree)
	if len(stub.TemplateRequests) != n {
		t.Fatalf("a bad source reached the daemon: %+v", stub.TemplateRequests[n:])
	}
}
