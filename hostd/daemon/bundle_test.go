package daemon

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmm/hostprofile"
	"github.com/warrenvm/warren/vmm/kvm"
)

const bundleTestMem = 8 << 20

// bundleState is a valid machine state of bundleTestMem bytes of RAM.
func bundleState() *vmm.State {
	st := &vmm.State{Version: vmm.StateVersion,
		Machine: vmm.MachineState{MemBytes: bundleTestMem, CPUs: 1, Cmdline: vmm.BaseCmdline,
			Profile: hostprofile.Profile{Kind: hostprofile.Hardware, Module: "kvm_amd"}},
		PICMaster: bytes.Repeat([]byte{1}, 512), PICSlave: bytes.Repeat([]byte{2}, 512), IOAPIC: bytes.Repeat([]byte{3}, 512)}
	st.VCPUs = []vmm.VCPUState{{CPUID: []kvm.CPUIDEntry{{Function: 0, EAX: 0xd}}, Regs: kvm.Regs{RAX: 42, RIP: 0x100000, RFLAGS: 2},
		LAPIC: bytes.Repeat([]byte{7}, 1024)}}
	return st
}

// noisy returns n bytes of pseudo-random data with all-zero stretches.
func noisy(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 1))
	for i := 0; i < n; i += 4096 {
		if (i/4096)%3 == 1 {
			continue // a zero page
		}
		for j := i; j < min(i+4096, n); j++ {
			b[j] = byte(r.Uint32())
		}
	}
	for i := 2 * bundleChunk; i < min(3*bundleChunk, n); i++ {
		b[i] = 0 // a zero chunk: left out of the bundle
	}
	return b
}

// bundleFixture is tenant alice's suspended sandbox on a fake daemon,
// whose latest snapshot was replaced by a real one (vmsnap) with a
// writable disk (an overlay over a raw base, written to) and a read-only
// one; mem and disks are what they hold.
type bundleFixture struct {
	td          *testDaemon
	c           *client
	id          string
	mem         []byte
	rw, ro      []byte
	layer, base string
	opts        json.RawMessage // the snapshot's run options
}

func newBundleFixture(t *testing.T, mod ...func(*Config)) *bundleFixture {
	td, _, c := aliceDaemon(t, mod...)
	if td.cfg.Keys != nil {
		c.ok(201, "POST", "/v1/keys", nil, nil)
	}
	tp := c.template(fakeKernel(t))
	sb := c.create(tp.ID)
	c.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/pause?to_disk=true", nil, nil)
	f := &bundleFixture{td: td, c: c, id: sb.ID}
	s := td.sandbox("alice", sb.ID)
	s.mu.Lock()
	defer s.mu.Unlock()
	dir := td.store.SandboxDir("alice", sb.ID)
	// The disks: a raw base, an overlay over it with writes, and a
	// read-only raw image.
	f.base = filepath.Join(dir, "disk0.base")
	baseData := noisy(3*bundleChunk+12345, 1)
	if err := os.WriteFile(f.base, baseData, 0o600); err != nil {
		t.Fatal(err)
	}
	rb, err := disk.OpenRaw(f.base, false)
	if err != nil {
		t.Fatal(err)
	}
	f.layer = filepath.Join(dir, "disk0.frozen.wcow")
	ov, err := disk.Create(f.layer, rb, disk.CreateOptions{BasePath: f.base})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ov.WriteAt([]byte("written after the base"), 5000); err != nil {
		t.Fatal(err)
	}
	ov.Close()
	rb.Close()
	f.rw = bytes.Clone(baseData)
	copy(f.rw[5000:], "written after the base")
	f.ro = noisy(bundleChunk+777, 2)
	roPath := filepath.Join(dir, "disk1.ro")
	if err := os.WriteFile(roPath, f.ro, 0o400); err != nil {
		t.Fatal(err)
	}
	// The snapshot.
	f.opts, _ = json.Marshal(map[string]any{"version": 2, "mem_mib": 8, "cpus": 1, "rng": true, "vsock": s.rec.Vsock, "cid": 3,
		"disks": []map[string]any{{"path": f.base}, {"path": roPath, "ro": true}}})
	f.writeSnapshot(t, s, noisy(bundleTestMem, 3))
	return f
}

