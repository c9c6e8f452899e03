package daemon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/memsnap"
	"github.com/warrenvm/warren/memsnap/uffd"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmmctl"
)

// fakeWorkingSet is the working set every fake VMM that records one
// saves: 5 pages in two runs, of the memory it restored.
var fakeWorkingSet = []uffd.Run{{First: 0, Count: 3}, {First: 7, Count: 2}}

// serveWorkingSet adds the VMM's working-set calls to a fake VMM's
// control API: POST /v1/working-set/save writes fakeWorkingSet, for the
// top layer of the snapshot it restored, to its --record-working-set
// file (409 without one, or in another memory mode, as the VMM refuses;
// the launcher's failSave makes it answer 500).
func (vm *fakeVM) serveWorkingSet(mux *http.ServeMux, reply func(http.ResponseWriter, int, any)) {
	mux.HandleFunc("POST /v1/working-set/save", func(w http.ResponseWriter, r *http.Request) {
		vm.mu.Lock()
		rs := vm.restore
		vm.mu.Unlock()
		if rs == nil || rs.Mode() != vmsnap.Uffd || rs.RecordWorkingSet == "" {
			reply(w, 409, map[string]string{"error": "this VM records no working set"})
			return
		}
		if vm.launcher.failSave.Load() {
			reply(w, 500, map[string]string{"error": "fake: save refused"})
			return
		}
		ws, err := workingSetFor(rs.Snapshot, fakeWorkingSet)
		if err == nil {
			err = uffd.WriteWorkingSet(rs.RecordWorkingSet, ws)
		}
		if err != nil {
			reply(w, 500, map[string]string{"error": err.Error()})
			return
		}
		reply(w, 200, vmmctl.WorkingSetReply{Mode: string(vmsnap.Uffd), Path: rs.RecordWorkingSet, Pages: ws.NumPages(), Runs: len(ws.Runs)})
	})
}

// workingSetFor is a working set of runs for the memory of snapshot snap
// (its top layer, page size and memory size).
func workingSetFor(snap string, runs []uffd.Run) (*uffd.WorkingSet, error) {
	dir, _, state, err := vmsnap.Paths(snap)
	if err != nil {
		return nil, err
	}
	chain, _, err := snapshotChain(dir, state)
	if err != nil {
		return nil, err
	}
	l, err := memsnap.Open(filepath.Join(dir, chain[0]))
	if err != nil {
		return nil, err
	}
	defer l.Close()
	h := l.Header()
	return &uffd.WorkingSet{PageSize: h.PageSize, MemSize: h.MemSize, Top: l.Hash(), Runs: runs}, nil
}

// lastRestoreOf is the fake launcher's last restore spec.
func (f *fakeLauncher) lastRestoreOf() vmmctl.Restore {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastRestoreSpec
}

// withUffd sets a test daemon's RestoreMemory to "uffd".
func withUffd(c *Config) { c.RestoreMemory = RestoreUffd }

// templateRec is GET /v1/templates/{id}.
func (c *client) templateRec(id string) store.Template {
	c.t.Helper()
	var tp store.Template
	c.ok(200, "GET", "/v1/templates/"+id, nil, &tp)
	return tp
}

// checkWorkingSetFile checks that path is the fake's working set of
// snapshot snap, with the permissions of snap's state file.
func checkWorkingSetFile(t *testing.T, path, snap string) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatalf("working set: %v", err)
	}
	st, err := os.Stat(snap + vmsnap.StateExt)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode() != st.Mode()&^0o111 {
		t.Errorf("working set %s: mode %v, the state file's is %v", path, fi.Mode(), st.Mode())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := uffd.ParseWorkingSet(b)
	if err != nil {
		t.Fatal(err)
	}
	want, err := workingSetFor(snap, fakeWorkingSet)
	if err != nil {
		t.Fatal(err)
	}
	if ws.Top != want.Top || fmt.Sprint(ws.Runs) != fmt.Sprint(want.Runs) {
		t.Errorf("working set %s: top %s runs %v, want %s %v", path, ws.Top.Short(), ws.Runs, want.Top.Short(), want.Runs)
	}
}

