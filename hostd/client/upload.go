package client

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/image"
)

// ImageRef turns an image source into what TemplateRequest.Image takes:
// a registry reference goes to the daemon as it is (the daemon pulls it);
// a local source (ref oci-layout:DIR[:TAG] or docker-archive:FILE, or
// rootfs, a root file system tree or tar) is read here, with the caller's
// permissions, and streamed to the daemon as a docker-archive upload
// (UploadImage), whose "upload:ID" it returns. fn sees the upload's
// progress, once a second.
func (c *Client) ImageRef(ctx context.Context, ref, rootfs string, fn ProgressFunc) (string, error) {
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
	if fn == nil {
		fn = func(wire.Progress) {}
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
