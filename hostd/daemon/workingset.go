package daemon

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/internal/atomicfile"
	"github.com/warrenvm/warren/memsnap"
	"github.com/warrenvm/warren/memsnap/uffd"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmmctl"
)

// Restoring creates by userfaultfd (Config.RestoreMemory "uffd",
// warren-hostd --restore-memory uffd).
//
// Memory modes. A create restores its template's snapshot; by default
// (RestoreMmap) lazily by mmap (`warren restore --lazy`: the chain
// flattened once into DIR/NAME.<hash>.wraw by the template's first
// restore, which holds tplState.warm so that no other flattens it too,
// and mapped copy-on-write by every VMM). With RestoreUffd it is restored
// with `--lazy=uffd` (memsnap/uffd): a fresh memfd that the VMM's fault
// server fills page by page as the guest touches it, and, when the
// template has a working set, prefetches in the order the guest first
// touched them while the guest already runs. Where the host cannot serve
// userfaultfd the VMM falls back to mmap by itself (one log line). Only
// creates use the mode: a resume from disk, a rollback (in place, in the
// running VMM) and fork children (the VMM's own) restore as before, and
// a decrypted working copy is restored eagerly (startVMM).
//
// The working set. Recorded when the template is built: in uffd mode the
// build ends by restoring its new snapshot once, in a recorder that no
// tenant sees and that is removed at once, which records as a first
// create does (workingset_build.go says how, when and for whom; not for a
// tenant with a key). Where the build recorded none (a tenant with a key,
// a recording that failed, a daemon killed while it ran, working sets
// forgotten since), by the template's first create in uffd mode since the
// daemon started (the one holding tplState.warm with warmed false) when
// its file is not there yet; the build's recorder is such a first
// restore too, holding warm for the build. That restore gets
// --record-working-set SANDBOXDIR/working-set.wset (recordingName, in the
// sandbox's own directory, which a confined VMM may write: the template's
// is bound read-only into its jail); once the guest's agent answered,
// the daemon runs one first command through it (`true`, as an exec
// would) and asks the VMM to save what it recorded (POST
// /v1/working-set/save). The daemon then imports the file
// (importWorkingSet: opened without following links, bounded, parsed,
// checked against the restored snapshot's top layer) into
// DIR/NAME.wset beside the snapshot that was restored (workingSetPath),
// written atomically, owned by the daemon, with the state file's
// permissions (never looser than the snapshot's own files), and removes
// the VMM's file. The template's record then says how many pages it
// holds (store.Template.WorkingSetPages). All of it happens under
// tplState.warm, so concurrent creates wait for the file and prefetch
// it; a failure to record is logged and shown in the create's (the
// build's) progress, never fails the create (the build), and a create's
// is not retried before the daemon starts
// again (warmed is set by the create that ran). Later creates get
// --prefetch with the file when it exists; the VMM reads it before it
// drops its privileges (so the file needs no permission a confined VMM
// lacks) and ignores, with a log line, one that is stale or corrupt.
//
// Where it lives. For a tenant without a key, beside the template's
// snapshot (TEMPLATEDIR/snap/base.wset), removed with the template's
// directory. For a tenant with a key, creates restore the template's
// lasting decrypted copy (atrest.go), and the working set lives beside
// that copy, on the decryption tmpfs (DECRYPTDIR/tpl.TENANT.ID/base.wset):
// the page numbers a guest touched are kept off the disks like
// everything else of its memory, and go with the copy (template deleted,
// key revoked, daemon started), to be recorded again by the next first
// create. A key created for a tenant removes the working sets beside its
// sealed snapshots (sealTenant) and makes the next create of each of its
// templates record one anew (forgetWorkingSets). settleWorkingSets, at
// start, clears the record's count of a template whose file is gone.
//
// Template bundles carry no working set: the importing host records its
// own at its first uffd create (a bundle's import is not a build).

// Config.RestoreMemory's values.
const (
	// RestoreMmap restores creates by mmap (the default).
	RestoreMmap = string(vmsnap.Mmap)
	// RestoreUffd restores creates by userfaultfd, with the template's
	// working set.
	RestoreUffd = string(vmsnap.Uffd)
)