// TestRestoreMemoryConfig: "mmap" is the default, "uffd" is taken, any
// other value is refused by New and by warren-hostd's flag.
func TestRestoreMemoryConfig(t *testing.T) {
	for _, c := range []struct{ in, want string }{{"", RestoreMmap}, {"mmap", RestoreMmap}, {"uffd", RestoreUffd}} {
		td := startDaemon(t, t.TempDir(), newFakeLauncher(t), func(cfg *Config) { cfg.RestoreMemory = c.in })
		if td.cfg.RestoreMemory != c.want {
			t.Errorf("RestoreMemory %q: the daemon's is %q, want %q", c.in, td.cfg.RestoreMemory, c.want)
		}
	}
	for _, bad := range []string{"eager", "UFFD", "lazy", " uffd"} {
		_, err := New(Config{State: t.TempDir(), Launcher: newFakeLauncher(t), CgroupRoot: "none", RestoreMemory: bad})
		if err == nil || !strings.Contains(err.Error(), "want mmap or uffd") {
			t.Errorf("RestoreMemory %q: New answered %v, want a refusal", bad, err)
		}
	}
	dir := t.TempDir()
	var stderr bytes.Buffer
	code := Main([]string{"--state", filepath.Join(dir, "state"), "--socket", filepath.Join(dir, "s.sock"), "--warren", "/bin/true",
		"--cgroup-root", "none", "--jail", "off", "--restore-memory", "userfaultfd"}, &stderr)
	if code == 0 || !strings.Contains(stderr.String(), `--restore-memory \"userfaultfd\": want mmap or uffd`) {
		t.Fatalf("Main = %d: %s", code, stderr.String())
	}
}

// TestCreateMmapUnchanged: without --restore-memory creates restore by
// mmap and record no working set.
func TestCreateMmapUnchanged(t *testing.T) {
	_, f, c := aliceDaemon(t)
	tp := c.template(fakeKernel(t))
	for range 2 {
		sb := c.create(tp.ID)
		want := vmmctl.Restore{Snapshot: tp.Snapshot, Lazy: true, API: sb.API, Vsock: sb.Vsock, Console: sb.Console}
		if got := f.lastRestoreOf(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("create's restore\n got %+v\nwant %+v", got, want)
		}
	}
	checkNoWorkingSet(t, c, tp.ID, workingSetPath(tp.Snapshot), "in mmap mode")
}

// TestCreateUffdRecordsAndPrefetches drives creates of a daemon with
// RestoreMemory "uffd" through the fake VMM: the template's first create
// restores by uffd and records the working set, which the daemon imports
// beside the template's snapshot (the VMM's file removed) and counts on
// the template; the next creates prefetch it; a resume from disk stays
// as it was (its own snapshot's working copy, eagerly: no uffd, nothing
// recorded or prefetched); a new daemon on the
// same state prefetches at once; deleting the template removes the file.
func TestCreateUffdRecordsAndPrefetches(t *testing.T) {
	state := t.TempDir()
	f := newFakeLauncher(t)
	td := startDaemon(t, state, f, withUffd)
	c := td.client(t, "alice")
	tp := c.template(fakeKernel(t))
	ws := workingSetPath(tp.Snapshot)
	if ws != filepath.Join(filepath.Dir(tp.Snapshot), "base.wset") {
		t.Fatalf("working set path %s", ws)
	}

	sb1 := c.create(tp.ID)
	rec := filepath.Join(td.store.SandboxDir("alice", sb1.ID), recordingName)
	want := vmmctl.Restore{Snapshot: tp.Snapshot, LazyMode: vmsnap.Uffd, RecordWorkingSet: rec, API: sb1.API, Vsock: sb1.Vsock, Console: sb1.Console}
	if got := f.lastRestoreOf(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("first create's restore\n got %+v\nwant %+v", got, want)
	}
	checkWorkingSetFile(t, ws, tp.Snapshot)
	if _, err := os.Lstat(rec); !os.IsNotExist(err) {
		t.Errorf("the VMM's recording %s is left: %v", rec, err)
	}
	if n := c.templateRec(tp.ID).WorkingSetPages; n != 5 {
		t.Errorf("working_set_pages %d, want 5", n)
	}

	sb2 := c.create(tp.ID)
	want = vmmctl.Restore{Snapshot: tp.Snapshot, LazyMode: vmsnap.Uffd, Prefetch: ws, API: sb2.API, Vsock: sb2.Vsock, Console: sb2.Console}
	if got := f.lastRestoreOf(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("second create's restore\n got %+v\nwant %+v", got, want)
	}
	c.ok(200, "POST", "/v1/sandboxes/"+sb2.ID+"/exec", map[string]any{"argv": []string{"true"}}, nil)

	c.suspendResume(sb2.ID)
	if got := f.lastRestoreOf(); got.Snapshot == tp.Snapshot || got.LazyMode != "" || got.RecordWorkingSet != "" || got.Prefetch != "" {
		t.Errorf("resume from disk: %+v, want a restore of its own snapshot as in mmap mode (no uffd, no working set)", got)
	}

	// A new daemon on the same state: its first create prefetches.
	td.Close()
	td = startDaemon(t, state, f, withUffd)
	c = td.client(t, "alice")
	if n := c.templateRec(tp.ID).WorkingSetPages; n != 5 {
		t.Errorf("after a restart: working_set_pages %d, want 5", n)
	}
	sb3 := c.create(tp.ID)
	if got := f.lastRestoreOf(); got.Prefetch != ws || got.RecordWorkingSet != "" || got.LazyMode != vmsnap.Uffd {
		t.Errorf("first create after a restart: %+v, want a prefetch of %s", got, ws)
	}
	for _, id := range []string{sb1.ID, sb2.ID, sb3.ID} {
		c.ok(200, "DELETE", "/v1/sandboxes/"+id, nil, nil)
	}
	c.ok(200, "DELETE", "/v1/templates/"+tp.ID, nil, nil)
	if _, err := os.Lstat(ws); !os.IsNotExist(err) {
		t.Errorf("the working set outlived its template: %v", err)
	}
}

