package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/image"
)

// Templates from container images. A TemplateRequest with Image names a
// registry reference, which the daemon pulls itself, or "upload:ID", an
// image the client uploaded as a docker-archive tar (POST /v1/images):
// local image sources (OCI layouts, archives, root file system trees) are
// read by the client, never by the daemon, which opens no host path a
// tenant names. Either way package image verifies the image (layer
// digests and sizes, diff_ids, platform, a bound on the uncompressed
// bytes), flattens its layers and makes one read-only ext4 base per image
// digest in the tenant's image directory (store.ImageDir), shared by the
// tenant's templates. The template's disk 0 is then an overlay of its own
// over that base (TEMPLATEDIR/disk0.base, which the build's guest boots
// on and writes to, frozen with the template's snapshot), and each
// sandbox's disk 0 an overlay over that, as for any writable template
// disk (disks.go).
//
// Pulls: a registry reference is resolved, and every connection the pull
// makes is checked after name resolution (pullDialer): loopback,
// link-local, private, CGNAT and unspecified addresses are refused unless
// the operator allowed that registry host (Config.Registries), so that a
// tenant cannot make the daemon fetch from the host's own services or its
// LAN. Plain HTTP (InsecureRegistry) is allowed only for hosts the
// operator listed too.

// Image defaults and bounds.
const (
	// defaultImageDiskMiB is a root file system's size when neither the
	// request nor the daemon's configuration says.
	defaultImageDiskMiB = 4096
	// maxImageDiskMiB bounds a requested root file system (1 TiB).
	maxImageDiskMiB = 1 << 20
	// defaultMaxUpload bounds an uploaded image archive.
	defaultMaxUpload = 16 << 30
	// defaultReadyTimeout bounds a template's ready command.
	defaultReadyTimeout = 120 * time.Second
	// uploadPrefix marks an uploaded image in TemplateRequest.Image.
	uploadPrefix = "upload:"
)

var uploadIDRE = regexp.MustCompile(`^up-[0-9a-f]{16}$`)

// Uploads that no template build used are removed after uploadTTL; a
// tenant has at most maxPendingUploads waiting (each can be up to
// Config.MaxUploadBytes).
const (
	uploadTTL         = 24 * time.Hour
	maxPendingUploads = 8
)

// pruneUploads removes the uploads in dir older than uploadTTL (and
// interrupted ones' temporary files) and returns how many are left.
func pruneUploads(dir string) int {
	ents, _ := os.ReadDir(dir)
	left := 0
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			continue
		}
		if time.Since(fi.ModTime()) > uploadTTL {
			os.Remove(filepath.Join(dir, e.Name()))
			continue
		}
		if strings.HasSuffix(e.Name(), ".tar") {
			left++
		}
	}
	return left
}

// imageStore is tenant's image base store.
func (d *Daemon) imageStore(tenant string) *image.Store {
	return &image.Store{Dir: d.store.ImageDir(tenant)}
}

// postImage stores an uploaded image archive (the request body, a
// docker-archive tar, at most Config.MaxUploadBytes) for a later template
// build, and answers its ID.
func (d *Daemon) postImage(w http.ResponseWriter, r *http.Request, tenant string) {
	limit := d.cfg.MaxUploadBytes
	if limit <= 0 {
		limit = defaultMaxUpload
	}
	ref := r.URL.Query().Get("ref")
	if len(ref) > 1024 || strings.ContainsFunc(ref, func(c rune) bool { return c < ' ' || c == 0x7f }) {
		writeErr(w, errf(400, "ref: at most 1024 printable characters"))
		return
	}
	if r.ContentLength > limit {
		writeErr(w, errf(413, "image archive of %d bytes: the daemon takes at most %d", r.ContentLength, limit))
		return
	}
	dir := d.store.UploadDir(tenant)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		writeErr(w, err)
		return
	}
	if n := pruneUploads(dir); n >= maxPendingUploads {
		writeErr(w, errf(429, "%d uploaded images wait for a template build already (at most %d; unused ones go after %s)", n, maxPendingUploads, uploadTTL))
		return
	}
	var rb [8]byte
	rand.Read(rb[:])
	id := "up-" + hex.EncodeToString(rb[:])
	f, err := os.CreateTemp(dir, ".upload-*")
	if err != nil {
		writeErr(w, err)
		return
	}
	tmp := f.Name()
	defer os.Remove(tmp) // a no-op once renamed
	n, err := io.Copy(f, io.LimitReader(r.Body, limit+1))
	if err == nil && n > limit {
		err = errf(413, "image archive longer than %d bytes", limit)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && n == 0 {
		err = errf(400, "empty image archive")
	}
	if err == nil && ref != "" {
		// What the client uploaded, for people (the base's Ref).
		err = os.WriteFile(filepath.Join(dir, id+".ref"), []byte(ref), 0o600)
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, id+".tar"))
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	d.log.Info("image uploaded", "tenant", tenant, "id", id, "bytes", n)
	writeJSON(w, http.StatusCreated, wire.ImageUpload{ID: id, Ref: uploadPrefix + id, Bytes: n})
}

