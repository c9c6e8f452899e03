package vmsnap

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"

	"github.com/warrenvm/warren/internal/strictjson"
	"github.com/warrenvm/warren/memsnap/statefile"
)

// Disks in snapshots. A VM's writable disks are cow/disk stacks: a live
// top the VM writes to, over frozen layers that never change. Every
// snapshot freezes each writable disk's top in its pause, at the instant
// of the memory, and the VM goes on in a new overlay over it (Disks
// Freeze): the frozen layer is the snapshot's disk state, recorded in the
// state file's "disks" section (DiskLayer), with no copy of the data. A
// restore gives each writable disk a new overlay over the snapshot's layer
// (never the layer itself, so a snapshot restores any number of times),
// and a rollback does the same in place, in the pause in which it loads
// the memory. Read-only disks are not part of it.

// maxDisks bounds the disks a snapshot records; maxChain the images under
// a live top (cow/disk OpenChain follows at most 64 layers).
const (
	maxDisks = 64
	maxChain = 64
)

// DiskLayer is one writable disk's state in a snapshot.
type DiskLayer struct {
	// Index is the disk's position among the VM's disks (read-only ones
	// included), which is its index in the caller's run options.
	Index int `json:"index"`
	// Layer is the absolute path of the frozen image that holds the disk
	// as it was at the snapshot's instant: a cow/disk overlay (or a raw
	// image frozen in place), never written again.
	Layer string `json:"layer"`
	// Chain is Layer and every image under it, top first, down to the
	// bottom image: absolute paths.
	Chain []string `json:"chain"`
}

// Disks is what a Snapshotter freezes at every snapshot and rolls back
// with the memory (cow.DiskSet implements it). The Snapshotter calls Lock
// before Prepare and Unlock after Settle (or after a rollback's Done or
// Abort): in between, nothing else changes the disks' stacks (a fork
// waits).
type Disks interface {
	sync.Locker
	// Prepare runs before the snapshot's pause, the VM running: it syncs
	// each writable top, so that the pause's own sync has little left.
	Prepare() error
	// Freeze runs in the pause, with the transports quiesced: it freezes
	// each writable disk's top in place, stacks a new overlay on it that
	// the device serves from now on, and returns the frozen layers (a sync
	// and a header write per disk: nothing in proportion to the disk).
	Freeze() ([]DiskLayer, error)
	// Settle runs after the VM resumed, with Freeze's layers, and returns
	// the layers the snapshot records. For a full snapshot (full) it keeps
	// the stacks short: it merges the layers each disk's VM owns into one
	// overlay and moves the live top onto it, and the merged layer is
	// recorded instead. On an error the layers returned are still valid
	// (Freeze's, where the merge failed) and the error says what failed.
	Settle(frozen []DiskLayer, full bool) ([]DiskLayer, error)
	// PrepareRollback runs before a rollback's pause: it checks that snap
	// holds a layer for every writable disk (a snapshot of the previous
	// format holds none: refused, naming its version) and makes a new
	// overlay over each. Nothing the VM uses changes.
	PrepareRollback(snap *Snapshot) (DiskRollback, error)
}

// DiskRollback is a rollback's disk work, from Disks PrepareRollback.
type DiskRollback interface {
	// Swap runs in the rollback's pause: each device serves its new
	// overlay from then on.
	Swap() error
	// Done runs after the VM resumed: the previous live tops, which
	// nothing references (snapshots and fork children reference frozen
	// layers only), are closed and removed.
	Done() error
	// Abort undoes PrepareRollback when the rollback fails before Swap:
	// the new overlays are closed and removed.
	Abort()
}

// parseDisks decodes and checks the "disks" section (from disk: every
// field is checked); its errors wrap statefile.ErrCorrupt.
func parseDisks(b []byte) ([]DiskLayer, error) {
	var ds []DiskLayer
	if err := strictjson.Unmarshal(b, &ds); err != nil {
		return nil, fmt.Errorf("disks: %v: %w", err, statefile.ErrCorrupt)
	}
	if ds == nil {
		return nil, fmt.Errorf("disks: not a list: %w", statefile.ErrCorrupt)
	}
	if err := checkDisks(ds); err != nil {
		return nil, fmt.Errorf("disks: %v: %w", err, statefile.ErrCorrupt)
	}
	return ds, nil
}

// checkDisks validates disk layers (what Write records and Load reads).
func checkDisks(ds []DiskLayer) error {
	if len(ds) > maxDisks {
		return fmt.Errorf("%d disks, at most %d", len(ds), maxDisks)
	}
	seen := map[int]bool{}
	for _, dl := range ds {
		if dl.Index < 0 || dl.Index >= maxDisks || seen[dl.Index] {
			return fmt.Errorf("disk index %d out of range or repeated", dl.Index)
		}
		seen[dl.Index] = true
		if len(dl.Chain) == 0 || len(dl.Chain) > maxChain {
			return fmt.Errorf("disk %d: chain of %d images, want 1 to %d", dl.Index, len(dl.Chain), maxChain)
		}
		if dl.Chain[0] != dl.Layer {
			return fmt.Errorf("disk %d: chain starts at %q, not at its layer %q", dl.Index, dl.Chain[0], dl.Layer)
		}
		inChain := map[string]bool{}
		for _, p := range dl.Chain {
			if !cleanAbs(p) || inChain[p] {
				return fmt.Errorf("disk %d: chain path %q is not a clean absolute path, or repeated", dl.Index, p)
			}
			inChain[p] = true
		}
	}
	return nil
}

// cleanAbs reports whether p is a clean absolute path of a sane length.
func cleanAbs(p string) bool {
	return len(p) <= 4096 && filepath.IsAbs(p) && filepath.Clean(p) == p && !strings.ContainsRune(p, 0)
}
