package cow

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/devices/virtio/blk"
	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmm/testguest"
)

// testDisk is a blk device over a cow/disk image of the test's, written
// from the host as the guest's driver would (through the device's
// backend), with a model of what it must read.
type testDisk struct {
	dev   *blk.Device
	model []byte
}

const diskSize = 4 << 20

// newRawDisk writes a raw image of diskSize bytes with a recognisable
// pattern into dir and opens it as a disk (writable unless ro).
func newRawDisk(t *testing.T, dir, name string, ro bool) *testDisk {
	t.Helper()
	model := make([]byte, diskSize)
	for i := range model {
		model[i] = byte(i*7 + len(name))
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, model, 0o600); err != nil {
		t.Fatal(err)
	}
	return openTestDisk(t, p, name, ro, model)
}

func openTestDisk(t *testing.T, path, name string, ro bool, model []byte) *testDisk {
	t.Helper()
	be, err := OpenDisk(path, ro)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := blk.NewWithBackend(be, name, blk.Options{ReadOnly: ro})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return &testDisk{dev: dev, model: model}
}

// write writes n random 4 KiB chunks tagged gen at random places.
func (d *testDisk) write(t *testing.T, r *rand.Rand, gen, n int) {
	t.Helper()
	w := d.dev.Backend()
	for range n {
		off := r.Int64N(diskSize/4096) * 4096
		p := bytes.Repeat([]byte(fmt.Sprintf("gen%04d-", gen)), 512)
		if _, err := w.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
		copy(d.model[off:], p)
	}
}

// view reads the whole of b.
func view(t *testing.T, b interface {
	ReadAt([]byte, int64) (int, error)
}) []byte {
	t.Helper()
	got := make([]byte, diskSize)
	if _, err := b.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	return got
}

