package rng

import (
	"context"
	"testing"

	"github.com/warrenvm/warren/devices/virtio"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
)

// newQuiesceRig is an activated device whose entropy source is read.
func newQuiesceRig(t *testing.T, read func([]byte) (int, error)) (*virtio.MMIO, *vt.Driver, *vt.Signals) {
	t.Helper()
	mem := make(vt.Memory, vt.MemSize)
	dev := New()
	if read != nil {
		dev.Read = read
	}
	irq := vt.NewSignals()
	tr := virtio.NewMMIO("rng", dev, mem, irq, nil)
	t.Cleanup(tr.Shutdown)
	drv := vt.NewDriver(mem, 0, 8)
	if st := vt.Bring(tr, features, drv); st&virtio.StatusDriverOK == 0 {
		t.Fatalf("status %#x", st)
	}
	return tr, drv, irq
}

func fill(p []byte) (int, error) {
	for i := range p {
		p[i] = 0x42
	}
	return len(p), nil
}

func TestQuiesce(t *testing.T) {
	entered, release := make(chan struct{}, 8), make(chan struct{}, 8)
	slow := false
	tr, drv, irq := newQuiesceRig(t, func(p []byte) (int, error) {
		if slow {
			entered <- struct{}{}
			<-release
		}
		return fill(p)
	})
	ctx := context.Background()

	// Requests offered while quiesced wait for Resume.
	if err := tr.Quiesce(ctx); err != nil {
		t.Fatal(err)
	}
	head, addrs := drv.Offer(vt.Buf{Len: 16, Writable: true})
	tr.Notify(0)
	vt.Quiet(t, irq, drv)
	if drv.Mem[addrs[0]] != 0 {
		t.Fatal("buffer filled while quiesced")
	}
	if err := tr.Resume(); err != nil {
		t.Fatal(err)
	}
	if u := waitUsed(t, drv, 1); u[0] != [2]uint32{uint32(head), 16} || drv.Mem[addrs[0]] != 0x42 {
		t.Fatalf("used %v", u)
	}

	// A request being served is finished before Quiesce returns. (slow is
	// set before the offer, whose atomic index store orders it.)
	slow = true
	drv.Offer(vt.Buf{Len: 16, Writable: true})
	drv.Offer(vt.Buf{Len: 16, Writable: true})
	tr.Notify(0)
	<-entered
	vt.QuiesceDuringPass(t, tr, release)
	if u := drv.Used(); len(u) != 1 {
		t.Fatalf("at the safe point: used %v", u)
	}
	irq.Drain()
	vt.Quiet(t, irq, drv)
	release <- struct{}{}
	if err := tr.Resume(); err != nil {
		t.Fatal(err)
	}
	waitUsed(t, drv, 1)
}

func TestQuiesceSaveRestore(t *testing.T) {
	tr, drv, _ := newQuiesceRig(t, fill)
	drv.Offer(vt.Buf{Len: 16, Writable: true})
	tr.Notify(0)
	waitUsed(t, drv, 1)
	if err := tr.Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	head, _ := drv.Offer(vt.Buf{Len: 8, Writable: true})
	st := vt.SaveQuiesced(t, tr, 0, 1)
	mem2 := drv.Mem.Clone()
	drv2 := drv.Clone(mem2)
	if err := tr.Resume(); err != nil {
		t.Fatal(err)
	}
	if u := waitUsed(t, drv, 1); u[0] != [2]uint32{uint32(head), 8} {
		t.Fatalf("after resume: used %v", u)
	}

	dev2 := New()
	dev2.Read = fill
	tr2 := virtio.NewMMIO("rng", dev2, mem2, vt.NewSignals(), nil)
	defer tr2.Shutdown()
	if err := tr2.Restore(st); err != nil {
		t.Fatal(err)
	}
	if u := waitUsed(t, drv2, 1); u[0] != [2]uint32{uint32(head), 8} {
		t.Fatalf("after restore: used %v", u)
	}
	if drv2.UsedIdx() != 2 || dev2.Metrics.Requests.Load() != 2 {
		t.Fatalf("restored used index %d, requests %d", drv2.UsedIdx(), dev2.Metrics.Requests.Load())
	}
}
