package daemon

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warrenvm/warren/hostd/store"
)

// soakSize is the soak's clients and cycles per client: 8x3, or
// WARREN_E2E_SOAK=CLIENTSxCYCLES.
func soakSize(t *testing.T) (clients, cycles int) {
	clients, cycles = 8, 3
	if v := os.Getenv("WARREN_E2E_SOAK"); v != "" {
		a, b, ok := strings.Cut(v, "x")
		c1, err1 := strconv.Atoi(a)
		c2, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || c1 < 1 || c2 < 1 {
			t.Fatalf("WARREN_E2E_SOAK=%q is not CLIENTSxCYCLES", v)
		}
		clients, cycles = c1, c2
	}
	return clients, cycles
}

// soakLedger is what the clients believe exists: sandboxes created and
// not yet being deleted (ids), and every sandbox ever seen created (seen).
// mu guards both.
type soakLedger struct {
	mu        sync.Mutex
	ids, seen map[string]bool
}

func (l *soakLedger) add(id string) { l.mu.Lock(); l.ids[id], l.seen[id] = true, true; l.mu.Unlock() }
func (l *soakLedger) del(id string) { l.mu.Lock(); delete(l.ids, id); l.mu.Unlock() }
func (l *soakLedger) snapshot() map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := make(map[string]bool, len(l.ids))
	for id := range l.ids {
		m[id] = true
	}
	return m
}

