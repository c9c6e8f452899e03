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
	"github.com/warrenvm/warren/vmmctl"
	"golang.org/x/sys/unix"
)

// Template disks. A template's disks are raw images of the operator's
// guest directory, named by their names (guestfiles.go): never host
// paths. The daemon opens each one itself (openat2 under the directory,
// regular files only) and copies it from that descriptor into the
// template's own directory (a reflink where the file system can, else a
// sparse full copy: copyImageFile); the VMMs only ever see those copies.
// A disk given as "NAME,ro" is shared: its copy, disk<I>.ro (mode 0400),
// is attached read-only by the build VMM and by every sandbox. A disk
// given as "NAME" is writable, copy-on-write all the way down:
//
//   - before the build, NAME is copied into the template's directory as
//     disk<I>.base, and the build VMM attaches that copy writable (the
//     guest may write to it while it boots); NAME is not needed after;
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

// templateDisk is one disk of a template request: NAME[,ro|,rw].
type templateDisk struct {
	// name is the file's name in the guest directory.
	name     string
	readOnly bool
	// file is name opened read-only by the daemon (openGuestFile), what
	// the template's copy is made from; the caller closes it.
	file *os.File
	// own: path is already the template's own writable image (an image
	// template's overlay over its base, images.go), used as it is.
	own  bool
	path string
}

// parseTemplateDisk parses NAME[,ro|,rw], NAME a file of the guest
// directory (checked, not opened: a host path is refused with a 400).
func parseTemplateDisk(v string) (templateDisk, error) {
	name, _, _ := strings.Cut(v, ",")
	if err := checkGuestName("disk", name); err != nil {
		return templateDisk{name: name}, err
	}
	d, err := vmmctl.ParseDisk(v)
	if err != nil {
		return templateDisk{}, errf(400, "disk %q: %v", v, err)
	}
	return templateDisk{name: d.Path, readOnly: d.ReadOnly}, nil
}

// openTemplateDisks opens every disk's file of the guest directory dir
// (all names are checked before the first is opened). On an error the
// files opened are closed.
func openTemplateDisks(dir string, disks []templateDisk) error {
	for i := range disks {
		f, err := openGuestFile(dir, "disk", disks[i].name)
		if err == nil {
			if err = checkRawImage(f, disks[i].name); err != nil {
				f.Close()
			}
		}
		if err != nil {
			closeTemplateDisks(disks)
			return err
		}
		disks[i].file = f
	}
	return nil
}

// closeTemplateDisks closes the disks' files of the guest directory.
func closeTemplateDisks(disks []templateDisk) {
	for i := range disks {
		if disks[i].file != nil {
			disks[i].file.Close()
			disks[i].file = nil
		}
	}
}

// baseName is the file name, in the template's directory, of the clone of
// its writable disk i.
func baseName(i int) string { return "disk" + strconv.Itoa(i) + ".base" }

// overlayName is the file name, in a sandbox's directory, of its overlay
// over the template's disk i.
func overlayName(i int) string { return "disk" + strconv.Itoa(i) + ".overlay" }

// roName is the file name, in the template's directory, of the copy of
// its read-only disk i.
func roName(i int) string { return "disk" + strconv.Itoa(i) + ".ro" }

// cloneTemplateDisks copies each disk into dir from its file (an own disk
// is used as it is) and returns, by disk index, the path the build VMM
// attaches and, for DiskBases, the writable disks' clones ("" for a
// read-only disk; nil when no disk is writable). A read-only disk's copy
// is made read-only on disk at once. On an error the copies made are
// removed.
func cloneTemplateDisks(dir string, disks []templateDisk) (paths, bases []string, err error) {
	var made []string
	defer func() {
		if err != nil {
			for _, p := range made {
				os.Remove(p)
			}
		}
	}()
	writable := false
	for i, td := range disks {
		switch {
		case td.own:
			paths, bases = append(paths, td.path), append(bases, td.path)
			writable = true
			continue
		case td.file == nil:
			return nil, nil, fmt.Errorf("disk %d (%q): not opened", i, td.name)
		}
		name := baseName(i)
		if td.readOnly {
			name = roName(i)
		}
		dst := filepath.Join(dir, name)
		if err := copyImageFile(td.file, dst); err != nil {
			return nil, nil, fmt.Errorf("disk %d (%q): %w", i, td.name, err)
		}
		made = append(made, dst)
		paths = append(paths, dst)
		if td.readOnly {
			if err := os.Chmod(dst, 0o400); err != nil {
				return nil, nil, fmt.Errorf("disk %d: %w", i, err)
			}
			bases = append(bases, "")
			continue
		}
		writable = true
		bases = append(bases, dst)
	}
	if !writable {
		bases = nil
	}
	return paths, bases, nil
}

// checkRawBases refuses the bases of the template's raw disk clones (not
// its own overlays) that start with an overlay's magic: the build's guest
// wrote those bytes (a raw disk's first block is the guest's), and an
// image that reads as an overlay is opened as one, by cow/disk and by
// every restore's VMM, with the base path its header names: a hostile
// guest could have its sandboxes' disks read any host file.
func checkRawBases(bases []string, disks []templateDisk) error {
	for i, b := range bases {
		if b == "" || i >= len(disks) || disks[i].own {
			continue
		}
		f, err := os.Open(b)
		if err != nil {
			return fmt.Errorf("disk %d: %w", i, err)
		}
		err = checkRawImage(f, disks[i].name)
		f.Close()
		if err != nil {
			return fmt.Errorf("disk %d after the build: the guest wrote an overlay header into its raw image: %w", i, err)
		}
	}
	return nil
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
// of the template's disk bases, and returns the restore's disk paths that
// attach them (vmmctl.Restore.DiskPaths: I to OVERLAY); none for a
// template without writable disks. On an error the overlays made are
// removed.
func createOverlays(dir string, bases []string) (_ map[int]string, err error) {
	var made []string
	var paths map[int]string
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
		if paths == nil {
			paths = map[int]string{}
		}
		paths[i] = p
	}
	return paths, nil
}

// copyImageFile makes dst (which must not exist) an independent copy of
// the raw image open as src: a reflink where the file system can
// (FICLONE, instant), else a sparse full copy (disk.Flatten). Never an
// overlay over src: the template would then change whenever the
// operator's image does, and its base would be opened by path.
func copyImageFile(src *os.File, dst string) error {
	fi, err := src.Stat()
	if err != nil {
		return err
	}
	d, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	err = unix.IoctlFileClone(int(d.Fd()), int(src.Fd()))
	if err == nil {
		err = d.Sync()
		if cerr := d.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
		return err
	}
	d.Close()
	os.Remove(dst)
	return disk.Flatten(fileImage{src, fi.Size()}, dst)
}

// fileImage is an open raw image as a disk.Backing.
type fileImage struct {
	*os.File
	size int64
}

// Size is the image's size.
func (f fileImage) Size() int64 { return f.size }

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
	paths, made, err := snapshotOverlays(d.store.SandboxDir(s.rec.Tenant, s.rec.ID), snap)
	if err != nil {
		return fmt.Errorf("disks: %w", err)
	}
	if err := d.startVMM(o, s, snap.Path, paths, nil); err != nil {
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
