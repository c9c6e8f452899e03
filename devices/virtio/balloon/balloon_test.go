package balloon

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/warrenvm/warren/devices/virtio"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
	reg "github.com/warrenvm/warren/internal/virtiommio"
)

const (
	allFeatures = virtio.FeatureVersion1 | virtio.FeatureEventIdx | FeatureStatsVQ | FeatureDeflateOnOOM | FeatureFreePageReporting
	// freeBase is fake guest memory past the drivers' buffers, where the
	// tests put the "free pages" they report.
	freeBase = 0x200000
)

// discardMem is fake guest memory that is a Discarder: it records every
// discarded range (guest address, bytes) and zeroes its whole pages.
type discardMem struct {
	vt.Memory
	mu     sync.Mutex
	ranges []pageRun
}

func (m *discardMem) Discard(gpa, n uint64) error {
	if _, err := m.Memory.Slice(gpa, n); err != nil {
		return err
	}
	m.record(gpa, n)
	return nil
}

func (m *discardMem) DiscardSlice(b []byte) error {
	off := uint64(uintptrOf(b) - uintptrOf(m.Memory))
	if off > uint64(len(m.Memory)) || uint64(len(b)) > uint64(len(m.Memory))-off {
		return fmt.Errorf("not guest memory")
	}
	m.record(off, uint64(len(b)))
	return nil
}

func (m *discardMem) record(gpa, n uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ranges = append(m.ranges, pageRun{gpa, n})
	lo, hi := (gpa+PageSize-1)&^(PageSize-1), (gpa+n)&^(PageSize-1)
	if lo < hi {
		clear(m.Memory[lo:hi])
	}
}

func (m *discardMem) discarded() []pageRun {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.ranges)
}

// rig is a balloon behind its transport over discardMem, brought up by a
// driver with features: drivers[i] plays queue i.
type rig struct {
	dev     *Device
	tr      *virtio.MMIO
	mem     *discardMem
	irq     *vt.Signals
	drivers []*vt.Driver
	roles   roles
}

func newRig(t *testing.T, features uint64) *rig {
	t.Helper()
	r := &rig{dev: New(), mem: &discardMem{Memory: make(vt.Memory, vt.MemSize)}, irq: vt.NewSignals(), roles: queueRoles(features)}
	r.tr = virtio.NewMMIO("balloon", r.dev, r.mem, r.irq, nil)
	r.dev.SetNotifier(r.tr.ConfigChanged)
	t.Cleanup(r.tr.Shutdown)
	n := 2
	if r.roles.stats >= 0 {
		n++
	}
	if r.roles.report >= 0 {
		n++
	}
	for i := range n {
		r.drivers = append(r.drivers, vt.NewDriver(r.mem.Memory, i, 64))
	}
	if st := vt.Bring(r.tr, features, r.drivers...); st&virtio.StatusDriverOK == 0 || st&virtio.StatusNeedsReset != 0 {
		t.Fatalf("bring-up: status %#x", st)
	}
	return r
}

// le32s encodes PFNs as the driver sends them.
func le32s(v ...uint32) []byte {
	var b []byte
	for _, x := range v {
		b = binary.LittleEndian.AppendUint32(b, x)
	}
	return b
}