// writeSnapshot replaces the fixture sandbox's snapshot (s, its state,
// locked) with one of memory mem and the fixture's disks.
func (f *bundleFixture) writeSnapshot(t *testing.T, s *sbState, mem []byte) {
	t.Helper()
	td := f.td
	f.mem = mem
	snap := s.rec.Latest()
	layers := []vmsnap.DiskLayer{{Index: 0, Layer: f.layer, Chain: []string{f.layer, f.base}}}
	os.Remove(snap.Path + ".wstate")
	if _, err := vmsnap.Write(snap.Path, &vmsnap.Capture{Kind: vmsnap.Full, State: bundleState(), Devices: []vmsnap.DeviceState{}, Options: f.opts,
		Fingerprint: []byte("fake-host"), Memory: bytes.NewReader(f.mem), Disks: layers}); err != nil {
		t.Fatal(err)
	}
	snap.Disks = []store.DiskLayer{{Index: 0, Layer: f.layer, Chain: []string{f.layer, f.base}}}
	if h := td.cfg.Hooks.SnapshotWritten; h != nil && td.cfg.Keys != nil {
		if err := h("alice", snap.Path); err != nil { // sealed, as the daemon keeps it
			t.Fatal(err)
		}
	}
	td.save(s)
}

// export fetches the sandbox's bundle.
func (f *bundleFixture) export(t *testing.T) []byte {
	t.Helper()
	st, b := f.c.do("GET", "/v1/sandboxes/"+f.id+"/bundle", nil)
	if st != 200 {
		t.Fatalf("export: %d %s", st, b)
	}
	return b
}

type tarFile struct {
	name string
	data []byte
}

func readTar(t *testing.T, b []byte) []tarFile {
	t.Helper()
	var out []tarFile
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		d, _ := io.ReadAll(tr)
		out = append(out, tarFile{h.Name, d})
	}
}

func writeTar(files []tarFile) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Size: int64(len(f.data)), Mode: 0o600})
		tw.Write(f.data)
	}
	tw.Close()
	return buf.Bytes()
}

