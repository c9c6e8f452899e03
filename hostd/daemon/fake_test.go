package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/agentclient/agentstub"
	"github.com/warrenvm/warren/ebpf/policy"
	"github.com/warrenvm/warren/guestinit/agent"
	"github.com/warrenvm/warren/memsnap/statefile"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmmctl"
)

// fakeLauncher stands in for the warren binary: each "VMM" is a real
// `sleep` process (so PIDs, start times, signals and cgroups are real),
// and the launcher serves, in the test process, a fake control API on the
// VMM's --api socket and a real guest agent (running commands on this
// host) behind a fake vsock CONNECT handshake on its --vsock socket. Both
// stop when the sleep process dies. The fake outlives a Daemon, like a
// real VMM.
type fakeLauncher struct {
	t      testing.TB
	mu     sync.Mutex
	vms    map[int]*fakeVM
	starts atomic.Int32
	// failRestore makes `restore` fail to start.
	failRestore atomic.Bool
	// failSave makes POST /v1/working-set/save fail (workingset_test.go).
	failSave atomic.Bool
	// muteForkChildren starts fork children whose agent never answers
	// (it listens elsewhere than the vsock path the fork reply names).
	muteForkChildren atomic.Bool
	// duringRun, when set, is called with a `run`'s spec as it starts:
	// what the build's guest does (to its disks, say).
	duringRun func(run vmmctl.Run)
	// lastRestore is the snapshot path of the last `restore`,
	// lastRestoreSpec all of it.
	lastRestore     string
	lastRestoreSpec vmmctl.Restore
	// lastRun is the last `run` (a template build), lastRunFiles what its
	// LaunchSpec.ExtraFiles held when it started.
	lastRun      vmmctl.Run
	lastRunFiles []fakeFile
	// balloonPuts are the PUT /v1/balloon requests its VMMs took.
	balloonPuts []vmmctl.BalloonRequest
	// confined are the Confine of every LaunchSpec started, by sandbox or
	// template id (the last one's), with the owner of the VMM's directory
	// (its --console's) at that moment.
	confined map[string]fakeConfine
}

// fakeConfine is what a VMM's launch said of its confinement.
type fakeConfine struct {
	c        *Confinement
	dirOwner int
}

// fakeFile is one of a LaunchSpec's ExtraFiles as the fake saw it.
type fakeFile struct {
	// data is its content; flags its open flags (F_GETFL).
	data  []byte
	flags int
}

// restored returns the snapshot path the last `restore` was given.
func (f *fakeLauncher) restored() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastRestore
}

type fakeVM struct {
	cmd        *exec.Cmd
	api, vsock string
	mu         sync.Mutex
	paused     bool
	snaps      []string
	// egress is the policy in force (nil: the VM has no egress): a
	// network VMM's --egress file, or "{}" (the template's) without one.
	egress json.RawMessage
	// denied is the filter's denied-packet count GET /v1/egress reports.
	denied atomic.Uint64
	// balloon is its memory balloon (nil: none): a `run --balloon`'s, or
	// the one its snapshot or fork parent had.
	balloon *fakeBalloon
	// restore is the `restore` it was started with (nil: a `run` or a
	// fork child): its working-set calls answer from it.
	restore  *vmmctl.Restore
	closers  []func()
	launcher *fakeLauncher
}

func newFakeLauncher(t testing.TB) *fakeLauncher {
	f := &fakeLauncher{t: t, vms: map[int]*fakeVM{}}
	t.Cleanup(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, vm := range f.vms {
			vm.cmd.Process.Kill()
		}
	})
	return f
}

