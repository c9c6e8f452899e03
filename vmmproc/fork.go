package vmmproc

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/cow"
	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/internal/strictjson"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmm/guestmem"
	"github.com/warrenvm/warren/vmmctl"
	"github.com/warrenvm/warren/vmmproc/egress"
	"golang.org/x/sys/unix"
)

// Forking (`warren fork API [-n N]`, POST /v1/fork). The parent process
// freezes its VM (cow.Forker: a pause of milliseconds, no memory copied)
// and starts each child as a new process of its own executable,
// `warren fork-child`, detached in its own session so that it outlives the
// parent; or, for a VMM warren-hostd confined (jail.SpawnEnv), has its
// jail-init start each one under the daemon's grant (familyhelper.go),
// with the same descriptors. The child inherits:
//
//	fd 3  a pipe carrying its forkSpec (JSON), closed after it
//	fd 4  a pipe on which it writes one line once its VM runs
//	      ("running <first KVM_RUN, Unix ns>") or could not be built
//	      ("error <message>"), then closes
//	fd 5… the files of the parent's memory base, in forkSpec.Memory's order
//
// Each child gets its own control socket, vsock socket and CID, console
// and log file, named PREFIX-K.{api,vsock,console,log}, its own disk
// overlays, its own tap and MAC when the parent has a tap, and a new
// hostname and machine id, which the guest agent applies at its first
// re-sync (the vsock transport reset every restored VM gets).

// forkSpec is what a child process is told on fd 3.
type forkSpec struct {
	Options  runOptions              `json:"options"`
	State    json.RawMessage         `json:"state"`
	Devices  []vmsnap.DeviceState    `json:"devices"`
	Memory   guestmem.BaseDescriptor `json:"memory"`
	API      string                  `json:"api"`
	Console  string                  `json:"console"`
	KVM      string                  `json:"kvm"`
	Identity agentwire.Identity      `json:"identity"`
	Verbose  bool                    `json:"verbose,omitempty"`
	// Jail is the parent's --jail: the child hardens itself the same way
	// once set up (see jail.go).
	Jail string `json:"jail,omitempty"`
	// NetHelper, when not 0, is the descriptor of the family's helper
	// socket (after the memory files): the child's private network comes
	// from there (nethelper.go).
	NetHelper int `json:"net_helper,omitempty"`
	// DiskBases, when set, are by disk the frozen images the child makes
	// its own overlays on first (cow/disk CreateChild; "" for a read-only
	// disk): a child that runs as its own uid, in a directory its parent
	// may not write (cow.Forker.ChildrenMakeDisks).
	DiskBases []string `json:"disk_bases,omitempty"`
	// Log, when set, is the child's log, which it opens itself (as its
	// own uid, in its own directory) and makes its standard output and
	// error; until then they are its parent's standard error.
	Log string `json:"log,omitempty"`
}

// forkRestore is what buildVMWithDevices makes a forked child from.
type forkRestore struct {
	state   *vmm.State
	devices []vmsnap.DeviceState
	mem     *guestmem.Memory // owned by the VM once built
}