// TestCreateUffdRecordFails: a VMM that cannot save its working set
// (here the fake refuses; a host without userfaultfd answers 409) leaves
// the create running, says so in its progress, and no later create of
// this daemon records again or prefetches.
func TestCreateUffdRecordFails(t *testing.T) {
	_, f, c := aliceDaemon(t, withUffd)
	f.failSave.Store(true)
	tp := c.template(fakeKernel(t))
	st, b := c.do("POST", "/v1/sandboxes", map[string]any{"template": tp.ID}, "Accept", "application/x-ndjson")
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var last struct {
		Result store.Sandbox
		Status int
	}
	json.Unmarshal([]byte(lines[len(lines)-1]), &last)
	if st != 200 || last.Status != 201 || last.Result.Status != store.Running {
		t.Fatalf("create: %d %s", st, b)
	}
	if !strings.Contains(string(b), "working set was not recorded: the VMM's save: fake: save refused") {
		t.Errorf("the create's progress does not say the recording failed: %s", b)
	}
	if got := f.lastRestoreOf(); got.RecordWorkingSet == "" {
		t.Fatalf("first create: %+v, want a recording", got)
	}
	checkNoWorkingSet(t, c, tp.ID, workingSetPath(tp.Snapshot), "after a failed recording")
	f.failSave.Store(false)
	c.create(tp.ID)
	if got := f.lastRestoreOf(); got.LazyMode != vmsnap.Uffd || got.RecordWorkingSet != "" || got.Prefetch != "" {
		t.Errorf("create after a failed recording: %+v, want uffd without a working set", got)
	}
	if n := c.templateRec(tp.ID).WorkingSetPages; n != 0 {
		t.Errorf("working_set_pages %d after a failed recording and a create without one", n)
	}
}

// TestCreateUffdKeyedTenant: for a tenant with a key the working set
// lives beside the template's decrypted copy (none beside its sealed
// snapshot), and goes with the copy when the daemon starts again (the
// count cleared, the next create records anew). A key created after a
// working set was recorded in plaintext removes it, and the next create
// records one beside the copy.
func TestCreateUffdKeyedTenant(t *testing.T) {
	state := t.TempDir()
	f := newFakeLauncher(t)
	keys := newProvider(t)
	mods := []func(*Config){withKeys(t, keys, ""), withUffd}
	td := startDaemon(t, state, f, mods...)
	c := td.client(t, "alice")
	tp := c.template(fakeKernel(t))
	plain := workingSetPath(tp.Snapshot)
	c.create(tp.ID)
	checkWorkingSetFile(t, plain, tp.Snapshot)

	// The key: the plaintext working set goes, the next create records
	// beside the copy.
	c.ok(201, "POST", "/v1/keys", nil, nil)
	checkNoWorkingSet(t, c, tp.ID, plain, "once the snapshot is sealed")
	c.create(tp.ID)
	got := f.lastRestoreOf()
	tplCopy := filepath.Join(td.cfg.DecryptDir, tplCopyPrefix+"alice."+tp.ID, "base")
	if got.Snapshot != tplCopy || got.RecordWorkingSet == "" || got.LazyMode != vmsnap.Uffd {
		t.Fatalf("first create with the key: %+v, want a recording restore of %s", got, tplCopy)
	}
	checkWorkingSetFile(t, workingSetPath(tplCopy), tplCopy)
	if _, err := os.Lstat(plain); !os.IsNotExist(err) {
		t.Errorf("a working set beside the sealed snapshot: %v", err)
	}
	sealedAll(t, filepath.Dir(tp.Snapshot))
	if n := c.templateRec(tp.ID).WorkingSetPages; n != 5 {
		t.Errorf("working_set_pages %d, want 5", n)
	}
	c.create(tp.ID)
	if got := f.lastRestoreOf(); got.Prefetch != workingSetPath(tplCopy) || got.RecordWorkingSet != "" {
		t.Errorf("second create with the key: %+v, want a prefetch of the copy's", got)
	}

	// A new daemon: the copy and its working set are gone, the count
	// is cleared, and the first create records again.
	td.Close()
	td = startDaemon(t, state, f, mods...)
	c = td.client(t, "alice")
	if n := c.templateRec(tp.ID).WorkingSetPages; n != 0 {
		t.Errorf("after a restart: working_set_pages %d, want 0 (the copy is gone)", n)
	}
	c.create(tp.ID)
	if got := f.lastRestoreOf(); got.RecordWorkingSet == "" || got.Prefetch != "" {
		t.Errorf("first create after a restart: %+v, want a recording", got)
	}
	checkWorkingSetFile(t, workingSetPath(tplCopy), tplCopy)
}