func (f *fakeLauncher) Start(spec LaunchSpec) (Proc, error) {
	// What the real launcher would refuse to encode, the fake refuses.
	if _, err := spec.Launch.Args(); err != nil {
		return Proc{}, fmt.Errorf("fake: %w", err)
	}
	var api, vs, console, policyFile string
	var egress json.RawMessage
	var bal *fakeBalloon
	if r := spec.Launch.Run; r != nil {
		api, vs, console, policyFile = r.API, r.Vsock, r.Console, r.Egress
		if r.PrivateNet {
			egress = json.RawMessage("{}")
		}
		if r.Balloon {
			bal = &fakeBalloon{MemMiB: uint64(r.MemMiB)}
		}
	} else {
		r := spec.Launch.Restore
		api, vs, console, policyFile = r.API, r.Vsock, r.Console, r.Egress
		if r.Secrets != "" {
			egress = json.RawMessage("{}")
		}
	}
	if policyFile != "" {
		b, err := os.ReadFile(policyFile)
		if err != nil {
			return Proc{}, fmt.Errorf("fake: %w", err)
		}
		egress = b
	}
	if api == "" || vs == "" {
		return Proc{}, fmt.Errorf("fake: no API or vsock socket in %+v", spec.Launch)
	}
	f.mu.Lock()
	if f.confined == nil {
		f.confined = map[string]fakeConfine{}
	}
	f.confined[spec.ID] = fakeConfine{c: spec.Confine, dirOwner: dirOwner(filepath.Dir(console))}
	f.mu.Unlock()
	if r := spec.Launch.Restore; r != nil {
		if f.failRestore.Load() {
			return Proc{}, errors.New("fake: restore refused")
		}
		// Like the real VMM, the fake reads the snapshot it is given:
		// its state file and memory chain must be plaintext.
		if _, err := vmsnapChain(r.Snapshot); err != nil {
			return Proc{}, fmt.Errorf("fake: restore %s: %w", r.Snapshot, err)
		}
		// A restore keeps the snapshot's balloon.
		b, err := readFakeBalloon(r.Snapshot)
		if err != nil {
			return Proc{}, fmt.Errorf("fake: restore %s: %w", r.Snapshot, err)
		}
		bal = b
		f.mu.Lock()
		f.lastRestore = r.Snapshot
		f.lastRestoreSpec = *r
		f.mu.Unlock()
	} else {
		var files []fakeFile
		for _, x := range spec.ExtraFiles {
			fi, err := x.Stat()
			if err != nil {
				return Proc{}, fmt.Errorf("fake: extra file: %w", err)
			}
			b := make([]byte, fi.Size())
			if _, err := x.ReadAt(b, 0); err != nil && len(b) > 0 {
				return Proc{}, fmt.Errorf("fake: extra file: %w", err)
			}
			fl, err := unix.FcntlInt(x.Fd(), unix.F_GETFL, 0)
			if err != nil {
				return Proc{}, fmt.Errorf("fake: extra file: %w", err)
			}
			files = append(files, fakeFile{b, fl})
		}
		f.mu.Lock()
		f.lastRun = *spec.Launch.Run
		f.lastRunFiles = files
		during := f.duringRun
		f.mu.Unlock()
		if during != nil {
			during(*spec.Launch.Run)
		}
	}
	f.starts.Add(1)
	vm, err := f.startVM(api, vs)
	if err != nil {
		return Proc{}, err
	}
	vm.mu.Lock()
	vm.egress = egress
	vm.balloon = bal
	vm.restore = spec.Launch.Restore
	vm.mu.Unlock()
	st, err := procStartTime(vm.cmd.Process.Pid)
	return Proc{PID: vm.cmd.Process.Pid, StartTime: st}, err
}

func (f *fakeLauncher) vm(pid int) *fakeVM {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.vms[pid]
}

func (f *fakeLauncher) startVM(api, vs string) (*fakeVM, error) {
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	vm := &fakeVM{cmd: cmd, api: api, vsock: vs, launcher: f}
	if err := vm.serve(); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, err
	}
	f.mu.Lock()
	f.vms[cmd.Process.Pid] = vm
	f.mu.Unlock()
	go func() {
		cmd.Wait()
		vm.mu.Lock()
		cl := vm.closers
		vm.closers = nil
		vm.mu.Unlock()
		for _, c := range cl {
			c()
		}
	}()
	return vm, nil
}