// statsBytes encodes statistics as the driver sends them.
func statsBytes(s ...Stat) []byte {
	var b []byte
	for _, x := range s {
		b = binary.LittleEndian.AppendUint16(b, x.Tag)
		b = binary.LittleEndian.AppendUint64(b, x.Value)
	}
	return b
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func waitNeedsReset(t *testing.T, tr *virtio.MMIO) {
	t.Helper()
	waitFor(t, "NEEDS_RESET", func() bool { return tr.Status()&virtio.StatusNeedsReset != 0 })
}

func TestQueueRoles(t *testing.T) {
	for _, c := range []struct {
		features uint64
		want     roles
	}{
		{0, roles{0, 1, -1, -1}},
		{FeatureStatsVQ, roles{0, 1, 2, -1}},
		{FeatureFreePageReporting, roles{0, 1, -1, 2}},
		{FeatureStatsVQ | FeatureFreePageReporting | FeatureDeflateOnOOM, roles{0, 1, 2, 3}},
	} {
		if got := queueRoles(c.features); got != c.want {
			t.Errorf("features %#x: roles %+v, want %+v", c.features, got, c.want)
		}
	}
}

// TestInflateDiscardsPages: the device discards exactly the pages whose
// PFNs the driver gives (consecutive ones as one run), PFN entries may
// straddle buffers, and returns the buffer.
func TestInflateDiscardsPages(t *testing.T) {
	r := newRig(t, allFeatures)
	pfn := func(gpa uint64) uint32 { return uint32(gpa / PageSize) }
	for p := uint64(freeBase); p < freeBase+0x20000; p++ {
		r.mem.Memory[p] = 0xee
	}
	arr := le32s(pfn(freeBase+0x3000), pfn(freeBase+0x4000), pfn(freeBase+0x5000), pfn(freeBase+0x10000))
	inf := r.drivers[r.roles.inflate]
	head, _ := inf.Offer(vt.Buf{Data: arr[:6]}, vt.Buf{Data: arr[6:]})
	r.tr.Notify(uint32(r.roles.inflate))
	if u := vt.WaitUsed(t, inf, 1); u[0] != [2]uint32{uint32(head), 0} {
		t.Fatalf("used %v", u)
	}
	want := []pageRun{{freeBase + 0x3000, 3 * PageSize}, {freeBase + 0x10000, PageSize}}
	if got := r.mem.discarded(); !reflect.DeepEqual(got, want) {
		t.Fatalf("discarded %v, want %v", got, want)
	}
	if r.mem.Memory[freeBase+0x2fff] != 0xee || r.mem.Memory[freeBase+0x3000] != 0 || r.mem.Memory[freeBase+0x6000] != 0xee {
		t.Error("discarded the wrong bytes")
	}
	if m := &r.dev.Metrics; m.InflatedPages.Load() != 4 || m.InflateDiscardedPages.Load() != 4 {
		t.Errorf("inflated %d, discarded %d", m.InflatedPages.Load(), m.InflateDiscardedPages.Load())
	}
	if r.tr.Status()&virtio.StatusNeedsReset != 0 {
		t.Fatal("needs reset")
	}

	// Deflate: counted, nothing discarded.
	def := r.drivers[r.roles.deflate]
	def.Offer(vt.Buf{Data: le32s(pfn(freeBase+0x3000), pfn(freeBase+0x4000))})
	r.tr.Notify(uint32(r.roles.deflate))
	vt.WaitUsed(t, def, 1)
	if n := r.dev.Metrics.DeflatedPages.Load(); n != 2 {
		t.Errorf("deflated %d", n)
	}
	if n := len(r.mem.discarded()); n != 2 {
		t.Errorf("deflate discarded: %v", r.mem.discarded())
	}
}

// TestInflateMalformedNeedsReset: a PFN outside guest RAM (past its end,
// or whose page overflows), an array that is not whole entries, or one
// too long is a driver fault: the device needs a reset and discards
// nothing of that chain.
func TestInflateMalformedNeedsReset(t *testing.T) {
	for _, c := range []struct {
		name string
		data []byte
	}{
		{"past RAM", le32s(freeBase/PageSize, vt.MemSize/PageSize)},
		{"far out", le32s(freeBase/PageSize, 0xffffffff)},
		{"partial entry", le32s(freeBase / PageSize)[:3]},
		{"too long", make([]byte, 4*(maxPFNs+1))},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, allFeatures)
			inf := r.drivers[r.roles.inflate]
			// The long array goes at freeBase (the driver's own buffer
			// area is 256 KiB).
			if len(c.data) > 0x40000 {
				inf.PutDesc(0, freeBase, uint32(len(c.data)), 0, 0)
				inf.Publish(0)
			} else {
				inf.Offer(vt.Buf{Data: c.data})
			}
			r.tr.Notify(uint32(r.roles.inflate))
			waitNeedsReset(t, r.tr)
			if d := r.mem.discarded(); len(d) != 0 {
				t.Errorf("discarded %v", d)
			}
			if r.dev.Metrics.Errors.Load() != 1 {
				t.Errorf("errors %d", r.dev.Metrics.Errors.Load())
			}
		})
	}
}

