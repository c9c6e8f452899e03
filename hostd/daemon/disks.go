package daemon

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/warrenvm/warren/cow"
	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/hostd/store"
)

// Template disks. A template's disk given as "PATH,ro" is shared: the
// build VMM and every sandbox attach PATH read-only. A disk given as
// "PATH" is writable, copy-on-write all the way down:
//
//   - before the build, PATH is copied (a reflink where the file system
//     can, else a sparse full copy: copyImage) into the template's
//     directory as disk<I>.base, and the build VMM attaches that copy
//     writable (the guest may write to it while it boots); PATH is not
//     needed after;
//   - once the template is snapshotted and its VMM stopped, the clone is
//     the template's frozen base: mode 0400, recorded in
//     store.Template.DiskBases, never written again;
//   - each sandbox gets its own cow/disk overlay over that base,
//     <sandboxdir>/disk<I>.overlay, given to the restore of the template's
//     snapshot as `warren restore --disk-path I=OVERLAY` (the VMM opens it
//     under the base's name, the one the snapshot's device state knows).
//   - every snapshot of the sandbox freezes its disk's live top in place
//     (the snapshot records that layer and its chain, store.Snapshot.Disks)
//     and the VMM goes on writing to a new top beside it,
//     disk<I>.<unique>.wcow; a full snapshot merges the sandbox's own
//     layers into one over the template's base. A resume from disk gives
//     the disk a new overlay over the latest snapshot's layer
//     (snapshotOverlays, --disk-path again), a rollback one over the
//     snapshot's layer (made by the VMM), so the files are exactly as at
//     the snapshot; layers nothing references any more are deleted
//     (diskgc.go). A fork of the sandbox freezes its top as well, under a
//     new one for it and one per child in the child's own directory: a
//     sandbox with fork children cannot be deleted before them
//     (diskDependents).
//   - the template's build is a snapshot too: it freezes the clone in
//     place (the base) and leaves a new top in the template's directory,
//     removed once the build VMM stops (settleTemplateDisks).
//
// I is the disk's index in the template's disks, which is also its index
// in the snapshot's run options.
//
// For a tenant with an encryption key, the base, the overlays and the
// fork layers are sealed on disk whenever no VMM needs them (diskseal.go).

// templateDisk is one disk of a template request: PATH[,ro|,rw].
type templateDisk struct {
	path     string
	readOnly bool
	// own: path is already the template's own writable image (an image
	// template's overlay over its base, images.go), used as it is.
	own bool
}

// parseTemplateDisk parses PATH[,ro|,rw] as `warren run --disk` does.
func parseTemplateDisk(v string) (templateDisk, error) {
	parts := strings.Split(v, ",")
	td := templateDisk{path: parts[0]}
	for _, opt := range parts[1:] {
		switch opt {
		case "ro":
			td.readOnly = true
		case "rw":
			td.readOnly = false
		default:
			return td, errf(400, "disk %q: unknown option %q (want ro)", v, opt)
		}
	}
	if !filepath.IsAbs(td.path) {
		return td, errf(400, "%q: paths must be absolute (they are read by the daemon)", td.path)
	}
	if _, err := os.Stat(td.path); err != nil {
		return td, errf(400, "%v", err)
	}
	return td, nil
}

// baseName is the file name, in the template's directory, of the clone of
// its writable disk i.
func baseName(i int) string { return "disk" + strconv.Itoa(i) + ".base" }

// overlayName is the file name, in a sandbox's directory, of its overlay
// over the template's disk i.
func overlayName(i int) string { return "disk" + strconv.Itoa(i) + ".overlay" }

// cloneTemplateDisks clones each writable disk into dir and returns, by
// disk index, the clones' paths ("" for a read-only disk), or nil when no
// disk is writable. On an error the clones made are removed.
func cloneTemplateDisks(dir string, disks []templateDisk) (_ []string, err error) {
	var bases []string
	defer func() {
		if err != nil {
			for _, b := range bases {
				if b != "" {
					os.Remove(b)
				}
			}
		}
	}()
	writable := false
	for i, td := range disks {
		if td.readOnly {
			bases = append(bases, "")
			continue
		}
		writable = true
		if td.own {
			bases = append(bases, td.path)
			continue
		}
		dst := filepath.Join(dir, baseName(i))
		if err := copyImage(td.path, dst); err != nil {
			return nil, fmt.Errorf("disk %d: %w", i, err)
		}
		bases = append(bases, dst)
	}
	if !writable {
		return nil, nil
	}
	return bases, nil
}

// freezeBases makes the template's disk clones read-only on disk: they are
// the bases of its sandboxes' overlays from now on.
func freezeBases(bases []string) error {
	for _, b := range bases {
		if b == "" {
			continue
		}
		if err := os.Chmod(b, 0o400); err != nil {
			return fmt.Errorf("freeze disk base: %w", err)
		}
	}
	return nil
}

