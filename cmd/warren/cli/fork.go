package cli

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
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
	"github.com/warrenvm/warren/ebpf/policy"
	"github.com/warrenvm/warren/hostd/egress"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmm/guestmem"
	"github.com/warrenvm/warren/vmmctl"
)

// Forking (`warren fork API [-n N]`, POST /v1/fork). The parent process
// freezes its VM (cow.Forker: a pause of milliseconds, no memory copied)
// and starts each child as a new process of its own executable,
// `warren fork-child`, detached in its own session so that it outlives the
// parent. The child inherits:
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
}

// forkRestore is what buildVMWithDevices makes a forked child from.
type forkRestore struct {
	state   *vmm.State
	devices []vmsnap.DeviceState
	mem     *guestmem.Memory // owned by the VM once built
}

// forkExecutable is the program started for each child (the running
// executable; tests run their own binary, which dispatches fork-child).
var forkExecutable = os.Executable

// fork serves POST /v1/fork.
func (a *apiServer) fork(w http.ResponseWriter, r *http.Request) {
	var req vmmctl.ForkRequest
	d := json.NewDecoder(io.LimitReader(r.Body, 1<<16))
	d.DisallowUnknownFields()
	if err := d.Decode(&req); err != nil {
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
	if req.Prefix == "" {
		req.Prefix = strings.TrimSuffix(a.apiPath, filepath.Ext(a.apiPath)) + "-fork-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	if !filepath.IsAbs(req.Prefix) {
		replyErr(w, http.StatusBadRequest, fmt.Errorf("fork: prefix %q is not absolute", req.Prefix))
		return
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
	exe, err := forkExecutable()
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
	helper, err := helperConn()
	if err != nil {
		return nil, fmt.Errorf("fork: %w", err)
	}
	// With a helper, a child's namespace is a private network the helper
	// makes (this process may make none): --netns means just that.
	cloneNetNS := req.NetNS && helper == nil
	specs := make([]forkSpec, req.N)
	children := make([]vmmctl.ForkChild, req.N)
	for k := range req.N {
		ch := &children[k]
		p := fmt.Sprintf("%s-%d", req.Prefix, k)
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
			mac, err := parseMAC("")
			if err != nil {
				return nil, err
			}
			o.Tap, o.MAC = fmt.Sprintf("wf%s%d", tag, k), mac.String()
			ch.Tap, ch.MAC = o.Tap, o.MAC
		}
		if o.Egress != nil {
			e := *o.Egress
			e.State, e.Audit, e.Sandbox = egState, p+".audit.jsonl", ch.Hostname
			o.Egress = &e
			ch.Audit = e.Audit
		}
		specs[k] = forkSpec{Options: o, API: ch.API, Console: ch.Console, KVM: a.kvmPath,
			Identity: agentwire.Identity{Hostname: ch.Hostname, MachineID: ch.MachineID, MAC: ch.MAC}, Jail: currentJail()}
		if len(ch.API) > 100 || len(ch.Vsock) > 100 {
			return nil, fmt.Errorf("fork: prefix %q is too long for a unix socket path", req.Prefix)
		}
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
		specs[k].State, specs[k].Devices, specs[k].Memory = state, pt.Devices, desc
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
		cmd   *exec.Cmd
		ready *os.File
	}
	procs := make([]started, len(specs))
	fail := func(err error) (*vmmctl.ForkReply, error) {
		for _, p := range procs {
			if p.cmd != nil && p.cmd.Process != nil {
				p.cmd.Process.Kill()
				p.cmd.Wait()
			}
			if p.ready != nil {
				p.ready.Close()
			}
		}
		return nil, err
	}
	for k := range specs {
		cmd, ready, err := startForkChild(exe, &specs[k], files, children[k].Log, cloneNetNS, helper)
		if err != nil {
			return fail(fmt.Errorf("fork: child %d: %w", k, err))
		}
		procs[k] = started{cmd, ready}
		children[k].PID = cmd.Process.Pid
		if cloneNetNS {
			children[k].NetNS = fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid)
		}
	}
	for k, p := range procs {
		line, err := readReady(p.ready, 2*time.Minute)
		p.ready.Close()
		procs[k].ready = nil
		if err != nil {
			logTail, _ := os.ReadFile(children[k].Log)
			return fail(fmt.Errorf("fork: child %d: %w; its log: %s", k, err, strings.TrimSpace(string(logTail))))
		}
		if ns, err := strconv.ParseInt(line, 10, 64); err == nil {
			children[k].ReadyMS = float64(time.Unix(0, ns).Sub(resumed).Microseconds()) / 1000
		}
	}
	// The children run on in their own sessions; reap them when they end
	// so they do not linger as zombies of this process.
	for _, p := range procs {
		go p.cmd.Wait()
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	a.log.Debug("fork", "children", len(children), "pause_ms", ms(pt.Pause))
	return &vmmctl.ForkReply{PauseMS: ms(pt.Pause), TotalMS: ms(time.Since(start)), Layers: len(desc.Layers), Children: children, Disks: parentDisks}, nil
}

// startForkChild starts one child process with its spec on fd 3, the
// ready pipe on fd 4, the memory files from fd 5 on and the helper
// socket, when set, after them; the returned file is the read end of the
// ready pipe.
func startForkChild(exe string, spec *forkSpec, memFiles []*os.File, logPath string, netns bool, helper *os.File) (*exec.Cmd, *os.File, error) {
	if helper != nil {
		spec.NetHelper = 5 + len(memFiles)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, nil, err
	}
	specR, specW, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	defer specR.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		specW.Close()
		return nil, nil, err
	}
	defer readyW.Close()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		specW.Close()
		readyR.Close()
		return nil, nil, err
	}
	defer logf.Close()
	cmd := exec.Command(exe, "fork-child")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.ExtraFiles = append([]*os.File{specR, readyW}, memFiles...)
	if helper != nil {
		cmd.ExtraFiles = append(cmd.ExtraFiles, helper)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if netns {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWNET
	}
	if err := cmd.Start(); err != nil {
		specW.Close()
		readyR.Close()
		return nil, nil, err
	}
	// The spec is a few kB to tens of kB: more than a pipe buffer holds
	// when the state is large, so write it while the child reads.
	go func() {
		specW.Write(b)
		specW.Close()
	}()
	return cmd, readyR, nil
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

// forkChildCmd is the hidden `warren fork-child`, run by a forking parent
// with the files described above.
func forkChildCmd(args []string, stdout, stderr io.Writer) int {
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
	forkChildProcess = true
	if spec.NetHelper != 0 {
		if spec.NetHelper < 5 || spec.NetHelper > 5+4096 {
			return fail("spec: helper descriptor %d", spec.NetHelper)
		}
		setHelperConn(os.NewFile(uintptr(spec.NetHelper), "helper"))
	}
	js, err := parseJail(spec.Jail)
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
	log := newLogger(stderr, spec.Verbose)
	out, closeOut, err := openConsole(spec.Console, stdout)
	if err != nil {
		mem.Close()
		return fail("%v", err)
	}
	defer closeOut()
	id := spec.Identity
	o := vmOptions{kvmPath: spec.KVM, log: log, console: out, trackDirty: true, identity: &id,
		fork: &forkRestore{state: st, devices: spec.Devices, mem: mem}}
	raw, _ := json.Marshal(spec.Options)
	if err := applyOptions(&o, raw); err != nil {
		mem.Close()
		return fail("%v", err)
	}
	// The parent's fork made the child's disk overlays for it alone.
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
	return runForeground(b2.vm, nil, func(format string, a ...any) int {
		fmt.Fprintf(stderr, "warren fork-child: "+format+"\n", a...)
		return 1
	})
}

// forkCmd is `warren fork [-n N] [--prefix PATH] API`.
func forkCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren fork", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: warren fork [-n N] [--prefix PATH] [--netns] [--json] API\n\n"+
			"makes N running copy-on-write children of the running VM whose control socket\n"+
			"is API. Child K serves its control API on PREFIX-K.api and its agent on\n"+
			"PREFIX-K.vsock (with vsock), and has its own CID, hostname and machine id.\n\n")
		fs.PrintDefaults()
	}
	n := fs.Int("n", 1, "number of children")
	prefix := fs.String("prefix", "", "path prefix of the children's sockets and files (default: beside API)")
	asJSON := fs.Bool("json", false, "print the answer as JSON")
	netns := fs.Bool("netns", false, "start each child in a new network namespace, with its tap there (needs a VM with a tap)")
	egressFile := fs.String("egress", "", "the children's egress policy (JSON), narrowing the parent's (default: the parent's)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var childPolicy *policy.Policy
	if *egressFile != "" {
		// (The parent VM checks it with its operator's allowances.)
		p, err := policy.LoadWith(*egressFile, policy.Options{WildcardCredentials: true})
		if err != nil {
			fmt.Fprintf(stderr, "warren fork: %v\n", err)
			return 2
		}
		childPolicy = &p
	}
	if fs.NArg() != 1 || *n < 1 || *n > vmmctl.MaxForkChildren {
		fs.Usage()
		return 2
	}
	if *prefix != "" {
		p, err := filepath.Abs(*prefix)
		if err != nil {
			fmt.Fprintf(stderr, "warren fork: %v\n", err)
			return 2
		}
		*prefix = p
	}
	ctx, stop := interruptContext()
	defer stop()
	var r vmmctl.ForkReply
	if err := apiCall(ctx, fs.Arg(0), "fork", vmmctl.ForkRequest{N: *n, Prefix: *prefix, NetNS: *netns, Egress: childPolicy}, &r); err != nil {
		fmt.Fprintf(stderr, "warren fork: %v\n", err)
		return 1
	}
	if *asJSON {
		json.NewEncoder(stdout).Encode(r)
		return 0
	}
	fmt.Fprintf(stdout, "forked %d children: parent paused %.1f ms, total %.1f ms, memory in %d layers\n", len(r.Children), r.PauseMS, r.TotalMS, r.Layers)
	for _, c := range r.Children {
		fmt.Fprintf(stdout, "child %d: pid %d api %s vsock %s cid %d hostname %s running after %.1f ms\n",
			c.Index, c.PID, c.API, c.Vsock, c.CID, c.Hostname, c.ReadyMS)
	}
	return 0
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