// checkRestoreMemory returns the mode v names ("" is RestoreMmap).
func checkRestoreMemory(v string) (string, error) {
	switch v {
	case "", RestoreMmap:
		return RestoreMmap, nil
	case RestoreUffd:
		return RestoreUffd, nil
	}
	return "", fmt.Errorf("daemon: restore memory %q: want %s or %s", v, RestoreMmap, RestoreUffd)
}

// workingSetExt ends a working set file's name.
const workingSetExt = ".wset"

// recordingName is the file a recording VMM writes its working set to, in
// its sandbox's directory.
const recordingName = "working-set" + workingSetExt

// workingSetPath is the working set file of snapshot DIR/NAME:
// DIR/NAME.wset.
func workingSetPath(snap string) string { return snap + workingSetExt }

// Bounds on recording a working set.
const (
	// firstCmdTimeout bounds the first command the recording create runs;
	// saveTimeout the VMM's save of the working set.
	firstCmdTimeout = 30 * time.Second
	saveTimeout     = 30 * time.Second
)

// templateCreate is what startVMM needs of a create (or of a build's
// recorder, workingset_build.go): its template, and whether the restore
// is the template's first since the daemon started (the caller then
// holds ts.warm; a recorder's always is).
type templateCreate struct {
	ts    *tplState
	first bool
}

// uffdCreate sets rs, the restore of a create from template tc that
// reads the snapshot use (the template's, or its lasting decrypted copy),
// to the uffd mode: with --prefetch when use has a working set, else, for
// the template's first restore, with --record-working-set into dir, the
// sandbox's directory. It returns the file the VMM records into ("" when
// it records none).
func uffdCreate(rs *vmmctl.Restore, dir, use string, tc *templateCreate) string {
	rs.Lazy, rs.LazyMode = false, vmsnap.Uffd
	ws := workingSetPath(use)
	if fi, err := os.Stat(ws); err == nil && fi.Mode().IsRegular() {
		rs.Prefetch = ws
		return ""
	}
	if !tc.first {
		return ""
	}
	rec := filepath.Join(dir, recordingName)
	os.Remove(rec) // a previous VMM's
	rs.RecordWorkingSet = rec
	return rec
}

// recordWorkingSet ends the recording of the working set by sandbox s's
// VMM (its first restore of template ts, whose agent answered): it runs
// the first command, has the VMM save the pages recorded into recording,
// imports them beside use (the snapshot restored) and records the count
// on the template. Failures are logged and reported as progress, never
// returned (caller holds s.mu and ts.warm).
func (d *Daemon) recordWorkingSet(o *op, s *sbState, ts *tplState, recording, use string) {
	sb := s.rec
	defer os.Remove(recording)
	o.progress("recording the template's working set", 96)
	pages, err := d.saveWorkingSet(s, recording, use)
	if err != nil {
		d.log.Warn("working set not recorded", "tenant", sb.Tenant, "template", ts.rec.ID, "sandbox", sb.ID, "err", err)
		o.progress("the template's working set was not recorded: "+err.Error(), 98)
		return
	}
	ts.rec.WorkingSetPages = pages
	d.saveTemplate(ts)
	d.log.Info("working set recorded", "tenant", sb.Tenant, "template", ts.rec.ID, "sandbox", sb.ID, "pages", pages, "file", workingSetPath(use))
	o.progress(fmt.Sprintf("recorded the template's working set (%d pages)", pages), 98)
}

// saveWorkingSet runs the first command in s's guest, has its VMM write
// the working set to recording and imports it beside use.
func (d *Daemon) saveWorkingSet(s *sbState, recording, use string) (uint64, error) {
	sb := s.rec
	ctx, cancel := context.WithTimeout(d.ctx, firstCmdTimeout)
	code, err := s.agent.Exec(ctx, agentwire.ExecRequest{Argv: []string{"true"}, Env: sb.Env, TimeoutMS: firstCmdTimeout.Milliseconds()}, io.Discard, io.Discard)
	cancel()
	if err != nil || code != 0 {
		// Its pages are recorded all the same: the working set is what
		// the guest touched, whatever the command's outcome.
		d.log.Debug("working set: the first command failed", "sandbox", sb.ID, "code", code, "err", err)
	}
	ctx, cancel = context.WithTimeout(d.ctx, saveTimeout)
	defer cancel()
	rep, err := vmmctl.Client{Socket: sb.API}.SaveWorkingSet(ctx)
	if err != nil {
		return 0, fmt.Errorf("the VMM's save: %w", err)
	}
	if rep.Path != recording {
		return 0, fmt.Errorf("the VMM saved its working set to %q, not %q", rep.Path, recording)
	}
	return importWorkingSet(recording, use)
}