// TestImportWorkingSetRefuses: what a VMM wrote into its directory is
// imported only as a regular file, reached without a link, of the
// snapshot's memory, well formed and not larger than that memory's
// working set can be; nothing is written beside the snapshot otherwise.
func TestImportWorkingSetRefuses(t *testing.T) {
	dir := t.TempDir()
	snap := filepath.Join(dir, "snap", "base")
	os.Mkdir(filepath.Dir(snap), 0o755)
	if _, err := writeFakeSnapshot(snap, "", 1); err != nil {
		t.Fatal(err)
	}
	os.Chmod(snap+vmsnap.StateExt, 0o640)
	other := filepath.Join(dir, "other", "base")
	os.Mkdir(filepath.Dir(other), 0o755)
	if _, err := writeFakeSnapshot(other, "", 2); err != nil {
		t.Fatal(err)
	}
	good, err := workingSetFor(snap, fakeWorkingSet)
	if err != nil {
		t.Fatal(err)
	}
	stale, err := workingSetFor(other, fakeWorkingSet)
	if err != nil {
		t.Fatal(err)
	}
	encode := func(ws *uffd.WorkingSet) []byte {
		b, err := ws.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	secret := filepath.Join(dir, "secret")
	os.WriteFile(secret, encode(good), 0o600)
	sb := filepath.Join(dir, "sandbox")
	os.Mkdir(sb, 0o700)
	src := filepath.Join(sb, recordingName)
	pages := uint64(fakeMemSize / 4096)
	every := &uffd.WorkingSet{PageSize: good.PageSize, MemSize: good.MemSize, Top: good.Top}
	for p := uint64(0); p < pages; p += 2 {
		// Every page a run of its own (out of order, so no two merge):
		// the largest working set of this memory.
		every.Runs = append(every.Runs, uffd.Run{First: p + 1, Count: 1}, uffd.Run{First: p, Count: 1})
	}
	for _, c := range []struct {
		name string
		make func() error
		want string
	}{
		{"missing", func() error { return nil }, "no such file"},
		{"symlink", func() error { return os.Symlink(secret, src) }, "too many levels of symbolic links"},
		{"fifo", func() error { return syscall.Mkfifo(src, 0o600) }, "not a regular file"},
		{"directory", func() error { return os.Mkdir(src, 0o700) }, "not a regular file"},
		{"garbage", func() error { return os.WriteFile(src, []byte("not a working set"), 0o600) }, "corrupt working set"},
		{"stale", func() error { return os.WriteFile(src, encode(stale), 0o600) }, "stale working set"},
		{"too large", func() error { return os.WriteFile(src, append(encode(every), 0), 0o600) }, "more than the"},
		{"empty", func() error {
			return os.WriteFile(src, encode(&uffd.WorkingSet{PageSize: good.PageSize, MemSize: good.MemSize, Top: good.Top}), 0o600)
		}, "an empty working set"},
	} {
		os.RemoveAll(src)
		if err := c.make(); err != nil {
			t.Fatal(err)
		}
		_, err := importWorkingSet(src, snap)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: import answered %v, want %q", c.name, err, c.want)
		}
		if _, err := os.Lstat(workingSetPath(snap)); !os.IsNotExist(err) {
			t.Fatalf("%s: a working set was written beside the snapshot: %v", c.name, err)
		}
	}
	// The largest one of this memory, and a good one, are taken.
	for _, ws := range []*uffd.WorkingSet{every, good} {
		os.RemoveAll(src)
		os.WriteFile(src, encode(ws), 0o600)
		n, err := importWorkingSet(src, snap)
		if err != nil || n != ws.NumPages() {
			t.Fatalf("import: %d pages, %v; want %d", n, err, ws.NumPages())
		}
	}
	checkWorkingSetFile(t, workingSetPath(snap), snap)
}

// checkNoWorkingSet fails t unless there is no file at path (not even a
// link) and template id's record counts no working set pages; when says
// at which step.
func checkNoWorkingSet(t *testing.T, c *client, id, path, when string) {
	t.Helper()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("a working set at %s %s: %v", path, when, err)
	}
	if n := c.templateRec(id).WorkingSetPages; n != 0 {
		t.Errorf("working_set_pages %d %s", n, when)
	}
}
