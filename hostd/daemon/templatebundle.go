package daemon

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/memsnap/vmsnap"
)

// Template bundles: a ready template, self-contained, to record it on
// another daemon without building it there (GET /v1/templates/{id}/bundle,
// POST /v1/templates/import; the fleet keeps them in its object store,
// hostd/kube's ObjectSnapshots, so that one host of a CPU group builds a
// template and the others fetch it).
//
// The stream is a sandbox bundle's (bundle.go: same tar framing, bounds,
// part names, digests in "end"), of the template's snapshot: "state",
// "memory" (one base layer) and "disk<I>" for each of its disks, each
// writable one read through its chain (for an image template, disk 0 with
// the image's shared base under it: the importing daemon needs nothing but
// the bundle, no image and no guest directory file). Its bundle.json says
// kind "template" and carries the template's record (bundleTemplate: the
// fields a create uses or shows; no path of this host), so that a sandbox
// bundle is never imported as a template, nor a template's as a sandbox.
//
// The import checks it all as a sandbox import does (bounded header, fixed
// part names, digests, the snapshot loaded and verified from the import's
// own directory, raw disks without an overlay's magic; nothing of the
// bundle names a file that is opened), writes the snapshot with this
// host's paths as the template's (TEMPLATEDIR/snap/base), its disks as the
// template's frozen bases (disk<I>.base, read-only, every sandbox's overlay
// sits on one) and read-only copies (disk<I>.ro), and records the template
// Ready for the caller's tenant. A create then restores it like a built
// one. Any failure removes everything the import made.
//
// For a tenant with a key, the template's disks (sealed at rest) are
// plaintext while the export reads them (acquireTemplateDisks) and sealed
// again after. Not carried: network templates (their snapshot's egress
// settings name this host's files and the operator's egress
// configuration): refused with 409, and the fleet builds those on each
// host. Nor is a template's working set (workingset.go): the importing
// host records its own at its first create in uffd mode (an imported
// template's record starts without one).

// bundleTemplate is a template bundle's template record (bundle.json's
// "template_record"): what its store.Template says but its id, tenant,
// status and paths.
type bundleTemplate struct {
	Kernel    string   `json:"kernel"`
	Initramfs string   `json:"initramfs,omitempty"`
	Disks     []string `json:"disks,omitempty"`
	Cmdline   string   `json:"cmdline,omitempty"`
	Balloon   bool     `json:"balloon,omitempty"`
	// Image is an image template's image: its reference, config digest
	// and commands (not its base's key or path, which are this host's).
	Image *bundleImage `json:"image,omitempty"`
	// BuildMS is how long its build took where it was built.
	BuildMS float64 `json:"build_ms,omitempty"`
}

// bundleImage is an image template's image in a bundle.
type bundleImage struct {
	Ref      string `json:"ref"`
	Digest   string `json:"digest,omitempty"`
	StartCmd string `json:"start_cmd,omitempty"`
	ReadyCmd string `json:"ready_cmd,omitempty"`
}

// Bounds on a template record's strings.
const (
	bundleNameMax = 4096
	bundleCmdMax  = 64 << 10
)