// importWorkingSet copies the working set a VMM wrote to src (a file in
// its sandbox's directory, which the VMM's uid owns: opened without
// following a link, a regular file only, at most what a working set of
// the snapshot's memory can take) to workingSetPath(use), once it parses
// and belongs to the top layer of snapshot use's memory chain. The copy
// is written atomically, with the permissions of use's state file. It
// returns the working set's pages.
func importWorkingSet(src, use string) (uint64, error) {
	dir, _, state, err := vmsnap.Paths(use)
	if err != nil {
		return 0, err
	}
	chain, _, err := snapshotChain(dir, state)
	if err != nil {
		return 0, fmt.Errorf("snapshot %s: %w", use, err)
	}
	top, err := memsnap.Open(filepath.Join(dir, chain[0]))
	if err != nil {
		return 0, err
	}
	hash, hdr := top.Hash(), top.Header()
	top.Close()
	st, err := os.Stat(state)
	if err != nil {
		return 0, err
	}
	b, err := readRecorded(src, hdr.Pages())
	if err != nil {
		return 0, err
	}
	ws, err := uffd.ParseWorkingSet(b)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", src, err)
	}
	if ws.Top != hash || ws.PageSize != hdr.PageSize || ws.MemSize != hdr.MemSize {
		return 0, fmt.Errorf("%s: a working set of layer %s (%d bytes in pages of %d), the snapshot's is %s (%d in %d): %w",
			src, ws.Top.Short(), ws.MemSize, ws.PageSize, hash.Short(), hdr.MemSize, hdr.PageSize, uffd.ErrStale)
	}
	if len(ws.Runs) == 0 {
		return 0, fmt.Errorf("%s: an empty working set", src)
	}
	if err := atomicfile.Write(workingSetPath(use), b, st.Mode().Perm()&0o666); err != nil {
		return 0, err
	}
	return ws.NumPages(), nil
}

// readRecorded reads the working set file at path, written by a VMM: not
// through a link, not a FIFO or device, and at most the size of a working
// set of pages pages in runs of one.
func readRecorded(path string, pages uint64) ([]byte, error) {
	f, _, err := openVMMFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	limit := uffd.WorkingSetFileLimit(pages)
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: more than the %d bytes a working set of %d pages takes: %w", path, limit, pages, uffd.ErrCorruptWorkingSet)
	}
	return b, nil
}

// settleWorkingSets clears the working set count of every template whose
// file is not beside its snapshot (a tenant with a key: it was beside
// the decrypted copy, which the daemon's start removed). Called by New
// before anything is served.
func (d *Daemon) settleWorkingSets() {
	for _, ts := range d.templates {
		t := ts.rec
		if t.WorkingSetPages == 0 {
			continue
		}
		if fi, err := os.Stat(workingSetPath(t.Snapshot)); err == nil && fi.Mode().IsRegular() {
			continue
		}
		t.WorkingSetPages = 0
		d.saveTemplate(ts)
	}
}

// forgetWorkingSets makes the next create of each of tenant's templates
// record a working set again, and clears their counts: its snapshots
// were sealed under a new key, and creates now restore decrypted copies,
// beside which no working set is yet (sealTenant removed the plaintext
// ones).
func (d *Daemon) forgetWorkingSets(tenant string) {
	d.mu.Lock()
	var tss []*tplState
	for _, ts := range d.templates {
		if ts.rec.Tenant == tenant {
			tss = append(tss, ts)
		}
	}
	d.mu.Unlock()
	for _, ts := range tss {
		ts.warm.Lock()
		if d.cfg.RestoreMemory == RestoreUffd {
			ts.warmed = false
		}
		if ts.rec.WorkingSetPages != 0 {
			ts.rec.WorkingSetPages = 0
			d.saveTemplate(ts)
		}
		ts.warm.Unlock()
	}
}