// sandboxDirs lists tenant's sandbox directories on td.
func sandboxDirs(t *testing.T, td *testDaemon, tenant string) []string {
	ents, _ := os.ReadDir(filepath.Join(td.state, "tenants", tenant, "sandboxes"))
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func TestBundleRoundTrip(t *testing.T) {
	f := newBundleFixture(t)
	b := f.export(t)
	files := readTar(t, b)
	if files[0].name != "bundle.json" || files[len(files)-1].name != "end" {
		t.Fatalf("bundle files %s ... %s", files[0].name, files[len(files)-1].name)
	}
	for _, x := range files {
		if strings.HasSuffix(x.name, fmt.Sprintf("/%016x", 2*bundleChunk)) && strings.HasPrefix(x.name, "disk0") {
			t.Errorf("the all-zero chunk %s is in the bundle", x.name)
		}
	}
	// Another daemon (another state directory) imports it.
	tdB, _, cB := aliceDaemon(t)
	var rec store.Sandbox
	cB.ok(201, "POST", "/v1/sandboxes/import?label=fleet%3Done", b, &rec)
	if rec.Status != store.Suspended || rec.Labels["fleet"] != "one" || rec.MemMiB != f.c.get(f.id).MemMiB || len(rec.Snapshots) != 1 {
		t.Fatalf("imported: %+v", rec)
	}
	snap := rec.Snapshots[0]
	dirB := tdB.store.SandboxDir("alice", rec.ID)
	if !strings.HasPrefix(snap.Path, dirB+"/") {
		t.Fatalf("snapshot at %s, outside %s", snap.Path, dirB)
	}
	// As a restore reads it (the page store's working copy, when its
	// memory went into the store).
	use, done, err := tdB.cfg.Hooks.BeforeRestore("alice", snap.Path)
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
	if !bytes.Equal(mem, f.mem) {
		t.Fatal("imported memory differs")
	}
	if ls.State.VCPUs[0].Regs.RAX != 42 {
		t.Fatal("machine state differs")
	}
	var opts struct {
		Disks []struct {
			Path, Name string
			RO         bool `json:"ro"`
		} `json:"disks"`
		Vsock string `json:"vsock"`
		RNG   bool   `json:"rng"`
	}
	if err := json.Unmarshal(ls.Meta.Options, &opts); err != nil {
		t.Fatal(err)
	}
	if len(opts.Disks) != 2 || opts.Disks[0].Path != filepath.Join(dirB, "disk0.base") || opts.Disks[1].Path != filepath.Join(dirB, "disk1.ro") ||
		!opts.Disks[1].RO || opts.Disks[0].Name != f.base || opts.Vsock != rec.Vsock || !opts.RNG {
		t.Fatalf("imported run options %+v", opts)
	}
	if len(ls.Disks) != 1 || ls.Disks[0].Layer != opts.Disks[0].Path || len(snap.Disks) != 1 || snap.Disks[0].Layer != opts.Disks[0].Path {
		t.Fatalf("imported disk layers %+v / %+v", ls.Disks, snap.Disks)
	}
	for i, want := range [][]byte{f.rw, f.ro} {
		got, err := os.ReadFile(opts.Disks[i].Path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("disk %d differs after import", i)
		}
	}
	// The existing resume path runs it (the fake VMM reads the snapshot).
	var resumed store.Sandbox
	cB.ok(200, "POST", "/v1/sandboxes/"+rec.ID+"/resume", nil, &resumed)
	if resumed.Status != store.Running {
		t.Fatalf("resumed: %+v", resumed)
	}
	// Named snapshots: an unknown one is 404.
	if st, _ := f.c.do("GET", "/v1/sandboxes/"+f.id+"/bundle?snapshot=nope", nil); st != 404 {
		t.Fatalf("unknown snapshot: %d", st)
	}
	// Another tenant cannot export alice's sandbox.
	if st, _ := f.td.client(t, "bob").do("GET", "/v1/sandboxes/"+f.id+"/bundle", nil); st != 404 {
		t.Fatalf("bob exported alice's sandbox: %d", st)
	}
}

func TestBundleImportRefusals(t *testing.T) {
	f := newBundleFixture(t)
	good := readTar(t, f.export(t))
	tdB, _, cB := aliceDaemon(t)
	idx := func(prefix string) int {
		for i, x := range good {
			if strings.HasPrefix(x.name, prefix) {
				return i
			}
		}
		t.Fatalf("no %s", prefix)
		return -1
	}
	clone := func() []tarFile { return cloneTar(good) }
	header := func(mod func(h map[string]any)) []tarFile { return withHeader(good, mod) }
	cases := map[string][]tarFile{
		"flipped disk byte": func() []tarFile {
			fs := clone()
			fs[idx("disk0/")].data[100] ^= 1
			return fs
		}(),
		"flipped memory byte, end resigned": func() []tarFile {
			fs := clone()
			c := idx("memory/") + 1 // a chunk (the first piece is the layer's header)
			fs[c].data[len(fs[c].data)/2] ^= 1
			return resignTar(fs)
		}(),
		"flipped state byte, end resigned": func() []tarFile {
			fs := clone()
			fs[idx("state/")].data[40] ^= 1
			return resignTar(fs)
		}(),
		"no end":            clone()[:len(good)-1],
		"cut short":         clone()[:len(good)/2],
		"files after end":   append(clone(), tarFile{"extra", []byte("x")}),
		"chunk dropped":     append(clone()[:idx("disk0/")], clone()[idx("disk0/")+1:]...),
		"path escape":       resignTar(append(clone()[:1], append([]tarFile{{"../../etc/passwd", []byte("x")}}, clone()[1:]...)...)),
		"unknown part":      resignTar(append(clone()[:1], append([]tarFile{{"disk9/0000000000000000", []byte("x")}}, clone()[1:]...)...)),
		"offset not hex16":  resignTar(append(clone()[:1], append([]tarFile{{"disk0/0", []byte("x")}}, clone()[1:]...)...)),
		"chunk beyond part": resignTar(append(clone()[:len(good)-1], tarFile{"disk1/" + fmt.Sprintf("%016x", 64*bundleChunk), []byte("x")}, tarFile{"end", nil})),
		"chunk repeated": func() []tarFile {
			fs := clone()
			i := idx("disk0/")
			fs = append(fs[:i+1], fs[i:]...)
			return resignTar(fs)
		}(),
		"memory pieces overlapping": func() []tarFile {
			fs := clone()
			i := idx("memory/")
			extra := tarFile{fmt.Sprintf("memory/%016x", len(fs[i].data)-1), []byte{1, 2}}
			return resignTar(append(fs[:i+1], append([]tarFile{extra}, fs[i+1:]...)...))
		}(),
		"memory in tiny pieces": func() []tarFile {
			// The index and footer, a byte a piece: more files than a
			// layer of its memory is cut into.
			fs := clone()
			last := idx("disk0/") - 1
			off, _ := strconv.ParseInt(strings.TrimPrefix(fs[last].name, "memory/"), 16, 64)
			var tiny []tarFile
			for j, c := range fs[last].data {
				tiny = append(tiny, tarFile{fmt.Sprintf("memory/%016x", off+int64(j)), []byte{c}})
			}
			return resignTar(append(fs[:last], append(tiny, fs[last+1:]...)...))
		}(),
		"header not first": resignTar(append(clone()[1:2], append(clone()[:1], clone()[2:]...)...)),
		"version":          header(func(h map[string]any) { h["version"] = bundleVersion + 1 }),
		"huge memory":      header(func(h map[string]any) { h["memory_bytes"] = 1 << 40 }),
		"huge disk": header(func(h map[string]any) {
			h["disks"] = []map[string]any{{"bytes": int64(1) << 50}, {"bytes": 10, "ro": true}}
		}),
		"layer name path": header(func(h map[string]any) { h["memory_layer"] = "../../x.wsnap" }),
		"snapshot name":   header(func(h map[string]any) { h["snapshot"] = "../x" }),
		"unknown field":   header(func(h map[string]any) { h["path"] = "/etc" }),
		"cpus":            header(func(h map[string]any) { h["cpus"] = 0 }),
		"disk ro swapped": header(func(h map[string]any) {
			h["disks"] = []map[string]any{{"bytes": len(f.rw), "ro": true}, {"bytes": len(f.ro)}}
		}),
		"too few disks": header(func(h map[string]any) { h["disks"] = h["disks"].([]any)[:1] }),
		"overlay magic in a raw disk": func() []tarFile {
			fs := clone()
			d := fs[idx("disk0/")].data
			copy(d, disk.Magic)
			return resignTar(fs)
		}(),
	}
	for name, fs := range cases {
		st, body := cB.do("POST", "/v1/sandboxes/import", writeTar(fs))
		t.Logf("%s: %d %s", name, st, bytes.TrimSpace(body))
		if st < 400 || st >= 500 {
			t.Errorf("%s: status %d: %s", name, st, body)
		}
		if d := sandboxDirs(t, tdB, "alice"); len(d) != 0 {
			t.Fatalf("%s: left %v", name, d)
		}
	}
	var list []store.Sandbox
	cB.ok(200, "GET", "/v1/sandboxes", nil, &list)
	if len(list) != 0 {
		t.Fatalf("refused imports recorded: %+v", list)
	}
	// The unchanged bundle still imports (the cases above fail for their change).
	cB.ok(201, "POST", "/v1/sandboxes/import", writeTar(good), nil)
	// A bundle whose end is resigned unchanged imports too (resign is right).
	cB.ok(201, "POST", "/v1/sandboxes/import", writeTar(resignTar(clone())), nil)
}

// TestBundleExportOpensOnlyTenantFiles: the snapshot's paths come from
// its VMM; an export refuses a disk outside the tenant's directory, by
// path or through a symbolic link in the sandbox's directory, and never
// sends its bytes.
func TestBundleExportOpensOnlyTenantFiles(t *testing.T) {
	f := newBundleFixture(t)
	outside := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(outside, bytes.Repeat([]byte("HOST-SECRET!"), 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := f.td.store.SandboxDir("alice", f.id)
	link := filepath.Join(dir, "disk1.link")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	s := f.td.sandbox("alice", f.id)
	for _, ro := range []string{outside, link, "/proc/self/environ"} {
		s.mu.Lock()
		snap := s.rec.Latest()
		opts, _ := json.Marshal(map[string]any{"version": 2, "mem_mib": 8, "cpus": 1, "vsock": s.rec.Vsock,
			"disks": []map[string]any{{"path": f.base}, {"path": ro, "ro": true}}})
		if _, err := vmsnap.Write(snap.Path, &vmsnap.Capture{Kind: vmsnap.Full, State: bundleState(), Devices: []vmsnap.DeviceState{}, Options: opts,
			Fingerprint: []byte("fake-host"), Memory: bytes.NewReader(f.mem),
			Disks: []vmsnap.DiskLayer{{Index: 0, Layer: f.layer, Chain: []string{f.layer, f.base}}}}); err != nil {
			t.Fatal(err)
		}
		s.mu.Unlock()
		st, b := f.c.do("GET", "/v1/sandboxes/"+f.id+"/bundle", nil)
		if st != 409 || bytes.Contains(b, []byte("HOST-SECRET")) {
			t.Fatalf("read-only disk %s: %d %.200s", ro, st, b)
		}
	}
}

// cloneTar returns a deep copy of a bundle's files, to tamper with.
func cloneTar(good []tarFile) []tarFile {
	out := make([]tarFile, len(good))
	for i, x := range good {
		out[i] = tarFile{x.name, bytes.Clone(x.data)}
	}
	return out
}

// resignTar recomputes a bundle's "end" (its last file) so that only the
// change a refusal test made is wrong.
func resignTar(fs []tarFile) []tarFile {
	var w bundleWriter
	var buf bytes.Buffer
	w.tw = tar.NewWriter(&buf)
	for _, x := range fs[:len(fs)-1] {
		w.file(x.name, x.data)
	}
	eb, _ := json.Marshal(bundleEnd{Files: w.files})
	fs[len(fs)-1] = tarFile{"end", eb}
	return fs
}

// withHeader returns a copy of the bundle good whose bundle.json mod
// changed, re-signed.
func withHeader(good []tarFile, mod func(h map[string]any)) []tarFile {
	fs := cloneTar(good)
	var h map[string]any
	json.Unmarshal(fs[0].data, &h)
	mod(h)
	fs[0].data, _ = json.Marshal(h)
	return resignTar(fs)
}
