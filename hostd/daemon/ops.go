package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/hostd/cgroup"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/image"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmmctl"
	"github.com/warrenvm/warren/vmmproc/jail"
)

// apiError is an error with its HTTP status.
type apiError struct {
	status int
	msg    string
	// code, when set, is the guest agent's error code the error carries
	// (agentwire.Code*: a program not found, not startable, ...).
	code string
}

func (e *apiError) Error() string { return e.msg }

func errf(status int, format string, a ...any) error {
	return &apiError{status: status, msg: fmt.Sprintf(format, a...)}
}

// errStatus returns err's status (500 when it has none) and message.
func errStatus(err error) (int, string) {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.status, err.Error()
	}
	return http.StatusInternalServerError, err.Error()
}

// buildTemplate boots the template's guest, waits for its agent,
// snapshots it and stops it.
func (d *Daemon) buildTemplate(o *op, tenant string, req wire.TemplateRequest) (int, any, error) {
	start := time.Now()
	if err := d.checkImageRequest(&req); err != nil {
		return 0, nil, err
	}
	// The kernel, initramfs and disks are files of the operator's guest
	// directory, by name (guestfiles.go): every name is checked before
	// anything is opened, and a host path is refused. An image template
	// that names none boots the operator's defaults.
	boot := []bootFile{{what: "kernel", v: req.Kernel}, {what: "initramfs", v: req.Initramfs}}
	for i := range boot {
		if boot[i].v != "" {
			if err := checkGuestName(boot[i].what, boot[i].v); err != nil {
				return 0, nil, err
			}
		}
	}
	if req.Image != "" {
		if req.Kernel == "" {
			boot[0] = bootFile{what: "kernel", v: d.cfg.GuestKernel, operator: true}
			req.Kernel = d.cfg.GuestKernel
		}
		if req.Initramfs == "" {
			boot[1] = bootFile{what: "initramfs", v: d.cfg.GuestInitramfs, operator: true}
			req.Initramfs = d.cfg.GuestInitramfs
		}
	}
	if req.Kernel == "" {
		if req.Image != "" {
			return 0, nil, errf(400, "kernel is required (this daemon has no --guest-kernel for image templates)")
		}
		return 0, nil, errf(400, "kernel is required")
	}
	var disks []templateDisk
	for _, v := range req.Disks {
		td, err := parseTemplateDisk(v)
		if err != nil {
			return 0, nil, err
		}
		disks = append(disks, td)
	}
	if err := d.keyUsable(tenant); err != nil {
		return 0, nil, err
	}
	if req.MemMiB == 0 {
		req.MemMiB = 256
	}
	if req.CPUs == 0 {
		req.CPUs = 1
	}
	if req.MemMiB < 64 || req.CPUs < 1 || req.CPUs > 64 {
		return 0, nil, errf(400, "mem_mib must be at least 64 and cpus 1 to 64")
	}
	// Opened by the daemon (read-only, regular files only); the VMM gets
	// the kernel's and initramfs's descriptors, and the disks are copied
	// from theirs into the template's directory.
	run := &vmmctl.Run{MemMiB: req.MemMiB, CPUs: req.CPUs, Balloon: req.Balloon}
	bootFiles, err := d.openBootFiles(boot, run)
	if err != nil {
		return 0, nil, err
	}
	defer func() {
		for _, f := range bootFiles {
			f.Close()
		}
	}()
	if err := openTemplateDisks(d.cfg.GuestDir, disks); err != nil {
		return 0, nil, err
	}
	defer closeTemplateDisks(disks)
	t := &store.Template{ID: newID("tp"), Tenant: tenant, Status: store.TemplateBuilding, Kernel: req.Kernel,
		Initramfs: req.Initramfs, Disks: req.Disks, MemMiB: req.MemMiB, CPUs: req.CPUs, Cmdline: req.Cmdline,
		Network: req.Network, Balloon: req.Balloon, Created: time.Now().UTC()}
	if req.Image != "" {
		t.Image = &store.TemplateImage{Ref: req.Image, StartCmd: req.StartCmd, ReadyCmd: req.ReadyCmd}
	}
	ts := &tplState{rec: t}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if err := d.saveTemplate(ts); err != nil {
		return 0, nil, err
	}
	d.mu.Lock()
	d.templates[t.ID] = ts
	d.mu.Unlock()
	dir := d.store.TemplateDir(tenant, t.ID)
	api, vs := d.sockets(t.ID)
	os.Remove(api)
	os.Remove(vs)
	fail := func(err error) (int, any, error) {
		stopProc(t.PID, t.StartTime, StopGrace)
		os.Remove(api)
		os.Remove(vs)
		t.Status, t.Error, t.PID, t.StartTime = store.TemplateFailed, err.Error(), 0, 0
		d.saveTemplate(ts)
		d.events.publish(tenant, wire.Event{Type: "template_failed", Template: t.ID, Detail: err.Error()})
		d.obs.ObserveOp("template_build", time.Since(start), err)
		d.log.Error("template build failed", "tenant", tenant, "template", t.ID, "err", err)
		return 0, nil, err
	}
	var imgBase *image.Base
	if req.Image != "" {
		// The image's root file system is disk 0: an overlay of the
		// template's own over the image's shared base.
		ov := filepath.Join(dir, baseName(0))
		var err error
		if imgBase, err = d.buildImageBase(o, t, req, ov, 2, 40); err != nil {
			return fail(err)
		}
		disks = append([]templateDisk{{path: ov, own: true}}, disks...)
		d.saveTemplate(ts)
		o.from = 40 // the boot's steps report from there on
	}
	paths, bases, err := cloneTemplateDisks(dir, disks)
	closeTemplateDisks(disks)
	if err != nil {
		return fail(fmt.Errorf("copy the template's disks: %w", err))
	}
	t.DiskBases = bases
	o.progress("template "+t.ID+": starting the VMM", 5)
	run.Vsock, run.API, run.Console = vs, api, filepath.Join(dir, "console.log")
	for i, td := range disks {
		// A read-only disk is its copy in the template's directory:
		// every sandbox of the template shares it, read-only. A writable
		// one is the template's own clone, which the guest may write to
		// while it boots; frozen once snapshotted (see disks.go).
		run.Disks = append(run.Disks, vmmctl.Disk{Path: paths[i], ReadOnly: td.readOnly})
	}
	run.Cmdline = req.Cmdline
	if imgBase != nil {
		// PID 1 moves into the image's root file system (guestinit).
		run.Cmdline = strings.TrimSpace(imageRootCmdline + " " + run.Cmdline)
	}
	if req.Network {
		if err := d.templateNetwork(dir, run); err != nil {
			return fail(fmt.Errorf("network: %w", err))
		}
	}
	confine, releaseDir, err := d.templateConfinement(t, dir)
	defer releaseDir()
	if err != nil {
		return fail(fmt.Errorf("confine the VMM: %w", err))
	}
	var cgDirs []string
	if d.cg != nil {
		// The build VMM is born in a group of its own with the
		// template's limits, removed once it is gone (fail and the
		// end of the build stop it).
		cg, err := d.cg.Create(t.ID, cgroup.Limits{MemoryBytes: int64(t.MemMiB+d.cfg.MemOverheadMiB) << 20, CPUs: float64(t.CPUs)})
		if err != nil {
			d.log.Warn("cgroup: template build runs without limits", "template", t.ID, "err", err)
		} else {
			cgDirs = cg.Dirs
			defer func() {
				if err := cg.Remove(); err != nil {
					d.log.Warn("cgroup remove", "template", t.ID, "err", err)
				}
			}()
		}
	}
	p, err := d.launcher.Start(LaunchSpec{Tenant: tenant, ID: t.ID, Kind: "template", Launch: vmmctl.Launch{Run: run}, Log: filepath.Join(dir, "vmm.log"), Network: req.Network,
		ExtraFiles: bootFiles, Confine: confine, Cgroup: cgDirs})
	for _, f := range bootFiles {
		f.Close() // the VMM has its own
	}
	bootFiles = nil
	if err != nil {
		return fail(fmt.Errorf("start VMM: %w", err))
	}
	t.PID, t.StartTime = p.PID, p.StartTime
	d.saveTemplate(ts)
	o.progress("booting the guest; waiting for its agent", 10)
	if err := d.waitAgent(o, vs, p, d.cfg.BootTimeout, filepath.Join(dir, "vmm.log"), run.Console, 10, 75); err != nil {
		return fail(err)
	}
	if imgBase != nil {
		if err := d.startTemplateCmd(o, t, req, imgBase, vs); err != nil {
			return fail(err)
		}
	}
	o.progress("snapshotting", 80)
	snap := filepath.Join(dir, "snap", "base")
	os.MkdirAll(filepath.Dir(snap), 0o700)
	ctx, cancel := context.WithTimeout(d.ctx, 5*time.Minute)
	defer cancel()
	if t.DiskBases != nil {
		// The guest must not write to its disks between the snapshot
		// and the VMM's end: the disks would no longer match its memory.
		// A paused VM stays paused through the snapshot.
		if err := vmmCall(ctx, api, http.MethodPost, "pause", struct{}{}, nil); err != nil {
			return fail(fmt.Errorf("pause before the snapshot: %w", err))
		}
	}
	var srep vmmctl.SnapshotReply
	if err := vmmCall(ctx, api, http.MethodPost, "snapshot", vmmctl.SnapshotRequest{Path: snap, Kind: vmsnap.Full}, &srep); err != nil {
		return fail(fmt.Errorf("snapshot: %w", err))
	}
	// Into the page store before the at-rest hook seals it
	// (templatepages.go).
	if err := d.templateIntoStore(tenant, snap); err != nil {
		d.log.Warn("page store: template layer not ingested", "template", t.ID, "err", err)
	}
	if h := d.cfg.Hooks.SnapshotWritten; h != nil {
		if err := h(tenant, snap); err != nil {
			return fail(cryptStatus(fmt.Errorf("snapshot hook: %w", err)))
		}
	}
	o.progress("stopping the build VMM", 95)
	stopProc(t.PID, t.StartTime, StopGrace)
	os.Remove(api)
	os.Remove(vs)
	if err := settleTemplateDisks(t, srep.Disks); err != nil {
		return fail(err)
	}
	if err := checkRawBases(t.DiskBases, disks); err != nil {
		return fail(err)
	}
	if err := freezeBases(t.DiskBases); err != nil {
		return fail(err)
	}
	t.Status, t.Snapshot, t.PID, t.StartTime = store.TemplateReady, snap, 0, 0
	t.BuildMS = float64(time.Since(start).Milliseconds())
	ts.lastUsed.Store(time.Now().UnixNano())
	record := d.recordsAtBuild(t)
	if record {
		// In uffd mode the build ends by recording the working set
		// (workingset_build.go): ready from here on, but creates wait
		// for warm until the recording ended, and then prefetch.
		ts.warm.Lock()
		defer ts.warm.Unlock()
	}
	if err := d.saveTemplate(ts); err != nil {
		return fail(err)
	}
	if record {
		d.recordAtBuild(o, ts)
	}
	d.sealIdleDisks(tenant) // its frozen disk bases
	d.obs.ObserveOp("template_build", time.Since(start), nil)
	d.events.publish(tenant, wire.Event{Type: "template_ready", Template: t.ID})
	d.log.Info("template ready", "tenant", tenant, "template", t.ID, "ms", t.BuildMS)
	c := *t
	return http.StatusCreated, c, nil
}