// openBase opens a template's frozen base read-only, as cow/disk stacks
// it: an overlay (with its chain) or a raw image.
func openBase(path string) (disk.Backing, func() error, error) {
	ov, err := disk.IsOverlay(path)
	if err != nil {
		return nil, nil, err
	}
	if ov {
		o, err := disk.OpenChain(path, true)
		if err != nil {
			return nil, nil, err
		}
		return o, o.Close, nil
	}
	r, err := disk.OpenRaw(path, false)
	if err != nil {
		return nil, nil, err
	}
	return r, r.Close, nil
}

// createOverlays makes, in the sandbox directory dir, an overlay over each
// of the template's disk bases, and returns the `warren restore`
// arguments that attach them (--disk-path I=OVERLAY); none for a template
// without writable disks. On an error the overlays made are removed.
func createOverlays(dir string, bases []string) (_ []string, err error) {
	var args, made []string
	defer func() {
		if err != nil {
			for _, p := range made {
				os.Remove(p)
			}
		}
	}()
	for i, b := range bases {
		if b == "" {
			continue
		}
		base, closeBase, err := openBase(b)
		if err != nil {
			return nil, fmt.Errorf("disk %d: the template's base: %w", i, err)
		}
		p := filepath.Join(dir, overlayName(i))
		o, err := disk.Create(p, base, disk.CreateOptions{BasePath: b})
		if err == nil {
			made = append(made, p)
			err = o.Close()
		}
		closeBase()
		if err != nil {
			return nil, fmt.Errorf("disk %d: %w", i, err)
		}
		args = append(args, "--disk-path", strconv.Itoa(i)+"="+p)
	}
	return args, nil
}

// copyImage makes dst an independent copy of the disk image at src: a
// reflink where the file system can (instant), else a sparse full copy
// (disk.Flatten). Never an overlay over src: the template would then
// change whenever the user's image does.
func copyImage(src, dst string) error {
	kind, err := disk.Clone(src, dst)
	if err != nil {
		return err
	}
	if kind == disk.Reflinked {
		return nil
	}
	os.Remove(dst) // the overlay Clone fell back to
	ov, err := disk.IsOverlay(src)
	if err != nil {
		return err
	}
	var b disk.Backing
	if ov {
		o, err := disk.OpenChain(src, true)
		if err != nil {
			return err
		}
		defer o.Close()
		b = o
	} else {
		r, err := disk.OpenRaw(src, false)
		if err != nil {
			return err
		}
		defer r.Close()
		b = r
	}
	return disk.Flatten(b, dst)
}

// resumeFrom restores s from its snapshot snap in a new VMM (caller holds
// s.mu): each writable disk on a new overlay over the snapshot's layer,
// made in the sandbox's directory with the layers unsealed
// (snapshotOverlays), so that the files are exactly as at the snapshot.
// The overlays are removed if the VMM does not start.
func (d *Daemon) resumeFrom(o *op, s *sbState, snap store.Snapshot) error {
	release, err := d.acquireDisks(*s.rec)
	if err != nil {
		return cryptStatus(fmt.Errorf("disks: %w", err))
	}
	defer release()
	args, made, err := snapshotOverlays(d.store.SandboxDir(s.rec.Tenant, s.rec.ID), snap)
	if err != nil {
		return fmt.Errorf("disks: %w", err)
	}
	if err := d.startVMM(o, s, snap.Path, args...); err != nil {
		for _, p := range made {
			os.Remove(p)
		}
		return err
	}
	return nil
}

// settleTemplateDisks makes the template's record match what the build
// VMM's snapshot froze (its answer's disks): each writable disk's base is
// the layer the snapshot recorded (the clone, frozen in place), and the
// live top the build VMM went on writing to after the snapshot, in the
// template's directory and referenced by nothing, is removed (the VMM has
// stopped). A VMM from before snapshots held disks answers none: the clones
// are the bases, as they were.
func settleTemplateDisks(t *store.Template, disks []cow.DiskFiles) error {
	for _, df := range disks {
		if df.Index < 0 || df.Index >= len(t.DiskBases) || t.DiskBases[df.Index] == "" {
			return fmt.Errorf("the build snapshot froze disk %d, which is not one of the template's writable disks", df.Index)
		}
		t.DiskBases[df.Index] = df.Layer
		if df.Top != "" && df.Top != df.Layer && filepath.Dir(df.Top) == filepath.Dir(df.Layer) {
			if err := os.Remove(df.Top); err != nil && !os.IsNotExist(err) {
				return fmt.Errorf("remove the build's leftover disk top: %w", err)
			}
		}
	}
	return nil
}