// fork serves POST /v1/fork.
func (a *apiServer) fork(w http.ResponseWriter, r *http.Request) {
	var req vmmctl.ForkRequest
	if err := strictjson.Decode(io.LimitReader(r.Body, 1<<16), &req); err != nil {
		replyErr(w, http.StatusBadRequest, fmt.Errorf("bad request: %w", err))
		return
	}
	if req.NetNS && a.opts.Tap == "" {
		replyErr(w, http.StatusBadRequest, fmt.Errorf("fork: --netns needs a VM with a tap"))
		return
	}
	if a.egress != nil && !req.NetNS && !a.opts.PrivateNet {
		// (A private-network VM's children each make their own namespace.)
		replyErr(w, http.StatusBadRequest, errors.New("fork: the VM has an egress policy: its children need --netns (each child's tap takes the same host address)"))
		return
	}
	if req.Egress != nil {
		if a.egress == nil {
			replyErr(w, http.StatusBadRequest, errors.New("fork: --egress: the VM has no egress policy to narrow"))
			return
		}
		req.Egress.Normalize()
		if err := req.Egress.ValidateWith(a.opts.Egress.policyOptions()); err != nil {
			replyErr(w, http.StatusBadRequest, fmt.Errorf("fork: %w", err))
			return
		}
		if err := req.Egress.Narrows(a.egress.Policy()); err != nil {
			replyErr(w, http.StatusBadRequest, fmt.Errorf("fork: %w", err))
			return
		}
	}
	if req.N < 1 || req.N > vmmctl.MaxForkChildren {
		replyErr(w, http.StatusBadRequest, fmt.Errorf("fork: n=%d, want 1 to %d", req.N, vmmctl.MaxForkChildren))
		return
	}
	if req.Secrets != nil {
		if a.egress == nil || len(req.Secrets) != req.N {
			replyErr(w, http.StatusBadRequest, fmt.Errorf("fork: %d secrets files for %d children (egress: %v): want one per child of a VM with egress", len(req.Secrets), req.N, a.egress != nil))
			return
		}
		for _, p := range req.Secrets {
			if !filepath.IsAbs(p) {
				replyErr(w, http.StatusBadRequest, fmt.Errorf("fork: secrets file %q is not absolute", p))
				return
			}
		}
	}
	if via := a.proc.spawnsViaHelper(); via && len(req.Grants) != req.N {
		replyErr(w, http.StatusBadRequest, fmt.Errorf("fork: this VMM's children are started by its jail-init under warren-hostd's grants: %d grants for %d children", len(req.Grants), req.N))
		return
	} else if !via && len(req.Grants) > 0 {
		replyErr(w, http.StatusBadRequest, errors.New("fork: grants, but no family helper starts this VMM's children"))
		return
	}
	if req.Prefix == "" && req.Prefixes == nil {
		req.Prefix = strings.TrimSuffix(a.apiPath, filepath.Ext(a.apiPath)) + "-fork-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	if req.Prefixes != nil && (len(req.Prefixes) != req.N || req.Prefix != "") {
		replyErr(w, http.StatusBadRequest, fmt.Errorf("fork: %d prefixes for %d children (and prefix %q): want one per child, or one prefix", len(req.Prefixes), req.N, req.Prefix))
		return
	}
	for _, p := range append([]string{req.Prefix}, req.Prefixes...) {
		if p != "" && !filepath.IsAbs(p) {
			replyErr(w, http.StatusBadRequest, fmt.Errorf("fork: prefix %q is not absolute", p))
			return
		}
	}
	if req.DiskDirs != nil {
		if len(req.DiskDirs) != req.N {
			replyErr(w, http.StatusBadRequest, fmt.Errorf("fork: %d disk_dirs for %d children", len(req.DiskDirs), req.N))
			return
		}
		for _, d := range req.DiskDirs {
			fi, err := os.Stat(d)
			if err == nil && !fi.IsDir() {
				err = fmt.Errorf("not a directory")
			}
			if !filepath.IsAbs(d) || err != nil {
				replyErr(w, http.StatusBadRequest, fmt.Errorf("fork: disk_dirs: %q is not an absolute path of a directory (%v)", d, err))
				return
			}
		}
	}
	rep, err := a.doFork(r.Context(), req)
	if err != nil {
		replyErr(w, http.StatusInternalServerError, err)
		return
	}
	reply(w, http.StatusOK, rep)
}

