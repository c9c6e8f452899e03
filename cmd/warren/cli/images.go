package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/image"
)

// imageForTemplate turns `templates create --image REF` or `--rootfs PATH`
// into the TemplateRequest's image: a registry reference goes to the daemon
// as it is (the daemon pulls it); a local source (oci-layout:DIR[:TAG],
// docker-archive:FILE, a root file system tree or tar) is read here, with
// this user's permissions, and streamed to the daemon as a docker-archive
// upload (POST /v1/images), whose "upload:ID" it returns.
func imageForTemplate(ctx context.Context, c *client.Client, ref, rootfs string, fn client.ProgressFunc) (string, error) {
	local := rootfs != "" || strings.HasPrefix(ref, "oci-layout:") || strings.HasPrefix(ref, "docker-archive:")
	if !local {
		return ref, nil
	}
	var (
		img    v1.Image
		err    error
		source = ref
	)
	if rootfs != "" {
		source = rootfs
		img, err = image.FromRootfs(rootfs)
	} else {
		img, err = image.Open(ctx, ref, image.OpenOptions{})
	}
	if err != nil {
		return "", err
	}
	pr, pw := io.Pipe()
	var sent atomic.Int64
	go func() {
		pw.CloseWithError(image.WriteArchive(&countingWriter{w: pw, n: &sent}, img, "warren/upload:latest"))
	}()
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				fn(wire.Progress{Step: fmt.Sprintf("uploading %s: %.1f MiB", source, float64(sent.Load())/(1<<20)), Pct: 1})
			}
		}
	}()
	u, err := c.UploadImage(ctx, pr, source)
	close(stop)
	pr.CloseWithError(io.ErrClosedPipe) // stops the writer if the upload failed first
	if err != nil {
		return "", fmt.Errorf("upload %s: %w", source, err)
	}
	fn(wire.Progress{Step: fmt.Sprintf("uploaded %s: %.1f MiB", source, float64(u.Bytes)/(1<<20)), Pct: 2})
	return u.Ref, nil
}

// countingWriter counts the bytes written through it.
type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// imagesCmd is `warren images [ls]` and `warren images rm KEY...`: the
// tenant's image bases (one per image digest, shared by its templates).
func imagesCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	sub, args := subcommand(args, "ls")
	switch sub {
	case "ls", "list":
		return listTable(ctx, "images", "images [ls]", args, stdout, stderr, (*client.Client).Images,
			"KEY\tREF\tLAYERS\tCONTENT\tDISK\tTEMPLATES", func(i client.Image) string {
				return fmt.Sprintf("%s\t%s\t%d\t%.0f MiB\t%.0f MiB\t%s", i.Key, orDash(i.Ref), i.Layers, float64(i.ContentBytes)/(1<<20),
					float64(i.DiskBytes)/(1<<20), orDash(strings.Join(i.Templates, ",")))
			})
	case "rm", "delete":
		d := newDaemonCmd(ctx, "images rm", "images rm KEY...", stdout, stderr)
		return d.forEachArg(args, func(k string) (string, error) { return k, d.c.DeleteImage(ctx, k) })
	}
	fmt.Fprintf(stderr, "warren images: unknown sub-command %q (ls, rm)\n", sub)
	return 2
}
