package virtio_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenvm/warren/devices/virtio"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
)

// fillDev is a minimal device for the transport's quiesce machinery: one
// queue; it fills each chain's writable bytes with 'x', calling hook (when
// set) first, inside the service pass.
type fillDev struct {
	w    virtio.Workers
	hook func()
}

func (d *fillDev) Type() uint32                        { return virtio.TypeRNG }
func (d *fillDev) Features() uint64                    { return virtio.FeatureEventIdx }
func (d *fillDev) QueueSizes() []uint16                { return []uint16{8} }
func (d *fillDev) ReadConfig(off uint64, data []byte)  {}
func (d *fillDev) WriteConfig(off uint64, data []byte) {}
func (d *fillDev) Reset()                              { d.w.Stop() }

func (d *fillDev) Activate(a *virtio.Activation) error {
	return d.w.ServeOne(a, "fill", nil, func(c *virtio.Chain) uint32 {
		if d.hook != nil {
			d.hook()
		}
		n := 0
		for _, b := range c.Writable {
			for i := range b {
				b[i] = 'x'
			}
			n += len(b)
		}
		return uint32(n)
	})
}

type fillRig struct {
	dev *fillDev
	tr  *virtio.MMIO
	drv *vt.Driver
	irq *vt.Signals
}

func newFillRig(t *testing.T, hook func()) *fillRig {
	t.Helper()
	mem := make(vt.Memory, vt.MemSize)
	r := &fillRig{dev: &fillDev{hook: hook}, drv: vt.NewDriver(mem, 0, 8), irq: vt.NewSignals()}
	r.tr = virtio.NewMMIO("fill", r.dev, mem, r.irq, nil)
	t.Cleanup(r.tr.Shutdown)
	if st := vt.Bring(r.tr, virtio.FeatureVersion1|virtio.FeatureEventIdx, r.drv); st&virtio.StatusDriverOK == 0 {
		t.Fatalf("status %#x", st)
	}
	return r
}

func TestQuiesceNotActivated(t *testing.T) {
	tr := virtio.NewMMIO("fill", &fillDev{}, make(vt.Memory, vt.MemSize), nil, nil)
	if err := tr.Quiesce(context.Background()); err != nil || tr.Quiesced() {
		t.Fatalf("quiesce before activation: %v, quiesced %v", err, tr.Quiesced())
	}
	if err := tr.Resume(); err != nil {
		t.Fatal(err)
	}
}

