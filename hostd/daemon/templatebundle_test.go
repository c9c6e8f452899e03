package daemon

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/memsnap/vmsnap"
)

// templateBundleFixture is tenant alice's ready template on a fake
// daemon whose snapshot was replaced by a real one (vmsnap) as a build
// leaves it: a writable disk whose frozen base is an overlay (written
// to) over a raw image, as an image template's disk 0 sits on the
// image's base, and a read-only disk; mem and the disks are what they
// hold.
type templateBundleFixture struct {
	td     *testDaemon
	c      *client
	id     string
	mem    []byte
	rw, ro []byte
}

func newTemplateBundleFixture(t *testing.T, mod ...func(*Config)) *templateBundleFixture {
	td, _, c := aliceDaemon(t, mod...)
	tp := c.template(fakeKernel(t))
	f := &templateBundleFixture{td: td, c: c, id: tp.ID}
	ts := td.template("alice", tp.ID)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	dir := td.store.TemplateDir("alice", tp.ID)
	base := filepath.Join(dir, "disk0.base")
	baseData := noisy(3*bundleChunk+12345, 4)
	if err := os.WriteFile(base, baseData, 0o400); err != nil {
		t.Fatal(err)
	}
	rb, err := disk.OpenRaw(base, true)
	if err != nil {
		t.Fatal(err)
	}
	layer := filepath.Join(dir, "disk0.frozen.wcow")
	ov, err := disk.Create(layer, rb, disk.CreateOptions{BasePath: base})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ov.WriteAt([]byte("written by the template's build"), 7000); err != nil {
		t.Fatal(err)
	}
	ov.Close()
	rb.Close()
	f.rw = bytes.Clone(baseData)
	copy(f.rw[7000:], "written by the template's build")
	f.ro = noisy(bundleChunk+999, 5)
	roPath := filepath.Join(dir, "disk1.ro")
	if err := os.WriteFile(roPath, f.ro, 0o400); err != nil {
		t.Fatal(err)
	}
	f.mem = noisy(bundleTestMem, 6)
	opts, _ := json.Marshal(map[string]any{"version": 2, "mem_mib": 8, "cpus": 1, "rng": true, "vsock": filepath.Join(dir, "build.vsock"), "cid": 3,
		"disks": []map[string]any{{"path": base}, {"path": roPath, "ro": true}}})
	os.Remove(ts.rec.Snapshot + vmsnap.StateExt)
	if _, err := vmsnap.Write(ts.rec.Snapshot, &vmsnap.Capture{Kind: vmsnap.Full, State: bundleState(), Devices: []vmsnap.DeviceState{}, Options: opts,
		Fingerprint: []byte("fake-host"), Memory: bytes.NewReader(f.mem),
		Disks: []vmsnap.DiskLayer{{Index: 0, Layer: layer, Chain: []string{layer, base}}}}); err != nil {
		t.Fatal(err)
	}
	ts.rec.DiskBases = []string{layer, ""}
	ts.rec.Disks = []string{"rootfs.ext4", "data.img,ro"}
	ts.rec.Cmdline = "quiet"
	ts.rec.Image = &store.TemplateImage{Ref: "docker.io/library/alpine:3", Digest: "sha256:abc", Base: "k1", Path: base,
		StartCmd: "sleep infinity", ReadyCmd: "true"}
	if err := td.saveTemplate(ts); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *templateBundleFixture) export(t *testing.T) []byte {
	t.Helper()
	st, b := f.c.do("GET", "/v1/templates/"+f.id+"/bundle", nil)
	if st != 200 {
		t.Fatalf("export: %d %s", st, b)
	}
	return b
}

