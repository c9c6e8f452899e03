package daemon

import (
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/warrenvm/warren/hostd/crypt"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/image"
	"github.com/warrenvm/warren/internal/product"
)

// rootfsLayout is the Debian image of `make rootfs` (an OCI layout), or
// the end of the test by product.Missing (a skip naming the command that
// makes it; a failure under make test).
func rootfsLayout(t *testing.T) string {
	t.Helper()
	p := os.Getenv("WARREN_ROOTFS")
	if p == "" {
		p = filepath.Join(repoRoot(t), "build", "rootfs", "debian")
	}
	if _, err := os.Stat(filepath.Join(p, "index.json")); err != nil {
		product.Missing(t, fmt.Sprintf("the Debian image at %s (%v)", p, err), "make rootfs")
	}
	return p
}

// TestE2EImage is issue 15 end to end, as a user runs it: the Debian
// image of `make rootfs` pushed to a registry server on loopback
// (go-containerregistry's registry, a real implementation of the
// distribution API), then through the daemon: a network template from the
// registry reference with a supervised start command and a ready command,
// a sandbox where python3 runs in the image's environment, curl and
// python3 reach an HTTPS upstream through the credential proxy (the
// placeholder in the image's environment, the sandbox CA in its trust
// store), a file written,
// a snapshot, more writes, a rollback (the files as at the snapshot), a
// fork into two children that each see only their own file, pause to
// disk, a daemon restart, resume (every file intact), the template's image
// base listed and refused for deletion while used, and a revoked key
// (creates and resumes refused).
func TestE2EImage(t *testing.T) {
	warren, kernel, initrd := e2ePaths(t)
	layout := rootfsLayout(t)
	state, step := e2eState(t, "hostd-image-")

	// The registry, on loopback, with the image pushed to it.
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	img, err := image.Open(t.Context(), image.LayoutPrefix+layout+":bookworm", image.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	refStr := host + "/warren/debian:bookworm"
	ref, err := name.ParseReference(refStr, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	step("pushed %s to the registry at %s", layout, reg.URL)

	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root (network namespaces, taps, eBPF)")
	}
	up := startUpstream(t, state)
	keys := &crypt.LocalProvider{Dir: filepath.Join(state, "keys")}
	if err := os.Mkdir(keys.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	mod := func(c *Config) {
		c.Keys = keys
		c.GuestKernel, c.GuestInitramfs = kernel, initrd
		c.Registries = []string{host}
		c.ImageDiskMiB = 2048
		c.EgressHosts, c.UpstreamCA, c.EgressUpstreamAllow = up.hosts, up.ca, "127.0.0.1"
		c.BootTimeout, c.RestoreTimeout = 6*time.Minute, 3*time.Minute
		c.Log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	td := startE2EDaemon(t, state, warren, mod)
	a := td.client(t, "tenant-img")
	defer func() {
		_, sbs, _ := td.store.Load()
		for _, sb := range sbs {
			stopProc(sb.PID, sb.StartTime, time.Second)
		}
	}()
	var ki KeyInfo
	a.ok(201, "POST", "/v1/keys", nil, &ki)
	if st, b := a.do("PUT", "/v1/secrets/API_KEY", []byte(up.secret)); st/100 != 2 {
		t.Fatalf("PUT secret: %d %s", st, b)
	}

	// Refusals before anything runs: a host path, an insecure pull from a
	// registry the operator did not allow, a private address without it.
	for _, bad := range []struct {
		req  map[string]any
		want string
	}{
		{map[string]any{"image": "oci-layout:" + layout}, "does not read host paths"},
		{map[string]any{"image": "10.1.2.3:5000/x:1", "insecure_registry": true}, "not one the operator allows"},
		{map[string]any{"image": "127.0.0.2:9/x:1"}, "does not pull from"},
	} {
		st, b := a.do("POST", "/v1/templates", bad.req)
		if st < 400 || !strings.Contains(string(b), bad.want) {
			t.Fatalf("template %v: %d %s, want an error with %q", bad.req, st, b, bad.want)
		}
	}
	step("a host path, an unlisted insecure registry and a private address are refused")

	step("template from %s (pull, ext4 base, boot, start command, snapshot)", refStr)
	var tp store.Template
	a.ok(201, "POST", "/v1/templates", map[string]any{"image": refStr, "insecure_registry": true, "mem_mib": 512, "network": true,
		"start_cmd": "cd /srv 2>/dev/null || mkdir -p /srv && cd /srv && echo served > index.html && exec python3 -m http.server 8000 --bind 127.0.0.1",
		"ready_cmd": "curl -fsS http://127.0.0.1:8000/index.html", "ready_timeout_s": 600}, &tp)
	if tp.Image == nil || tp.Image.Digest == "" || tp.Image.Base == "" || len(tp.DiskBases) != 1 {
		t.Fatalf("template: %+v", tp)
	}
	step("template %s ready in %.0f ms (pull %.0f ms, base %.0f ms, digest %s)", tp.ID, tp.BuildMS, tp.Image.PullMS, tp.Image.BaseMS, tp.Image.Digest)
	var il wire.ImageList
	a.ok(200, "GET", "/v1/images", nil, &il)
	if len(il.Images) != 1 || il.Images[0].Key != tp.Image.Base || !slices.Contains(il.Images[0].Templates, tp.ID) {
		t.Fatalf("images: %+v", il)
	}
	if st, _ := a.do("DELETE", "/v1/images/"+url.PathEscape(tp.Image.Base), nil); st != 409 {
		t.Fatalf("deleting the image base a template uses: %d, want 409", st)
	}

	var sb store.Sandbox
	pol := map[string]any{"credentials": []map[string]any{{"secret": "API_KEY", "hosts": []string{"api.test"}, "substitute": []string{"headers", "query"}}}}
	a.ok(201, "POST", "/v1/sandboxes", map[string]any{"template": tp.ID, "egress": pol, "secrets": []string{"API_KEY"}}, &sb)
	step("sandbox %s running (API_KEY scoped to api.test)", sb.ID)
	step("its network VMM is confined: %s", checkNetConfined(t, td.cfg.VMMUIDs, sb.PID, td.store.SandboxDir(sb.Tenant, sb.ID), keys.Dir))
	want := func(id, cmd, out string) {
		t.Helper()
		got, errOut, code := a.exec(id, "sh", "-c", cmd)
		if code != 0 || got != out {
			t.Fatalf("%s: %q: %q (stderr %q, exit %d), want %q", id, cmd, got, errOut, code, out)
		}
	}
	want(sb.ID, `python3 -c 'import sys; print(6*7, sys.version_info[0])'`, "42 3\n")
	want(sb.ID, `echo "$(id -un) $(pwd) $LANG"`, "root /root C.UTF-8\n")
	want(sb.ID, "curl -fsS http://127.0.0.1:8000/index.html", "served\n")
	want(sb.ID, "grep -c ' / / .* - ext4 /dev/vda ' /proc/self/mountinfo", "1\n")
	step("python3, the image's environment, the start command's server, an ext4 root")

	// Egress and credentials in the image: the placeholder is in the
	// image's environment, the sandbox CA in the image's trust store, so
	// that curl and Python's ssl reach the upstream through the
	// credential proxy, which puts the real secret in.
	ph, _, _ := a.exec(sb.ID, "sh", "-c", `echo -n "$API_KEY"`)
	if ph == "" || strings.Contains(ph, up.secret) {
		t.Fatalf("the guest's $API_KEY is %q", ph)
	}
	want(sb.ID, `curl -fsS "https://api.test/v1/echo?key=$API_KEY&from=curl"`, "upstream saw key="+ph+"&from=curl\n")
	want(sb.ID, `python3 -c 'import os, urllib.request as u; print(u.urlopen("https://api.test/v1/echo?from=python&key=" + os.environ["API_KEY"]).read().decode(), end="")'`,
		"upstream saw from=python&key="+ph+"\n")
	if got := up.seen(); !strings.Contains(got, "key="+up.secret+"&from=curl") || !strings.Contains(got, "from=python&key="+up.secret) {
		t.Fatalf("the upstream saw %q, not the secret from both", got)
	}
	step("curl and python3 reach https://api.test through the credential proxy; the guest holds only %q", ph)

	want(sb.ID, "echo v1 > /root/state.txt && sync && cat /root/state.txt", "v1\n")
	var snap store.Snapshot
	a.ok(201, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", map[string]any{"name": "s1"}, &snap)
	want(sb.ID, "echo v2 > /root/state.txt && echo later > /root/after.txt && cat /root/state.txt /root/after.txt", "v2\nlater\n")
	a.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/rollback", map[string]any{"snapshot": "s1"}, nil)
	want(sb.ID, "cat /root/state.txt; ls /root/after.txt 2>&1 >/dev/null | wc -l", "v1\n1\n")
	step("snapshot s1, more writes, rollback: the files as at s1")

	var fr wire.ForkResult
	a.ok(201, "POST", "/v1/sandboxes/"+sb.ID+"/fork", map[string]any{"n": 2}, &fr)
	if len(fr.Children) != 2 || len(fr.Errors) != 0 {
		t.Fatalf("fork: %+v", fr)
	}
	for i, k := range fr.Children {
		want(k.ID, fmt.Sprintf("echo child%d > /root/child%d.txt && cat /root/state.txt", i, i), "v1\n")
	}
	for i, k := range fr.Children {
		want(k.ID, "ls /root | grep child", fmt.Sprintf("child%d.txt\n", i))
		want(k.ID, "curl -fsS http://127.0.0.1:8000/index.html", "served\n")
	}
	want(sb.ID, "ls /root | grep -c child || true", "0\n")
	step("fork x2: each child sees only its own file, and its own start command's server")

	var rec store.Sandbox
	a.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/pause?to_disk=true", nil, &rec)
	if rec.Status != store.Suspended {
		t.Fatalf("pause to disk: %+v", rec)
	}
	td.Close()
	<-td.done
	td = startE2EDaemon(t, state, warren, mod)
	a = td.client(t, "tenant-img")
	a.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/resume", nil, &rec)
	want(sb.ID, "cat /root/state.txt; ls /root", "v1\nstate.txt\n")
	want(sb.ID, `python3 -c 'print("still", 6*7)'`, "still 42\n")
	step("paused to disk, daemon restarted, resumed: every file intact")

	for _, k := range fr.Children {
		a.ok(200, "DELETE", "/v1/sandboxes/"+k.ID, nil, nil)
	}
	a.ok(200, "DELETE", "/v1/keys", nil, nil)
	if st, b := a.do("POST", "/v1/sandboxes", map[string]any{"template": tp.ID}); st < 400 {
		t.Fatalf("create after the key was revoked: %d %s", st, b)
	}
	if st, b := a.do("POST", "/v1/sandboxes/"+sb.ID+"/resume", nil); st < 400 {
		t.Fatalf("resume after the key was revoked: %d %s", st, b)
	}
	step("the key revoked: creates and resumes refused")
}