func TestQuiesceHoldsAndResumes(t *testing.T) {
	r := newFillRig(t, nil)
	ctx := context.Background()
	for range 2 { // twice: the second is a no-op
		if err := r.tr.Quiesce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !r.tr.Quiesced() {
		t.Fatal("not quiesced")
	}
	h1, _ := r.drv.Offer(vt.Buf{Len: 4, Writable: true})
	h2, _ := r.drv.Offer(vt.Buf{Len: 4, Writable: true})
	r.tr.Notify(0)
	vt.Quiet(t, r.irq, r.drv)
	// A notification taken while quiesced is not lost: Resume serves both.
	if err := r.tr.Resume(); err != nil {
		t.Fatal(err)
	}
	if u := vt.WaitUsed(t, r.drv, 2); u[0][0] != uint32(h1) || u[1][0] != uint32(h2) {
		t.Fatalf("used %v", u)
	}
	select {
	case <-r.irq.C:
	case <-time.After(5 * time.Second):
		t.Fatal("no interrupt after Resume")
	}
	if err := r.tr.Resume(); err != nil || r.tr.Quiesced() { // not quiesced: no-op
		t.Fatalf("second Resume: %v", err)
	}
}

func TestQuiesceWaitsForPass(t *testing.T) {
	entered, release := make(chan struct{}, 8), make(chan struct{})
	r := newFillRig(t, func() { entered <- struct{}{}; <-release })
	for range 3 {
		r.drv.Offer(vt.Buf{Len: 4, Writable: true})
	}
	r.tr.Notify(0)
	<-entered // the first request is in progress

	vt.QuiesceDuringPass(t, r.tr, release)
	// The request in progress was pushed before Quiesce returned; the
	// others wait for Resume.
	if u := r.drv.Used(); len(u) != 1 {
		t.Fatalf("at the safe point: used %v, want 1 entry", u)
	}
	r.irq.Drain() // raised in the pass, before Quiesce returned
	vt.Quiet(t, r.irq, r.drv)
	close(release)
	if err := r.tr.Resume(); err != nil {
		t.Fatal(err)
	}
	vt.WaitUsed(t, r.drv, 2)
}

func TestShutdownWhileQuiesced(t *testing.T) {
	r := newFillRig(t, nil)
	if err := r.tr.Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.drv.Offer(vt.Buf{Len: 4, Writable: true})
	r.tr.Notify(0)
	done := make(chan struct{})
	go func() { r.tr.Shutdown(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown of a quiesced device hangs")
	}
	if u := r.drv.Used(); len(u) != 0 {
		t.Fatalf("used %v", u)
	}
}

// TestQuiesceSaveRestore saves a quiesced device, lets it resume, and
// restores the state into a fresh transport over a copy of guest memory:
// both go on from the same used index, without a lost or repeated entry.
func TestQuiesceSaveRestore(t *testing.T) {
	r := newFillRig(t, nil)
	for range 3 {
		r.drv.Offer(vt.Buf{Len: 4, Writable: true})
	}
	r.tr.Notify(0)
	vt.WaitUsed(t, r.drv, 3)
	if err := r.tr.Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Offered before the snapshot, not yet seen by the device.
	pending, _ := r.drv.Offer(vt.Buf{Len: 4, Writable: true})
	st := vt.SaveQuiesced(t, r.tr, 0, 3)
	mem2 := r.drv.Mem.Clone()
	drv2 := r.drv.Clone(mem2)

	// The same process goes on.
	if err := r.tr.Resume(); err != nil {
		t.Fatal(err)
	}
	if u := vt.WaitUsed(t, r.drv, 1); u[0][0] != uint32(pending) {
		t.Fatalf("after resume: used %v", u)
	}

	// So does the restored copy.
	dev2 := &fillDev{}
	tr2 := virtio.NewMMIO("fill", dev2, mem2, vt.NewSignals(), nil)
	defer tr2.Shutdown()
	if err := tr2.Restore(st); err != nil {
		t.Fatal(err)
	}
	if u := vt.WaitUsed(t, drv2, 1); u[0][0] != uint32(pending) {
		t.Fatalf("after restore: used %v", u)
	}
	next, _ := drv2.Offer(vt.Buf{Len: 4, Writable: true})
	tr2.Notify(0)
	if u := vt.WaitUsed(t, drv2, 1); u[0][0] != uint32(next) {
		t.Fatalf("after restore: used %v", u)
	}
	if got := drv2.UsedIdx(); got != 5 {
		t.Fatalf("restored used index %d, want 5", got)
	}
}

// TestQuiesceStress quiesces and resumes a device again and again while
// the guest keeps it busy: while quiesced the used index never moves.
func TestQuiesceStress(t *testing.T) {
	r := newFillRig(t, nil)
	stop := make(chan struct{})
	var served atomic.Int64
	fed := make(chan struct{})
	go func() { // the guest: keeps up to 4 requests outstanding
		defer close(fed)
		out := 0
		for {
			select {
			case <-stop:
				return
			default:
			}
			n := len(r.drv.Used())
			out -= n
			served.Add(int64(n))
			for out < 4 {
				r.drv.Offer(vt.Buf{Len: 8, Writable: true})
				out++
			}
			r.tr.Notify(0)
			time.Sleep(50 * time.Microsecond)
		}
	}()
	used := r.drv.UsedIdx
	for range 50 {
		if err := r.tr.Quiesce(context.Background()); err != nil {
			t.Fatal(err)
		}
		before := used()
		time.Sleep(200 * time.Microsecond)
		if after := used(); after != before {
			t.Fatalf("used index moved from %d to %d while quiesced", before, after)
		}
		if err := r.tr.Resume(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Microsecond)
	}
	close(stop)
	<-fed
	if served.Load() == 0 {
		t.Fatal("nothing served")
	}
}

// TestRaisePending: a restored transport whose saved state has an
// unacknowledged interrupt signals it again on RaisePending (the VMM calls
// it once the vCPUs' LAPICs are loaded); one with none pending does not.
func TestRaisePending(t *testing.T) {
	for _, c := range []struct {
		intStatus uint32
		want      int
	}{{0, 0}, {1, 1}} {
		tr := virtio.NewMMIO("fill", &fillDev{}, make(vt.Memory, vt.MemSize), nil, nil)
		st, err := tr.Save()
		tr.Shutdown()
		if err != nil {
			t.Fatal(err)
		}
		st.IntStatus = c.intStatus
		sig := vt.NewSignals()
		tr2 := virtio.NewMMIO("fill", &fillDev{}, make(vt.Memory, vt.MemSize), sig, nil)
		if err := tr2.Restore(st); err != nil {
			t.Fatal(err)
		}
		sig.Drain()
		tr2.RaisePending()
		if got := sig.Drain(); got != c.want {
			t.Errorf("interrupt status %#x: %d signals, want %d", c.intStatus, got, c.want)
		}
		tr2.Shutdown()
	}
}