// serve starts the fake control API and the agent.
func (vm *fakeVM) serve() error {
	os.Remove(vm.api)
	os.Remove(vm.vsock)
	al, err := net.Listen("unix", vm.api)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, st int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(st)
		json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("POST /v1/pause", func(w http.ResponseWriter, r *http.Request) {
		vm.mu.Lock()
		vm.paused = true
		vm.mu.Unlock()
		reply(w, 200, map[string]bool{"paused": true})
	})
	mux.HandleFunc("POST /v1/resume", func(w http.ResponseWriter, r *http.Request) {
		vm.mu.Lock()
		vm.paused = false
		vm.mu.Unlock()
		reply(w, 200, map[string]bool{"paused": false})
	})
	mux.HandleFunc("POST /v1/snapshot", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Path, Kind string }
		json.NewDecoder(r.Body).Decode(&req)
		// A real state file and memory layer (a made-up machine), so
		// that at-rest encryption and restores see the real formats.
		if _, err := writeFakeSnapshot(req.Path, "", 1); err != nil {
			reply(w, 500, map[string]string{"error": err.Error()})
			return
		}
		vm.mu.Lock()
		vm.snaps = append(vm.snaps, req.Path)
		bal := vm.balloon.clone()
		vm.mu.Unlock()
		if err := writeFakeBalloon(req.Path, bal); err != nil {
			reply(w, 500, map[string]string{"error": err.Error()})
			return
		}
		reply(w, 200, map[string]any{"path": req.Path, "kind": req.Kind, "layer_bytes": 5})
	})
	mux.HandleFunc("POST /v1/rollback", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Path string }
		json.NewDecoder(r.Body).Decode(&req)
		if _, err := os.Stat(req.Path + ".wstate"); err != nil {
			reply(w, 400, map[string]string{"error": err.Error()})
			return
		}
		reply(w, 200, map[string]any{"path": req.Path})
	})
	mux.HandleFunc("POST /v1/fork", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			N      int
			Prefix string
		}
		json.NewDecoder(r.Body).Decode(&req)
		var kids []map[string]any
		for k := range req.N {
			p := fmt.Sprintf("%s-%d", req.Prefix, k)
			agentAt := p + ".vsock"
			if vm.launcher.muteForkChildren.Load() {
				agentAt = p + ".elsewhere"
			}
			c, err := vm.launcher.startVM(p+".api", agentAt)
			if err != nil {
				reply(w, 500, map[string]string{"error": err.Error()})
				return
			}
			vm.mu.Lock()
			bal := vm.balloon.clone() // a child has its parent's devices
			vm.mu.Unlock()
			c.mu.Lock()
			c.balloon = bal
			c.mu.Unlock()
			kids = append(kids, map[string]any{"index": k, "pid": c.cmd.Process.Pid, "api": p + ".api", "vsock": p + ".vsock",
				"console": p + ".console", "log": p + ".log", "hostname": fmt.Sprintf("fork-%d", k)})
		}
		reply(w, 200, map[string]any{"pause_ms": 1.5, "children": kids})
	})
	// GET and PUT /v1/egress as the VMM answers them: policy, stats, audit.
	egressReply := func(w http.ResponseWriter, r *http.Request, put []byte) {
		vm.mu.Lock()
		defer vm.mu.Unlock()
		if vm.egress == nil {
			reply(w, 404, map[string]string{"error": "egress: this VM has no egress policy"})
			return
		}
		if put != nil {
			if _, err := policy.Parse(put); err != nil {
				reply(w, 400, map[string]string{"error": err.Error()})
				return
			}
			vm.egress = put
		}
		reply(w, 200, map[string]any{"policy": vm.egress, "stats": map[string]any{"passed": 1,
			"filter": map[string]uint64{"DeniedPackets": vm.denied.Load()}}, "audit": "egress.jsonl"})
	}
	mux.HandleFunc("GET /v1/egress", func(w http.ResponseWriter, r *http.Request) { egressReply(w, r, nil) })
	mux.HandleFunc("PUT /v1/egress", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		egressReply(w, r, b)
	})
	// GET and PUT /v1/balloon as a VMM with a balloon answers them (404
	// without one): the driver reaches the target at once.
	balloonReply := func(w http.ResponseWriter, put *vmmctl.BalloonRequest) {
		vm.mu.Lock()
		defer vm.mu.Unlock()
		b := vm.balloon
		if b == nil {
			reply(w, 404, map[string]string{"error": "balloon: this VM has no balloon (warren run --balloon)"})
			return
		}
		if put != nil {
			if put.TargetMiB != nil && *put.TargetMiB > b.MemMiB {
				reply(w, 400, map[string]string{"error": fmt.Sprintf("balloon: target %d MiB is more than the guest's %d MiB", *put.TargetMiB, b.MemMiB)})
				return
			}
			if put.StatsIntervalS != nil {
				b.IntervalS = *put.StatsIntervalS
			}
			if put.TargetMiB != nil {
				b.InflatedPages += max(*put.TargetMiB, b.TargetMiB)<<8 - b.TargetMiB<<8
				b.DeflatedPages += max(*put.TargetMiB, b.TargetMiB)<<8 - *put.TargetMiB<<8
				b.TargetMiB = *put.TargetMiB
			}
			vm.launcher.mu.Lock()
			vm.launcher.balloonPuts = append(vm.launcher.balloonPuts, *put)
			vm.launcher.mu.Unlock()
		}
		reply(w, 200, b.reply())
	}
	mux.HandleFunc("GET /v1/balloon", func(w http.ResponseWriter, r *http.Request) { balloonReply(w, nil) })
	mux.HandleFunc("PUT /v1/balloon", func(w http.ResponseWriter, r *http.Request) {
		var req vmmctl.BalloonRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			reply(w, 400, map[string]string{"error": "bad request: " + err.Error()})
			return
		}
		balloonReply(w, &req)
	})
	vm.serveWorkingSet(mux, reply)
	srv := &http.Server{Handler: mux}
	go srv.Serve(al)

	vl, err := net.Listen("unix", vm.vsock)
	if err != nil {
		srv.Close()
		return err
	}
	// Firecracker's hybrid vsock: "CONNECT <port>\n" -> "OK <host port>\n".
	conns := agentstub.Hybrid(vl)
	as := agent.NewServer(agent.ProcessWaiter{}, agent.Options{})
	go as.Serve(conns)
	vm.closers = append(vm.closers, func() { srv.Close() }, func() { conns.Close(); as.Close() },
		func() { os.Remove(vm.api); os.Remove(vm.vsock) })
	return nil
}

