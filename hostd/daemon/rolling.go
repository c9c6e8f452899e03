package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/warrenvm/warren/hostd/store"
)

// Rolling snapshots: a goroutine per sandbox takes a snapshot every
// Rolling.Every, named roll-NNNNNN: a full one, then incremental ones
// until the chain has Rolling.Keep layers, then a full one again (what
// `warren snapshot --every --max-chain` does). When a new chain starts,
// the rolling snapshots older than the previous chain are deleted: at most
// 2×Keep rolling snapshots stay, and every one left restores (its whole
// chain is there); the disk layers only the deleted ones held go too (a
// full snapshot merges the sandbox's own layers into one, so the disks'
// chains stay as short as the memory's). Compacting a chain in place (`warren compact`) would
// not let its layers go: the VMM's next incremental layer names the
// chain's top layer as its parent.

// startRolling starts s's rolling snapshotter (caller holds s.mu or owns s).
func (d *Daemon) startRolling(s *sbState) {
	if s.stopRolling != nil {
		s.stopRolling()
	}
	every, err := time.ParseDuration(s.rec.Rolling.Every)
	if err != nil || every < time.Second {
		d.log.Error("rolling snapshots: bad interval", "sandbox", s.rec.ID, "every", s.rec.Rolling.Every)
		return
	}
	ctx, cancel := context.WithCancel(d.ctx)
	s.stopRolling = cancel
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			s.mu.Lock()
			if ctx.Err() == nil && s.rec.Status == store.Running {
				if err := d.rollOnce(ctx, s); err != nil {
					d.log.Warn("rolling snapshot failed", "sandbox", s.rec.ID, "err", err)
				}
			}
			s.mu.Unlock()
		}
	}()
}

// rollOnce takes the next rolling snapshot (caller holds s.mu).
func (d *Daemon) rollOnce(ctx context.Context, s *sbState) error {
	sb := s.rec
	keep := max(sb.Rolling.Keep, 1)
	seq := 1
	for _, x := range sb.Snapshots {
		if n, ok := strings.CutPrefix(x.Name, "roll-"); ok {
			if v, err := strconv.Atoi(n); err == nil && v >= seq {
				seq = v + 1
			}
		}
	}
	kind := "incremental"
	if s.chain == 0 || s.chain >= keep {
		kind = "full"
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	snap, err := d.takeSnapshot(cctx, s, fmt.Sprintf("roll-%06d", seq), kind, true)
	if err != nil {
		return err
	}
	if snap.Kind != "full" {
		s.chain++
		return nil
	}
	s.chain = 1
	// Keep the rolling snapshots from the previous full one on.
	var fulls []int
	for i, x := range sb.Snapshots {
		if x.Rolling && x.Kind == "full" {
			fulls = append(fulls, i)
		}
	}
	if len(fulls) < 3 {
		return nil
	}
	cut := fulls[len(fulls)-2]
	var kept []store.Snapshot
	var gone []store.Snapshot
	for i, x := range sb.Snapshots {
		if x.Rolling && i < cut {
			gone = append(gone, x)
		} else {
			kept = append(kept, x)
		}
	}
	sb.Snapshots = kept
	if err := d.save(s); err != nil {
		return err
	}
	for _, x := range gone {
		removeSnapshotFiles(x.Path)
	}
	// The chunks only they named (pagestore.go).
	d.sweepPagesLater(sb.Tenant)
	// Their disk layers, unless a kept snapshot's chain or a VMM's stands
	// on them (diskgc.go).
	d.collectDisksLater(sb.Tenant)
	return nil
}

// removeSnapshotFiles deletes DIR/NAME's files: NAME.wstate, NAME.*.wsnap, NAME.*.wraw.
func removeSnapshotFiles(path string) {
	os.Remove(path + ".wstate")
	m, _ := filepath.Glob(path + ".*")
	for _, f := range m {
		os.Remove(f)
	}
}