// TestReportDiscardsRanges: every range of a free page report is
// discarded and the buffer returned, with the reporting queue at the
// index the negotiated features give it (3 with the stats queue, 2
// without).
func TestReportDiscardsRanges(t *testing.T) {
	for _, features := range []uint64{allFeatures, allFeatures &^ FeatureStatsVQ} {
		t.Run(fmt.Sprintf("features=%#x", features), func(t *testing.T) {
			r := newRig(t, features)
			want := []pageRun{{freeBase, 0x10000}, {freeBase + 0x80000, PageSize}, {freeBase + 0xf0000, 2 * PageSize}}
			rep := r.drivers[r.roles.report]
			for i, w := range want {
				flags := uint16(2) // device-writable, as Linux adds them
				if i < len(want)-1 {
					flags |= 1
				}
				rep.PutDesc(uint16(i), w.gpa, uint32(w.n), flags, uint16(i+1))
			}
			rep.Publish(0)
			r.tr.Notify(uint32(r.roles.report))
			if u := vt.WaitUsed(t, rep, 1); u[0] != [2]uint32{0, 0} {
				t.Fatalf("used %v", u)
			}
			if got := r.mem.discarded(); !reflect.DeepEqual(got, want) {
				t.Fatalf("discarded %v, want %v", got, want)
			}
			m := &r.dev.Metrics
			if m.Reports.Load() != 1 || m.ReportedBytes.Load() != 0x13000 || m.ReportDiscardedBytes.Load() != 0x13000 {
				t.Errorf("reports %d, bytes %d, discarded %d", m.Reports.Load(), m.ReportedBytes.Load(), m.ReportDiscardedBytes.Load())
			}
			// A range outside RAM is refused by the queue: NEEDS_RESET.
			rep.PutDesc(3, vt.MemSize-PageSize, 2*PageSize, 2, 0)
			rep.Publish(3)
			r.tr.Notify(uint32(r.roles.report))
			waitNeedsReset(t, r.tr)
			if n := len(r.mem.discarded()); n != len(want) {
				t.Errorf("discarded %d ranges", n)
			}
		})
	}
}

// TestStats: the device keeps the latest statistics (a repeated tag keeps
// its last value), at most MaxStats of them, holds the buffer, and returns
// it every statistics interval to ask for more.
func TestStats(t *testing.T) {
	r := newRig(t, allFeatures)
	st := r.drivers[r.roles.stats]
	first := []Stat{{4, 123}, {5, 456}, {99, 7}, {4, 124}}
	head, _ := st.Offer(vt.Buf{Data: statsBytes(first...)})
	r.tr.Notify(uint32(r.roles.stats))
	waitFor(t, "statistics", func() bool { return r.dev.Metrics.StatsUpdates.Load() == 1 })
	info := r.dev.Info()
	if want := []Stat{{4, 124}, {5, 456}, {99, 7}}; !reflect.DeepEqual(info.Stats, want) || info.StatsTime.IsZero() {
		t.Fatalf("stats %v at %v, want %v", info.Stats, info.StatsTime, want)
	}
	if info.Stats[0].Name() != "free-memory" || info.Stats[2].Name() != "" {
		t.Errorf("names %q %q", info.Stats[0].Name(), info.Stats[2].Name())
	}
	vt.Quiet(t, nil, st) // held, not returned

	if err := r.dev.SetStatsInterval(time.Millisecond); err == nil {
		t.Error("1 ms interval accepted")
	}
	if err := r.dev.SetStatsInterval(MinStatsInterval); err != nil {
		t.Fatal(err)
	}
	if u := vt.WaitUsed(t, st, 1); u[0] != [2]uint32{uint32(head), 0} {
		t.Fatalf("stats buffer returned as %v", u)
	}
	// The driver answers with a new set in a buffer of more than
	// MaxStats entries: the first MaxStats are kept.
	var many []Stat
	for i := range MaxStats + 8 {
		many = append(many, Stat{uint16(i), uint64(1000 + i)})
	}
	st.Offer(vt.Buf{Data: statsBytes(many...)})
	r.tr.Notify(uint32(r.roles.stats))
	waitFor(t, "second statistics", func() bool { return r.dev.Metrics.StatsUpdates.Load() == 2 })
	if got := r.dev.Info().Stats; !reflect.DeepEqual(got, many[:MaxStats]) {
		t.Fatalf("stats %v", got)
	}
	vt.WaitUsed(t, st, 1) // and asked for again
	if err := r.dev.SetStatsInterval(0); err != nil {
		t.Fatal(err)
	}
}

// TestConfig: the target is num_pages (config offset 0), a change raises
// a configuration-change interrupt once the driver runs, and the driver's
// writes of actual (offset 4, whole or by bytes) are what Info reports.
func TestConfig(t *testing.T) {
	r := newRig(t, allFeatures)
	r.irq.Drain()
	gen := vt.Read32(r.tr, reg.ConfigGeneration)
	r.dev.SetTarget(4096)
	waitFor(t, "config generation", func() bool { return vt.Read32(r.tr, reg.ConfigGeneration) != gen })
	if vt.Read32(r.tr, reg.InterruptStatus)&2 == 0 {
		t.Error("no configuration-change interrupt status")
	}
	if n := r.irq.Drain(); n == 0 {
		t.Error("no interrupt")
	}
	if v := vt.Read32(r.tr, reg.Config); v != 4096 {
		t.Errorf("num_pages %d", v)
	}
	vt.Write32(r.tr, reg.Config+4, 1000)
	vt.Write32(r.tr, reg.Config, 7) // num_pages is the device's
	r.tr.Write(reg.Config+5, []byte{0x10})
	if info := r.dev.Info(); info.TargetPages != 4096 || info.ActualPages != 0x10e8 /* 1000 with byte 1 set to 0x10 */ || !info.Active {
		t.Errorf("info %+v", info)
	}
	b := make([]byte, 2)
	r.tr.Read(reg.Config+2, b)
	if b[0] != 0 || b[1] != 0 {
		t.Errorf("num_pages high bytes %v", b)
	}
	if v := vt.Read32(r.tr, reg.Config+8); v != 0 {
		t.Errorf("past the config: %#x", v)
	}
	if vt.Read32(r.tr, reg.DeviceID) != Type {
		t.Error("device ID")
	}
}

