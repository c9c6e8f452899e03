package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/hostd/store"
)

// Recording a template's working set when it is built (uffd mode; see
// workingset.go for the working set itself).
//
// The recorder. Once the build's snapshot is written, the build VMM
// stopped and the template's record says ready, buildTemplate has the
// snapshot restored once by a recorder: a sandbox the daemon makes for
// itself, with an id of its own kind (recorderPrefix: "wsr-…", never an
// "sb-…" a tenant was given), started exactly as a create's first
// restore is (startVMM with the template's templateCreate, first: the
// same admission, confinement, uid, cgroup, disk overlays over the
// template's bases, uffd restore with --record-working-set, first
// command `true`, save, importWorkingSet checks and the count on the
// template's record). It is never put in Daemon.sandboxes: no API call
// can name, list, count or touch it, the metrics and quotas that count
// sandboxes do not see it, the monitor does not watch it, and no event
// names it. Its directory is a sandbox directory of the tenant (where a
// confined VMM's uid and binds expect it), and its record is written
// there as any create's is, so that a daemon killed while it runs finds
// it: adopt removes every recorder it finds (its VMM stopped, its
// directory, cgroup, sockets, jail mount point and family run directory
// removed) before anything is served, and sweepRecorders removes what a
// recorder killed before it recorded itself left in the run and jail
// directories. Whatever way the recording ends, discardRecorder removes
// all of it before the build answers.
//
// Ready, then recorded. The template's record says ready (and is saved)
// before the recorder starts, with tplState.warm held by the build until
// the recording has ended: a create that comes meanwhile waits for warm
// and then finds the working set and prefetches it, as creates after a
// first create's recording do; a daemon killed during the recording
// leaves a ready template (not a failed build) whose first create
// records, as before. The build's answer comes after the recording and
// carries its count (store.Template.WorkingSetPages); BuildMS is the time
// to the snapshot, without the recording.
//
// A network template is recorded too: the recorder's restore has the
// network a create's has (restoreNetwork: its secrets file and audit log
// in its directory, its private network made by its jail-init), dropped
// with it (dropSecrets). A create that waits behind a recording waits at
// most what a first create's recording takes (RestoreTimeout, then
// firstCmdTimeout and saveTimeout).
//
// Failures. A recording that fails (the VMM did not start or its agent
// did not answer, the VMM fell back to mmap and refuses to save, the file
// did not pass importWorkingSet) is logged and shown in the build's
// progress, and never fails the build: the template is ready either way,
// warmed stays false, and its first create records as before.
//
// Not recorded at build, left to the first create as before: mmap mode
// (nothing is recorded there at all), and a tenant with a key (or whose
// key cannot be read): its creates restore the template's lasting
// decrypted copy, its working set lives beside that copy on the
// decryption tmpfs, and its disk files are unsealed only for the VMMs the
// key machinery knows of (diskseal.go counts Daemon.sandboxes), which a
// recorder is not. A key created while a recorder runs: the recorder is
// not among the sandboxes postKey holds, so sealing may happen under it
// (at worst its guest reads sealed bytes and the recording fails or
// records an unhelpful order); the template's files end sealed as for
// any other, the recorder's own overlays go with it, and a working set
// imported in plaintext is
// removed (recordAtBuild looks for a key once the recording ended, with
// warm held, which forgetWorkingSets waits for; a key created after that
// look finds the file there for sealTenant to remove). A key revoked
// meanwhile does not stop the recorder (deleteKey stops the sandboxes it
// knows); it ends with the recording, as above.

// recorderPrefix begins the id of a build's working-set recorder.
const recorderPrefix = "wsr"

// isRecorder reports whether id is a recorder's (recorderPrefix).
func isRecorder(id string) bool { return strings.HasPrefix(id, recorderPrefix+"-") }

// recordsAtBuild reports whether the build of t ends by recording its
// working set: uffd mode, for a tenant without a key.
func (d *Daemon) recordsAtBuild(t *store.Template) bool {
	return d.cfg.RestoreMemory == RestoreUffd && !d.keyed(t.Tenant)
}

