package daemon

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/memsnap/uffd"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmmctl"
)

// TestE2EUffd drives real VMs through a daemon that restores creates by
// userfaultfd (RestoreMemory "uffd"), jailed and confined as
// warren-hostd's defaults: the template's build ends by recording its
// working set (a recorder restores the new snapshot; its VMM, as its own
// uid, writes the working set into the recorder's directory; the daemon
// imports it beside the template's snapshot, non-empty, of the
// snapshot's top layer, and the build's answer and the template's record
// count its pages), and nothing of the recorder remains; the template's
// first create prefetches it (its VMM's GET /v1/working-set: mode uffd,
// pages prefetched, no error, nothing recorded); exec works; a file the
// uffd-restored guest wrote comes back after a snapshot and a rollback;
// deleting the template removes the working set. Three guest starts (the
// build, its recorder and a create). Needs what TestE2E needs.
func TestE2EUffd(t *testing.T) {
	warren, kernel, initrd := e2ePaths(t)
	state, step := e2eState(t, "hostd-uffd-")
	td := startE2EDaemon(t, state, warren, func(c *Config) {
		c.RestoreMemory = RestoreUffd
		c.Log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	a := td.client(t, "tenant-u")
	var all []store.Sandbox
	defer func() {
		for _, sb := range all {
			stopProc(sb.PID, sb.StartTime, time.Second)
		}
		if t.Failed() {
			for _, sb := range all {
				t.Logf("%s vmm.log:\n%s", sb.ID, tail(sb.Log, 3000))
			}
		}
	}()
	ctx := context.Background()
	var tp store.Template
	a.ok(201, "POST", "/v1/templates", map[string]any{"kernel": kernel, "initramfs": initrd, "mem_mib": 256, "cpus": 1}, &tp)
	step("template %s ready in %.0f ms (to the snapshot), %d working set pages recorded", tp.ID, tp.BuildMS, tp.WorkingSetPages)

	// The build recorded the working set.
	ws := workingSetPath(tp.Snapshot)
	b, err := os.ReadFile(ws)
	if err != nil {
		// A host that cannot serve userfaultfd: the recorder's VMM fell
		// back to mmap and refused to save; a create's VMM says so.
		sb := a.create(tp.ID)
		all = append(all, sb)
		if r, err := (vmmctl.Client{Socket: sb.API}).WorkingSet(ctx); err == nil && r.Mode == string(vmsnap.Mmap) {
			t.Skipf("this host cannot serve memory by userfaultfd (the VMM fell back to mmap): %s", tail(sb.Log, 2000))
		}
		t.Fatalf("no working set beside the template's snapshot after its build (working_set_pages %d): %v", tp.WorkingSetPages, err)
	}
	set, err := uffd.ParseWorkingSet(b)
	if err != nil {
		t.Fatal(err)
	}
	top, err := workingSetFor(tp.Snapshot, nil) // the snapshot's top layer and memory
	if err != nil {
		t.Fatal(err)
	}
	if set.Top != top.Top || set.MemSize != top.MemSize || set.NumPages() == 0 {
		t.Fatalf("working set of layer %s, %d bytes, %d pages; the snapshot's layer is %s, %d bytes", set.Top.Short(), set.MemSize, set.NumPages(), top.Top.Short(), top.MemSize)
	}
	if tp.WorkingSetPages == 0 || tp.WorkingSetPages != set.NumPages() {
		t.Errorf("the build's answer: working_set_pages %d, the file holds %d", tp.WorkingSetPages, set.NumPages())
	}
	if n := a.templateRec(tp.ID).WorkingSetPages; n != set.NumPages() {
		t.Errorf("the template's working_set_pages %d, the file holds %d", n, set.NumPages())
	}
	if fi, err := os.Stat(ws); err != nil {
		t.Error(err)
	} else if uid := fi.Sys().(*syscall.Stat_t).Uid; fi.Mode().Perm()&0o022 != 0 || int(uid) != os.Getuid() {
		t.Errorf("working set %s: %v, owner %d: want the daemon's, writable by no one else", ws, fi.Mode(), uid)
	}
	// Nothing of the recorder remains: no sandbox directory, socket,
	// jail mount point or run directory, nothing listed.
	for _, dir := range []string{filepath.Join(td.store.Root, "tenants", "tenant-u", "sandboxes"), td.store.RunDir(), filepath.Join(td.store.Root, "jail")} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if strings.Contains(e.Name(), recorderPrefix+"-") {
				t.Errorf("the build's recorder left %s", filepath.Join(dir, e.Name()))
			}
		}
	}
	checkNoRecorder(t, td, a)
	step("the build recorded a working set of %d pages in %d runs", set.NumPages(), len(set.Runs))

	// The template's first create prefetches it.
	sb1 := a.create(tp.ID)
	all = append(all, sb1)
	var r1 *vmmctl.WorkingSetReply
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if r1, err = (vmmctl.Client{Socket: sb1.API}).WorkingSet(ctx); err != nil {
			t.Fatal(err)
		}
		if r1.Stats != nil && r1.Stats.PrefetchedPages > 0 || time.Now().After(deadline) {
			break
		}
	}
	if r1.Mode != string(vmsnap.Uffd) || r1.Stats == nil || r1.Stats.PrefetchedPages == 0 || r1.Stats.Errors != 0 || r1.Path != "" || r1.Stats.Recording {
		t.Fatalf("first create's VMM: %+v (stats %+v), want the uffd mode, pages prefetched, nothing recorded", r1, r1.Stats)
	}
	step("first create %s: %d pages prefetched, %d faults", sb1.ID, r1.Stats.PrefetchedPages, r1.Stats.Faults)
	if out, _, code := a.exec(sb1.ID, "sh", "-c", "echo one"); out != "one\n" || code != 0 {
		t.Fatalf("exec in the first sandbox: %q %d", out, code)
	}

	// A file survives a snapshot and a rollback of the uffd-restored VM.
	a.exec(sb1.ID, "sh", "-c", "echo first > /root/mark")
	a.ok(201, "POST", "/v1/sandboxes/"+sb1.ID+"/snapshots", map[string]any{"name": "s1"}, nil)
	a.exec(sb1.ID, "sh", "-c", "echo second > /root/mark")
	a.ok(200, "POST", "/v1/sandboxes/"+sb1.ID+"/rollback", map[string]any{"snapshot": "s1"}, nil)
	if out, _, _ := a.exec(sb1.ID, "cat", "/root/mark"); out != "first\n" {
		t.Fatalf("after the rollback to s1: %q, want \"first\\n\"", out)
	}
	step("snapshot and rollback of %s: the file came back", sb1.ID)

	for _, sb := range all {
		a.ok(200, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
	}
	a.ok(200, "DELETE", "/v1/templates/"+tp.ID, nil, nil)
	if _, err := os.Lstat(ws); !os.IsNotExist(err) {
		t.Errorf("the working set outlived its template: %v", err)
	}
}