// TestFeatureNegotiation: the device offers exactly its features, and a
// driver that sets up fewer queues than it negotiated is refused.
func TestFeatureNegotiation(t *testing.T) {
	mem := make(vt.Memory, vt.MemSize)
	tr := virtio.NewMMIO("balloon", New(), mem, vt.NewSignals(), nil)
	defer tr.Shutdown()
	vt.Write32(tr, reg.DeviceFeaturesSel, 0)
	lo := vt.Read32(tr, reg.DeviceFeatures)
	if lo&(FeatureStatsVQ|FeatureDeflateOnOOM|FeatureFreePageReporting) != FeatureStatsVQ|FeatureDeflateOnOOM|FeatureFreePageReporting || lo&(1<<3|1<<4|1) != 0 {
		t.Errorf("features low %#x", lo)
	}
	drivers := []*vt.Driver{vt.NewDriver(mem, 0, 8), vt.NewDriver(mem, 1, 8), vt.NewDriver(mem, 2, 8)}
	if st := vt.Bring(tr, allFeatures, drivers...); st&virtio.StatusNeedsReset == 0 {
		t.Errorf("reporting queue missing: status %#x", st)
	}
}

// TestSaveRestore: a quiesced device's state (target, actual, statistics,
// interval, counters and the held statistics buffer) restores over a copy
// of guest memory, and the restored device returns the held buffer when
// asked; bad states are refused.
func TestSaveRestore(t *testing.T) {
	r := newRig(t, allFeatures)
	st := r.drivers[r.roles.stats]
	head, _ := st.Offer(vt.Buf{Data: statsBytes(Stat{4, 1 << 30})})
	r.tr.Notify(uint32(r.roles.stats))
	waitFor(t, "statistics", func() bool { return r.dev.Metrics.StatsUpdates.Load() == 1 })
	inf := r.drivers[r.roles.inflate]
	inf.Offer(vt.Buf{Data: le32s(freeBase / PageSize)})
	r.tr.Notify(uint32(r.roles.inflate))
	vt.WaitUsed(t, inf, 1)
	r.dev.SetTarget(300)
	vt.Write32(r.tr, reg.Config+4, 1)
	if err := r.tr.Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	ts, err := r.tr.Save()
	if err != nil {
		t.Fatal(err)
	}
	if q := ts.Queues[r.roles.stats]; q.NextAvail != 1 || q.NextUsed != 0 {
		t.Fatalf("stats queue saved as %+v", q)
	}
	mem2 := &discardMem{Memory: r.mem.Memory.Clone()}
	st2 := st.Clone(mem2.Memory)
	if err := r.tr.Resume(); err != nil {
		t.Fatal(err)
	}

	dev2 := New()
	tr2 := virtio.NewMMIO("balloon", dev2, mem2, vt.NewSignals(), nil)
	defer tr2.Shutdown()
	if err := tr2.Restore(ts); err != nil {
		t.Fatal(err)
	}
	info := dev2.Info()
	if info.TargetPages != 300 || info.ActualPages != 1 || !reflect.DeepEqual(info.Stats, []Stat{{4, 1 << 30}}) || !info.Active {
		t.Fatalf("restored %+v", info)
	}
	if dev2.Metrics.InflatedPages.Load() != 1 || dev2.Metrics.StatsUpdates.Load() != 1 {
		t.Errorf("restored counters %d %d", dev2.Metrics.InflatedPages.Load(), dev2.Metrics.StatsUpdates.Load())
	}
	if err := dev2.SetStatsInterval(MinStatsInterval); err != nil {
		t.Fatal(err)
	}
	if u := vt.WaitUsed(t, st2, 1); u[0] != [2]uint32{uint32(head), 0} {
		t.Fatalf("restored device returned %v", u)
	}
	if tr2.Status()&virtio.StatusNeedsReset != 0 {
		t.Fatal("restored device needs reset")
	}

	raw := func(f func(s map[string]any)) virtio.TransportState {
		var s map[string]any
		if err := json.Unmarshal(ts.Device, &s); err != nil {
			t.Fatal(err)
		}
		f(s)
		b, _ := json.Marshal(s)
		bad := ts
		bad.Device = b
		return bad
	}
	many := make([]any, MaxStats+1)
	for i := range many {
		many[i] = map[string]any{"tag": i, "value": 1}
	}
	for name, bad := range map[string]virtio.TransportState{
		"version":        raw(func(s map[string]any) { s["version"] = 2 }),
		"stats":          raw(func(s map[string]any) { s["stats"] = many }),
		"interval":       raw(func(s map[string]any) { s["stats_interval_ms"] = -1 }),
		"short interval": raw(func(s map[string]any) { s["stats_interval_ms"] = 1 }),
	} {
		if err := virtio.NewMMIO("balloon", New(), mem2, nil, nil).Restore(bad); err == nil {
			t.Errorf("%s: bad state accepted", name)
		}
	}

	// A state claiming a held buffer that the queue does not show out
	// (or the reverse) activates as NEEDS_RESET, never pushing a stale
	// head.
	noHeld := raw(func(s map[string]any) { delete(s, "held_stats") })
	tr3 := virtio.NewMMIO("balloon", New(), mem2.Memory.Clone(), nil, nil)
	defer tr3.Shutdown()
	if err := tr3.Restore(noHeld); err == nil && tr3.Status()&virtio.StatusNeedsReset == 0 {
		t.Error("a stats buffer out that the device does not hold was accepted")
	}
}

