package daemon

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/vmmctl"
)

// balloonTemplate builds a template with "balloon": true (128 MiB).
func (c *client) balloonTemplate(kernel string) store.Template {
	c.t.Helper()
	var tp store.Template
	c.ok(201, "POST", "/v1/templates", map[string]any{"kernel": kernel, "mem_mib": 128, "cpus": 1, "balloon": true}, &tp)
	if tp.Status != store.TemplateReady || !tp.Balloon {
		c.t.Fatalf("template %+v", tp)
	}
	return tp
}

// balloonPutCount is how many PUT /v1/balloon the fake's VMMs took.
func (f *fakeLauncher) balloonPutCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.balloonPuts)
}

// TestBalloon: a template with a balloon gives its build `--balloon` and
// its sandboxes (through its snapshot) a balloon whose target the daemon
// sets, checks, records and keeps across a resume from disk and a fork;
// a sandbox without one, a stopped or paused one and another tenant are
// answered as the API says.
func TestBalloon(t *testing.T) {
	td, f, c := aliceDaemon(t)
	tp := c.balloonTemplate(fakeKernel(t))
	f.mu.Lock()
	built := f.lastRun.Balloon
	f.mu.Unlock()
	if !built {
		t.Fatal("the template's build was not started with --balloon")
	}
	var got store.Template
	c.ok(200, "GET", "/v1/templates/"+tp.ID, nil, &got)
	if !got.Balloon {
		t.Errorf("GET template: %+v", got)
	}
	sb := c.create(tp.ID)
	path := "/v1/sandboxes/" + sb.ID + "/balloon"

	var rep vmmctl.BalloonReply
	c.ok(200, "GET", path, nil, &rep)
	if rep.TargetMiB != 0 || !rep.Active || !rep.FreePageReporting {
		t.Errorf("GET balloon at first: %+v", rep)
	}
	if sb.BalloonTargetMiB != nil {
		t.Errorf("a new sandbox has a target: %d", *sb.BalloonTargetMiB)
	}

	c.ok(200, "PUT", path, map[string]any{"target_mib": 64, "stats_interval_s": 5}, &rep)
	if rep.TargetMiB != 64 || rep.TargetPages != 64<<8 || rep.StatsIntervalS != 5 {
		t.Errorf("PUT balloon answered %+v", rep)
	}
	rep = vmmctl.BalloonReply{}
	c.ok(200, "GET", path, nil, &rep)
	if rep.TargetMiB != 64 || rep.ActualMiB != 64 || rep.Counters.InflatedPages != 64<<8 || len(rep.Stats) != 1 {
		t.Errorf("GET balloon after the PUT: %+v", rep)
	}
	target := func(id string) string {
		t.Helper()
		if p := c.get(id).BalloonTargetMiB; p != nil {
			return fmt.Sprint(*p)
		}
		return "none"
	}
	if got := target(sb.ID); got != "64" {
		t.Errorf("the record's target: %s", got)
	}
	var list []store.Sandbox
	c.ok(200, "GET", "/v1/sandboxes", nil, &list)
	if len(list) != 1 || list[0].BalloonTargetMiB == nil || *list[0].BalloonTargetMiB != 64 {
		t.Errorf("the listing: %+v", list)
	}

	// Refused before the VMM is asked: a target above the guest's
	// memory, a bad interval, bad bodies.
	puts := f.balloonPutCount()
	for _, tc := range []struct {
		body any
		msg  string
	}{
		{map[string]any{"target_mib": 129}, "more than the sandbox's 128 MiB of guest memory"},
		{map[string]any{"stats_interval_s": 86401}, "at most 86400"},
		{[]byte(`{"target_mib":`), "bad request body"},
		{[]byte(`{"target_mib":-1}`), "bad request body"},
		{[]byte(`{"target":1}`), "unknown field"},
		{[]byte(`{} {}`), "more than one JSON value"},
		{[]byte(`null`), "must be a JSON object"},
		{[]byte(`{"target_mib":1,"pad":"` + strings.Repeat("x", 8<<10) + `"}`), "at most 4096 bytes"},
	} {
		st, b := c.do("PUT", path, tc.body)
		if st != 400 || !strings.Contains(string(b), tc.msg) {
			t.Errorf("PUT %.60v: %d %s, want 400 %q", tc.body, st, b, tc.msg)
		}
	}
	if n := f.balloonPutCount(); n != puts {
		t.Errorf("refused PUTs reached the VMM: %d, then %d", puts, n)
	}
	c.ok(200, "PUT", path, map[string]any{"target_mib": 128}, &rep)
	c.ok(200, "PUT", path, map[string]any{"target_mib": 64}, &rep)
	if got := target(sb.ID); got != "64" {
		t.Errorf("the record's target after 128 then 64: %s", got)
	}

	// Another tenant finds neither the sandbox nor its balloon.
	bob := td.client(t, "bob")
	for _, m := range []string{"GET", "PUT"} {
		st, b := bob.do(m, path, map[string]any{"target_mib": 0})
		if st != 404 || !strings.Contains(string(b), "not found") {
			t.Errorf("bob's %s of alice's balloon: %d %s", m, st, b)
		}
	}
	if got := target(sb.ID); got != "64" {
		t.Errorf("the record's target after bob: %s", got)
	}

	// A fork child has its parent's balloon.
	fr := c.fork(sb.ID, 1)
	rep = vmmctl.BalloonReply{}
	c.ok(200, "GET", "/v1/sandboxes/"+fr.Children[0].ID+"/balloon", nil, &rep)
	if rep.TargetMiB != 64 {
		t.Errorf("the fork child's balloon: %+v", rep)
	}

	// Paused in memory: readable, not changed.
	c.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/pause", nil, nil)
	c.ok(200, "GET", path, nil, nil)
	if st, b := c.do("PUT", path, map[string]any{"target_mib": 0}); st != 409 || !strings.Contains(string(b), "is paused") {
		t.Errorf("PUT balloon of a paused sandbox: %d %s", st, b)
	}
	c.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/resume", nil, nil)
	// Its snapshots keep the balloon and its target: resumed from disk,
	// the new VMM has them.
	c.suspendResume(sb.ID)
	rep = vmmctl.BalloonReply{}
	c.ok(200, "GET", path, nil, &rep)
	if rep.TargetMiB != 64 || target(sb.ID) != "64" {
		t.Errorf("after a resume from disk: %+v, record %s", rep, target(sb.ID))
	}
	// Suspended: no VMM to ask.
	c.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/pause?to_disk=true", nil, nil)
	for _, m := range []string{"GET", "PUT"} {
		if st, b := c.do(m, path, map[string]any{"target_mib": 0}); st != 409 || !strings.Contains(string(b), "is suspended") {
			t.Errorf("%s balloon of a suspended sandbox: %d %s", m, st, b)
		}
	}
	if got := target(sb.ID); got != "64" {
		t.Errorf("the record's target after refused PUTs: %s", got)
	}

	// A template without a balloon: its sandboxes have none.
	plain := c.create(c.template(fakeKernel(t)).ID)
	f.mu.Lock()
	built = f.lastRun.Balloon
	f.mu.Unlock()
	if built {
		t.Error("a template without balloon was built with --balloon")
	}
	want := "sandbox " + plain.ID + " has no balloon (its template was created without --balloon)"
	for _, m := range []string{"GET", "PUT"} {
		st, b := c.do(m, "/v1/sandboxes/"+plain.ID+"/balloon", map[string]any{"target_mib": 1})
		if st != 404 || !strings.Contains(string(b), want) {
			t.Errorf("%s balloon without one: %d %s, want 404 %q", m, st, b, want)
		}
	}
	if got := target(plain.ID); got != "none" {
		t.Errorf("a refused PUT recorded a target: %s", got)
	}
}