// layerView opens a snapshot's disk layer read-only, as a restore would
// stand on it, and reads it whole.
func layerView(t *testing.T, l vmsnap.DiskLayer) []byte {
	t.Helper()
	be, err := OpenDisk(l.Layer, true)
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	if o, ok := be.(*disk.Overlay); ok {
		if got := append([]string{l.Layer}, disk.Chain(o)...); !slices.Equal(got, l.Chain) {
			t.Fatalf("layer %s has chain %q, the snapshot recorded %q", l.Layer, got, l.Chain)
		}
	}
	return view(t, be)
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// TestSnapshotDisks runs the counter guest with a writable disk (a raw
// image) and a read-only one, written from the host between snapshots,
// and takes 12 snapshots (a full one every 4th): each snapshot freezes the
// disk at its instant (its layer reads as the disk did then, and goes on
// doing so while the VM writes on), the read-only disk is never touched,
// the live chain stays bounded (full snapshots merge the VM's own layers),
// and the merged-away layers are gone. Then: an in-place rollback to an
// older snapshot gives the older blocks (and removes the replaced live
// top), twice in a row; a restore of an older snapshot in a new VM, twice,
// gives its blocks on two independent overlays; and a fork child in a
// directory of its own keeps the parent's layers foreign (its full
// snapshots merge only its own). The pause with and without disks is
// logged.
func TestSnapshotDisks(t *testing.T) {
	kvmtest.Require(t)
	var con testguest.SyncBuffer
	cfg := counterConfig(t, 32<<20, &con)
	vm, err := vmm.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runVM(t, vm)
	kvmtest.WaitFor(t, 2*time.Minute, "the guest to count", func() bool { return counter(vm) > 100 })
	dir, roDir, snaps := t.TempDir(), t.TempDir(), t.TempDir()
	rw := newRawDisk(t, dir, "disk0.img", false)
	ro := newRawDisk(t, roDir, "ro.img", true)
	set := NewDiskSet([]Disk{{Dev: rw.dev}, {Dev: ro.dev, ReadOnly: true}})
	fp, err := vmsnap.HostFingerprint("", cfg.Profile)
	if err != nil {
		t.Fatal(err)
	}
	s := vmsnap.NewSnapshotter(vm, nil, json.RawMessage(`{}`), fp)

	// The pause without disks, for comparison.
	var bare []time.Duration
	for i := range 5 {
		rep, err := s.Take(context.Background(), filepath.Join(snaps, fmt.Sprintf("bare%d", i)), vmsnap.Full)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Disks) != 0 {
			t.Fatalf("a snapshot without Disks records %v", rep.Disks)
		}
		bare = append(bare, rep.Pause)
	}
	s.Disks = set

	r := rand.New(rand.NewPCG(1, 2))
	type taken struct {
		path  string
		layer vmsnap.DiskLayer
		model []byte
	}
	var all []taken
	var withDisks, freeze []time.Duration
	for i := range 12 {
		rw.write(t, r, i, 64)
		kind := vmsnap.Incremental
		if i%4 == 0 {
			kind = vmsnap.Full
		}
		p := filepath.Join(snaps, fmt.Sprintf("s%02d", i))
		rep, err := s.Take(context.Background(), p, kind)
		if err != nil {
			t.Fatal(err)
		}
		if rep.DiskWarning != "" {
			t.Fatalf("snapshot %d: %s", i, rep.DiskWarning)
		}
		withDisks, freeze = append(withDisks, rep.Pause), append(freeze, rep.Freeze)
		if len(rep.Disks) != 1 || rep.Disks[0].Index != 0 {
			t.Fatalf("snapshot %d records disks %+v, want disk 0 only", i, rep.Disks)
		}
		all = append(all, taken{p, rep.Disks[0], bytes.Clone(rw.model)})
		live := set.Live()
		t.Logf("%s: layer %s, live chain %d images", rep.Kind, filepath.Base(rep.Disks[0].Layer), len(live[0].Chain))
		// Bounded: the live top, the incremental layers since the last
		// full snapshot, its merged layer, the raw image.
		if n := len(live[0].Chain); n > 5 {
			t.Errorf("after snapshot %d the live chain has %d images: %q", i, n, live[0].Chain)
		}
		if live[0].Chain[0] != rep.Disks[0].Layer {
			t.Errorf("the live top is over %s, the snapshot recorded %s", live[0].Chain[0], rep.Disks[0].Layer)
		}
	}
	t.Logf("pause: without disks median %v, with a disk median %v (of which freezing %v)", median(bare), median(withDisks), median(freeze))
	for i, tk := range all {
		if !bytes.Equal(layerView(t, tk.layer), tk.model) {
			t.Fatalf("snapshot %d's disk layer does not read as the disk did at the snapshot", i)
		}
	}
	if !bytes.Equal(view(t, ro.dev.Backend()), ro.model) || ro.dev.Backend() != ro.dev.Backend().(*disk.Raw) {
		t.Error("the read-only disk changed")
	}
	// Only the layers snapshots record, the live top and the raw image are
	// left in the disk's directory: the merged-away ones are gone.
	keep := map[string]bool{set.Live()[0].Top: true}
	for _, tk := range all {
		for _, p := range tk.layer.Chain {
			keep[p] = true
		}
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if p := filepath.Join(dir, e.Name()); !keep[p] {
			t.Errorf("%s is left in the disk's directory, referenced by nothing", e.Name())
		}
	}

	// Rollback to snapshot 5, twice: the older blocks, on a new top each
	// time; the replaced top is removed.
	for range 2 {
		rw.write(t, r, 99, 64)
		old := set.Live()[0].Top
		snap, err := vmsnap.Load(all[5].path, vmsnap.HostFingerprintSource("", cfg.Profile))
		if err != nil {
			t.Fatal(err)
		}
		rep, err := s.Rollback(context.Background(), snap)
		snap.Close()
		if err != nil {
			t.Fatal(err)
		}
		if rep.Disks != 1 || rep.DiskWarning != "" {
			t.Errorf("rollback: %v", rep)
		}
		if !bytes.Equal(view(t, rw.dev.Backend()), all[5].model) {
			t.Fatal("after the rollback the disk does not read as at snapshot 5")
		}
		if _, err := os.Stat(old); !os.IsNotExist(err) {
			t.Errorf("the replaced live top %s is still there (%v)", old, err)
		}
		live := set.Live()[0]
		if live.Top == old || live.Chain[0] != all[5].layer.Layer {
			t.Errorf("after the rollback the top is %s over %s", live.Top, live.Chain[0])
		}
		copy(rw.model, all[5].model)
		t.Logf("%v", rep)
	}
	// Snapshots still restore after the rollbacks; the VM goes on.
	rw.write(t, r, 100, 8)
	if _, err := s.Take(context.Background(), filepath.Join(snaps, "after"), vmsnap.Incremental); err != nil {
		t.Fatal(err)
	}

	// Restore snapshot 2 in a new VM, twice: each on its own overlay over
	// the layer, reading as at snapshot 2, written apart.
	var restored []*testDisk
	for k := range 2 {
		snap, err := vmsnap.Load(all[2].path, vmsnap.HostFingerprintSource("", cfg.Profile))
		if err != nil {
			t.Fatal(err)
		}
		ccfg := cfg
		ccfg.Kernel, ccfg.StartPaused, ccfg.Console = nil, true, &testguest.SyncBuffer{}
		rvm, err := snap.Restore(ccfg, false)
		if err != nil {
			t.Fatal(err)
		}
		rvm.Close()
		l := snap.Disks[0]
		snap.Close()
		top := disk.NewLayerPath(filepath.Dir(l.Layer), l.Layer)
		if err := disk.CreateOn(top, l.Layer); err != nil {
			t.Fatal(err)
		}
		d := openTestDisk(t, top, "disk0.img", false, bytes.Clone(all[2].model))
		if err := CheckChain(d.dev.Backend(), l.Chain); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(view(t, d.dev.Backend()), d.model) {
			t.Fatalf("restore %d of snapshot 2 does not read as at snapshot 2", k)
		}
		d.write(t, r, 200+k, 16)
		restored = append(restored, d)
	}
	for k, d := range restored {
		if !bytes.Equal(view(t, d.dev.Backend()), d.model) {
			t.Errorf("restore %d sees the other's writes", k)
		}
	}

	// A fork child with its disk in a directory of its own.
	kidDir := t.TempDir()
	f := &Forker{VM: vm, Disks: set}
	pt, err := f.Fork(context.Background(), 1, []string{kidDir})
	if err != nil {
		t.Fatal(err)
	}
	defer pt.Close()
	parentLayer := set.Live()[0].Chain[0]
	if filepath.Dir(pt.Disks[0][0]) != kidDir || pt.Disks[1][0] != ro.dev.Path() {
		t.Fatalf("child disks %q", pt.Disks)
	}
	kvm := runChild(t, cfg, pt)
	kd := openTestDisk(t, pt.Disks[0][0], "disk0.img", false, bytes.Clone(rw.model))
	kset := NewDiskSet([]Disk{{Dev: kd.dev, OwnTop: true}})
	ks := vmsnap.NewSnapshotter(kvm, nil, json.RawMessage(`{}`), fp)
	ks.Disks = kset
	rw.write(t, r, 300, 32) // the parent writes on apart
	for i := range 6 {
		kd.write(t, r, 400+i, 32)
		kind := vmsnap.Incremental
		if i%3 == 0 {
			kind = vmsnap.Full
		}
		rep, err := ks.Take(context.Background(), filepath.Join(snaps, fmt.Sprintf("kid%d", i)), kind)
		if err != nil {
			t.Fatal(err)
		}
		if rep.DiskWarning != "" {
			t.Fatal(rep.DiskWarning)
		}
		chain := kset.Live()[0].Chain
		if !slices.Contains(chain, parentLayer) {
			t.Fatalf("the child's chain %q no longer holds the parent's layer %s: it merged a foreign layer", chain, parentLayer)
		}
		for _, p := range chain[:slices.Index(chain, parentLayer)] {
			if filepath.Dir(p) != kidDir {
				t.Errorf("the child's own layer %s is outside its directory", p)
			}
		}
		if !bytes.Equal(layerView(t, rep.Disks[0]), kd.model) {
			t.Fatalf("the child's snapshot %d does not hold its disk", i)
		}
	}
	if !bytes.Equal(view(t, rw.dev.Backend()), rw.model) {
		t.Error("the parent's disk changed under its child's snapshots")
	}
	if strings.Contains(con.String(), "X") {
		t.Fatalf("the guest failed: %q", con.String())
	}
}
