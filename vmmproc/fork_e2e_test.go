package vmmproc

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/vmmctl"
)

// TestForkEndToEnd restores the Linux template with the control API,
// writes a file, and forks it with `warren fork -n 8`: eight new processes
// whose agents answer with their own hostname and machine id; each writes
// different data to the same guest path and reads back its own, while the
// parent's file is unchanged and it sees none of theirs. A child forks a
// grandchild that sees the child's data. Killing a child leaves the parent
// and siblings running; stopping the parent leaves the children running.
func TestForkEndToEnd(t *testing.T) {
	g, dir, sock, api := templateWithAPI(t)
	run := func(args ...string) string { t.Helper(); return mustRun(t, args...) }
	// exec runs an idempotent command in a guest. A connection that the
	// guest drops before answering (exit 125) is retried once and logged:
	// under the nested host's emulation a just-forked child has been seen
	// to drop one fresh connection after answering others (see the issue
	// notes); what the test checks is what the command then reads.
	exec := func(sock string, args ...string) string {
		t.Helper()
		argv := append([]string{"exec", "--timeout", "2m", sock, "--"}, args...)
		code, out, errOut := cli(t, nil, argv...)
		if code == 125 {
			t.Logf("warren %s: exit 125 (%s); retrying once", strings.Join(argv, " "), strings.TrimSpace(errOut))
			code, out, errOut = cli(t, nil, argv...)
		}
		if code != 0 {
			t.Fatalf("warren %s: exit %d: %s%s", strings.Join(argv, " "), code, out, errOut)
		}
		return out
	}
	health := func(sock string) agentwire.Health {
		t.Helper()
		run("health", "--wait", "3m", sock)
		h, err := agentclient.New(sock).Health(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	ph := health(sock)
	run("exec", sock, "--", "sh", "-c", "echo parent > /tmp/same; echo base > /tmp/base")

	fork := func(api, prefix string, n int) vmmctl.ForkReply {
		t.Helper()
		var r vmmctl.ForkReply
		out := run("fork", "-n", fmt.Sprint(n), "--prefix", prefix, "--json", api)
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("warren fork --json: %v: %q", err, out)
		}
		for _, c := range r.Children {
			t.Cleanup(func() {
				if p, err := os.FindProcess(c.PID); err == nil {
					p.Signal(syscall.SIGKILL)
				}
				if t.Failed() {
					logb, _ := os.ReadFile(c.Log)
					con, _ := os.ReadFile(c.Console)
					t.Logf("child %s log:\n%s\nconsole:\n%s", c.API, logb, tail(con))
				}
			})
		}
		if len(r.Children) != n {
			t.Fatalf("fork made %d children, want %d", len(r.Children), n)
		}
		return r
	}
	start := time.Now()
	r := fork(api, filepath.Join(dir, "c"), 8)
	t.Logf("forked 8: parent paused %.1f ms, children running after %v ms, total %.1f ms", r.PauseMS, readyTimes(r), r.TotalMS)
	ids := map[string]bool{ph.MachineID: true}
	cids := map[uint64]bool{3: true}
	for _, c := range r.Children {
		h := health(c.Vsock)
		// The identity comes with the agent's first re-sync after the
		// fork's transport reset, which may follow its first answer.
		for deadline := time.Now().Add(time.Minute); h.Hostname != c.Hostname && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
			h = health(c.Vsock)
		}
		t.Logf("child %d answered %v after the fork: hostname %s, machine id %s, syncs %d", c.Index, time.Since(start), h.Hostname, h.MachineID, h.Syncs)
		if h.Hostname != c.Hostname || h.MachineID != c.MachineID {
			t.Errorf("child %d: hostname %q machine id %q, want %q %q", c.Index, h.Hostname, h.MachineID, c.Hostname, c.MachineID)
		}
		if ids[h.MachineID] || cids[c.CID] {
			t.Errorf("child %d shares machine id %s or CID %d", c.Index, h.MachineID, c.CID)
		}
		ids[h.MachineID], cids[c.CID] = true, true
		exec(c.Vsock, "sh", "-c", fmt.Sprintf("echo child-%d > /tmp/same", c.Index))
	}
	for _, c := range r.Children {
		if got := exec(c.Vsock, "cat", "/tmp/same", "/tmp/base"); got != fmt.Sprintf("child-%d\nbase\n", c.Index) {
			t.Errorf("child %d reads %q", c.Index, got)
		}
	}
	if got := run("exec", sock, "--", "cat", "/tmp/same"); got != "parent\n" {
		t.Errorf("the parent reads %q after its children wrote", got)
	}
	if h := health(sock); h.Hostname != ph.Hostname || h.MachineID != ph.MachineID {
		t.Errorf("the parent's identity changed: %q %q", h.Hostname, h.MachineID)
	}

	// A fork of a fork: the grandchild has child 1's data.
	c1 := r.Children[1]
	gr := fork(c1.API, filepath.Join(dir, "g"), 1)
	gc := gr.Children[0]
	health(gc.Vsock)
	if got := exec(gc.Vsock, "cat", "/tmp/same"); got != "child-1\n" {
		t.Errorf("the grandchild reads %q", got)
	}

	// A killed child leaves the others running.
	p0, _ := os.FindProcess(r.Children[0].PID)
	p0.Signal(syscall.SIGKILL)
	health(sock)
	health(r.Children[2].Vsock)
	// The parent stops: its children run on (they hold their own
	// references to the memory base).
	g.vm.Stop(nil)
	time.Sleep(200 * time.Millisecond)
	for _, c := range r.Children[1:] {
		if got := exec(c.Vsock, "cat", "/tmp/same"); got != fmt.Sprintf("child-%d\n", c.Index) {
			t.Errorf("after the parent stopped, child %d reads %q", c.Index, got)
		}
	}
}

func readyTimes(r vmmctl.ForkReply) []float64 {
	var v []float64
	for _, c := range r.Children {
		v = append(v, c.ReadyMS)
	}
	return v
}
