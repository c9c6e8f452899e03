package daemon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

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
		if h := workingSetSaveHook.Load(); h != nil {
			(*h)(vm.api)
		}
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

// workingSetSaveHook, when set, is called with a fake VMM's API socket
// as it takes POST /v1/working-set/save, before it saves.
var workingSetSaveHook atomic.Pointer[func(api string)]

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

// TestCreateMmapUnchanged: without --restore-memory a build restores
// nothing once its snapshot is written (its one VMM is the build's), and
// creates restore by mmap and record no working set.
func TestCreateMmapUnchanged(t *testing.T) {
	td, f, c := aliceDaemon(t)
	tp := c.template(fakeKernel(t))
	if n, got := f.starts.Load(), f.lastRestoreOf(); n != 1 || got.Snapshot != "" {
		t.Errorf("the build started %d VMMs, the last restore %+v: want the build's VMM only", n, got)
	}
	checkNoWorkingSet(t, c, tp.ID, workingSetPath(tp.Snapshot), "after the build in mmap mode")
	checkNoRecorder(t, td, c)
	for range 2 {
		sb := c.create(tp.ID)
		want := vmmctl.Restore{Snapshot: tp.Snapshot, Lazy: true, API: sb.API, Vsock: sb.Vsock, Console: sb.Console}
		if got := f.lastRestoreOf(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("create's restore\n got %+v\nwant %+v", got, want)
		}
	}
	checkNoWorkingSet(t, c, tp.ID, workingSetPath(tp.Snapshot), "in mmap mode")
}

