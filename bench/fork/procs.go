package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/bench/agentdial"
	"github.com/warrenvm/warren/bench/console"
	"github.com/warrenvm/warren/bench/rig"
	"github.com/warrenvm/warren/devices/virtio/vsock"
	"github.com/warrenvm/warren/vmmctl"
)

// registry holds every VMM the benchmark started, so that an error or an
// interrupt stops them all: booted VMMs (console processes, in their own
// process groups) and process groups started otherwise (fork children,
// each leading its own session; QEMU restores).
type registry struct {
	mu     sync.Mutex
	procs  map[*console.Proc]bool
	groups map[int]bool
	closed bool   // killAll ran: anything added later is killed at once
	work   string // removed by killAll
}

func newRegistry() *registry {
	return &registry{procs: map[*console.Proc]bool{}, groups: map[int]bool{}}
}

func (r *registry) addProc(p *console.Proc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		p.Kill()
		return
	}
	r.procs[p] = true
}

func (r *registry) dropProc(p *console.Proc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.procs, p)
}

// addGroup registers the process group led by pid.
func (r *registry) addGroup(pid int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		syscall.Kill(-pid, syscall.SIGKILL)
		return
	}
	r.groups[pid] = true
}

func (r *registry) dropGroup(pid int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.groups, pid)
}

// killAll SIGKILLs everything registered and removes the work directory.
func (r *registry) killAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for pid := range r.groups {
		syscall.Kill(-pid, syscall.SIGKILL)
	}
	r.groups = map[int]bool{}
	for p := range r.procs {
		p.Kill()
	}
	r.procs = map[*console.Proc]bool{}
	if r.work != "" {
		os.RemoveAll(r.work)
	}
}

// parent is a booted Warren VM with its control API, the one forked.
type parent struct {
	p      *console.Proc
	api    string
	client *agentclient.Client
}

// bootWarren boots a Warren guest of memMiB MiB with its files named
// DIR/NAME.* and waits for its agent; vmmArgs go to `warren run`.
func bootWarren(c config, reg *registry, dir, name string, memMiB int, vmmArgs ...string) (*parent, error) {
	sock, api := filepath.Join(dir, name+".vsock"), filepath.Join(dir, name+".api")
	argv := c.WarrenArgv(memMiB, sock, api, guestArgs)
	argv = slices.Insert(argv, 2, vmmArgs...) // after "warren run"
	p, err := console.Start(argv)
	if err != nil {
		return nil, fmt.Errorf("warren: %w", err)
	}
	reg.addProc(p)
	w := &parent{p: p, api: api, client: agentclient.New(sock)}
	if err := rig.WaitAgent("warren", p, w.client, c.timeout); err != nil {
		w.stop(reg)
		return nil, err
	}
	return w, nil
}

func (w *parent) stop(reg *registry) {
	w.client.Close()
	w.p.Kill()
	reg.dropProc(w.p)
}

// fork asks the VM whose control socket is api for n children named
// PREFIX-K.*; every child started is registered.
func fork(reg *registry, api, prefix string, n int, timeout time.Duration) (vmmctl.ForkReply, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	r, err := vmmctl.Client{Socket: api}.Fork(ctx, vmmctl.ForkRequest{N: n, Prefix: prefix})
	if err != nil {
		return vmmctl.ForkReply{}, fmt.Errorf("warren fork: %w", err)
	}
	for _, ch := range r.Children {
		reg.addGroup(ch.PID) // each child leads its own session
	}
	if len(r.Children) != n {
		return *r, fmt.Errorf("warren fork: %d children, asked for %d", len(r.Children), n)
	}
	return *r, nil
}

// forkToAgent forks w once, its child's files named PREFIX-0.*, and
// waits for the child's agent. It returns the reply (whose children are
// to be stopped, even on error), the request's round trip and the time
// from the request to the agent's answer.
func forkToAgent(c config, reg *registry, w *parent, prefix string) (r vmmctl.ForkReply, call, agentT time.Duration, err error) {
	start := time.Now()
	r, err = fork(reg, w.api, prefix, 1, c.runTimeout)
	call = time.Since(start)
	if err != nil {
		return r, call, 0, err
	}
	ch := r.Children[0]
	client := childClient(ch)
	defer client.Close()
	agentT, err = waitAnswer(client, start, start.Add(c.runTimeout), func() bool { return !alive(ch.PID) })
	if err != nil {
		if alive(ch.PID) {
			fmt.Printf("child pid %d, its agent silent: its vCPUs (a snapshot of it):\n%s", ch.PID, hungState(ch, filepath.Dir(ch.API)))
			dumpStacks(ch)
		}
		return r, call, 0, fmt.Errorf("child pid %d: %w; its log: %s; its console: %s", ch.PID, err, logTail(ch), consoleTail(ch))
	}
	return r, call, agentT, nil
}