// check validates a template record of a bundle with disks disks.
func (bt *bundleTemplate) check(disks int) error {
	str := func(what, v string, max int) error {
		if len(v) > max || strings.ContainsRune(v, 0) {
			return fmt.Errorf("bad %s", what)
		}
		return nil
	}
	if bt.Kernel == "" {
		return fmt.Errorf("no kernel")
	}
	if len(bt.Disks) > disks {
		return fmt.Errorf("%d disks named, the bundle has %d", len(bt.Disks), disks)
	}
	errs := []error{str("kernel", bt.Kernel, bundleNameMax), str("initramfs", bt.Initramfs, bundleNameMax),
		str("cmdline", bt.Cmdline, bundleNameMax)}
	for _, d := range bt.Disks {
		errs = append(errs, str("disk name", d, bundleNameMax))
	}
	if im := bt.Image; im != nil {
		errs = append(errs, str("image ref", im.Ref, bundleNameMax), str("image digest", im.Digest, bundleNameMax),
			str("start command", im.StartCmd, bundleCmdMax), str("ready command", im.ReadyCmd, bundleCmdMax))
	}
	if bt.BuildMS < 0 || bt.BuildMS > 1e9 {
		errs = append(errs, fmt.Errorf("build_ms %v", bt.BuildMS))
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// exportTemplateBundle writes ready template ts to w as a bundle (caller
// holds ts.mu). An error returned with started false is the request's;
// one with started true cut the stream short.
func (d *Daemon) exportTemplateBundle(ts *tplState, w io.Writer) (started bool, err error) {
	t := ts.rec
	switch {
	case t.Status != store.TemplateReady:
		return false, errf(409, "template %s is %s", t.ID, t.Status)
	case t.Network:
		return false, errf(409, "template %s has a network: bundles do not carry network templates yet", t.ID)
	}
	if err := d.keyUsable(t.Tenant); err != nil {
		return false, err
	}
	release, err := d.acquireTemplateDisks(t.Tenant, t.ID)
	if err != nil {
		return false, cryptStatus(fmt.Errorf("template %s: disks: %w", t.ID, err))
	}
	defer release()
	// Its layer, rebuilt if its cache was dropped, stays open for the
	// export once loaded (templatepages.go).
	ts.lastUsed.Store(time.Now().UnixNano())
	ts.warm.Lock()
	err = d.ensureTemplateLayer(t)
	var ls *vmsnap.Snapshot
	var closeLS func()
	if err == nil {
		ls, closeLS, err = d.loadForExport(t.Tenant, t.Snapshot)
	}
	ts.warm.Unlock()
	if err != nil {
		return false, fmt.Errorf("template %s: snapshot: %w", t.ID, err)
	}
	defer closeLS()
	bt := &bundleTemplate{Kernel: t.Kernel, Initramfs: t.Initramfs, Disks: t.Disks, Cmdline: t.Cmdline, Balloon: t.Balloon, BuildMS: t.BuildMS}
	if im := t.Image; im != nil {
		bt.Image = &bundleImage{Ref: im.Ref, Digest: im.Digest, StartCmd: im.StartCmd, ReadyCmd: im.ReadyCmd}
	}
	hdr := bundleHeader{Version: bundleVersion, Kind: bundleKindTemplate, Snapshot: filepath.Base(t.Snapshot), Template: t.ID,
		MemMiB: t.MemMiB, CPUs: t.CPUs, TemplateRecord: bt}
	scratchRoot := d.store.TemplateDir(t.Tenant, t.ID)
	if d.encrypts(t.Tenant) && d.cfg.DecryptDir != "" {
		scratchRoot = d.cfg.DecryptDir
		os.MkdirAll(scratchRoot, 0o700)
	}
	return d.streamBundle(w, t.Tenant, hdr.Snapshot, ls, hdr, scratchRoot)
}

// importTemplateBundle reads a template bundle from r and records it as a
// new ready template of tenant.
func (d *Daemon) importTemplateBundle(tenant string, r io.Reader) (rec store.Template, err error) {
	if err := d.keyUsable(tenant); err != nil {
		return rec, err
	}
	id := newID("tp")
	dir := d.store.TemplateDir(tenant, id)
	staging, cleanup, err := importDir(dir)
	if err != nil {
		return rec, err
	}
	defer cleanup(&err)
	_, vsock := d.sockets(id)
	rb, err := receiveBundle(r, dir, staging, bundleKindTemplate, vsock)
	if err != nil {
		return rec, err
	}
	defer rb.ls.Close()
	hdr, bt, ls := rb.hdr, rb.hdr.TemplateRecord, rb.ls
	t := &store.Template{ID: id, Tenant: tenant, Status: store.TemplateReady, Kernel: bt.Kernel, Initramfs: bt.Initramfs,
		Disks: bt.Disks, MemMiB: hdr.MemMiB, CPUs: hdr.CPUs, Cmdline: bt.Cmdline, Balloon: bt.Balloon, BuildMS: bt.BuildMS,
		Created: time.Now().UTC()}
	if im := bt.Image; im != nil {
		t.Image = &store.TemplateImage{Ref: im.Ref, Digest: im.Digest, StartCmd: im.StartCmd, ReadyCmd: im.ReadyCmd}
	}
	// Its frozen bases: the writable disks' images, by disk index ("" for
	// a read-only disk; none when no disk is writable), as a build leaves
	// them (cloneTemplateDisks, settleTemplateDisks).
	if len(rb.layers) > 0 {
		t.DiskBases = make([]string, len(hdr.Disks))
		for _, l := range rb.layers {
			t.DiskBases[l.Index] = l.Layer
		}
	}
	snap := filepath.Join(dir, "snap", "base")
	if err := os.MkdirAll(filepath.Dir(snap), 0o700); err != nil {
		return rec, err
	}
	if _, err := vmsnap.Write(snap, &vmsnap.Capture{Kind: vmsnap.Full, State: ls.State, Devices: ls.Devices, Options: rb.opts,
		Fingerprint: ls.Fingerprint, Memory: ls.Chain.Reader(), Disks: rb.vlayers, Created: ls.Meta.Created}); err != nil {
		return rec, err
	}
	ls.Close()
	if err := os.RemoveAll(staging); err != nil {
		return rec, err
	}
	if err := d.templateIntoStore(tenant, snap); err != nil {
		d.log.Warn("page store: template layer not ingested", "template", id, "err", err)
	}
	if hook := d.cfg.Hooks.SnapshotWritten; hook != nil {
		if err := hook(tenant, snap); err != nil {
			return rec, cryptStatus(fmt.Errorf("snapshot hook: %w", err))
		}
	}
	t.Snapshot = snap
	ts := &tplState{rec: t}
	if err := d.saveTemplate(ts); err != nil {
		return rec, err
	}
	d.mu.Lock()
	d.templates[id] = ts
	d.mu.Unlock()
	d.sealIdleDisks(tenant) // its disk bases, for a tenant with a key
	d.log.Info("template imported", "tenant", tenant, "template", id, "from", hdr.Template)
	return *t, nil
}

// getTemplateBundle is GET /v1/templates/{id}/bundle: the ready
// template as a bundle (application/x-tar). The template is held (a
// delete waits) while the bundle streams; an error after the stream
// began cuts it short, without its "end", which an import refuses.
func (d *Daemon) getTemplateBundle(w http.ResponseWriter, r *http.Request, ts *tplState) {
	if t := ts.view.Load(); t.Status != store.TemplateReady {
		writeErr(w, errf(409, "template %s is %s", t.ID, t.Status)) // (not waiting for its build)
		return
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	d.serveBundle(w, "template", ts.rec.ID, func(bw io.Writer) (bool, error) { return d.exportTemplateBundle(ts, bw) })
}

// postTemplateImport is POST /v1/templates/import: a template bundle
// (application/x-tar) as a new ready template of the tenant (201, its
// record).
func (d *Daemon) postTemplateImport(w http.ResponseWriter, r *http.Request, tenant string) {
	start := time.Now()
	rec, err := d.importTemplateBundle(tenant, r.Body)
	d.obs.ObserveOp("template_import", time.Since(start), err)
	if err != nil {
		writeErr(w, err)
		return
	}
	d.events.publish(tenant, wire.Event{Type: "template_ready", Template: rec.ID, Detail: "imported from a bundle"})
	writeJSON(w, http.StatusCreated, rec)
}