// recordAtBuild records the working set of ts, whose build just made it
// ready, by a recorder's restore of its snapshot, and removes the
// recorder. Failures are logged and reported as o's progress, never
// returned (caller holds ts.mu and ts.warm).
func (d *Daemon) recordAtBuild(o *op, ts *tplState) {
	t := ts.rec
	end := o.scoped("working set: ", 95, 99)
	err := d.runRecorder(o, ts)
	end()
	if err != nil {
		d.log.Warn("working set not recorded at build", "tenant", t.Tenant, "template", t.ID, "err", err)
		o.progress("the template's working set was not recorded: "+err.Error(), 99)
		return
	}
	if t.WorkingSetPages == 0 {
		return // recordWorkingSet logged and reported why (or the restore was not one that records)
	}
	if d.keyed(t.Tenant) {
		// A key was created while the recorder ran: the working set
		// must not stay in plaintext beside the (now sealed) snapshot.
		os.Remove(workingSetPath(t.Snapshot))
		t.WorkingSetPages = 0
		d.saveTemplate(ts)
		d.log.Warn("working set recorded at build dropped: the tenant has a key now", "tenant", t.Tenant, "template", t.ID)
		o.progress("the template's working set was dropped: the tenant has a key now", 99)
	}
}

// runRecorder starts a recorder of template ts (its first restore, as a
// create's: startVMM records the working set once the agent answered)
// and removes it again, whatever happened.
func (d *Daemon) runRecorder(o *op, ts *tplState) error {
	t := ts.rec
	id := newID(recorderPrefix)
	api, vs := d.sockets(id)
	dir := d.store.SandboxDir(t.Tenant, id)
	sb := &store.Sandbox{ID: id, Tenant: t.Tenant, Template: t.ID, Status: store.Creating, API: api, Vsock: vs,
		Console: filepath.Join(dir, "console.log"), Log: filepath.Join(dir, "vmm.log"), MemMiB: t.MemMiB, CPUs: t.CPUs,
		Network: t.Network, Created: time.Now().UTC()}
	s := &sbState{rec: sb, agent: agentclient.New(vs)}
	s.mu.Lock()
	defer s.mu.Unlock()
	defer d.discardRecorder(s)
	if err := d.save(s); err != nil {
		return err
	}
	release, err := d.acquireDisks(*sb)
	if err != nil {
		return err
	}
	defer release()
	diskPaths, err := createOverlays(dir, t.DiskBases)
	if err != nil {
		return err
	}
	return d.startVMM(o, s, t.Snapshot, diskPaths, &templateCreate{ts: ts, first: true})
}

// discardRecorder stops recorder s's VMM and removes everything of it: its
// secrets file, cgroup, sockets, jail mount point, family run directory
// and sandbox directory (caller holds s.mu or owns s). Errors are logged.
func (d *Daemon) discardRecorder(s *sbState) {
	sb := s.rec
	stopProc(sb.PID, sb.StartTime, StopGrace)
	d.dropSecrets(sb, true)
	if s.cgroup != nil {
		if err := s.cgroup.Remove(); err != nil {
			d.log.Warn("cgroup remove", "recorder", sb.ID, "err", err)
		}
	}
	s.agent.Close()
	d.removeRecorderFiles(sb.ID)
	if err := d.store.RemoveSandbox(sb.Tenant, sb.ID); err != nil {
		d.log.Error("remove a working-set recorder", "tenant", sb.Tenant, "recorder", sb.ID, "err", err)
	}
}

// removeRecorderFiles removes what recorder id has outside its sandbox
// directory: its sockets, its jail's mount point and its family's run
// directory (it has no fork children).
func (d *Daemon) removeRecorderFiles(id string) {
	api, vs := d.sockets(id)
	os.Remove(api)
	os.Remove(vs)
	os.Remove(filepath.Join(d.store.Root, "jail", id))
	os.RemoveAll(filepath.Join(d.store.RunDir(), "j-"+id))
}

// sweepRecorders, at start (adopt, after the records were settled),
// removes what recorders of a daemon that died left without a record:
// sockets, family run directories and jail mount points named by a
// recorder id. Their sandbox directories are recordless ones, which
// adopt removes with their cgroups.
func (d *Daemon) sweepRecorders() {
	seen := map[string]bool{}
	for _, dir := range []string{d.store.RunDir(), filepath.Join(d.store.Root, "jail")} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			id := strings.TrimPrefix(e.Name(), "j-")
			id = strings.TrimSuffix(strings.TrimSuffix(id, ".api"), ".vsock")
			if isRecorder(id) && store.ValidID(id) && !seen[id] {
				seen[id] = true
				d.removeRecorderFiles(id)
			}
		}
	}
}

// discardRecorderRecord removes, at start, recorder sb that a daemon
// killed during a build's recording left with a record.
func (d *Daemon) discardRecorderRecord(sb *store.Sandbox) {
	d.log.Warn("removing a working-set recorder left by a daemon that was killed while it ran", "tenant", sb.Tenant, "recorder", sb.ID)
	s := &sbState{rec: sb, agent: agentclient.New(sb.Vsock)}
	if d.cg != nil {
		s.cgroup = d.cg.Open(sb.ID)
	}
	d.discardRecorder(s)
}