// childClient reaches a fork child's agent through its vsock socket,
// racing dials as for a restored VM: the child's guest resets its vsock
// transport after the fork, and a stream opened before may go unanswered.
func childClient(ch vmmctl.ForkChild) *agentclient.Client {
	sock := ch.Vsock
	return agentclient.NewDial(agentdial.Racing(func(ctx context.Context) (net.Conn, error) {
		return vsock.Dial(ctx, sock, agentwire.Port)
	}))
}

// waitAnswer calls GET /health until the agent answers and returns the
// time since start; it gives up at deadline or once gone reports the VMM
// gone.
func waitAnswer(client *agentclient.Client, start, deadline time.Time, gone func() bool) (time.Duration, error) {
	for {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		_, err := client.Health(ctx)
		cancel()
		if err == nil {
			return time.Since(start), nil
		}
		if gone() {
			return 0, fmt.Errorf("the VMM exited before its agent answered (%v)", err)
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("agent did not answer in %s: %w", deadline.Sub(start).Round(time.Millisecond), err)
		}
		time.Sleep(time.Millisecond)
	}
}

// alive reports whether pid is a process that has not exited (a zombie
// has): fork children are their parent VMM's to reap, not ours.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// stopGroups stops the process groups led by pids as a user would:
// SIGTERM (the VMM stops its VM and exits), SIGKILL to what is left after
// 10 s. (In the nested KVM host, SIGKILLed VMMs were followed by L1 soft
// lockups; see bench/snapshot.) It waits for them to be gone, at most 30 s
// more.
func stopGroups(reg *registry, pids ...int) {
	for _, pid := range pids {
		syscall.Kill(-pid, syscall.SIGTERM)
	}
	waitGone := func(d time.Duration) bool {
		for end := time.Now().Add(d); ; time.Sleep(5 * time.Millisecond) {
			left := false
			for _, pid := range pids {
				left = left || alive(pid)
			}
			if !left {
				return true
			}
			if time.Now().After(end) {
				return false
			}
		}
	}
	if !waitGone(10 * time.Second) {
		for _, pid := range pids {
			if alive(pid) {
				syscall.Kill(-pid, syscall.SIGKILL)
			}
		}
		if !waitGone(30 * time.Second) {
			fmt.Printf("warning: VMM processes %v not all gone 30s after SIGKILL; going on\n", pids)
		}
	}
	for _, pid := range pids {
		reg.dropGroup(pid)
	}
}

// stopChildren stops fork children and removes their files
// (PREFIX-K.{api,vsock,console,log}).
func stopChildren(reg *registry, children []vmmctl.ForkChild) {
	var pids []int
	for _, ch := range children {
		pids = append(pids, ch.PID)
	}
	stopGroups(reg, pids...)
	for _, ch := range children {
		prefix := strings.TrimSuffix(ch.API, ".api")
		files, _ := filepath.Glob(prefix + ".*")
		for _, f := range files {
			os.Remove(f)
		}
	}
}

// consoleTail is the end of a child's console, for an error message: the
// guest's last words before a hang (the console file goes with the child).
func consoleTail(ch vmmctl.ForkChild) string {
	b, _ := os.ReadFile(ch.Console)
	return tail(string(b))
}

// dumpStacks asks a live child whose agent never answered for its
// goroutines' stacks (SIGQUIT: the Go runtime writes them to the child's
// log, its standard error, and exits) and prints them, so that a hung
// child says whether its VMM was stuck (a device worker, a lock) or ran a
// guest that went silent (its vCPU threads in KVM_RUN).
func dumpStacks(ch vmmctl.ForkChild) {
	if err := syscall.Kill(ch.PID, syscall.SIGQUIT); err != nil {
		fmt.Printf("child pid %d: SIGQUIT: %v\n", ch.PID, err)
		return
	}
	for i := 0; i < 50 && alive(ch.PID); i++ {
		time.Sleep(100 * time.Millisecond)
	}
	b, _ := os.ReadFile(ch.Log)
	if len(b) > 64<<10 {
		b = b[len(b)-64<<10:]
	}
	fmt.Printf("child pid %d's log after SIGQUIT (its goroutines):\n%s\n", ch.PID, b)
}

// logTail is the end of a child's log, for an error message.
func logTail(ch vmmctl.ForkChild) string {
	b, _ := os.ReadFile(ch.Log)
	return tail(string(b))
}

func tail(s string) string {
	if len(s) > 800 {
		s = s[len(s)-800:]
	}
	return strings.TrimSpace(s)
}
