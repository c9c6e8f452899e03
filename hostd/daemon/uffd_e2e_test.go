package daemon

import (
	"context"
	"log/slog"
	"os"
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
// warren-hostd's defaults: the template's first create records its
// working set (the VMM, as its own uid, writes it into the sandbox's
// directory; the daemon imports it beside the template's snapshot,
// non-empty, of the snapshot's top layer, and the template's record
// counts its pages); the second create prefetches it (its VMM's GET
// /v1/working-set: mode uffd, pages prefetched, no error); exec works in
// both; a file the uffd-restored guest wrote comes back after a snapshot
// and a rollback; deleting the template removes the working set. Three
// guest starts (the build and two creates). Needs what TestE2E needs.
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
	step("template %s ready in %.0f ms", tp.ID, tp.BuildMS)

	// One: the template's first create records the working set.
	sb1 := a.create(tp.ID)
	all = append(all, sb1)
	r1, err := vmmctl.Client{Socket: sb1.API}.WorkingSet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r1.Mode == string(vmsnap.Mmap) {
		t.Skipf("this host cannot serve memory by userfaultfd (the VMM fell back to mmap): %s", tail(sb1.Log, 2000))
	}
	if r1.Mode != string(vmsnap.Uffd) || r1.Stats == nil || r1.Stats.Faults == 0 || r1.Stats.Errors != 0 || r1.Stats.Recording {
		t.Fatalf("first create's VMM: %+v (stats %+v), want the uffd mode, faults served, the recording saved", r1, r1.Stats)
	}
	ws := workingSetPath(tp.Snapshot)
	b, err := os.ReadFile(ws)
	if err != nil {
		t.Fatalf("no working set beside the template's snapshot after its first create: %v", err)
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
	if n := a.templateRec(tp.ID).WorkingSetPages; n != set.NumPages() {
		t.Errorf("the template's working_set_pages %d, the file holds %d", n, set.NumPages())
	}
	if fi, err := os.Stat(ws); err != nil {
		t.Error(err)
	} else if uid := fi.Sys().(*syscall.Stat_t).Uid; fi.Mode().Perm()&0o022 != 0 || int(uid) != os.Getuid() {
		t.Errorf("working set %s: %v, owner %d: want the daemon's, writable by no one else", ws, fi.Mode(), uid)
	}
	step("first create %s: working set of %d pages in %d runs recorded (%d faults served)", sb1.ID, set.NumPages(), len(set.Runs), r1.Stats.Faults)
	if out, _, code := a.exec(sb1.ID, "sh", "-c", "echo one"); out != "one\n" || code != 0 {
		t.Fatalf("exec in the first sandbox: %q %d", out, code)
	}

	// Two: the next create prefetches it.
	sb2 := a.create(tp.ID)
	all = append(all, sb2)
	var r2 *vmmctl.WorkingSetReply
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if r2, err = (vmmctl.Client{Socket: sb2.API}).WorkingSet(ctx); err != nil {
			t.Fatal(err)
		}
		if r2.Stats != nil && r2.Stats.PrefetchedPages > 0 || time.Now().After(deadline) {
			break
		}
	}
	if r2.Mode != string(vmsnap.Uffd) || r2.Stats == nil || r2.Stats.PrefetchedPages == 0 || r2.Stats.Errors != 0 || r2.Path != "" {
		t.Fatalf("second create's VMM: %+v (stats %+v), want the uffd mode, pages prefetched, nothing recorded", r2, r2.Stats)
	}
	step("second create %s: %d pages prefetched, %d faults", sb2.ID, r2.Stats.PrefetchedPages, r2.Stats.Faults)
	if out, _, code := a.exec(sb2.ID, "sh", "-c", "echo two"); out != "two\n" || code != 0 {
		t.Fatalf("exec in the second sandbox: %q %d", out, code)
	}

	// A file survives a snapshot and a rollback of the uffd-restored VM.
	a.exec(sb2.ID, "sh", "-c", "echo first > /root/mark")
	a.ok(201, "POST", "/v1/sandboxes/"+sb2.ID+"/snapshots", map[string]any{"name": "s1"}, nil)
	a.exec(sb2.ID, "sh", "-c", "echo second > /root/mark")
	a.ok(200, "POST", "/v1/sandboxes/"+sb2.ID+"/rollback", map[string]any{"snapshot": "s1"}, nil)
	if out, _, _ := a.exec(sb2.ID, "cat", "/root/mark"); out != "first\n" {
		t.Fatalf("after the rollback to s1: %q, want \"first\\n\"", out)
	}
	step("snapshot and rollback of %s: the file came back", sb2.ID)

	for _, sb := range all {
		a.ok(200, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
	}
	a.ok(200, "DELETE", "/v1/templates/"+tp.ID, nil, nil)
	if _, err := os.Lstat(ws); !os.IsNotExist(err) {
		t.Errorf("the working set outlived its template: %v", err)
	}
}