// TestBuildUffdRecordsAndCreatesPrefetch drives a daemon with
// RestoreMemory "uffd" through the fake VMM: the template's build ends by
// recording the working set (a recorder's restore of the new snapshot:
// uffd, --record-working-set in the recorder's own directory), which the
// daemon imports beside the template's snapshot (the VMM's file removed)
// and counts on the template in the build's answer; the recorder is gone
// (checkRecorderGone); the first create prefetches it and the next ones
// too; a resume from disk stays as it was (its own snapshot's working
// copy, eagerly: no uffd, nothing recorded or prefetched); a new daemon on
// the same state prefetches at once; deleting the template removes the
// file.
func TestBuildUffdRecordsAndCreatesPrefetch(t *testing.T) {
	state := t.TempDir()
	f := newFakeLauncher(t)
	td := startDaemon(t, state, f, withUffd)
	c := td.client(t, "alice")
	tp, progress := buildStream(c, map[string]any{"kernel": fakeKernel(t), "mem_mib": 128, "cpus": 1})
	ws := workingSetPath(tp.Snapshot)
	if ws != filepath.Join(filepath.Dir(tp.Snapshot), "base.wset") {
		t.Fatalf("working set path %s", ws)
	}
	if tp.WorkingSetPages != 5 {
		t.Errorf("the build's answer: working_set_pages %d, want 5", tp.WorkingSetPages)
	}
	if !strings.Contains(progress, "working set: ") || !strings.Contains(progress, "recorded the template's working set (5 pages)") {
		t.Errorf("the build's progress does not show the recording: %s", progress)
	}
	recRS := f.lastRestoreOf()
	recID := checkRecorderGone(t, td, f, c, recRS)
	rec := filepath.Join(td.store.SandboxDir("alice", recID), recordingName)
	want := vmmctl.Restore{Snapshot: tp.Snapshot, LazyMode: vmsnap.Uffd, RecordWorkingSet: rec, API: recRS.API, Vsock: recRS.Vsock,
		Console: filepath.Join(td.store.SandboxDir("alice", recID), "console.log")}
	if fmt.Sprint(recRS) != fmt.Sprint(want) {
		t.Fatalf("the build's recording restore\n got %+v\nwant %+v", recRS, want)
	}
	checkWorkingSetFile(t, ws, tp.Snapshot)
	if n := c.templateRec(tp.ID).WorkingSetPages; n != 5 {
		t.Errorf("working_set_pages %d, want 5", n)
	}

	sb1 := c.create(tp.ID)
	want = vmmctl.Restore{Snapshot: tp.Snapshot, LazyMode: vmsnap.Uffd, Prefetch: ws, API: sb1.API, Vsock: sb1.Vsock, Console: sb1.Console}
	if got := f.lastRestoreOf(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("first create's restore\n got %+v\nwant %+v", got, want)
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

// TestBuildUffdCreateWaitsForRecording: while the build's recorder
// records (held in its save here), the template is ready, the recorder is
// nowhere to be seen through the API (not listed, its id unknown, not
// deletable), and a create that comes meanwhile waits for the recording
// and then prefetches it instead of recording one of its own.
func TestBuildUffdCreateWaitsForRecording(t *testing.T) {
	td, f, c := aliceDaemon(t, withUffd)
	saving, release := make(chan string, 1), make(chan struct{})
	hook := func(api string) {
		if isRecorder(strings.TrimSuffix(filepath.Base(api), ".api")) {
			saving <- api
			<-release
		}
	}
	workingSetSaveHook.Store(&hook)
	defer workingSetSaveHook.Store(nil)
	built := make(chan store.Template, 1)
	go func() {
		var tp store.Template
		st, b, err := c.try("POST", "/v1/templates", map[string]any{"kernel": fakeKernel(t), "mem_mib": 128, "cpus": 1})
		if err == nil && st == 201 {
			json.Unmarshal(b, &tp)
		} else {
			t.Errorf("build: %d %s %v", st, b, err)
		}
		built <- tp
	}()
	var api string
	select {
	case api = <-saving:
	case <-time.After(20 * time.Second):
		close(release)
		t.Fatal("the build's recorder never saved its working set")
	}
	id := strings.TrimSuffix(filepath.Base(api), ".api")
	var list []store.Template
	c.ok(200, "GET", "/v1/templates", nil, &list)
	if len(list) != 1 || list[0].Status != store.TemplateReady {
		close(release)
		t.Fatalf("templates while the build records: %+v, want one ready", list)
	}
	tpID := list[0].ID
	checkRecorderUnseen(t, td, c)
	for _, req := range [][2]string{{"GET", "/v1/sandboxes/" + id}, {"DELETE", "/v1/sandboxes/" + id}, {"POST", "/v1/sandboxes/" + id + "/exec"}} {
		if st, b := c.do(req[0], req[1], map[string]any{"argv": []string{"true"}}); st != 404 {
			t.Errorf("%s %s while it records: %d %s, want 404", req[0], req[1], st, b)
		}
	}
	created := make(chan store.Sandbox, 1)
	go func() {
		var sb store.Sandbox
		st, b, err := c.try("POST", "/v1/sandboxes", map[string]any{"template": tpID})
		if err == nil && st == 201 {
			json.Unmarshal(b, &sb)
		} else {
			t.Errorf("create: %d %s %v", st, b, err)
		}
		created <- sb
	}()
	// (The create reaches the template's warm lock meanwhile; were it
	// not held, the create would record, not prefetch.)
	time.Sleep(200 * time.Millisecond)
	close(release)
	tp, sb := <-built, <-created
	if tp.WorkingSetPages != 5 {
		t.Errorf("the build's answer: working_set_pages %d, want 5", tp.WorkingSetPages)
	}
	if got := f.lastRestoreOf(); got.API != sb.API || got.Prefetch != workingSetPath(tp.Snapshot) || got.RecordWorkingSet != "" {
		t.Errorf("the create made during the build's recording: %+v, want a prefetch of %s", got, workingSetPath(tp.Snapshot))
	}
	checkNoRecorder(t, td, c)
}

// TestBuildUffdRecordingFails: a build whose recording fails (the
// recorder's VMM cannot save its working set; or it cannot even start)
// is ready all the same, says so in its progress, leaves no recorder
// behind and no working set; the template's first create then records
// it (the fallback of workingset.go) and the next create prefetches.
func TestBuildUffdRecordingFails(t *testing.T) {
	for _, c := range []struct {
		name string
		fail func(f *fakeLauncher) *atomic.Bool
		want string
	}{
		{"save refused", func(f *fakeLauncher) *atomic.Bool { return &f.failSave }, "working set was not recorded: the VMM's save: fake: save refused"},
		{"restore refused", func(f *fakeLauncher) *atomic.Bool { return &f.failRestore }, "working set was not recorded: start VMM: fake: restore refused"},
	} {
		t.Run(c.name, func(t *testing.T) {
			td, f, cl := aliceDaemon(t, withUffd)
			fail := c.fail(f)
			fail.Store(true)
			before := f.starts.Load()
			tp, progress := buildStream(cl, map[string]any{"kernel": fakeKernel(t), "mem_mib": 128, "cpus": 1})
			fail.Store(false)
			if tp.Status != store.TemplateReady || tp.WorkingSetPages != 0 {
				t.Fatalf("build: %+v, want ready without a working set", tp)
			}
			if !strings.Contains(progress, c.want) {
				t.Errorf("the build's progress does not say the recording failed (%q): %s", c.want, progress)
			}
			if c.name == "save refused" {
				// The build's VMM and the recorder's.
				if n := f.starts.Load() - before; n != 2 {
					t.Errorf("%d VMMs started by the build, want 2", n)
				}
				checkRecorderGone(t, td, f, cl, f.lastRestoreOf())
			} else {
				checkNoRecorder(t, td, cl)
			}
			checkNoWorkingSet(t, cl, tp.ID, workingSetPath(tp.Snapshot), "after the build's failed recording")

			sb1 := cl.create(tp.ID)
			rec := filepath.Join(td.store.SandboxDir("alice", sb1.ID), recordingName)
			if got := f.lastRestoreOf(); got.RecordWorkingSet != rec || got.Prefetch != "" || got.LazyMode != vmsnap.Uffd {
				t.Fatalf("first create after the build's failed recording: %+v, want a recording into %s", got, rec)
			}
			checkWorkingSetFile(t, workingSetPath(tp.Snapshot), tp.Snapshot)
			if n := cl.templateRec(tp.ID).WorkingSetPages; n != 5 {
				t.Errorf("working_set_pages %d after the first create recorded, want 5", n)
			}
			cl.create(tp.ID)
			if got := f.lastRestoreOf(); got.Prefetch != workingSetPath(tp.Snapshot) || got.RecordWorkingSet != "" {
				t.Errorf("second create: %+v, want a prefetch", got)
			}
		})
	}
}

// TestBuildUffdNetworkAndDisks: a build of a network template with a
// writable disk records its working set too: the recorder's restore has
// what a create's has (the network's secrets file, an overlay of its own
// over the template's frozen disk base, in its directory), all of which
// goes with it; the template's base is left as the build froze it; the
// first create prefetches.
func TestBuildUffdNetworkAndDisks(t *testing.T) {
	src := guestDir(t, map[string]string{"rw.img": strings.Repeat("warren disk\n", 1000)})
	td, f, c := aliceDaemon(t, withUffd, func(c *Config) { c.GuestDir = src })
	var tp store.Template
	c.ok(201, "POST", "/v1/templates", map[string]any{"kernel": fakeKernel(t), "mem_mib": 128, "cpus": 1, "network": true, "disks": []string{"rw.img"}}, &tp)
	if tp.Status != store.TemplateReady || len(tp.DiskBases) != 1 {
		t.Fatalf("template %+v", tp)
	}
	before, err := os.ReadFile(tp.DiskBases[0])
	if err != nil {
		t.Fatal(err)
	}
	rs := f.lastRestoreOf()
	id := strings.TrimSuffix(filepath.Base(rs.API), ".api")
	dir := td.store.SandboxDir("alice", id)
	if rs.RecordWorkingSet == "" || rs.Secrets == "" || len(rs.DiskPaths) != 1 || filepath.Dir(rs.DiskPaths[0]) != dir {
		t.Fatalf("the build's recording restore: %+v, want a recording with the network's secrets and an overlay in %s", rs, dir)
	}
	checkRecorderGone(t, td, f, c, rs)
	if after, err := os.ReadFile(tp.DiskBases[0]); err != nil || !bytes.Equal(after, before) {
		t.Errorf("the template's disk base changed by its recording: %v", err)
	}
	checkWorkingSetFile(t, workingSetPath(tp.Snapshot), tp.Snapshot)
	if tp.WorkingSetPages != 5 {
		t.Errorf("working_set_pages %d, want 5", tp.WorkingSetPages)
	}
	c.create(tp.ID)
	if got := f.lastRestoreOf(); got.Prefetch != workingSetPath(tp.Snapshot) || got.RecordWorkingSet != "" {
		t.Errorf("first create: %+v, want a prefetch", got)
	}
}

// TestWorkingSetRecorderLeftoversRemovedAtStart: a daemon killed while a build's
// recorder ran leaves its record (its VMM still running), its sockets,
// jail mount point and family run directory, and possibly a recorder
// directory without a record; the next daemon stops the VMM and removes
// all of it before it serves, and never lists it; the template is ready
// and its first create records.
func TestWorkingSetRecorderLeftoversRemovedAtStart(t *testing.T) {
	state := t.TempDir()
	f := newFakeLauncher(t)
	td := startDaemon(t, state, f, withUffd)
	c := td.client(t, "alice")
	f.failSave.Store(true)
	tp := c.template(fakeKernel(t))
	f.failSave.Store(false)
	td.Close()

	// A recorder with a record and a live "VMM" (as a killed daemon
	// leaves it), and one without a record.
	st, err := store.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	vmm := exec.Command("sleep", "600")
	if err := vmm.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vmm.Process.Kill() })
	exited := make(chan struct{})
	go func() { vmm.Wait(); close(exited) }()
	start, err := procStartTime(vmm.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	var leftovers []string
	for i, id := range []string{newID(recorderPrefix), newID(recorderPrefix)} {
		dir := st.SandboxDir("alice", id)
		api, vs := filepath.Join(st.RunDir(), id+".api"), filepath.Join(st.RunDir(), id+".vsock")
		paths := []string{dir, api, vs, filepath.Join(st.Root, "jail", id), filepath.Join(st.RunDir(), "j-"+id)}
		for _, p := range paths[3:] {
			if err := os.MkdirAll(p, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		os.WriteFile(filepath.Join(paths[4], "console.log"), []byte("x"), 0o600)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(api, nil, 0o600)
		os.WriteFile(vs, nil, 0o600)
		os.WriteFile(filepath.Join(dir, recordingName), []byte("partial"), 0o600)
		if i == 0 {
			sb := &store.Sandbox{ID: id, Tenant: "alice", Template: tp.ID, Status: store.Running, PID: vmm.Process.Pid, StartTime: start,
				API: api, Vsock: vs, Console: filepath.Join(dir, "console.log"), Log: filepath.Join(dir, "vmm.log"), MemMiB: 128, CPUs: 1}
			if err := st.SaveSandbox(sb); err != nil {
				t.Fatal(err)
			}
		}
		leftovers = append(leftovers, paths...)
	}

	td = startDaemon(t, state, f, withUffd)
	c = td.client(t, "alice")
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Errorf("the recorder's VMM (pid %d) still runs after the daemon started", vmm.Process.Pid)
	}
	for _, p := range leftovers {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("a recorder's leftover %s is still there: %v", p, err)
		}
	}
	checkNoRecorder(t, td, c)
	c.create(tp.ID)
	if got := f.lastRestoreOf(); got.RecordWorkingSet == "" {
		t.Errorf("first create: %+v, want a recording", got)
	}
}

// buildStream builds a template from req with its progress streamed, and
// returns the built template and the stream.
func buildStream(c *client, req map[string]any) (store.Template, string) {
	c.t.Helper()
	st, b := c.do("POST", "/v1/templates", req, "Accept", "application/x-ndjson")
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var last struct {
		Result store.Template
		Status int
	}
	json.Unmarshal([]byte(lines[len(lines)-1]), &last)
	if st != 200 || last.Status != 201 || last.Result.Status != store.TemplateReady {
		c.t.Fatalf("build: %d %s", st, b)
	}
	return last.Result, string(b)
}

// checkRecorderGone checks that the build's recorder, whose restore was
// rs, is a recorder (its id of recorderPrefix, never a tenant's kind) and
// that nothing of it remains: its VMM stopped, its directory, sockets,
// jail mount point and run directory removed, no sandbox of the tenant
// listed and its id unknown to the API. It returns its id.
func checkRecorderGone(t *testing.T, td *testDaemon, f *fakeLauncher, c *client, rs vmmctl.Restore) string {
	t.Helper()
	id := strings.TrimSuffix(filepath.Base(rs.API), ".api")
	if !isRecorder(id) || !store.ValidID(id) {
		t.Fatalf("the build's recording restore %+v: not a recorder's (id %q)", rs, id)
	}
	f.mu.Lock()
	var pid int
	for p, vm := range f.vms {
		if vm.api == rs.API {
			pid = p
		}
	}
	f.mu.Unlock()
	if pid == 0 {
		t.Errorf("no fake VMM served the recorder's API %s", rs.API)
	} else if err := syscall.Kill(pid, 0); err == nil {
		if st, err := procStartTime(pid); err == nil && alive(pid, st) {
			t.Errorf("the recorder's VMM (pid %d) still runs", pid)
		}
	}
	for _, p := range []string{td.store.SandboxDir(c.tenant, id), rs.API, rs.Vsock, filepath.Join(td.store.Root, "jail", id), filepath.Join(td.store.RunDir(), "j-"+id)} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("the recorder's %s is left: %v", p, err)
		}
	}
	if st, _ := c.do("GET", "/v1/sandboxes/"+id, nil); st != 404 {
		t.Errorf("GET /v1/sandboxes/%s: %d, want 404", id, st)
	}
	checkNoRecorder(t, td, c)
	return id
}