// bootFile is a template's kernel or initramfs (what): v names a file of
// the guest directory, or, for an operator's default (operator), is a
// name there or a path of the operator's.
type bootFile struct {
	what, v  string
	operator bool
}

// openBootFiles opens the template's kernel and initramfs (those given),
// sets their descriptors in run (KernelFD, InitramfsFD:
// LaunchSpec.ExtraFiles in that order) and returns the files, which the
// caller closes. On an error none is left open.
func (d *Daemon) openBootFiles(boot []bootFile, run *vmmctl.Run) (files []*os.File, err error) {
	defer func() {
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			files = nil
		}
	}()
	for _, b := range boot {
		if b.v == "" {
			continue
		}
		var f *os.File
		if b.operator {
			f, err = openOperatorFile(d.cfg.GuestDir, b.what, b.v)
		} else {
			f, err = openGuestFile(d.cfg.GuestDir, b.what, b.v)
		}
		if err != nil {
			return files, err
		}
		files = append(files, f)
		if err = checkBootFile(f, b.what, b.v); err != nil {
			return files, err
		}
		fd := FirstExtraFD + len(files) - 1
		switch b.what {
		case "kernel":
			run.KernelFD = fd
		case "initramfs":
			run.InitramfsFD = fd
		default:
			return files, fmt.Errorf("boot file %q: not the kernel or the initramfs", b.what)
		}
	}
	return files, nil
}

