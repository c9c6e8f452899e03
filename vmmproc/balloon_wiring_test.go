package vmmproc

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/vmmctl"
)

// TestBalloonOptions: --balloon reaches the VM's options, a snapshot's run
// options record it (and leave it out when off, so that a warren that does
// not know it still reads theirs), and a restore or fork reads it back.
func TestBalloonOptions(t *testing.T) {
	a, err := ParseRunArgs([]string{"--kernel-fd", "4", "--balloon"}, io.Discard)
	if err != nil || !a.Balloon {
		t.Fatalf("--balloon: %+v, %v", a, err)
	}
	for _, on := range []bool{true, false} {
		raw, err := recordOptions(vmOptions{memMiB: 256, cpus: 1, balloon: on})
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		if _, ok := m["balloon"]; ok != on {
			t.Errorf("balloon %v recorded as %s", on, raw)
		}
		var o vmOptions
		if err := applyOptions(&o, raw); err != nil || o.balloon != on {
			t.Errorf("balloon %v read back as %v, %v", on, o.balloon, err)
		}
	}
}

// TestBalloonRollback boots Linux with `warren run --balloon`'s options,
// takes a snapshot through the control API while the guest's driver has
// its statistics buffer out with the device, changes the balloon, and
// rolls back: the device comes back with the snapshot's target and
// counters, still holding the driver's buffer, which it returns when
// statistics are asked for (the driver answers with new ones), and a new
// target is followed as before.
func TestBalloonRollback(t *testing.T) {
	o := vmOptions{memMiB: 256, cpus: 1, balloon: true, trackDirty: true, cmdline: "warren.shell=1 warren.hostname=balloon"}
	g := bootGuest(t, o)
	if g.dev.balloon == nil {
		t.Fatal("no balloon device")
	}
	dev := g.dev.balloon
	g.sh("echo up", 2*time.Minute)
	dir := t.TempDir()
	api := filepath.Join(dir, "api.sock")
	stopAPI, err := startAPI(api, &built{vm: g.vm, devs: g.dev}, o, NewLogger(os.Stderr, false), "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer stopAPI()
	c := vmmctl.Client{Socket: api}
	ctx := context.Background()
	kvmtest.WaitFor(t, time.Minute, "the driver's first statistics", func() bool { return dev.Metrics.StatsUpdates.Load() >= 1 })
	if _, err := c.SetBalloonTarget(ctx, 8); err != nil {
		t.Fatal(err)
	}
	kvmtest.WaitFor(t, 2*time.Minute, "actual 8 MiB", func() bool { r, err := c.Balloon(ctx); return err == nil && r.ActualMiB == 8 })
	snap := filepath.Join(dir, "snap")
	if _, err := c.Snapshot(ctx, vmmctl.SnapshotRequest{Path: snap, Kind: "full"}); err != nil {
		t.Fatal(err)
	}
	at := dev.Metrics.StatsUpdates.Load()
	g.sh("echo snapped", 2*time.Minute)
	if _, err := c.SetBalloonTarget(ctx, 16); err != nil {
		t.Fatal(err)
	}
	kvmtest.WaitFor(t, 2*time.Minute, "actual 16 MiB", func() bool { r, err := c.Balloon(ctx); return err == nil && r.ActualMiB == 16 })
	g.sh("echo inflated", 2*time.Minute)
	if _, err := c.Rollback(ctx, snap); err != nil {
		t.Fatal(err)
	}
	g.sh("echo rolled back", 2*time.Minute)
	r, err := c.Balloon(ctx)
	if err != nil || r.TargetMiB != 8 || r.ActualMiB != 8 || r.Counters.InflatedPages != 8*256 || !r.Active {
		t.Fatalf("after the rollback: %+v, %v", r, err)
	}
	if n := dev.Metrics.StatsUpdates.Load(); n != at {
		t.Fatalf("statistics updates %d after the rollback, %d at the snapshot", n, at)
	}
	one := uint64(1)
	if _, err := c.SetBalloon(ctx, vmmctl.BalloonRequest{StatsIntervalS: &one}); err != nil {
		t.Fatal(err)
	}
	kvmtest.WaitFor(t, 2*time.Minute, "statistics after the rollback", func() bool { return dev.Metrics.StatsUpdates.Load() >= at+2 })
	if _, err := c.SetBalloonTarget(ctx, 0); err != nil {
		t.Fatal(err)
	}
	kvmtest.WaitFor(t, 2*time.Minute, "actual back to 0", func() bool { r, err := c.Balloon(ctx); return err == nil && r.ActualPages == 0 })
	if r, err = c.Balloon(ctx); err != nil || r.Counters.Errors != 0 {
		t.Fatalf("final: %+v, %v", r, err)
	}
	g.sh("echo alive", 2*time.Minute)
}