// checkNoRecorder checks that the daemon holds no recorder among its
// sandboxes and lists none of tenant c's sandboxes that is one, and that
// no recorder directory is left among the tenant's sandboxes.
func checkNoRecorder(t *testing.T, td *testDaemon, c *client) {
	t.Helper()
	checkRecorderUnseen(t, td, c)
	ents, _ := os.ReadDir(filepath.Join(td.store.Root, "tenants", c.tenant, "sandboxes"))
	for _, e := range ents {
		if isRecorder(e.Name()) {
			t.Errorf("a recorder's directory is left: %s", e.Name())
		}
	}
}

// checkRecorderUnseen checks that the daemon holds no recorder among its
// sandboxes and lists none of tenant c's sandboxes that is one.
func checkRecorderUnseen(t *testing.T, td *testDaemon, c *client) {
	t.Helper()
	var list []store.Sandbox
	c.ok(200, "GET", "/v1/sandboxes", nil, &list)
	for _, sb := range list {
		if isRecorder(sb.ID) {
			t.Errorf("a recorder is listed: %+v", sb)
		}
	}
	for _, s := range td.allSandboxes() {
		if isRecorder(s.rec.ID) {
			t.Errorf("the daemon holds a recorder among its sandboxes: %s", s.rec.ID)
		}
	}
}