// fakeBalloon is a fake VMM's memory balloon, as its snapshots keep it
// (a section of their state file).
type fakeBalloon struct {
	MemMiB, TargetMiB, IntervalS uint64
	InflatedPages, DeflatedPages uint64
}

// fakeBalloonSection names the state file section of a fake snapshot's
// balloon.
const fakeBalloonSection = "fake-balloon"

func (b *fakeBalloon) clone() *fakeBalloon {
	if b == nil {
		return nil
	}
	c := *b
	return &c
}

// reply is its GET /v1/balloon answer: an active driver with free page
// reporting and a statistics queue, at its target.
func (b *fakeBalloon) reply() vmmctl.BalloonReply {
	pages := uint32(b.TargetMiB << 8)
	return vmmctl.BalloonReply{TargetMiB: b.TargetMiB, TargetPages: pages, ActualMiB: b.TargetMiB, ActualPages: pages,
		Active: true, FreePageReporting: true, StatsQueue: true, StatsIntervalS: float64(b.IntervalS),
		StatsTime: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Stats:     []vmmctl.BalloonStat{{Tag: 4, Name: "free-memory", Value: (b.MemMiB - b.TargetMiB) << 20 / 2}},
		Counters:  vmmctl.BalloonCounters{InflatedPages: b.InflatedPages, DeflatedPages: b.DeflatedPages, StatsUpdates: 1}}
}

// writeFakeBalloon adds b (nil: none) to the state file of snapshot path.
func writeFakeBalloon(path string, b *fakeBalloon) error {
	if b == nil {
		return nil
	}
	_, _, state, err := vmsnap.Paths(path)
	if err != nil {
		return err
	}
	f, err := statefile.Read(state)
	if err != nil {
		return err
	}
	data, _ := json.Marshal(b)
	f.Sections = append(f.Sections, statefile.Section{Name: fakeBalloonSection, Data: data})
	enc, err := f.Encode()
	if err != nil {
		return err
	}
	return statefile.WriteAtomic(state, enc)
}

// readFakeBalloon returns the balloon snapshot path has (nil: none).
func readFakeBalloon(path string) (*fakeBalloon, error) {
	_, _, state, err := vmsnap.Paths(path)
	if err != nil {
		return nil, err
	}
	f, err := statefile.Read(state)
	if err != nil {
		return nil, err
	}
	data, ok := f.Section(fakeBalloonSection)
	if !ok {
		return nil, nil
	}
	var b fakeBalloon
	return &b, json.Unmarshal(data, &b)
}

var _ = context.Background
