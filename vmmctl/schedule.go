package vmmctl

import (
	"context"
	"fmt"
	"time"

	"github.com/warrenvm/warren/memsnap/vmsnap"
)

// SnapshotSchedule is how SnapshotEvery takes its snapshots.
type SnapshotSchedule struct {
	// Every is the interval between two snapshots (more than 0).
	Every time.Duration
	// MaxChain is the most layers in a chain (at least 1): once the
	// chain has that many, the next snapshot is a full one.
	MaxChain int
	// Count stops the schedule after this many snapshots (0: only when
	// its context ends).
	Count int
	// Incremental starts with an incremental snapshot over the VM's
	// previous one, counted as the chain's first layer; otherwise the
	// first snapshot is a full one.
	Incremental bool
}

// SnapshotEvery takes the snapshots PATH-0001, PATH-0002, ... of the VM,
// one every s.Every: a full one, then incremental ones over it, and a
// full one again once the chain has s.MaxChain layers. It calls onTaken
// with each snapshot's reply, and returns nil when s.Count snapshots are
// taken or ctx ends (a snapshot that fails because ctx ended included),
// or the first other error.
func (c Client) SnapshotEvery(ctx context.Context, path string, s SnapshotSchedule, onTaken func(*SnapshotReply)) error {
	chain := 0 // layers in the current chain; 0 before the first snapshot
	if s.Incremental {
		chain = 1 // the VM's previous snapshot is the chain's first layer, as far as we know
	}
	for seq := 1; ; seq++ {
		kind := vmsnap.Incremental
		if chain == 0 || chain >= s.MaxChain {
			kind, chain = vmsnap.Full, 0
		}
		r, err := c.Snapshot(ctx, SnapshotRequest{Path: fmt.Sprintf("%s-%04d", path, seq), Kind: kind})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		onTaken(r)
		chain++
		if seq == s.Count {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(s.Every):
		}
	}
}