// templateDirs lists tenant's template directories on td.
func templateDirs(td *testDaemon, tenant string) []string {
	ents, _ := os.ReadDir(filepath.Join(td.state, "tenants", tenant, "templates"))
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// TestTemplateBundleRoundTrip: a template exported from one daemon is
// recorded ready on another, with its fields, its snapshot rewritten with
// that host's paths, its writable disk flattened into a frozen base and
// its read-only disk copied; a sandbox is created from it there exactly
// as from a built template (its own overlay over the imported base).
func TestTemplateBundleRoundTrip(t *testing.T) {
	f := newTemplateBundleFixture(t)
	b := f.export(t)
	files := readTar(t, b)
	var hdr map[string]any
	if err := json.Unmarshal(files[0].data, &hdr); err != nil || files[0].name != "bundle.json" || hdr["kind"] != "template" {
		t.Fatalf("bundle.json: %s (%v)", files[0].data, err)
	}
	if bytes.Contains(files[0].data, []byte(f.td.state)) {
		t.Fatalf("bundle.json names this host's paths: %s", files[0].data)
	}
	tdB, fB, cB := aliceDaemon(t)
	var rec store.Template
	cB.ok(201, "POST", "/v1/templates/import", b, &rec)
	orig := *f.td.template("alice", f.id).view.Load()
	dirB := tdB.store.TemplateDir("alice", rec.ID)
	switch {
	case rec.ID == "" || rec.ID == f.id || rec.Tenant != "alice" || rec.Status != store.TemplateReady:
		t.Fatalf("imported: %+v", rec)
	case rec.MemMiB != orig.MemMiB || rec.CPUs != orig.CPUs || rec.Kernel != orig.Kernel || rec.Cmdline != "quiet" ||
		!slices.Equal(rec.Disks, orig.Disks) || rec.Network || rec.Balloon != orig.Balloon:
		t.Fatalf("imported fields %+v, built %+v", rec, orig)
	case rec.Image == nil || rec.Image.Ref != orig.Image.Ref || rec.Image.Digest != orig.Image.Digest ||
		rec.Image.StartCmd != "sleep infinity" || rec.Image.ReadyCmd != "true" || rec.Image.Path != "" || rec.Image.Base != "":
		t.Fatalf("imported image %+v", rec.Image)
	case !slices.Equal(rec.DiskBases, []string{filepath.Join(dirB, "disk0.base"), ""}):
		t.Fatalf("imported disk bases %q", rec.DiskBases)
	case rec.Snapshot != filepath.Join(dirB, "snap", "base"):
		t.Fatalf("imported snapshot %s, not in %s", rec.Snapshot, dirB)
	}
	use, done, err := tdB.cfg.Hooks.BeforeRestore("alice", rec.Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	if done != nil {
		defer done()
	}
	ls, err := vmsnap.Load(use, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	mem := make([]byte, bundleTestMem)
	if _, err := ls.Chain.Reader().ReadAt(mem, 0); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	if !bytes.Equal(mem, f.mem) || ls.State.VCPUs[0].Regs.RAX != 42 {
		t.Fatal("imported memory or machine state differs")
	}
	var opts struct {
		Disks []struct {
			Path string
			RO   bool `json:"ro"`
		} `json:"disks"`
		Vsock string `json:"vsock"`
	}
	if err := json.Unmarshal(ls.Meta.Options, &opts); err != nil {
		t.Fatal(err)
	}
	if len(opts.Disks) != 2 || opts.Disks[0].Path != rec.DiskBases[0] || opts.Disks[1].Path != filepath.Join(dirB, "disk1.ro") || !opts.Disks[1].RO ||
		strings.HasPrefix(opts.Vsock, f.td.state) {
		t.Fatalf("imported run options %+v", opts)
	}
	if len(ls.Disks) != 1 || ls.Disks[0].Layer != rec.DiskBases[0] {
		t.Fatalf("imported disk layers %+v", ls.Disks)
	}
	for i, want := range [][]byte{f.rw, f.ro} {
		got, err := os.ReadFile(opts.Disks[i].Path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("disk %d differs after import", i)
		}
		if fi, _ := os.Stat(opts.Disks[i].Path); fi.Mode().Perm()&0o222 != 0 {
			t.Fatalf("disk %d is writable on disk: %v", i, fi.Mode())
		}
	}
	// It survives a restart of the daemon's records and is listed.
	var list []store.Template
	cB.ok(200, "GET", "/v1/templates", nil, &list)
	if len(list) != 1 || list[0].ID != rec.ID || list[0].Status != store.TemplateReady {
		t.Fatalf("templates on B: %+v", list)
	}
	// A sandbox of it: restored from the imported snapshot, on its own
	// overlay over the imported base.
	sb := cB.create(rec.ID)
	fB.mu.Lock()
	rs := fB.lastRestoreSpec
	fB.mu.Unlock()
	if rs.Snapshot != rec.Snapshot || len(rs.DiskPaths) != 1 || !strings.HasPrefix(rs.DiskPaths[0], tdB.store.SandboxDir("alice", sb.ID)+"/") {
		t.Fatalf("restore of the imported template: %+v", rs)
	}
	o, err := disk.OpenChain(rs.DiskPaths[0], true)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(f.rw))
	_, err = o.ReadAt(got, 0)
	o.Close()
	if err != nil || !bytes.Equal(got, f.rw) {
		t.Fatalf("the sandbox's disk 0 does not read the template's (%v)", err)
	}
	// Another tenant can neither export alice's template nor see the import.
	if st, _ := f.td.client(t, "bob").do("GET", "/v1/templates/"+f.id+"/bundle", nil); st != 404 {
		t.Fatalf("bob exported alice's template: %d", st)
	}
	if st, _ := tdB.client(t, "bob").do("GET", "/v1/templates/"+rec.ID, nil); st != 404 {
		t.Fatalf("bob sees alice's imported template: %d", st)
	}
}

// TestTemplateBundleRefusals: a tampered template bundle, a sandbox's
// bundle given as a template's and a template's as a sandbox's are
// refused and leave nothing; network templates are not exported.
func TestTemplateBundleRefusals(t *testing.T) {
	f := newTemplateBundleFixture(t)
	good := readTar(t, f.export(t))
	sbBundle := newBundleFixture(t).export(t)
	tdB, _, cB := aliceDaemon(t)
	clone := func() []tarFile { return cloneTar(good) }
	header := func(mod func(h map[string]any)) []byte { return writeTar(withHeader(good, mod)) }
	flip := func(prefix string) []byte {
		fs := clone()
		for i := range fs {
			if strings.HasPrefix(fs[i].name, prefix) {
				fs[i].data[len(fs[i].data)/3] ^= 1
				break
			}
		}
		return writeTar(fs)
	}
	cases := map[string][]byte{
		"a sandbox's bundle":           sbBundle,
		"kind dropped":                 header(func(h map[string]any) { delete(h, "kind") }),
		"kind sandbox-like, no record": header(func(h map[string]any) { delete(h, "kind"); delete(h, "template_record") }),
		"no template record":           header(func(h map[string]any) { delete(h, "template_record") }),
		"unknown kind":                 header(func(h map[string]any) { h["kind"] = "image" }),
		"env in a template":            header(func(h map[string]any) { h["env"] = []string{"A=1"} }),
		"no kernel":                    header(func(h map[string]any) { h["template_record"].(map[string]any)["kernel"] = "" }),
		"unknown record field":         header(func(h map[string]any) { h["template_record"].(map[string]any)["snapshot"] = "/etc/passwd" }),
		"huge cmdline":                 header(func(h map[string]any) { h["template_record"].(map[string]any)["cmdline"] = strings.Repeat("x", 5000) }),
		"more disk names than disks": header(func(h map[string]any) {
			h["template_record"].(map[string]any)["disks"] = []string{"a", "b", "c"}
		}),
		"flipped disk byte":   flip("disk0/"),
		"flipped memory byte": flip("memory/"),
		"no end":              writeTar(clone()[:len(good)-1]),
	}
	for name, b := range cases {
		st, body := cB.do("POST", "/v1/templates/import", b)
		t.Logf("%s: %d %s", name, st, bytes.TrimSpace(body))
		if st != 400 {
			t.Errorf("%s: status %d, want 400: %s", name, st, body)
		}
		if d := templateDirs(tdB, "alice"); len(d) != 0 {
			t.Fatalf("%s: left %v", name, d)
		}
	}
	// A template's bundle is not a sandbox's.
	if st, body := cB.do("POST", "/v1/sandboxes/import", writeTar(good)); st != 400 || !strings.Contains(string(body), "template") {
		t.Fatalf("a template's bundle imported as a sandbox: %d %s", st, body)
	}
	if d := sandboxDirs(t, tdB, "alice"); len(d) != 0 {
		t.Fatalf("left %v", d)
	}
	var list []store.Template
	cB.ok(200, "GET", "/v1/templates", nil, &list)
	if len(list) != 0 {
		t.Fatalf("refused imports recorded: %+v", list)
	}
	// The unchanged bundle imports (the cases fail for their change).
	cB.ok(201, "POST", "/v1/templates/import", writeTar(good), nil)
	// A network template is not exported.
	ts := f.td.template("alice", f.id)
	ts.mu.Lock()
	ts.rec.Network = true
	f.td.saveTemplate(ts)
	ts.mu.Unlock()
	if st, body := f.c.do("GET", "/v1/templates/"+f.id+"/bundle", nil); st != 409 {
		t.Fatalf("network template exported: %d %.200s", st, body)
	}
}

// TestTemplateBundleSealedDisks: for a tenant with a key, a template's
// disks are sealed at rest; its export reads them in plaintext (the
// bundle holds what the build wrote) and leaves them sealed again.
func TestTemplateBundleSealedDisks(t *testing.T) {
	f := newTemplateBundleFixture(t, withKeys(t, newProvider(t), ""))
	f.c.ok(201, "POST", "/v1/keys", nil, nil)
	dir := f.td.store.TemplateDir("alice", f.id)
	files := []string{filepath.Join(dir, "disk0.base"), filepath.Join(dir, "disk0.frozen.wcow")}
	f.td.sealIdleDisks("alice")
	if got := sealState(t, files...); !got[0] || !got[1] {
		t.Fatalf("before the export: sealed %v, want both", got)
	}
	b := f.export(t)
	if !bytes.Contains(b, []byte("written by the template's build")) {
		t.Fatal("the bundle lacks what the template's build wrote to its disk")
	}
	if got := sealState(t, files...); !got[0] || !got[1] {
		t.Fatalf("after the export: sealed %v, want both", got)
	}
}
