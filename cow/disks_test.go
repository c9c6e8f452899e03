package cow

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/devices/virtio/blk"
	"github.com/warrenvm/warren/memsnap/vmsnap"
)

// freezeOnce runs a snapshot's disk steps on set without a VM (Prepare,
// Freeze, Settle) and returns the layers it records.
func freezeOnce(t *testing.T, set *DiskSet, full bool) []vmsnap.DiskLayer {
	t.Helper()
	set.Lock()
	defer set.Unlock()
	if err := set.Prepare(); err != nil {
		t.Fatal(err)
	}
	frozen, err := set.Freeze()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := set.Settle(frozen, full)
	if err != nil {
		t.Fatal(err)
	}
	return layers
}

// TestDiskSetRollbackRefuses: a snapshot without disk state (the previous
// format), one without a layer for a writable disk, one with a layer for
// a read-only disk, and one whose layer's chain is not what it recorded
// are refused before anything changes; no file is left behind.
func TestDiskSetRollbackRefuses(t *testing.T) {
	dir := t.TempDir()
	rw := newRawDisk(t, dir, "disk0.img", false)
	ro := newRawDisk(t, t.TempDir(), "ro.img", true)
	set := NewDiskSet([]Disk{{Dev: rw.dev}, {Dev: ro.dev, ReadOnly: true}})
	rw.write(t, rand.New(rand.NewPCG(1, 1)), 1, 10)
	good := freezeOnce(t, set, false)
	other := newRawDisk(t, t.TempDir(), "other.img", false)
	otherSet := NewDiskSet([]Disk{{Dev: other.dev}})
	foreign := freezeOnce(t, otherSet, false)
	before, _ := os.ReadDir(dir)
	for _, tc := range []struct {
		name string
		snap vmsnap.Snapshot
		want string
	}{
		{"version 1", vmsnap.Snapshot{Path: "/s/old.wstate", Meta: vmsnap.Meta{Version: 1}}, "snapshot format version 1"},
		{"no layer", vmsnap.Snapshot{Path: "/s/x.wstate", Meta: vmsnap.Meta{Version: 2}, Disks: []vmsnap.DiskLayer{}}, "no layer for writable disk 0"},
		{"read-only disk's layer", vmsnap.Snapshot{Path: "/s/x.wstate", Meta: vmsnap.Meta{Version: 2},
			Disks: append(good, vmsnap.DiskLayer{Index: 1, Layer: "/r/ro.img", Chain: []string{"/r/ro.img"}})}, "not as a writable disk"},
		{"another chain", vmsnap.Snapshot{Path: "/s/x.wstate", Meta: vmsnap.Meta{Version: 2},
			Disks: []vmsnap.DiskLayer{{Index: 0, Layer: good[0].Layer, Chain: []string{good[0].Layer, "/elsewhere.img"}}}}, "the snapshot recorded"},
		{"another disk's layer", vmsnap.Snapshot{Path: "/s/x.wstate", Meta: vmsnap.Meta{Version: 2},
			Disks: []vmsnap.DiskLayer{{Index: 0, Layer: foreign[0].Layer, Chain: []string{foreign[0].Layer, "/elsewhere.img"}}}}, "the snapshot recorded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set.Lock()
			r, err := set.PrepareRollback(&tc.snap)
			set.Unlock()
			if err == nil {
				r.Abort()
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			if cerr := set.CanRollback(&tc.snap); cerr == nil && !strings.Contains(tc.name, "chain") && !strings.Contains(tc.name, "another disk") {
				t.Errorf("CanRollback accepted what PrepareRollback refuses")
			}
			if after, _ := os.ReadDir(dir); len(after) != len(before) {
				t.Errorf("a refused rollback left %d files for %d", len(after), len(before))
			}
		})
	}
}

// TestDiskSetRollbackKeepsUserImage: a rollback removes the live top it
// replaces only when that top is the VM's own; an image the user gave
// (warren run --disk X.wcow) is closed and kept.
func TestDiskSetRollbackKeepsUserImage(t *testing.T) {
	for _, own := range []bool{false, true} {
		dir := t.TempDir()
		raw := newRawDisk(t, dir, "disk0.img", true)
		raw.dev.Close()
		user := filepath.Join(dir, "mine.wcow")
		if err := disk.CreateOn(user, filepath.Join(dir, "disk0.img")); err != nil {
			t.Fatal(err)
		}
		d := openTestDisk(t, user, "mine", false, bytes.Clone(raw.model))
		set := NewDiskSet([]Disk{{Dev: d.dev, OwnTop: own}})
		// A layer to roll back to, from a snapshot of another VM standing
		// on the same image.
		snapTop := filepath.Join(dir, "snap.wcow")
		if err := disk.CreateOn(snapTop, filepath.Join(dir, "disk0.img")); err != nil {
			t.Fatal(err)
		}
		layer := vmsnap.DiskLayer{Index: 0, Layer: snapTop, Chain: []string{snapTop, filepath.Join(dir, "disk0.img")}}
		snap := &vmsnap.Snapshot{Path: "/s/x.wstate", Meta: vmsnap.Meta{Version: 2}, Disks: []vmsnap.DiskLayer{layer}}
		set.Lock()
		r, err := set.PrepareRollback(snap)
		if err == nil {
			err = r.Swap()
		}
		if err == nil {
			err = r.Done()
		}
		set.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		_, err = os.Stat(user)
		if own != os.IsNotExist(err) {
			t.Errorf("own=%v: after the rollback the replaced top exists: %v", own, err)
		}
		if got := set.Live()[0].Chain; len(got) != 2 || got[0] != snapTop {
			t.Errorf("own=%v: live chain %q", own, got)
		}
	}
}

// BenchmarkFreeze times the part of a snapshot's pause the disks take
// (DiskSet Freeze, after Prepare; Settle outside the timer) for a writable
// disk of 4 MiB and of 64 GiB (sparse), with 64 random 4 KiB writes since
// the previous snapshot: it must not grow with the disk's size.
func BenchmarkFreeze(b *testing.B) {
	for _, size := range []int64{4 << 20, 64 << 30} {
		b.Run(fmt.Sprintf("disk=%dMiB", size>>20), func(b *testing.B) {
			dir := b.TempDir()
			p := filepath.Join(dir, "disk0.img")
			f, err := os.Create(p)
			if err != nil {
				b.Fatal(err)
			}
			f.Truncate(size)
			f.Close()
			be, err := OpenDisk(p, false)
			if err != nil {
				b.Fatal(err)
			}
			dev, err := blk.NewWithBackend(be, p, blk.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer dev.Close()
			set := NewDiskSet([]Disk{{Dev: dev}})
			r := rand.New(rand.NewPCG(1, 2))
			page := bytes.Repeat([]byte{7}, 4096)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				for range 64 {
					dev.Backend().WriteAt(page, r.Int64N(size/4096)*4096)
				}
				set.Lock()
				if err := set.Prepare(); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				frozen, err := set.Freeze()
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				if _, err := set.Settle(frozen, i%8 == 7); err != nil {
					b.Fatal(err)
				}
				set.Unlock()
				b.StartTimer()
			}
		})
	}
}
