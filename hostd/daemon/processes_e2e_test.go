package daemon

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
)

// TestE2EProcesses drives the process API on real VMs through the daemon:
// two sandboxes from one template name their processes apart; a
// background process outlives its client, a pause, a pause to disk and
// a resume; a fork child lists it (same id, still running) and names its
// own new processes from another id namespace than the parent's; a
// rollback brings back the process table of the snapshot; a process with
// no timeout is still running after all of that.
func TestE2EProcesses(t *testing.T) {
	warren, kernel, initrd := e2ePaths(t)
	state, step := e2eState(t, "hostd-procs-")
	td := startE2EDaemon(t, state, warren, nil)
	c := td.client(t, "procs")
	var sbs []store.Sandbox
	defer func() {
		for _, sb := range sbs {
			c.try("DELETE", "/v1/sandboxes/"+sb.ID, nil)
		}
	}()

	var tp store.Template
	c.ok(201, "POST", "/v1/templates", map[string]any{"kernel": kernel, "initramfs": initrd, "mem_mib": 256, "cpus": 1}, &tp)
	step("template %s ready", tp.ID)
	sb := c.create(tp.ID)
	sbs = append(sbs, sb)
	base := "/v1/sandboxes/" + sb.ID
	step("sandbox %s running", sb.ID)

	start := func(base string, argv ...string) wire.ProcessInfo {
		t.Helper()
		var pi wire.ProcessInfo
		c.ok(200, "POST", base+"/processes", map[string]any{"argv": argv}, &pi)
		if pi.ID == "" || pi.State != "running" {
			t.Fatalf("started %v: %+v", argv, pi)
		}
		return pi
	}
	// output reads what is kept of a process's output, without following.
	output := func(base, id string) (string, *int) {
		t.Helper()
		st, b := c.do("GET", base+"/processes/"+id+"/output?follow=0&offset=0", nil)
		if st != 200 {
			t.Fatalf("output of %s: %d %s", id, st, b)
		}
		var out strings.Builder
		var exit *int
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(nil, 4<<20)
		for sc.Scan() {
			var f wire.ExecFrame
			if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
				t.Fatalf("output line %q: %v", sc.Bytes(), err)
			}
			if f.Error != "" {
				t.Fatalf("output of %s: %s", id, f.Error)
			}
			out.Write(f.Stdout)
			out.Write(f.Stderr)
			if f.Exit != nil {
				exit = f.Exit
			}
		}
		return out.String(), exit
	}
	get := func(base, id string) wire.ProcessInfo {
		t.Helper()
		var pi wire.ProcessInfo
		c.ok(200, "GET", base+"/processes/"+id, nil, &pi)
		return pi
	}
	// ticks waits until process id's output has grown past n ticks.
	ticks := func(base, id string, n int) string {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			out, _ := output(base, id)
			if strings.Count(out, "tick") > n {
				return out
			}
			if time.Now().After(deadline) {
				t.Fatalf("process %s: output stuck at %q", id, out)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}

	// A ticker with no timeout, and a short job whose client goes away.
	ticker := start(base, "sh", "-c", `i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done`)
	job := start(base, "sh", "-c", "sleep 2; echo done")
	step("ticker %s (pid %d), job %s", ticker.ID, ticker.Pid, job.ID)
	// Another sandbox from the same template (the same memory, the same
	// random state) names its processes apart: the agent renews its id
	// namespace with the host's entropy at each restore's re-sync.
	sb2 := c.create(tp.ID)
	sbs = append(sbs, sb2)
	if other := start("/v1/sandboxes/"+sb2.ID, "true"); other.ID == ticker.ID {
		t.Fatalf("sandboxes %s and %s from one template both named a process %s", sb.ID, sb2.ID, other.ID)
	}
	c.ok(200, "DELETE", "/v1/sandboxes/"+sb2.ID, nil, nil)
	var waited wire.ProcessInfo
	c.ok(200, "GET", base+"/processes/"+job.ID+"/wait", nil, &waited)
	if out, exit := output(base, job.ID); out != "done\n" || exit == nil || *exit != 0 || waited.Exit == nil || waited.Exit.Code != 0 {
		t.Fatalf("job: output %q exit %v, wait %+v", out, exit, waited)
	}
	step("the job's output read back after it ended: done, exit 0")

	n := strings.Count(ticks(base, ticker.ID, 2), "tick")
	c.ok(200, "POST", base+"/pause", nil, nil)
	c.ok(200, "POST", base+"/resume", nil, nil)
	n = strings.Count(ticks(base, ticker.ID, n), "tick")
	step("the ticker goes on after a pause and resume (%d ticks)", n)
	c.ok(200, "POST", base+"/pause?to_disk=true", nil, nil)
	c.ok(200, "POST", base+"/resume", nil, nil)
	n = strings.Count(ticks(base, ticker.ID, n), "tick")
	if pi := get(base, ticker.ID); pi.State != "running" || pi.Pid != ticker.Pid {
		t.Fatalf("after a pause to disk: %+v", pi)
	}
	step("and after a pause to disk and a resume (%d ticks)", n)

	var snap store.Snapshot
	c.ok(201, "POST", base+"/snapshots", map[string]any{"name": "procs"}, &snap)
	step("snapshot %s", snap.Name)

	fr := c.fork(sb.ID, 1)
	child := fr.Children[0]
	sbs = append(sbs, child)
	if child.Status != store.Running {
		t.Fatalf("fork child %+v: %v", child, fr.Errors)
	}
	cbase := "/v1/sandboxes/" + child.ID
	var clist []wire.ProcessInfo
	c.ok(200, "GET", cbase+"/processes", nil, &clist)
	found := false
	for _, pi := range clist {
		found = found || (pi.ID == ticker.ID && pi.State == "running")
	}
	if !found {
		t.Fatalf("fork child %s lists %+v, not the running ticker %s", child.ID, clist, ticker.ID)
	}
	ticks(cbase, ticker.ID, n)
	pnew, cnew := start(base, "true"), start(cbase, "true")
	prefix := func(id string) string { p, _, _ := strings.Cut(id, "-"); return p }
	if prefix(pnew.ID) == prefix(cnew.ID) {
		t.Fatalf("parent and child name new processes alike: %s, %s", pnew.ID, cnew.ID)
	}
	step("fork child %s lists the ticker, running; new ids %s (parent) and %s (child)", child.ID, pnew.ID, cnew.ID)

	c.ok(200, "DELETE", base+"/processes/"+ticker.ID, nil, nil)
	if st, b := c.do("GET", base+"/processes/"+ticker.ID, nil); st != 404 {
		t.Fatalf("removed ticker: %d %s", st, b)
	}
	if pi := get(cbase, ticker.ID); pi.State != "running" {
		t.Fatalf("the child's ticker after the parent's was removed: %+v", pi)
	}
	c.ok(200, "POST", base+"/rollback", map[string]any{"snapshot": snap.Name}, nil)
	if pi := get(base, ticker.ID); pi.State != "running" {
		t.Fatalf("after the rollback: %+v", pi)
	}
	ticks(base, ticker.ID, n)
	step("removed in the parent, the ticker is back and running after a rollback to %s", snap.Name)
}