// waitAgent waits until the agent behind vsock answers, the VMM p ends,
// or timeout; it reports progress from pct0 towards pct1.
func (d *Daemon) waitAgent(o *op, vsock string, p Proc, timeout time.Duration, log, console string, pct0, pct1 int) error {
	c := agentclient.New(vsock)
	defer c.Close()
	start := time.Now()
	lastReport := start
	for {
		ctx, cancel := context.WithTimeout(d.ctx, 3*time.Second)
		_, err := c.Health(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if !alive(p.PID, p.StartTime) {
			return fmt.Errorf("the VMM (pid %d) exited: %s", p.PID, tail(log, 600))
		}
		el := time.Since(start)
		if el > timeout {
			// What the guest printed last says where it stopped (the
			// tenant's own guest's console, and the VMM's log).
			return fmt.Errorf("the guest agent did not answer within %s: %v; the guest's console ends: %q; the VMM's log ends: %q",
				timeout, err, tail(console, 600), tail(log, 400))
		}
		if d.ctx.Err() != nil {
			return d.ctx.Err()
		}
		if time.Since(lastReport) > 5*time.Second {
			lastReport = time.Now()
			pct := pct0 + int(float64(pct1-pct0)*min(1, el.Seconds()/timeout.Seconds()))
			o.progress(fmt.Sprintf("waiting for the guest agent (%ds)", int(el.Seconds())), pct)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// createSandbox restores the template's snapshot in a new VMM.
func (d *Daemon) createSandbox(o *op, tenant string, req wire.SandboxRequest) (int, any, error) {
	start := time.Now()
	ts := d.template(tenant, req.Template)
	if ts == nil {
		return 0, nil, errf(404, "template %q not found", req.Template)
	}
	tp := *ts.view.Load()
	if tp.Status != store.TemplateReady {
		return 0, nil, errf(409, "template %s is %s", tp.ID, tp.Status)
	}
	if err := d.keyUsable(tenant); err != nil {
		return 0, nil, err
	}
	if req.MemMiB == 0 {
		req.MemMiB = tp.MemMiB
	}
	if req.CPUs == 0 {
		req.CPUs = tp.CPUs
	}
	if req.MemMiB < tp.MemMiB {
		return 0, nil, errf(400, "mem_mib %d is less than the template's guest memory (%d MiB)", req.MemMiB, tp.MemMiB)
	}
	if req.CPUs < 1 || req.CPUs > 64 {
		return 0, nil, errf(400, "cpus must be 1 to 64")
	}
	for _, e := range req.Env {
		if !strings.Contains(e, "=") {
			return 0, nil, errf(400, "env entry %q is not KEY=VALUE", e)
		}
	}
	if isNull(req.Egress) {
		req.Egress = nil
	}
	if req.Egress != nil && !tp.Network {
		return 0, nil, errf(400, "egress needs a template built with \"network\": true (template %s has no network)", tp.ID)
	}
	egress, err := d.checkEgress(tenant, req.Egress, req.Secrets)
	if err != nil {
		return 0, nil, err
	}
	id := newID("sb")
	api, vs := d.sockets(id)
	dir := d.store.SandboxDir(tenant, id)
	now := time.Now().UTC()
	sb := &store.Sandbox{ID: id, Tenant: tenant, Template: tp.ID, Status: store.Creating, API: api, Vsock: vs,
		Console: filepath.Join(dir, "console.log"), Log: filepath.Join(dir, "vmm.log"), MemMiB: req.MemMiB, CPUs: req.CPUs,
		Network: tp.Network, Egress: egress, Env: req.Env, Secrets: req.Secrets, Labels: req.Labels, Created: now}
	s := &sbState{rec: sb, agent: agentclient.New(vs)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := d.save(s); err != nil {
		return 0, nil, err
	}
	d.mu.Lock()
	d.sandboxes[id] = s
	d.mu.Unlock()
	// The first restore of a template flattens its snapshot (mmap) or
	// records its working set (uffd: workingset.go): the others wait for
	// it. It rebuilds the template's layer first when its cache was
	// dropped (templatepages.go).
	ts.creating.Add(1)
	ts.lastUsed.Store(time.Now().UnixNano())
	defer func() {
		ts.lastUsed.Store(time.Now().UnixNano())
		ts.creating.Add(-1)
	}()
	ts.warm.Lock()
	first := !ts.warmed
	if !first {
		ts.warm.Unlock()
	} else {
		defer func() {
			ts.warmed = sb.Status == store.Running
			ts.warm.Unlock()
		}()
		err = d.ensureTemplateLayer(&tp)
	}
	// Its own copy-on-write view of each of the template's writable disks
	// (over bases that are plaintext while it starts: diskseal.go).
	var diskPaths map[int]string
	if err == nil {
		var release func()
		if release, err = d.acquireDisks(*sb); err == nil {
			defer release()
			diskPaths, err = createOverlays(dir, tp.DiskBases)
		} else {
			err = cryptStatus(fmt.Errorf("disks: %w", err))
		}
	}
	if err == nil {
		err = d.startVMM(o, s, tp.Snapshot, diskPaths, &templateCreate{ts: ts, first: first})
	}
	if err != nil {
		sb.Status, sb.Reason = store.Failed, err.Error()
		d.save(s)
		d.obs.ObserveOp("create", time.Since(start), err)
		return 0, nil, err
	}
	d.obs.ObserveOp("create", time.Since(start), nil)
	d.events.publish(tenant, wire.Event{Type: "created", Sandbox: id, Template: tp.ID})
	d.log.Info("sandbox created", "tenant", tenant, "sandbox", id, "template", tp.ID, "pid", sb.PID, "ms", time.Since(start).Milliseconds())
	return http.StatusCreated, copyRec(sb), nil
}

// startVMM restores snap in a new VMM for s, puts it in s's cgroup and
// waits for its agent, holding a restore slot throughout (admission.go);
// on success s is running (caller holds s.mu).
// diskPaths are the restore's disk paths (vmmctl.Restore.DiskPaths): the
// sandbox's own overlays over the template's bases (a create) or over its
// snapshot's disk layers (a resume). Once the agent answers, the record
// gets the VMM's live disks (GET /v1/disks). tc is the template of a
// create or of a build's recorder (nil for a resume): its memory is
// restored in Config.RestoreMemory's mode, and the template's first
// restore in uffd mode records its working set (workingset.go).
func (d *Daemon) startVMM(o *op, s *sbState, snap string, diskPaths map[int]string, tc *templateCreate) error {
	sb := s.rec
	if err := d.admitRestore(o); err != nil {
		return err
	}
	defer d.restores.release()
	use, lasting := snap, false
	if h := d.cfg.Hooks.BeforeRestore; h != nil {
		p, done, err := h(sb.Tenant, snap)
		if err != nil {
			return cryptStatus(fmt.Errorf("restore hook: %w", err))
		}
		use, lasting = p, done == nil
		if done != nil {
			defer done()
		}
	}
	release, err := d.acquireDisks(*sb)
	if err != nil {
		return cryptStatus(fmt.Errorf("disks: %w", err))
	}
	defer release()
	os.Remove(sb.API)
	os.Remove(sb.Vsock)
	s.agent.Close() // connections to a previous VMM
	o.progress("starting the VMM", 10)
	// Confinement first: it gives the sandbox's directory its uid, which
	// the secrets file restoreNetwork writes is then given too. The VMM
	// starts a family of its own (a fork child restored leaves its
	// parent's): its run directory and grant key are its own.
	if d.grantSecret != nil {
		sb.Family = sb.ID
	}
	confine, err := d.confinement(sb)
	if err != nil {
		d.dropSecrets(sb, false)
		return fmt.Errorf("confine the VMM: %w", err)
	}
	rs := &vmmctl.Restore{Snapshot: use, Lazy: true, API: sb.API, Vsock: sb.Vsock, Console: sb.Console, DiskPaths: diskPaths}
	if err := d.restoreNetwork(sb, rs); err != nil {
		d.dropSecrets(sb, false)
		return fmt.Errorf("network: %w", err)
	}
	if use != snap && !lasting {
		// A decrypted working copy is restored eagerly (into the VMM's
		// memfd) and removed as soon as the VMM has loaded it: a lazy
		// restore would flatten it into a .wraw on the working copy's
		// tmpfs and keep that mapped, plaintext and unreclaimable, for
		// the VMM's life. A template's lasting copy is restored lazily:
		// its .wraw is shared by all the template's sandboxes (see
		// atrest.go).
		rs.Lazy = false
	}
	var recording string
	if tc != nil && rs.Lazy && d.cfg.RestoreMemory == RestoreUffd {
		// A create from the template's snapshot or its lasting copy.
		recording = uffdCreate(rs, d.store.SandboxDir(sb.Tenant, sb.ID), use, tc)
	}
	p, err := d.launcher.Start(LaunchSpec{Tenant: sb.Tenant, ID: sb.ID, Kind: "sandbox", Launch: vmmctl.Launch{Restore: rs}, Log: sb.Log, Network: sb.Network, Confine: confine,
		Cgroup: d.sandboxCgroup(s)})
	if err != nil {
		d.dropSecrets(sb, false)
		return fmt.Errorf("start VMM: %w", err)
	}
	sb.PID, sb.StartTime, sb.RestoredFrom, sb.Spawner = p.PID, p.StartTime, snap, p.Spawner
	if !p.Spawner {
		sb.Family = ""
	}
	s.chainOK, s.chain = false, 0
	d.placeInCgroup(s, p.PID)
	d.save(s)
	o.progress("restoring; waiting for the guest agent", 30)
	if err := d.waitAgent(o, sb.Vsock, p, d.cfg.RestoreTimeout, sb.Log, sb.Console, 30, 95); err != nil {
		stopProc(p.PID, p.StartTime, StopGrace)
		sb.PID, sb.StartTime = 0, 0
		d.dropSecrets(sb, false)
		return err
	}
	sb.Status, sb.Reason = store.Running, ""
	d.refreshDisks(s)
	d.save(s)
	if recording != "" {
		d.recordWorkingSet(o, s, tc.ts, recording, use)
	}
	o.progress("running", 100)
	return nil
}

// sandboxCgroup returns the directories of s's cgroup, made on first use
// with its limits, for its next VMM to be born in (LaunchSpec.Cgroup);
// nil without cgroups, or when making it fails (logged).
func (d *Daemon) sandboxCgroup(s *sbState) []string {
	sb := s.rec
	if d.cg == nil {
		return nil
	}
	if s.cgroup == nil {
		g, err := d.cg.Create(sb.ID, cgroup.Limits{MemoryBytes: int64(sb.MemMiB+d.cfg.MemOverheadMiB) << 20, CPUs: float64(sb.CPUs)})
		if err != nil {
			d.log.Warn("cgroup: sandbox runs without limits", "sandbox", sb.ID, "err", err)
			return nil
		}
		s.cgroup = g
	}
	return s.cgroup.Dirs
}

// placeInCgroup makes sure pid is in s's cgroup (sandboxCgroup) and
// records it; without cgroups, or when that fails, it records "none" and
// goes on. A VMM the launcher started in the group is there already (the
// move is then a no-op), and so is a fork child its family's jail-init
// started under a grant (forkGrants); the child of a VMM that starts its
// own (no --vmm-uid-range) is born in its parent's group and moved here.
func (d *Daemon) placeInCgroup(s *sbState, pid int) {
	sb := s.rec
	if d.sandboxCgroup(s) == nil {
		sb.Cgroup = []string{"none"}
		return
	}
	if err := s.cgroup.Add(pid); err != nil {
		d.log.Warn("cgroup: sandbox runs without limits", "sandbox", sb.ID, "err", err)
		sb.Cgroup = []string{"none"}
		return
	}
	sb.Cgroup = s.cgroup.Dirs
}

// running checks that s can take a VMM call (caller holds s.mu).
func running(s *sbState, allowPaused bool) error {
	st := s.rec.Status
	if st == store.Running || (allowPaused && st == store.Paused) {
		return nil
	}
	return errf(409, "sandbox %s is %s", s.rec.ID, st)
}

// pause pauses s's VMM in memory.
func (d *Daemon) pause(ctx context.Context, s *sbState) error {
	if err := running(s, false); err != nil {
		return err
	}
	if err := vmmCall(ctx, s.rec.API, http.MethodPost, "pause", struct{}{}, nil); err != nil {
		return err
	}
	s.rec.Status = store.Paused
	d.save(s)
	d.events.publish(s.rec.Tenant, wire.Event{Type: "paused", Sandbox: s.rec.ID})
	return nil
}

// suspendLocked snapshots s and stops its VMM (pause to disk).
func (d *Daemon) suspendLocked(ctx context.Context, s *sbState, o *op) (any, error) {
	start := time.Now()
	if err := running(s, true); err != nil {
		return nil, err
	}
	sb := s.rec
	if sb.Status == store.Paused {
		if err := vmmCall(ctx, sb.API, http.MethodPost, "resume", struct{}{}, nil); err != nil {
			return nil, err
		}
		sb.Status = store.Running
	}
	o.progress("snapshotting", 20)
	snap, err := d.takeSnapshot(ctx, s, freeName(sb, "suspend"), "full", false)
	if err != nil {
		return nil, err
	}
	o.progress("stopping the VMM", 80)
	if s.stopRolling != nil {
		s.stopRolling()
		s.stopRolling = nil
	}
	stopProc(sb.PID, sb.StartTime, StopGrace)
	d.ingestSnapshots(sb.Tenant, filepath.Dir(snap.Path), "") // no VMM chains on it now
	sb.Status, sb.Reason, sb.PID, sb.StartTime = store.Suspended, "paused to disk at "+snap.Name, 0, 0
	d.dropSecrets(sb, false)
	d.save(s)
	d.sealIdleDisks(sb.Tenant)
	d.obs.ObserveOp("pause_to_disk", time.Since(start), nil)
	d.events.publish(sb.Tenant, wire.Event{Type: "paused", Sandbox: sb.ID, Detail: "to disk: " + snap.Name})
	return copyRec(sb), nil
}

// resume resumes a paused VMM, or restores a suspended or stopped
// sandbox from its latest snapshot.
func (d *Daemon) resume(ctx context.Context, s *sbState, o *op) (any, error) {
	sb := s.rec
	switch sb.Status {
	case store.Paused:
		if err := vmmCall(ctx, sb.API, http.MethodPost, "resume", struct{}{}, nil); err != nil {
			return nil, err
		}
		sb.Status = store.Running
		d.save(s)
		d.events.publish(sb.Tenant, wire.Event{Type: "resumed", Sandbox: sb.ID})
		return copyRec(sb), nil
	case store.Suspended, store.Stopped:
		latest := sb.Latest()
		if latest == nil {
			return nil, errf(409, "sandbox %s is %s and has no snapshot to resume from", sb.ID, sb.Status)
		}
		start := time.Now()
		if err := d.keyUsable(sb.Tenant); err != nil {
			return nil, err
		}
		if err := d.resumeFrom(o, s, *latest); err != nil {
			sb.Reason = "resume failed: " + err.Error()
			d.save(s)
			d.obs.ObserveOp("resume_from_disk", time.Since(start), err)
			return nil, err
		}
		if sb.Rolling != nil {
			d.startRolling(s)
		}
		d.collectDisksLater(sb.Tenant) // the previous VMM's tops
		d.obs.ObserveOp("resume_from_disk", time.Since(start), nil)
		d.events.publish(sb.Tenant, wire.Event{Type: "resumed", Sandbox: sb.ID, Detail: "from " + latest.Name})
		return copyRec(sb), nil
	case store.Running:
		return copyRec(sb), nil
	}
	return nil, errf(409, "sandbox %s is %s", sb.ID, sb.Status)
}

// freeName returns prefix-<UTC time>, with -N added if a snapshot has that name.
func freeName(sb *store.Sandbox, prefix string) string {
	base := prefix + "-" + time.Now().UTC().Format("20060102T150405Z")
	name := base
	for n := 2; ; n++ {
		taken := false
		for _, x := range sb.Snapshots {
			taken = taken || x.Name == name
		}
		if !taken {
			return name
		}
		name = fmt.Sprintf("%s-%d", base, n)
	}
}

var snapNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)

// takeSnapshot snapshots s's VMM into its snapshots directory (caller
// holds s.mu). An incremental snapshot is taken full when the VMM has no
// earlier snapshot there (its parent must be in the same directory).
func (d *Daemon) takeSnapshot(ctx context.Context, s *sbState, name, kind string, rolling bool) (store.Snapshot, error) {
	sb := s.rec
	if !snapNameRE.MatchString(name) || strings.HasSuffix(name, ".wstate") {
		return store.Snapshot{}, errf(400, "bad snapshot name %q", name)
	}
	for _, x := range sb.Snapshots {
		if x.Name == name {
			return store.Snapshot{}, errf(409, "snapshot %q exists", name)
		}
	}
	if kind == "incremental" && !s.chainOK {
		kind = "full"
	}
	path := filepath.Join(d.store.SandboxDir(sb.Tenant, sb.ID), "snapshots", name)
	if err := d.snapshotsDir(sb); err != nil {
		return store.Snapshot{}, err
	}
	start := time.Now()
	var rep vmmctl.SnapshotReply
	err := vmmCall(ctx, sb.API, http.MethodPost, "snapshot", vmmctl.SnapshotRequest{Path: path, Kind: vmsnap.Kind(kind)}, &rep)
	d.obs.ObserveOp("snapshot", time.Since(start), err)
	if err != nil {
		return store.Snapshot{}, err
	}
	// Into the page store, before sealing: every layer but the one the
	// VMM chains its next incremental snapshot on (pagestore.go).
	keep := ""
	if !d.encrypts(sb.Tenant) {
		keep = name
	}
	d.ingestSnapshots(sb.Tenant, filepath.Dir(path), keep)
	if h := d.cfg.Hooks.SnapshotWritten; h != nil {
		if err := h(sb.Tenant, path); err != nil {
			return store.Snapshot{}, cryptStatus(fmt.Errorf("snapshot hook: %w", err))
		}
	}
	// A sealed layer cannot be the parent of the VMM's next incremental
	// one (it opens it by path): a tenant with a key gets full ones.
	s.chainOK = !d.encrypts(sb.Tenant)
	snap := store.Snapshot{Name: name, Path: path, Kind: kind, Time: time.Now().UTC(), Bytes: rep.LayerBytes, PauseMS: rep.PauseMS, Rolling: rolling,
		Disks: snapshotDisks(rep.Disks)}
	if rep.Disks != nil {
		// The snapshot froze the disks: the VMM writes to new tops.
		sb.Disks = liveDisks(rep.Disks)
	}
	sb.Snapshots = append(sb.Snapshots, snap)
	d.save(s)
	d.events.publish(sb.Tenant, wire.Event{Type: "snapshotted", Sandbox: sb.ID, Detail: name + " (" + kind + ")"})
	return snap, nil
}

// rollback rolls s's VMM back to its snapshot name, in place.
func (d *Daemon) rollback(ctx context.Context, s *sbState, name string) (*wire.RollbackReply, error) {
	if err := running(s, true); err != nil {
		return nil, err
	}
	sb := s.rec
	var snap *store.Snapshot
	for i := range sb.Snapshots {
		if sb.Snapshots[i].Name == name {
			snap = &sb.Snapshots[i]
		}
	}
	if snap == nil {
		return nil, errf(404, "snapshot %q not found", name)
	}
	use := snap.Path
	if h := d.cfg.Hooks.BeforeRestore; h != nil {
		p, done, err := h(sb.Tenant, snap.Path)
		if err != nil {
			return nil, cryptStatus(fmt.Errorf("restore hook: %w", err))
		}
		use = p
		d.grantVMM(sb, use) // a confined VMM reads it as its own uid
		if done != nil {
			defer done()
		}
	}
	// The VMM puts the writable disks back too, on new overlays over the
	// snapshot's layers (it refuses, 409, a snapshot without disk state
	// for a VMM with writable disks), and removes the replaced tops.
	var vrep vmmctl.RollbackReply
	if err := vmmCall(ctx, sb.API, http.MethodPost, "rollback", vmmctl.RollbackRequest{Path: use}, &vrep); err != nil {
		return nil, err
	}
	if vrep.Disks != nil {
		sb.Disks = liveDisks(vrep.Disks)
		d.save(s)
	}
	// The tenant gets the figures, not the host's paths.
	rep := &wire.RollbackReply{Snapshot: name, PauseMS: vrep.PauseMS, TotalMS: vrep.TotalMS, LoadMS: vrep.LoadMS,
		PagesWritten: vrep.Written, PagesCleared: vrep.Cleared,
		Line: fmt.Sprintf("%s rolled back to %s: pause %.1f ms, %d pages rewritten, %d cleared (load %.1f ms)",
			sb.ID, name, vrep.PauseMS, vrep.Written, vrep.Cleared, vrep.LoadMS)}
	d.collectDisksLater(sb.Tenant) // layers only the replaced tops stood on
	s.chainOK, s.chain = false, 0
	// The rollback reset the vsock transport: connections to the agent
	// are gone, and it answers again once it has reconnected.
	s.agent.Close()
	if err := d.waitAgent(newOp(), sb.Vsock, Proc{PID: sb.PID, StartTime: sb.StartTime}, 30*time.Second, sb.Log, sb.Console, 0, 0); err != nil {
		return nil, fmt.Errorf("after the rollback: %w", err)
	}
	d.events.publish(sb.Tenant, wire.Event{Type: "rolled_back", Sandbox: sb.ID, Detail: name})
	return rep, nil
}

// fork forks s's VMM into n children, each a new sandbox of the tenant.
func (d *Daemon) fork(o *op, s *sbState, n int) (int, any, error) {
	start := time.Now()
	s.mu.Lock()
	if err := running(s, false); err != nil {
		s.mu.Unlock()
		return 0, nil, err
	}
	if n < 1 || n > 64 {
		s.mu.Unlock()
		return 0, nil, errf(400, "n must be 1 to 64")
	}
	parent := copyRec(s.rec)
	prefix := filepath.Join(d.store.RunDir(), newID("fk"))
	if fam := d.famRunDir(&parent); dirOwner(fam) >= 0 {
		prefix = filepath.Join(fam, newID("fk")) // in a confined parent's jail
	}
	o.progress(fmt.Sprintf("forking into %d", n), 10)
	ctx, cancel := context.WithTimeout(d.ctx, 5*time.Minute)
	defer cancel()
	// The children's ids and directories come first: a parent with
	// writable disks makes each child's disk overlays in the child's own
	// directory, so that the layers the child's snapshots make are its own
	// and the parent's stay foreign to it (never merged by it).
	ids, dirs := make([]string, n), make([]string, n)
	for k := range ids {
		ids[k] = newID("sb")
		dirs[k] = d.store.SandboxDir(parent.Tenant, ids[k])
		os.MkdirAll(dirs[k], 0o700)
		if !parent.Spawner {
			d.shareDir(&parent, dirs[k])
		}
	}
	freq := vmmctl.ForkRequest{N: n, Prefix: prefix}
	if len(parent.Disks) > 0 {
		freq.DiskDirs = dirs
	}
	// Where the parent's jail-init starts the children, each is its own
	// uid, born in its own cgroup, under a grant saying so.
	plan, err := d.forkGrants(&parent, ids, dirs)
	var rep vmmctl.ForkReply
	if err == nil {
		if plan != nil {
			freq.Prefix, freq.Prefixes, freq.Grants = "", plan.prefixes, plan.grants
			if parent.Network {
				// Each child's proxy reads its own, as its own uid.
				freq.Secrets, err = d.forkSecrets(&parent, ids, plan)
			}
		}
	}
	if err == nil {
		err = vmmCall(ctx, parent.API, http.MethodPost, "fork", freq, &rep)
	}
	if err == nil && rep.Disks != nil {
		s.rec.Disks = liveDisks(rep.Disks) // the parent's new tops
		d.save(s)
	}
	s.mu.Unlock()
	used := map[int]bool{}
	defer func() {
		for k, dir := range dirs { // a child that never was
			if !used[k] {
				os.RemoveAll(dir)
				plan.undo(k)
			}
		}
	}()
	if err != nil {
		d.obs.ObserveOp("fork", time.Since(start), err)
		return 0, nil, err
	}
	o.progress("children started; waiting for their agents", 50)
	var kids []store.Sandbox
	var errs []string
	for _, ch := range rep.Children {
		if ch.Index < 0 || ch.Index >= n || used[ch.Index] {
			errs = append(errs, fmt.Sprintf("child %d: the VMM answered a child index out of range", ch.Index))
			continue
		}
		used[ch.Index] = true // its directory holds its disks, whatever follows
		// A jailed VMM reports its children's PIDs in its own pid
		// namespace: the daemon supervises them by their PIDs in its own.
		pid, err := jail.HostPID(parent.PID, ch.PID)
		if err != nil {
			errs = append(errs, fmt.Sprintf("child %d: its pid %d: %v", ch.Index, ch.PID, err))
			continue
		}
		ch.PID = pid
		id := ids[ch.Index]
		st, _ := procStartTime(ch.PID)
		now := time.Now().UTC()
		sb := &store.Sandbox{ID: id, Tenant: parent.Tenant, Template: parent.Template, Status: store.Creating, PID: ch.PID,
			StartTime: st, API: ch.API, Vsock: ch.Vsock, Console: ch.Console, Log: ch.Log, MemMiB: parent.MemMiB,
			CPUs: parent.CPUs, Network: parent.Network, Egress: parent.Egress, Env: parent.Env, Secrets: parent.Secrets, Parent: parent.ID, Created: now,
			Disks: liveDisks(ch.Disks), Spawner: parent.Spawner, Family: parent.Family,
			BalloonTargetMiB: parent.BalloonTargetMiB} // the child's VMM has the parent's balloon
		ks := &sbState{rec: sb, agent: agentclient.New(ch.Vsock)}
		if plan != nil && plan.groups[ch.Index] != nil {
			ks.cgroup = plan.groups[ch.Index] // it was born there: placeInCgroup only records it
		}
		ks.mu.Lock()
		d.placeInCgroup(ks, ch.PID)
		d.save(ks)
		d.mu.Lock()
		d.sandboxes[id] = ks
		d.mu.Unlock()
		if err := d.waitAgent(o, ch.Vsock, Proc{PID: ch.PID, StartTime: st}, d.cfg.RestoreTimeout, ch.Log, ch.Console, 50, 95); err != nil {
			// A child whose agent never answered is of no use: its VMM
			// goes now rather than hold its memory until a delete.
			stopProc(ch.PID, st, StopGrace)
			sb.Status, sb.Reason, sb.PID, sb.StartTime = store.Failed, err.Error(), 0, 0
			errs = append(errs, fmt.Sprintf("child %d: %v", ch.Index, err))
		} else {
			sb.Status = store.Running
			d.events.publish(sb.Tenant, wire.Event{Type: "created", Sandbox: id, Detail: "forked from " + parent.ID})
		}
		d.save(ks)
		kids = append(kids, copyRec(sb))
		ks.mu.Unlock()
	}
	d.events.publish(parent.Tenant, wire.Event{Type: "forked", Sandbox: parent.ID, Detail: fmt.Sprintf("%d children", len(kids))})
	var ferr error
	if len(errs) > 0 {
		ferr = errors.New(strings.Join(errs, "; "))
	}
	d.obs.ObserveOp("fork", time.Since(start), ferr)
	res := wire.ForkResult{Parent: parent.ID, PauseMS: rep.PauseMS, Children: kids}
	if ferr != nil {
		res.Errors = errs
	}
	return http.StatusCreated, res, nil
}

// deleteSandbox stops s's VMM and removes everything of it. A sandbox
// with writable disks whose fork children are still there is refused
// (409): the children's disk overlays sit on layers in its directory.
func (d *Daemon) deleteSandbox(s *sbState) error {
	if kids := d.diskDependents(s); len(kids) > 0 {
		return errf(409, "sandbox %s has fork children on its disk layers (%s): delete them first", s.rec.ID, strings.Join(kids, ", "))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.rec
	if s.stopRolling != nil {
		s.stopRolling()
		s.stopRolling = nil
	}
	s.deleted = true
	stopProc(sb.PID, sb.StartTime, StopGrace)
	d.dropSecrets(sb, true)
	if s.cgroup != nil {
		if err := s.cgroup.Remove(); err != nil {
			d.log.Warn("cgroup remove", "sandbox", sb.ID, "err", err)
		}
	}
	os.Remove(sb.API)
	os.Remove(sb.Vsock)
	os.Remove(filepath.Join(d.store.Root, "jail", sb.ID)) // its VMMs' empty mount point, if confined
	if strings.HasPrefix(sb.Console, d.store.RunDir()) {  // a fork child's files
		os.Remove(sb.Console)
		os.Remove(sb.Console + ".1") // the console's older generation (logcap)
		os.Remove(sb.Log)
		if dir := filepath.Dir(sb.Console); filepath.Base(dir) == sb.ID && dir != filepath.Clean(d.store.RunDir()) {
			os.RemoveAll(dir) // a fork child's own run directory (forkGrants)
		}
	}
	s.agent.Close()
	if err := d.store.RemoveSandbox(sb.Tenant, sb.ID); err != nil {
		return err
	}
	d.mu.Lock()
	delete(d.sandboxes, sb.ID)
	d.mu.Unlock()
	d.sealIdleDisks(sb.Tenant)     // its ancestors' and template's disks may be idle now
	d.collectDisksLater(sb.Tenant) // and its parent's layers only it stood on unreferenced
	d.sweepPagesLater(sb.Tenant)   // and the page store's chunks only its snapshots named
	d.events.publish(sb.Tenant, wire.Event{Type: "deleted", Sandbox: sb.ID})
	d.log.Info("sandbox deleted", "tenant", sb.Tenant, "sandbox", sb.ID)
	return nil
}

// deleteTemplate removes a template no sandbox uses.
func (d *Daemon) deleteTemplate(ts *tplState) error {
	if !ts.mu.TryLock() {
		return errf(409, "template %s is being built", ts.rec.ID)
	}
	defer ts.mu.Unlock()
	t := ts.rec
	for _, s := range d.allSandboxes() {
		if s.rec.Tenant == t.Tenant && s.rec.Template == t.ID {
			return errf(409, "template %s is used by sandbox %s", t.ID, s.rec.ID)
		}
	}
	if err := d.store.RemoveTemplate(t.Tenant, t.ID); err != nil {
		return err
	}
	if d.atRest != nil {
		d.atRest.dropTemplateCopies(t.Tenant, t.ID)
	}
	d.sweepPagesLater(t.Tenant) // the chunks only its layer named
	d.mu.Lock()
	delete(d.templates, t.ID)
	d.mu.Unlock()
	d.events.publish(t.Tenant, wire.Event{Type: "template_deleted", Template: t.ID})
	return nil
}

// diskDependents returns the ids of s's fork children when s's template
// has writable disks (each child's overlay has a layer of s's as its
// base); none otherwise.
func (d *Daemon) diskDependents(s *sbState) []string {
	rec := d.snapshotRec(s)
	d.mu.Lock()
	ts := d.templates[rec.Template]
	d.mu.Unlock()
	if ts == nil || !slices.ContainsFunc(ts.rec.DiskBases, func(p string) bool { return p != "" }) {
		return nil
	}
	var kids []string
	for _, o := range d.allSandboxes() {
		if o != s && d.snapshotRec(o).Parent == rec.ID {
			kids = append(kids, d.snapshotRec(o).ID)
		}
	}
	slices.Sort(kids)
	return kids
}