// TestE2EBalloon: with real, jailed VMMs, a "balloon" template's sandbox
// has the balloon through the template's snapshot; the guest's driver
// inflates it to the daemon's target, deflates it again, and a resume
// from disk keeps the target. It needs what TestE2E needs.
func TestE2EBalloon(t *testing.T) {
	warren, kernel, initrd := e2ePaths(t)
	state, step := e2eState(t, "hostd-balloon-")
	td := startE2EDaemon(t, state, warren, nil)
	a := td.client(t, "tenant-b")
	var tp store.Template
	a.ok(201, "POST", "/v1/templates", map[string]any{"kernel": kernel, "initramfs": initrd, "mem_mib": 256, "cpus": 1, "balloon": true}, &tp)
	step("balloon template %s ready in %.0f ms", tp.ID, tp.BuildMS)
	sb := a.create(tp.ID)
	defer func() { rec := a.get(sb.ID); stopProc(rec.PID, rec.StartTime, time.Second) }()
	path := "/v1/sandboxes/" + sb.ID + "/balloon"
	var rep vmmctl.BalloonReply
	kvmtest.WaitFor(t, 2*time.Minute, "the guest's driver to take the balloon", func() bool {
		a.ok(200, "GET", path, nil, &rep)
		return rep.Active
	})
	if !rep.FreePageReporting {
		t.Errorf("no free page reporting: %+v", rep)
	}
	step("sandbox %s restored with its balloon: %+v", sb.ID, rep)

	a.ok(200, "PUT", path, map[string]any{"target_mib": 64, "stats_interval_s": 1}, &rep)
	kvmtest.WaitFor(t, 2*time.Minute, "the balloon to reach 64 MiB", func() bool {
		a.ok(200, "GET", path, nil, &rep)
		return rep.ActualMiB == 64
	})
	step("inflated to %d MiB: %d pages in, %d discarded", rep.ActualMiB, rep.Counters.InflatedPages, rep.Counters.InflateDiscardedPages)
	if p := a.get(sb.ID).BalloonTargetMiB; p == nil || *p != 64 {
		t.Errorf("the record's target: %v", p)
	}
	if st, b := a.do("PUT", path, map[string]any{"target_mib": 257}); st != 400 {
		t.Errorf("a target above the guest's memory: %d %s", st, b)
	}

	// A resume from disk restores the sandbox's own snapshot: the new VMM
	// has the balloon at the same target.
	a.suspendResume(sb.ID)
	a.ok(200, "GET", path, nil, &rep)
	if rep.TargetMiB != 64 {
		t.Errorf("after a resume from disk: %+v", rep)
	}
	a.ok(200, "PUT", path, map[string]any{"target_mib": 0}, &rep)
	kvmtest.WaitFor(t, 2*time.Minute, "the balloon to deflate", func() bool {
		a.ok(200, "GET", path, nil, &rep)
		return rep.ActualMiB == 0
	})
	step("deflated after a resume from disk: %+v", rep.Counters)
}