// listImages answers the tenant's image bases and the templates on them.
func (d *Daemon) listImages(w http.ResponseWriter, r *http.Request, tenant string) {
	bases, err := d.imageStore(tenant).List()
	if err != nil {
		writeErr(w, err)
		return
	}
	users := d.imageUsers(tenant)
	out := wire.ImageList{Images: []store.Image{}}
	for _, b := range bases {
		out.Images = append(out.Images, store.Image{Key: b.Key, Digest: b.Digest, Ref: b.Config.Ref, DiskBytes: b.DiskBytes,
			ContentBytes: b.ContentBytes, Layers: b.Layers, Templates: append([]string{}, users[b.Key]...)})
	}
	writeJSON(w, 200, out)
}

// delImage removes an image base that no template of the tenant uses.
func (d *Daemon) delImage(w http.ResponseWriter, r *http.Request, tenant string) {
	key := r.PathValue("key")
	if users := d.imageUsers(tenant)[key]; len(users) > 0 {
		writeErr(w, errf(409, "image %s is used by template %s", key, strings.Join(users, ", ")))
		return
	}
	if err := d.imageStore(tenant).Remove(key); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			writeErr(w, errf(404, "image %q not found", key))
			return
		}
		if errors.Is(err, image.ErrBusy) {
			writeErr(w, errf(409, "image %s is being built", key))
			return
		}
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// imageUsers maps each image base key of tenant to the templates on it
// (building ones included).
func (d *Daemon) imageUsers(tenant string) map[string][]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := map[string][]string{}
	for _, ts := range d.templates {
		t := ts.view.Load()
		if t.Tenant == tenant && t.Image != nil && t.Image.Base != "" {
			m[t.Image.Base] = append(m[t.Image.Base], t.ID)
		}
	}
	for k := range m {
		slices.Sort(m[k])
	}
	return m
}

