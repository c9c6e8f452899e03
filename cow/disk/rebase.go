package disk

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Rebase puts the overlay on the image at path (an overlay, opened with
// its chain, or a raw image; read-only) in place of its current base. The
// new base must read exactly as the current one does — Merge makes such
// an image from the layers under an overlay — which Rebase checks as far
// as it cheaply can: same size and same Identity (else ErrBaseMismatch);
// the caller guarantees the rest by construction. The overlay's own
// blocks, bitmap and file are untouched: only the base path in the header
// changes (relative to the overlay's directory when path is in it).
//
// Crash safety: a version 2 header has two slots. Rebase writes the new
// header, with the next generation, into the slot that is not active and
// fdatasyncs the file; the old slot is never written. A crash before the
// write is durable leaves the old slot the valid one with the highest
// generation (a torn new slot fails its checksum), so the overlay reopens
// over either base, and both read the same. A version 1 overlay has one
// header and is refused (ErrVersion).
//
// Readers in flight: every read of the base (ReadAt, copy-up) holds the
// overlay's base lock shared; Rebase swaps the base under it held
// exclusively, after the header write, so a read in flight finishes on the
// old base and every later one reads the new one. The old base is closed
// then if the overlay owned it (OpenChain, Fork, an earlier Rebase); the
// overlay owns the new one (Close closes it).
//
// Only a writable overlay (a running VM's live top) is rebased: a frozen
// layer's header never changes after the freeze, since other processes may
// have it open and snapshots record its chain. Rebase must not race with
// Close, Fork or another Rebase of the same overlay.
func (o *Overlay) Rebase(path string) error {
	fail := func(err error) error { return fmt.Errorf("rebase overlay %s onto %s: %w", o.f.Name(), path, err) }
	if o.readOnly.Load() {
		return fail(errors.New("the overlay is frozen (read-only): only a live top is rebased"))
	}
	if o.geom.Version != Version {
		return fail(fmt.Errorf("%w: a version %d overlay has one header slot and cannot be rebased", ErrVersion, o.geom.Version))
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return fail(err)
	}
	self, err := filepath.Abs(o.f.Name())
	if err != nil {
		return fail(err)
	}
	nb, closeNB, err := openLayer(abs, 0)
	if err != nil {
		return fail(err)
	}
	ok := false
	defer func() {
		if !ok {
			closeNB()
		}
	}()
	cur := o.Header()
	if sz := uint64(nb.Size()); sz != cur.BaseSize {
		return fail(fmt.Errorf("%w: the new base is %d bytes, the overlay's %d", ErrBaseMismatch, sz, cur.BaseSize))
	}
	id, err := Identity(nb)
	if err != nil {
		return fail(err)
	}
	if id != cur.BaseDigest {
		return fail(fmt.Errorf("%w: the new base's content differs from the current base's (digest %x, recorded %x)", ErrBaseMismatch, id[:8], cur.BaseDigest[:8]))
	}
	nh := cur
	nh.BasePath = abs
	if filepath.Dir(abs) == filepath.Dir(self) {
		nh.BasePath = filepath.Base(abs)
	}
	nh.Generation++
	nh.slot = 1 - cur.slot
	b, err := nh.marshalSlot()
	if err != nil {
		return fail(err)
	}
	write := o.writeSlot
	if write == nil {
		write = func(f *os.File, b []byte, off int64) error {
			_, err := f.WriteAt(b, off)
			return err
		}
	}
	if err := write(o.f, b, int64(nh.slot)*SlotSize); err != nil {
		return fail(err)
	}
	if err := fdatasync(o.f); err != nil {
		return fail(err)
	}
	o.baseMu.Lock()
	old := o.closeBase
	o.base, o.hdr, o.closeBase = nb, nh, closeNB
	o.baseMu.Unlock()
	ok = true
	if old != nil {
		if err := old(); err != nil {
			return fmt.Errorf("rebase overlay %s: close the old base: %w", o.f.Name(), err)
		}
	}
	return nil
}

// NewLayerPath returns a fresh path in dir for a layer of the disk whose
// file is like: <stem>.<unique>.wcow, with the stem Fork uses (like's base
// name without its extension and without a unique part an earlier layer
// gave it) and unique the time in nanoseconds and 32 random bits.
func NewLayerPath(dir, like string) string {
	return filepath.Join(dir, forkStem(like)+"."+uniqueSuffix()+Ext)
}

// CreateOn makes a new, empty overlay at path (which must not exist) over
// the image at base (an overlay, opened with its chain, or a raw image;
// read-only), recording base relative to path's directory when it is in
// it, else absolute; both are synced and closed before it returns.
func CreateOn(path, base string) error {
	abs, err := filepath.Abs(base)
	if err != nil {
		return err
	}
	b, closeBase, err := openLayer(abs, 0)
	if err != nil {
		return fmt.Errorf("create overlay %s: base: %w", path, err)
	}
	defer closeBase()
	bp := abs
	if dir, err := filepath.Abs(filepath.Dir(path)); err == nil && dir == filepath.Dir(abs) {
		bp = filepath.Base(abs)
	}
	o, err := Create(path, b, CreateOptions{BasePath: bp})
	if err != nil {
		return err
	}
	return o.Close()
}

// Chain returns the paths of the images under b, top first, as absolute
// paths: for an overlay, its base and everything under it down to the
// bottom image; for a raw image, nothing. A base that is neither an
// Overlay nor a Raw (a test's in-memory image) ends the list.
func Chain(b Backing) []string {
	var out []string
	for {
		o, ok := b.(*Overlay)
		if !ok {
			return out
		}
		b = o.Base()
		switch l := b.(type) {
		case *Overlay:
			out = append(out, absPath(l.Path()))
		case *Raw:
			out = append(out, absPath(l.Path()))
		}
	}
}

// absPath is path made absolute (unchanged if that fails).
func absPath(path string) string {
	if a, err := filepath.Abs(path); err == nil {
		return a
	}
	return path
}

// Owned returns the overlays that top and the layers under it hold in dir:
// the contiguous run of overlays from top down whose files are in dir,
// top first, and the first layer under them that is not (an image
// elsewhere, or a raw image anywhere: a bottom image is never part of a
// run). An empty run means top itself is not an overlay in dir.
func Owned(top Backing, dir string) (run []*Overlay, rest Backing) {
	dir = absPath(dir)
	b := top
	for {
		o, ok := b.(*Overlay)
		if !ok || filepath.Dir(absPath(o.Path())) != dir {
			return run, b
		}
		run = append(run, o)
		b = o.Base()
	}
}