// doFork freezes the VM and starts the children.
func (a *apiServer) doFork(ctx context.Context, req vmmctl.ForkRequest) (*vmmctl.ForkReply, error) {
	a.forkMu.Lock()
	defer a.forkMu.Unlock()
	start := time.Now()
	exe, err := a.proc.executable()
	if err != nil {
		return nil, fmt.Errorf("fork: %w", err)
	}
	// The children's identities and paths are settled before the pause.
	tag := randomHex(3)
	var egState egress.State
	if a.egress != nil {
		var err error
		if egState, err = a.egress.State(); err != nil {
			return nil, fmt.Errorf("fork: egress state: %w", err)
		}
		if req.Egress != nil {
			egState.Policy = *req.Egress
		}
	}
	helper := a.proc.helperConn()
	// With a helper, a child's namespace is a private network the helper
	// makes (this process may make none): --netns means just that.
	cloneNetNS := req.NetNS && helper == nil
	specs := make([]forkSpec, req.N)
	children := make([]vmmctl.ForkChild, req.N)
	for k := range req.N {
		ch := &children[k]
		p := fmt.Sprintf("%s-%d", req.Prefix, k)
		if req.Prefixes != nil {
			p = req.Prefixes[k]
		}
		ch.Index, ch.API, ch.Console, ch.Log = k, p+".api", p+".console", p+".log"
		ch.Hostname, ch.MachineID = fmt.Sprintf("fork-%s-%d", tag, k), agentwire.NewMachineID()
		o := a.opts
		o.Disks = nil
		if req.NetNS && helper != nil {
			o.PrivateNet = true
		}
		if o.Vsock != "" {
			o.Vsock, o.CID = p+".vsock", randomCID()
			ch.Vsock, ch.CID = o.Vsock, o.CID
		}
		if o.Tap != "" {
			mac, err := ParseMAC("")
			if err != nil {
				return nil, err
			}
			o.Tap, o.MAC = fmt.Sprintf("wf%s%d", tag, k), mac.String()
			ch.Tap, ch.MAC = o.Tap, o.MAC
		}
		if o.Egress != nil {
			e := *o.Egress
			e.State, e.Audit, e.Sandbox = egState, p+".audit.jsonl", ch.Hostname
			if req.Secrets != nil {
				e.Secrets = req.Secrets[k]
			}
			o.Egress = &e
			ch.Audit = e.Audit
		}
		specs[k] = forkSpec{Options: o, API: ch.API, Console: ch.Console, KVM: a.kvmPath,
			Identity: agentwire.Identity{Hostname: ch.Hostname, MachineID: ch.MachineID, MAC: ch.MAC}, Jail: a.proc.currentJail()}
		if len(ch.API) > 100 || len(ch.Vsock) > 100 {
			return nil, fmt.Errorf("fork: prefix %q is too long for a unix socket path", p)
		}
	}
	// Children its jail-init starts run as uids of their own: they make
	// their own disk overlays, in directories this process may not write.
	a.forker.ChildrenMakeDisks = req.Grants != nil
	// Memory served by userfaultfd becomes an ordinary memfd first: the
	// fork shares it with the children as a layer.
	if err := a.completeMemory("fork"); err != nil {
		return nil, err
	}
	pt, err := a.forker.Fork(ctx, req.N, req.DiskDirs)
	if err != nil {
		return nil, err
	}
	defer pt.Close()
	resumed := time.Now()
	parentDisks := a.disks.Live()
	state, err := pt.State.Marshal()
	if err != nil {
		return nil, err
	}
	desc, files := pt.Memory.Descriptor()
	for k := range specs {
		specs[k].State, specs[k].Devices, specs[k].Memory, specs[k].DiskBases = state, pt.Devices, desc, pt.DiskBases
		for i, d := range a.opts.Disks {
			specs[k].Options.Disks = append(specs[k].Options.Disks, diskOption{Path: pt.Disks[i][k], ReadOnly: d.ReadOnly,
				Name: a.disks.Disks()[i].Dev.Path()})
		}
		// Child k's overlays sit on the layers the fork froze, which are
		// the parent's new tops' bases: the same chains.
		children[k].Disks = []cow.DiskFiles{}
		for _, pd := range parentDisks {
			children[k].Disks = append(children[k].Disks, cow.DiskFiles{Index: pd.Index, Top: pt.Disks[pd.Index][k], Chain: pd.Chain})
		}
	}
	// Start every child, then wait for them all: they restore in parallel.
	type started struct {
		cmd     *exec.Cmd     // started by this process
		spawned *spawnedChild // or by the family's helper
		ready   *os.File
	}
	procs := make([]started, len(specs))
	defer func() {
		for _, p := range procs {
			if p.spawned != nil {
				p.spawned.close()
			}
		}
	}()
	fail := func(err error) (*vmmctl.ForkReply, error) {
		for _, p := range procs {
			if p.cmd != nil && p.cmd.Process != nil {
				p.cmd.Process.Kill()
				p.cmd.Wait()
			}
			if p.spawned != nil {
				p.spawned.kill() // jail-init reaps it
			}
			if p.ready != nil {
				p.ready.Close()
			}
		}
		return nil, err
	}
	for k := range specs {
		var p started
		var err error
		if req.Grants != nil {
			p.spawned, p.ready, err = spawnForkChild(helper, req.Grants[k], &specs[k], files, children[k].Log)
		} else {
			p.cmd, p.ready, err = startForkChild(exe, &specs[k], files, children[k].Log, cloneNetNS, helper)
		}
		if err != nil {
			return fail(fmt.Errorf("fork: child %d: %w", k, err))
		}
		procs[k] = p
		if p.cmd != nil {
			children[k].PID = p.cmd.Process.Pid
		} else {
			children[k].PID = p.spawned.pid
		}
		if cloneNetNS {
			children[k].NetNS = fmt.Sprintf("/proc/%d/ns/net", children[k].PID)
		}
	}
	for k, p := range procs {
		line, err := readReady(p.ready, 2*time.Minute)
		p.ready.Close()
		procs[k].ready = nil
		if err != nil {
			logTail, _ := os.ReadFile(children[k].Log)
			return fail(fmt.Errorf("fork: child %d: %w%s; its log: %s", k, err, childExit(p.cmd), strings.TrimSpace(string(logTail))))
		}
		if ns, err := strconv.ParseInt(line, 10, 64); err == nil {
			children[k].ReadyMS = float64(time.Unix(0, ns).Sub(resumed).Microseconds()) / 1000
		}
	}
	// A requester that went away (warren-hostd killed during the fork)
	// would never learn of the children: nobody would supervise, record
	// or stop them, and they would keep their family's jail-init alive.
	if err := ctx.Err(); err != nil {
		return fail(fmt.Errorf("fork: the request was given up (%w): its children are stopped", err))
	}
	// The children run on in their own sessions; reap them when they end
	// so they do not linger as zombies of this process (jail-init reaps
	// those it started).
	for _, p := range procs {
		if p.cmd != nil {
			go p.cmd.Wait()
		}
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	a.log.Debug("fork", "children", len(children), "pause_ms", ms(pt.Pause))
	return &vmmctl.ForkReply{PauseMS: ms(pt.Pause), TotalMS: ms(time.Since(start)), Layers: len(desc.Layers), Children: children, Disks: parentDisks}, nil
}

// childExit says how a child this process started ended, when it ended
// within a second (", segmentation fault", ", exit status 2"): a child
// killed before it could write a word (the OOM killer, a seccomp kill, a
// binary replaced under it) leaves an empty log, and its wait status is
// then the only trace. It reaps the child; "" when cmd is nil (a child
// the family's helper started) or still runs.
func childExit(cmd *exec.Cmd) string {
	if cmd == nil || cmd.Process == nil {
		return ""
	}
	var st syscall.WaitStatus
	reaped := false
	for range 100 {
		pid, err := syscall.Wait4(cmd.Process.Pid, &st, syscall.WNOHANG, nil)
		if reaped = err == nil && pid == cmd.Process.Pid; reaped || err != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	switch {
	case !reaped:
		return ""
	case st.Signaled():
		return ", " + st.Signal().String()
	case st.Exited():
		return fmt.Sprintf(", exit status %d", st.ExitStatus())
	}
	return ""
}

// childStart is what one child is started with: its log (standard
// output and error) and its descriptors 3, 4, ... (fds: the spec pipe's
// read end, the ready pipe's write end, the memory files, the helper
// socket when set), with this process's ends of the pipes.
type childStart struct {
	log    *os.File
	ownLog bool // log is this process's, not opened for the child
	fds    []*os.File
	specW  *os.File
	readyR *os.File
	spec   []byte
}

// newChildStart opens a child's log at logPath and makes its pipes; the
// spec names the helper's descriptor (after the memory files) when
// helper is set. With childLog the child opens its log itself (spec.Log)
// and gets this process's standard error until then.
func newChildStart(spec *forkSpec, memFiles []*os.File, logPath string, helper *os.File, childLog bool) (*childStart, error) {
	if helper != nil {
		spec.NetHelper = 5 + len(memFiles)
	}
	if childLog {
		spec.Log = logPath
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	c := &childStart{spec: b}
	specR, specW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	c.fds, c.specW = []*os.File{specR}, specW
	readyR, readyW, err := os.Pipe()
	if err != nil {
		c.abort()
		return nil, err
	}
	c.fds, c.readyR = append(c.fds, readyW), readyR
	c.fds = append(c.fds, memFiles...)
	if helper != nil {
		c.fds = append(c.fds, helper)
	}
	if childLog {
		c.log, c.ownLog = os.Stderr, true
	} else if c.log, err = os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644); err != nil {
		c.abort()
		return nil, err
	}
	return c, nil
}

// started closes the child's ends of the pipes and its log here, sends
// it its spec, and returns the read end of its ready pipe.
func (c *childStart) started() *os.File {
	c.fds[0].Close()
	c.fds[1].Close()
	if !c.ownLog {
		c.log.Close()
	}
	// The spec is a few kB to tens of kB: more than a pipe buffer holds
	// when the state is large, so write it while the child reads.
	go func() {
		c.specW.Write(c.spec)
		c.specW.Close()
	}()
	return c.readyR
}

// abort closes every file of a child that was not started.
func (c *childStart) abort() {
	for _, f := range []*os.File{c.log, c.specW, c.readyR} {
		if f != nil && (f != c.log || !c.ownLog) {
			f.Close()
		}
	}
	for _, f := range c.fds[:min(2, len(c.fds))] {
		f.Close()
	}
}

// startForkChild starts one child process with its spec on fd 3, the
// ready pipe on fd 4, the memory files from fd 5 on and the helper
// socket, when set, after them; the returned file is the read end of the
// ready pipe.
func startForkChild(exe string, spec *forkSpec, memFiles []*os.File, logPath string, netns bool, helper *os.File) (*exec.Cmd, *os.File, error) {
	c, err := newChildStart(spec, memFiles, logPath, helper, false)
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(exe, "fork-child")
	cmd.Stdout, cmd.Stderr = c.log, c.log
	cmd.ExtraFiles = c.fds
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if netns {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNET
	}
	if err := cmd.Start(); err != nil {
		c.abort()
		return nil, nil, err
	}
	return cmd, c.started(), nil
}

// spawnForkChild has the family's helper on conn start one child under
// grant, with the same descriptors as startForkChild's (the helper socket
// among them: conn), but for its log, which the child opens itself (as
// its own uid: this process may not write its directory); the returned
// file is the read end of the ready pipe.
func spawnForkChild(conn *os.File, grant string, spec *forkSpec, memFiles []*os.File, logPath string) (*spawnedChild, *os.File, error) {
	c, err := newChildStart(spec, memFiles, logPath, conn, true)
	if err != nil {
		return nil, nil, err
	}
	child, err := spawnViaHelper(conn, grant, c.log, c.fds)
	if err != nil {
		c.abort()
		return nil, nil, err
	}
	return child, c.started(), nil
}

// readReady reads a child's ready line: the first KVM_RUN time, or its
// error.
func readReady(f *os.File, timeout time.Duration) (string, error) {
	f.SetReadDeadline(time.Now().Add(timeout))
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		if errors.Is(err, io.EOF) {
			return "", fmt.Errorf("exited before its VM ran")
		}
		return "", err
	}
	line = strings.TrimSpace(line)
	if msg, ok := strings.CutPrefix(line, "error "); ok {
		return "", errors.New(msg)
	}
	if v, ok := strings.CutPrefix(line, "running "); ok {
		return v, nil
	}
	return "", fmt.Errorf("unexpected ready line %q", line)
}

// ForkChild is the hidden `warren fork-child ARGS...` (args: none), run
// by a forking parent with the files described above; it returns the
// process's exit status. Its input is the forkSpec on fd 3, which only
// this package writes, so it parses no flags of its own.
func ForkChild(args []string, stdout, stderr io.Writer) int {
	ready := os.NewFile(4, "ready")
	fail := func(format string, a ...any) int {
		msg := fmt.Sprintf(format, a...)
		fmt.Fprintf(stderr, "warren fork-child: %s\n", msg)
		if ready != nil {
			fmt.Fprintf(ready, "error %s\n", strings.ReplaceAll(msg, "\n", " "))
			ready.Close()
			ready = nil
		}
		return 1
	}
	if len(args) != 0 {
		return fail("unexpected arguments %q (this command is run by warren fork)", args)
	}
	specFile := os.NewFile(3, "spec")
	b, err := io.ReadAll(io.LimitReader(specFile, 64<<20))
	specFile.Close()
	if err != nil {
		return fail("read spec: %v", err)
	}
	var spec forkSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		return fail("spec: %v", err)
	}
	var helper *os.File
	if spec.Log != "" {
		if err := redirectOutput(spec.Log); err != nil {
			return fail("%v", err)
		}
	}
	if spec.NetHelper != 0 {
		if spec.NetHelper < 5 || spec.NetHelper > 5+4096 {
			return fail("spec: helper descriptor %d", spec.NetHelper)
		}
		helper = os.NewFile(uintptr(spec.NetHelper), "helper")
	}
	js, err := ParseJail(spec.Jail)
	if err != nil {
		return fail("%v", err)
	}
	nfiles := 0
	for _, l := range spec.Memory.Layers {
		nfiles = max(nfiles, l.File+1)
	}
	files := make([]*os.File, nfiles)
	for i := range files {
		files[i] = os.NewFile(uintptr(5+i), fmt.Sprintf("memory-%d", i))
	}
	base, err := guestmem.OpenBase(spec.Memory, files)
	if err != nil {
		return fail("%v", err)
	}
	mem, err := guestmem.NewFromBase(base)
	base.Close()
	if err != nil {
		return fail("%v", err)
	}
	st, err := vmm.UnmarshalState(spec.State)
	if err != nil {
		mem.Close()
		return fail("%v", err)
	}
	log := NewLogger(stderr, spec.Verbose)
	out, closeOut, err := OpenConsole(spec.Console, stdout)
	if err != nil {
		mem.Close()
		return fail("%v", err)
	}
	defer closeOut()
	id := spec.Identity
	o := vmOptions{proc: newForkChildProcess(helper), kvmPath: spec.KVM, log: log, console: out, trackDirty: true, identity: &id,
		fork: &forkRestore{state: st, devices: spec.Devices, mem: mem}}
	raw, _ := json.Marshal(spec.Options)
	if err := applyOptions(&o, raw); err != nil {
		mem.Close()
		return fail("%v", err)
	}
	// The parent's fork made the child's disk overlays for it alone, or
	// left them to it (DiskBases).
	for i, base := range spec.DiskBases {
		if base == "" {
			continue
		}
		if i >= len(o.disks) || o.disks[i].readOnly {
			mem.Close()
			return fail("spec: a disk base for disk %d, which is not a writable disk", i)
		}
		if err := disk.CreateChild(o.disks[i].path, base); err != nil {
			mem.Close()
			return fail("%v", err)
		}
	}
	o.ownDisks = map[int]bool{}
	for i, d := range o.disks {
		o.ownDisks[i] = !d.readOnly
	}
	// The machine's shape is the saved state's, whatever the options say.
	o.memMiB, o.cpus = int(st.Machine.MemBytes>>20), st.Machine.CPUs
	o.onFirstRun = func() {
		t := time.Now().UnixNano()
		go func() {
			if ready != nil {
				fmt.Fprintf(ready, "running %d\n", t)
				ready.Close()
				ready = nil
			}
		}()
	}
	b2, err := build(o)
	if err != nil {
		return fail("%v", err)
	}
	defer b2.close()
	stopAPI, err := startAPI(spec.API, b2, o, log, "", "")
	if err != nil {
		return fail("%v", err)
	}
	defer stopAPI()
	if err := enterJail(js, &o, log); err != nil {
		return fail("%v", err)
	}
	if err := runForeground(b2.vm, nil); err != nil {
		fmt.Fprintf(stderr, "warren fork-child: %v\n", err)
		return 1
	}
	return 0
}

// redirectOutput opens the log at path (appending) and makes it this
// process's standard output and error.
func redirectOutput(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, fd := range []int{1, 2} {
		if err := unix.Dup3(int(f.Fd()), fd, 0); err != nil {
			return fmt.Errorf("log %s: %w", path, err)
		}
	}
	return nil
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// randomCID returns a random guest CID, away from the reserved ones and
// the small numbers people pick by hand.
func randomCID() uint64 {
	var b [4]byte
	rand.Read(b[:])
	return 1<<16 + uint64(binary.LittleEndian.Uint32(b[:])&(1<<30-1))
}