// TestHeldForgottenAfterReset: after a driver reset the buffer the device
// held belongs to nobody: a new driver's buffers are served and the old
// head is never returned.
func TestHeldForgottenAfterReset(t *testing.T) {
	r := newRig(t, allFeatures)
	st := r.drivers[r.roles.stats]
	st.Offer(vt.Buf{Data: statsBytes(Stat{1, 1})})
	r.tr.Notify(uint32(r.roles.stats))
	waitFor(t, "statistics", func() bool { return r.dev.Metrics.StatsUpdates.Load() == 1 })
	vt.Write32(r.tr, reg.Status, 0)
	clear(r.mem.Memory)
	drivers := []*vt.Driver{vt.NewDriver(r.mem.Memory, 0, 64), vt.NewDriver(r.mem.Memory, 1, 64), vt.NewDriver(r.mem.Memory, 2, 64), vt.NewDriver(r.mem.Memory, 3, 64)}
	if s := vt.Bring(r.tr, allFeatures, drivers...); s&virtio.StatusNeedsReset != 0 || s&virtio.StatusDriverOK == 0 {
		t.Fatalf("after reset: status %#x", s)
	}
	if err := r.dev.SetStatsInterval(MinStatsInterval); err != nil {
		t.Fatal(err)
	}
	vt.Quiet(t, nil, drivers[2])
	time.Sleep(2 * MinStatsInterval)
	if u := drivers[2].Used(); len(u) != 0 {
		t.Fatalf("returned a buffer of the old driver: %v", u)
	}
	head, _ := drivers[2].Offer(vt.Buf{Data: statsBytes(Stat{2, 2})})
	r.tr.Notify(2)
	if u := vt.WaitUsed(t, drivers[2], 1); u[0] != [2]uint32{uint32(head), 0} {
		t.Fatalf("used %v", u)
	}
}

// TestQuiesce: a quiesced device serves nothing and tells the driver of
// no new target until Resume.
func TestQuiesce(t *testing.T) {
	r := newRig(t, allFeatures)
	if err := r.tr.Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.irq.Drain()
	gen := vt.Read32(r.tr, reg.ConfigGeneration)
	inf := r.drivers[r.roles.inflate]
	inf.Offer(vt.Buf{Data: le32s(freeBase / PageSize)})
	r.tr.Notify(uint32(r.roles.inflate))
	r.dev.SetTarget(10)
	vt.Quiet(t, r.irq, r.drivers...)
	if vt.Read32(r.tr, reg.ConfigGeneration) != gen || len(r.mem.discarded()) != 0 {
		t.Fatal("worked while quiesced")
	}
	if err := r.tr.Resume(); err != nil {
		t.Fatal(err)
	}
	vt.WaitUsed(t, inf, 1)
	waitFor(t, "config change", func() bool { return vt.Read32(r.tr, reg.ConfigGeneration) != gen })
}