// checkImageRequest validates the image fields of a template request.
func (d *Daemon) checkImageRequest(req *wire.TemplateRequest) error {
	if req.Image == "" {
		if req.StartCmd != "" || req.StartImageCmd || req.ReadyCmd != "" || req.DiskMiB != 0 || req.InsecureRegistry {
			return errf(400, "start_cmd, start_image_cmd, ready_cmd, disk_mib and insecure_registry need an image")
		}
		return nil
	}
	if id, ok := strings.CutPrefix(req.Image, uploadPrefix); ok {
		if !uploadIDRE.MatchString(id) {
			return errf(400, "bad upload id %q", id)
		}
		if req.InsecureRegistry {
			return errf(400, "insecure_registry is for registry references, not uploads")
		}
	} else {
		if strings.Contains(req.Image, ":") && (strings.HasPrefix(req.Image, "oci-layout:") || strings.HasPrefix(req.Image, "docker-archive:")) {
			return errf(400, "%q: the daemon does not read host paths; upload local images (warren templates create --image does)", req.Image)
		}
		ref, err := name.ParseReference(req.Image, name.StrictValidation)
		if err != nil {
			if ref, err = name.ParseReference(req.Image); err != nil {
				return errf(400, "image %q: %v", req.Image, err)
			}
		}
		if req.InsecureRegistry && !slices.Contains(d.cfg.Registries, ref.Context().RegistryStr()) {
			return errf(403, "insecure_registry: registry %s is not one the operator allows (warren-hostd --registry)", ref.Context().RegistryStr())
		}
	}
	if req.StartCmd != "" && req.StartImageCmd {
		return errf(400, "start_cmd and start_image_cmd exclude each other")
	}
	if req.DiskMiB < 0 || req.DiskMiB > maxImageDiskMiB || (req.DiskMiB != 0 && req.DiskMiB < 64) {
		return errf(400, "disk_mib must be 64 to %d", maxImageDiskMiB)
	}
	if req.ReadyTimeoutS < 0 || req.ReadyTimeoutS > 3600 {
		return errf(400, "ready_timeout_s must be 0 to 3600")
	}
	for _, s := range []string{req.StartCmd, req.ReadyCmd} {
		if len(s) > 64<<10 || strings.IndexByte(s, 0) >= 0 {
			return errf(400, "start_cmd and ready_cmd: at most 64 KiB, no NUL bytes")
		}
	}
	if req.ReadyCmd != "" && req.StartCmd == "" && !req.StartImageCmd {
		return errf(400, "ready_cmd needs a start command (start_cmd or start_image_cmd)")
	}
	return nil
}

// openImage resolves the request's image: a pull from a registry, or the
// tenant's upload. done removes the upload, if any, once the build no
// longer needs it.
func (d *Daemon) openImage(ctx context.Context, tenant string, req wire.TemplateRequest) (img v1.Image, done func(), err error) {
	if id, ok := strings.CutPrefix(req.Image, uploadPrefix); ok {
		p := filepath.Join(d.store.UploadDir(tenant), id+".tar")
		fi, err := os.Lstat(p)
		if err != nil || !fi.Mode().IsRegular() {
			return nil, nil, errf(404, "no upload %q (POST /v1/images first; an upload serves one template build)", id)
		}
		refFile := filepath.Join(d.store.UploadDir(tenant), id+".ref")
		done := func() { os.Remove(p); os.Remove(refFile) }
		img, err := image.Open(ctx, "docker-archive:"+p, image.OpenOptions{})
		if err != nil {
			done()
			// (The daemon's own path is not the tenant's business.)
			msg := strings.ReplaceAll(err.Error(), "docker-archive:"+p, "the archive")
			return nil, nil, errf(400, "upload %s: %s", id, strings.ReplaceAll(msg, p, "the archive"))
		}
		return img, done, nil
	}
	img, err = image.Open(ctx, req.Image, image.OpenOptions{Insecure: req.InsecureRegistry, Transport: d.pullTransport()})
	if err != nil {
		return nil, nil, errf(400, "image %s: %v", req.Image, err)
	}
	return img, func() {}, nil
}