// TestE2ESoak drives a real warren-hostd (its own process, real VMMs)
// with concurrent clients, each cycling create, exec, snapshot, exec,
// rollback, fork, exec in the child, delete, while VMMs are killed with
// SIGKILL at random and the daemon itself is killed with SIGKILL and
// restarted twice; then, the chaos over, one more cycle per client, which
// must go through whole. Every API answer must be a success or a clear error
// (a JSON body naming it); no sandbox a client saw created may go
// missing from the list while it lives; at the end, after everything is
// deleted and the daemon stopped, no process of the state directory, no
// mount under it, no sandbox directory, cgroup, tap or network namespace
// of the run may be left. WARREN_E2E_SOAK=CLIENTSxCYCLES sizes it (8x3).
func TestE2ESoak(t *testing.T) {
	warren, kernel, initrd := e2ePaths(t)
	clients, cycles := soakSize(t)
	state, step := e2eState(t, "hostd-soak-")
	netBefore, nsBefore := dirNames("/sys/class/net"), dirNames("/run/netns")
	const tenant = "tenant-soak"

	var hdMu sync.Mutex // guards hd and restarts
	hd := startHostd(t, state, warren, 1)
	restarts := 1
	var up atomic.Bool
	up.Store(true)
	defer func() {
		hdMu.Lock()
		defer hdMu.Unlock()
		if hd.cmd.ProcessState == nil {
			hd.cmd.Process.Kill()
			hd.cmd.Wait()
		}
		for _, p := range stateProcs(state) {
			syscall.Kill(p, syscall.SIGKILL)
		}
		if t.Failed() {
			for i := 1; i <= restarts; i++ {
				if b, err := os.ReadFile(filepath.Join(state, fmt.Sprintf("hostd-%d.log", i))); err == nil {
					t.Logf("hostd-%d.log:\n%s", i, lastLines(string(b), 30))
				}
			}
		}
	}()
	c := newClient(t, hd.sock, tenant) // the socket path stays the same across restarts
	var tp store.Template
	c.ok(201, "POST", "/v1/templates", map[string]any{"kernel": kernel, "initramfs": initrd, "mem_mib": 256, "cpus": 1}, &tp)
	step("template %s ready in %.0f ms; %d clients x %d cycles", tp.ID, tp.BuildMS, clients, cycles)

	ledger := &soakLedger{ids: map[string]bool{}, seen: map[string]bool{}}
	var answers, clear, unclear, transport atomic.Int64
	var unclearMu sync.Mutex
	var unclearSeen []string
	// call makes one API call and classifies its answer: ok (2xx), a
	// clear error (4xx/5xx with a JSON error), or a transport error (the
	// daemon is down: the caller waits for it and gives the cycle up).
	var transportSeen, clearSeen []string
	noteTransport := func(err error) {
		transport.Add(1)
		unclearMu.Lock()
		if len(transportSeen) < 5 {
			transportSeen = append(transportSeen, err.Error())
		}
		unclearMu.Unlock()
	}
	noteUnclear := func(s string) {
		unclear.Add(1)
		unclearMu.Lock()
		unclearSeen = append(unclearSeen, s)
		unclearMu.Unlock()
	}
	// classify counts an error answer: clear (4xx/5xx with a JSON error)
	// or not.
	classify := func(method, path string, st int, b []byte) {
		answers.Add(1)
		var e struct{ Error string }
		if st >= 400 && json.Unmarshal(b, &e) == nil && e.Error != "" {
			clear.Add(1)
			unclearMu.Lock()
			clearSeen = append(clearSeen, fmt.Sprintf("%s %s: %d %s", method, path, st, e.Error))
			unclearMu.Unlock()
			return
		}
		noteUnclear(fmt.Sprintf("%s %s: %d %q", method, path, st, b))
	}
	// call makes one API call and classifies its answer: ok (2xx), a
	// clear error, or a transport error (the daemon is down: the caller
	// waits for it and gives the cycle up).
	call := func(method, path string, body, out any) (ok, down bool) {
		st, b, err := c.try(method, path, body)
		if err != nil {
			noteTransport(err)
			return false, true
		}
		if st < 200 || st >= 300 {
			classify(method, path, st, b)
			return false, false
		}
		answers.Add(1)
		if out != nil {
			if err := json.Unmarshal(b, out); err != nil {
				noteUnclear(fmt.Sprintf("%s %s: %d with a body that is not its JSON: %q", method, path, st, b))
				return false, false
			}
		}
		return true, false
	}
	waitUp := func() {
		for deadline := time.Now().Add(3 * time.Minute); !up.Load(); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				return
			}
		}
	}
	remove := func(id string) {
		ledger.del(id)
		for range 3 {
			if ok, down := call("DELETE", "/v1/sandboxes/"+id, nil, nil); ok || !down {
				return
			}
			waitUp()
		}
	}
	// execOK runs `echo want` in id: true when it printed want and exited
	// 0; an exec answered with an error status is classified as call's.
	execOK := func(id, want string) bool {
		var st int
		var b []byte
		var err error
		if st, b, err = c.try("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"argv": []string{"sh", "-c", "echo " + want}}); err == nil && st != 200 {
			// The error answer, classified (the same request again would
			// run twice: classify this one's body instead).
			classify("POST", "/v1/sandboxes/"+id+"/exec", st, b)
			return false
		}
		if err != nil {
			noteTransport(err)
			return false
		}
		answers.Add(1)
		out, _, code, ferr := parseExec(b)
		return ferr == nil && code == 0 && out == want+"\n"
	}
	var cyclesDone, good atomic.Int64
	// cycle is one client's cycle; it returns "" when every step
	// succeeded, else the step that did not.
	cycle := func(ci int) string {
		var sb store.Sandbox
		ok, down := call("POST", "/v1/sandboxes", map[string]any{"template": tp.ID, "labels": map[string]string{"client": strconv.Itoa(ci)}}, &sb)
		if !ok {
			if down {
				waitUp()
			}
			return "create"
		}
		ledger.add(sb.ID)
		defer remove(sb.ID)
		if !execOK(sb.ID, "hello") {
			return "exec"
		}
		if ok, _ := call("POST", "/v1/sandboxes/"+sb.ID+"/snapshots", map[string]any{"name": "s1"}, nil); !ok {
			return "snapshot"
		}
		if !execOK(sb.ID, "between") {
			return "exec after the snapshot"
		}
		if ok, _ := call("POST", "/v1/sandboxes/"+sb.ID+"/rollback", map[string]any{"snapshot": "s1"}, nil); !ok {
			return "rollback"
		}
		var fr struct{ Children []store.Sandbox }
		ok, _ = call("POST", "/v1/sandboxes/"+sb.ID+"/fork", map[string]any{"n": 1}, &fr)
		for _, ch := range fr.Children {
			ledger.add(ch.ID)
			defer remove(ch.ID)
		}
		if !ok || len(fr.Children) != 1 {
			return "fork"
		}
		if !execOK(fr.Children[0].ID, "child") {
			return "exec in the fork child"
		}
		good.Add(1)
		return ""
	}

	// The chaos: every 3-8 s, one time in two, a VMM of the tenant is
	// killed; the daemon is killed and restarted once a third and again
	// two thirds of the cycles are done (at least 15 s apart), or at the
	// latest once the clients are done.
	stop := make(chan struct{})
	chaosDone := make(chan struct{})
	var vmmKills atomic.Int64
	go func() {
		defer close(chaosDone)
		r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
		total := int64(clients * cycles)
		kills := 0
		last := time.Now()
		stopped := false
		for {
			if !stopped {
				select {
				case <-stop:
					stopped = true
				case <-time.After(time.Duration(3000+r.IntN(5000)) * time.Millisecond):
				}
			}
			if stopped && kills == 2 {
				return
			}
			if kills < 2 && (stopped || cyclesDone.Load() >= int64(kills+1)*total/3 && time.Since(last) > 15*time.Second) {
				last = time.Now()
				kills++
				hdMu.Lock()
				up.Store(false)
				hd.cmd.Process.Signal(syscall.SIGKILL)
				hd.cmd.Wait()
				restarts++
				step("warren-hostd killed with SIGKILL (%d of 2); restarting", kills)
				hd = startHostd(t, state, warren, restarts)
				hdMu.Unlock()
				checkLedger(t, c, ledger, "after a daemon restart")
				up.Store(true)
				continue
			}
			if stopped || r.IntN(2) == 0 {
				continue
			}
			var list []store.Sandbox
			if st, b, err := c.try("GET", "/v1/sandboxes", nil); err != nil || st != 200 || json.Unmarshal(b, &list) != nil {
				continue
			}
			list = slices.DeleteFunc(list, func(s store.Sandbox) bool { return s.Status != store.Running || s.PID <= 0 })
			if len(list) > 0 {
				victim := list[r.IntN(len(list))]
				if alive(victim.PID, victim.StartTime) && syscall.Kill(victim.PID, syscall.SIGKILL) == nil {
					vmmKills.Add(1)
				}
			}
		}
	}()

	var wg sync.WaitGroup
	for ci := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range cycles {
				if step := cycle(ci); step != "" {
					t.Logf("client %d: a cycle ended at: %s", ci, step)
				}
				cyclesDone.Add(1)
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-chaosDone

	// The calm after: one more cycle per client, each of which must go
	// through whole.
	calm := make([]string, clients)
	for ci := range clients {
		wg.Add(1)
		go func() { defer wg.Done(); calm[ci] = cycle(ci) }()
	}
	wg.Wait()
	for ci, step := range calm {
		if step != "" {
			t.Errorf("client %d's cycle after the chaos failed at: %s", ci, step)
		}
	}
	step("%d cycles done and one more per client after the chaos, %d of them whole; %d API answers (%d clear errors, %d unclear), %d transport errors, %d VMMs killed, %d daemon restarts",
		cyclesDone.Load(), good.Load(), answers.Load(), clear.Load(), unclear.Load(), transport.Load(), vmmKills.Load(), restarts-1)
	if len(transportSeen) > 0 {
		t.Logf("transport errors (the first %d): %q", len(transportSeen), transportSeen)
	}
	for _, e := range clearSeen {
		t.Logf("clear error: %s", e)
	}
	if unclear.Load() > 0 {
		t.Errorf("answers that were neither a success nor a clear error: %q", unclearSeen)
	}
	if restarts-1 != 2 {
		t.Errorf("the daemon was restarted %d times, want 2", restarts-1)
	}
	checkLedger(t, c, ledger, "at the end")

	// Everything left goes (creates cut short by a daemon kill, say).
	var list []store.Sandbox
	c.ok(200, "GET", "/v1/sandboxes", nil, &list)
	for _, sb := range list {
		ledger.add(sb.ID)
		c.ok(200, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
	}
	c.ok(200, "DELETE", "/v1/templates/"+tp.ID, nil, nil)
	hdMu.Lock()
	hd.cmd.Process.Signal(syscall.SIGTERM)
	hd.cmd.Wait()
	hdMu.Unlock()
	step("%d leftovers deleted, template deleted, daemon stopped", len(list))

	if p := stateProcs(state); len(p) > 0 {
		t.Errorf("processes of the state directory left: %v", p)
		for _, pid := range p {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			t.Logf("pid %d: %q", pid, strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00"))
		}
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), state) {
		t.Errorf("mounts under the state directory left:\n%s", grepLines(string(b), state))
	}
	if ents, _ := os.ReadDir(filepath.Join(state, "tenants", tenant, "sandboxes")); len(ents) > 0 {
		t.Errorf("sandbox directories left: %v", ents)
		for _, e := range ents {
			t.Logf("%s holds %v", e.Name(), dirNames(filepath.Join(state, "tenants", tenant, "sandboxes", e.Name())))
		}
	}
	for _, g := range cgroupDirs() {
		if ledger.seen[filepath.Base(g)] {
			t.Errorf("cgroup left: %s", g)
		}
	}
	if n := dirNames("/sys/class/net"); !slices.Equal(n, netBefore) {
		t.Errorf("network interfaces %v before, %v after", netBefore, n)
	}
	if n := dirNames("/run/netns"); !slices.Equal(n, nsBefore) {
		t.Errorf("network namespaces %v before, %v after", nsBefore, n)
	}
}

// checkLedger fails t when a sandbox the clients saw created, and did not
// start deleting, before and after listing is not listed.
func checkLedger(t *testing.T, c *client, l *soakLedger, when string) {
	before := l.snapshot()
	var list []store.Sandbox
	st, b, err := c.try("GET", "/v1/sandboxes", nil)
	if err != nil || st != 200 || json.Unmarshal(b, &list) != nil {
		t.Errorf("%s: list: %d %v %s", when, st, err, b)
		return
	}
	after := l.snapshot()
	listed := map[string]bool{}
	for _, s := range list {
		listed[s.ID] = true
	}
	for id := range before {
		if after[id] && !listed[id] {
			t.Errorf("%s: sandbox %s is no longer listed", when, id)
		}
	}
}

// stateProcs returns the processes (but this one) with an argument under
// state: the daemon, its VMMs, their jail-inits and fork children.
func stateProcs(state string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(string(b), state) {
			out = append(out, pid)
		}
	}
	return out
}

// dirNames lists dir's entries, sorted (nil when it cannot be read).
func dirNames(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var n []string
	for _, e := range ents {
		n = append(n, e.Name())
	}
	slices.Sort(n)
	return n
}

// cgroupDirs returns the directories under the daemon's default cgroup
// parent ("warren") of every hierarchy mounted at /sys/fs/cgroup.
func cgroupDirs() []string {
	var out []string
	for _, pat := range []string{"/sys/fs/cgroup/warren/*", "/sys/fs/cgroup/*/warren/*"} {
		m, _ := filepath.Glob(pat)
		out = append(out, m...)
	}
	return out
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