// TestCreateUffdRecordFails: a VMM that cannot save its working set
// (here the fake refuses; a host without userfaultfd answers 409), both
// the build's recorder and then the template's first create's, leaves
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
// working set was recorded in plaintext (by the build, before the key)
// removes it, and the next create records one beside the copy. A build
// for a tenant with a key records nothing (workingset_build.go): its
// first create records beside the copy.
func TestCreateUffdKeyedTenant(t *testing.T) {
	state := t.TempDir()
	f := newFakeLauncher(t)
	keys := newProvider(t)
	mods := []func(*Config){withKeys(t, keys, ""), withUffd}
	td := startDaemon(t, state, f, mods...)
	c := td.client(t, "alice")
	tp := c.template(fakeKernel(t))
	plain := workingSetPath(tp.Snapshot)
	checkWorkingSetFile(t, plain, tp.Snapshot) // the build's, without a key
	c.create(tp.ID)
	if got := f.lastRestoreOf(); got.Prefetch != plain {
		t.Errorf("first create before the key: %+v, want a prefetch of %s", got, plain)
	}

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

	// A build with the key records nothing: its one VMM is the build's.
	before := f.starts.Load()
	tp2 := c.template(fakeKernel(t))
	if n := f.starts.Load() - before; n != 1 {
		t.Errorf("a build with the key started %d VMMs, want 1 (no recorder)", n)
	}
	checkNoWorkingSet(t, c, tp2.ID, workingSetPath(tp2.Snapshot), "after a build with the key")
	c.create(tp2.ID)
	copy2 := filepath.Join(td.cfg.DecryptDir, tplCopyPrefix+"alice."+tp2.ID, "base")
	if got := f.lastRestoreOf(); got.Snapshot != copy2 || got.RecordWorkingSet == "" {
		t.Fatalf("first create of a template built with the key: %+v, want a recording restore of %s", got, copy2)
	}
	checkWorkingSetFile(t, workingSetPath(copy2), copy2)
	if _, err := os.Lstat(workingSetPath(tp2.Snapshot)); !os.IsNotExist(err) {
		t.Errorf("a working set beside the sealed snapshot: %v", err)
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