// buildImageBase makes (or finds) the ext4 base of the request's image,
// reporting progress from pct0 to pct1, and creates the template's own
// overlay over it at ov. It returns the base and fills t.Image.
func (d *Daemon) buildImageBase(o *op, t *store.Template, req wire.TemplateRequest, ov string, pct0, pct1 int) (*image.Base, error) {
	ctx := d.ctx
	start := time.Now()
	o.progress("image "+req.Image+": resolving", pct0)
	img, done, err := d.openImage(ctx, t.Tenant, req)
	if err != nil {
		return nil, err
	}
	defer done()
	pulled := time.Now()
	diskMiB := req.DiskMiB
	if diskMiB == 0 {
		diskMiB = d.cfg.ImageDiskMiB
	}
	if diskMiB == 0 {
		diskMiB = defaultImageDiskMiB
	}
	last, shown := time.Time{}, pct0
	ref := req.Image
	if id, ok := strings.CutPrefix(ref, uploadPrefix); ok {
		if b, err := os.ReadFile(filepath.Join(d.store.UploadDir(t.Tenant), id+".ref")); err == nil && len(b) > 0 {
			ref = string(b) + " (uploaded)"
		}
	}
	base, err := d.imageStore(t.Tenant).Build(ctx, img, image.BuildOptions{
		DiskBytes: int64(diskMiB) << 20, MaxUncompressed: d.cfg.MaxImageBytes, Ref: ref,
		Progress: func(p image.Progress) {
			// At most a line a second, and every layer's start.
			if time.Since(last) < time.Second && p.Bytes != 0 {
				return
			}
			last = time.Now()
			// Steps count their layers from 1 again (fetching, reading,
			// unpacking): the percentage only ever goes up.
			if p.Layers > 0 {
				shown = max(shown, pct0+(pct1-pct0)*p.Layer/(p.Layers+1))
			}
			o.progress(progressLine(p), shown)
		},
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("image %s: interrupted: %w", req.Image, ctx.Err())
		}
		return nil, errf(400, "image %s: %v", req.Image, err)
	}
	t.Image.Digest, t.Image.Base, t.Image.Path, t.Image.Cached = base.Digest, base.Key, base.Path, base.Cached
	t.Image.PullMS = float64(pulled.Sub(start).Milliseconds())
	if !base.Cached {
		t.Image.BaseMS = float64(time.Since(pulled).Milliseconds())
	}
	o.progress(fmt.Sprintf("image %s: base %s (%s, %d layers%s)", req.Image, shortDigest(base.Digest), mib(base.ContentBytes), base.Layers,
		map[bool]string{true: ", cached", false: ""}[base.Cached]), pct1)
	raw, err := disk.OpenRaw(base.Path, false)
	if err != nil {
		return nil, fmt.Errorf("image base: %w", err)
	}
	defer raw.Close()
	top, err := disk.Create(ov, raw, disk.CreateOptions{BasePath: base.Path})
	if err != nil {
		return nil, fmt.Errorf("image base: the template's overlay: %w", err)
	}
	if err := top.Close(); err != nil {
		os.Remove(ov)
		return nil, fmt.Errorf("image base: the template's overlay: %w", err)
	}
	return base, nil
}

// progressLine is an image build step for people.
func progressLine(p image.Progress) string {
	s := p.Step
	if p.Layers > 0 && p.Layer > 0 {
		s += fmt.Sprintf(" (layer %d/%d)", p.Layer, p.Layers)
	}
	if p.Total > 0 {
		s += fmt.Sprintf(": %s of %s", mib(p.Bytes), mib(p.Total))
	} else if p.Bytes > 0 {
		s += ": " + mib(p.Bytes)
	}
	return s
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func shortDigest(d string) string {
	if _, h, ok := strings.Cut(d, ":"); ok && len(h) > 12 {
		return h[:12]
	}
	return d
}

// pullTransport is the HTTP transport registry pulls use: its dialer
// refuses addresses a tenant must not reach through the daemon
// (pullDialer), unless the registry's host is one the operator allows.
func (d *Daemon) pullTransport() http.RoundTripper {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.DialContext = pullDialer(d.cfg.Registries).DialContext
	return tr
}

// pullDialer dials registries for pulls. Every connection's address is
// checked after resolution, in the dialer's Control hook (so a name that
// resolves to a forbidden address is refused too, whatever it resolved
// to before): loopback, link-local, private (RFC 1918, ULA), CGNAT,
// multicast and unspecified addresses are refused unless the dialled
// host:port is in allowed (the operator's --registry list).
func pullDialer(allowed []string) *dialerWithAllow {
	return &dialerWithAllow{allowed: allowed}
}

type dialerWithAllow struct{ allowed []string }

func (p *dialerWithAllow) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	if !hostAllowed(p.allowed, addr) {
		d.Control = func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("registry address %q: %w", address, err)
			}
			if !publicAddr(ap.Addr()) {
				return fmt.Errorf("registry %s resolves to %s, an address the daemon does not pull from (warren-hostd --registry %s allows it)", addr, ap.Addr(), addr)
			}
			return nil
		}
	}
	return d.DialContext(ctx, network, addr)
}

// hostAllowed reports whether addr (host:port, as dialled) or its host
// alone is in allowed.
func hostAllowed(allowed []string, addr string) bool {
	host, _, _ := net.SplitHostPort(addr)
	return slices.Contains(allowed, addr) || (host != "" && slices.Contains(allowed, host))
}

// cgnat is 100.64.0.0/10 (RFC 6598).
var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// publicAddr reports whether a is an address on the internet at large.
func publicAddr(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsValid() && !a.IsLoopback() && !a.IsPrivate() && !a.IsLinkLocalUnicast() && !a.IsLinkLocalMulticast() &&
		!a.IsMulticast() && !a.IsUnspecified() && !a.IsInterfaceLocalMulticast() && !cgnat.Contains(a)
}

// imageRootCmdline is what an image template's guest gets on its kernel
// command line: PID 1 mounts disk 0 as its root file system and moves
// into it (guestinit).
const imageRootCmdline = "warren.root=/dev/vda"

// startServiceName names the template's start command in the guest
// agent (its log is the agent's log of that service).
const startServiceName = "start"

// startTemplateCmd starts the template's start command, if it has one,
// as a service the guest agent supervises, and waits until it is ready:
// its ready command exits 0 (each try bounded, the whole wait by
// ReadyTimeoutS), or, without one, until it has run for a second without
// exiting. The template's snapshot, taken next, then has it running in
// every sandbox.
func (d *Daemon) startTemplateCmd(o *op, t *store.Template, req wire.TemplateRequest, base *image.Base, vsock string) error {
	var argv []string
	switch {
	case req.StartCmd != "":
		argv = []string{"/bin/sh", "-c", req.StartCmd}
	case req.StartImageCmd:
		if argv = base.Config.Argv(); argv == nil {
			return errf(400, "start_image_cmd: image %s has no Entrypoint or Cmd", req.Image)
		}
		t.Image.StartCmd = strings.Join(argv, " ")
	default:
		return nil
	}
	timeout := defaultReadyTimeout
	if req.ReadyTimeoutS > 0 {
		timeout = time.Duration(req.ReadyTimeoutS) * time.Second
	}
	ctx, cancel := context.WithTimeout(d.ctx, timeout)
	defer cancel()
	c := agentclient.New(vsock)
	defer c.Close()
	o.progress("starting the start command: "+strings.Join(argv, " "), 76)
	if _, err := c.StartService(ctx, agentwire.ServiceSpec{Name: startServiceName, Argv: argv}); err != nil {
		return fmt.Errorf("start command: %w", err)
	}
	if req.ReadyCmd == "" {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
		return serviceRunning(ctx, c)
	}
	o.progress("waiting for the ready command: "+req.ReadyCmd, 77)
	// Each try is bounded too, by a quarter of the whole wait (at least
	// 30 s): a first curl in a guest whose kernel is emulated (a PVM
	// host) takes tens of seconds.
	try := max(30*time.Second, timeout/4)
	n, err := c.PollExec(ctx, agentwire.ExecRequest{Argv: []string{"/bin/sh", "-c", req.ReadyCmd}, TimeoutMS: try.Milliseconds()}, 500*time.Millisecond)
	if err != nil {
		return errf(504, "the ready command did not succeed within %s: %v", timeout, err)
	}
	o.progress(fmt.Sprintf("ready after %d tries of the ready command", n), 78)
	return serviceRunning(ctx, c)
}

// serviceRunning checks that the start command is running now (the agent
// restarts one that exits, but one that keeps failing is no state to
// snapshot).
func serviceRunning(ctx context.Context, c *agentclient.Client) error {
	st, err := c.Service(ctx, startServiceName)
	if err != nil {
		return fmt.Errorf("start command: %w", err)
	}
	if st.State != agentwire.ServiceRunning {
		why := st.LastError
		if e := st.LastExit; e != nil {
			why = fmt.Sprintf("exit code %d %s after %d ms", e.Code, e.Signal, e.RanMS)
		}
		return errf(400, "the start command is not running (%s; %d starts): its log in the guest is %s/%s.log", why, st.Starts, agentwire.DefaultLogDir, startServiceName)
	}
	return nil
}
