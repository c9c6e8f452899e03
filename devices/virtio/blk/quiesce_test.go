package blk

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/warrenvm/warren/devices/virtio"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
)

// newQuiesceEnv is newEnv with the interrupts at hand.
func newQuiesceEnv(t *testing.T) (*env, *vt.Signals) {
	t.Helper()
	dev, err := New(newImage(t, 32), Options{ID: "q"})
	if err != nil {
		t.Fatal(err)
	}
	mem := make(vt.Memory, vt.MemSize)
	irq := vt.NewSignals()
	e := &env{dev: dev, tr: virtio.NewMMIO("blk", dev, mem, irq, nil), drv: vt.NewDriver(mem, 0, 64), mem: mem}
	t.Cleanup(func() {
		e.tr.Shutdown()
		e.dev.Close()
	})
	if st := vt.Bring(e.tr, features, e.drv); st&virtio.StatusDriverOK == 0 || st&virtio.StatusNeedsReset != 0 {
		t.Fatalf("status %#x", st)
	}
	return e, irq
}

func TestQuiesceHoldsRequests(t *testing.T) {
	e, irq := newQuiesceEnv(t)
	if err := e.tr.Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	head, addrs := e.drv.Offer(out(hdr(TypeIn, 2)), in(SectorSize), in(1))
	e.tr.Notify(0)
	vt.Quiet(t, irq, e.drv)
	if e.mem[addrs[2]] != 0xee {
		t.Fatal("status byte written while quiesced")
	}
	if err := e.tr.Resume(); err != nil {
		t.Fatal(err)
	}
	if u := waitUsed(t, e.drv, 1); u[0] != [2]uint32{uint32(head), SectorSize + 1} {
		t.Fatalf("used %v", u)
	}
	if e.mem[addrs[2]] != StatusOK || e.mem[addrs[1]] != 3 {
		t.Fatalf("status %d, data %d", e.mem[addrs[2]], e.mem[addrs[1]])
	}
	select {
	case <-irq.C:
	case <-time.After(5 * time.Second):
		t.Fatal("no interrupt after Resume")
	}
}

// TestQuiesceWaitsForRequest: Quiesce waits for the request in progress to
// complete and be pushed; the requests behind it wait for Resume.
func TestQuiesceWaitsForRequest(t *testing.T) {
	e, irq := newQuiesceEnv(t)
	entered, release := make(chan struct{}, 8), make(chan struct{}, 8)
	e.dev.serveHook = func() { entered <- struct{}{}; <-release }
	var heads []uint16
	for i := range 3 {
		h, _ := e.drv.Offer(out(hdr(TypeOut, uint64(i))), out(bytes.Repeat([]byte{0xa0 + byte(i)}, SectorSize)), in(1))
		heads = append(heads, h)
	}
	e.tr.Notify(0)
	<-entered

	vt.QuiesceDuringPass(t, e.tr, release)
	if u := e.drv.Used(); len(u) != 1 || u[0][0] != uint32(heads[0]) {
		t.Fatalf("at the safe point: used %v, want head %d only", u, heads[0])
	}
	irq.Drain()
	vt.Quiet(t, irq, e.drv)
	if w := e.dev.Metrics.Writes.Load(); w != 1 {
		t.Fatalf("%d writes while quiesced, want 1", w)
	}
	release <- struct{}{}
	release <- struct{}{}
	if err := e.tr.Resume(); err != nil {
		t.Fatal(err)
	}
	if u := waitUsed(t, e.drv, 2); u[0][0] != uint32(heads[1]) || u[1][0] != uint32(heads[2]) {
		t.Fatalf("after resume: used %v", u)
	}
}

// TestQuiesceSaveRestore: a snapshot of a running disk, taken while
// quiesced with a request offered but not yet served. The same process
// resumes and serves it; a fresh transport restored over a copy of guest
// memory (taken before Resume) serves it too, and its used ring continues
// where the snapshot left it.
func TestQuiesceSaveRestore(t *testing.T) {
	e, _ := newQuiesceEnv(t)
	data := bytes.Repeat([]byte{0x5a}, SectorSize)
	if _, st, _ := e.do(t, out(hdr(TypeOut, 7)), out(data), in(1)); st != StatusOK {
		t.Fatalf("write: status %d", st)
	}
	if err := e.tr.Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	head, addrs := e.drv.Offer(out(hdr(TypeIn, 7)), in(SectorSize), in(1))
	st := vt.SaveQuiesced(t, e.tr, 0, 1)
	mem2 := e.mem.Clone()
	drv2 := e.drv.Clone(mem2)

	if err := e.tr.Resume(); err != nil {
		t.Fatal(err)
	}
	if u := waitUsed(t, e.drv, 1); u[0] != [2]uint32{uint32(head), SectorSize + 1} || !bytes.Equal(e.mem[addrs[1]:addrs[1]+SectorSize], data) {
		t.Fatalf("after resume: used %v", u)
	}
	e.tr.Shutdown()
	e.dev.Close() // the restored disk takes the image's lock

	dev2, err := New(e.dev.Path(), Options{ID: "q"})
	if err != nil {
		t.Fatal(err)
	}
	tr2 := virtio.NewMMIO("blk", dev2, mem2, vt.NewSignals(), nil)
	defer func() { tr2.Shutdown(); dev2.Close() }()
	if err := tr2.Restore(st); err != nil {
		t.Fatal(err)
	}
	if u := waitUsed(t, drv2, 1); u[0] != [2]uint32{uint32(head), SectorSize + 1} || !bytes.Equal(mem2[addrs[1]:addrs[1]+SectorSize], data) {
		t.Fatalf("after restore: used %v", u)
	}
	e2 := &env{dev: dev2, tr: tr2, drv: drv2, mem: mem2}
	if _, st, _ := e2.do(t, out(hdr(TypeFlush, 0)), in(1)); st != StatusOK {
		t.Fatalf("flush after restore: status %d", st)
	}
	if got := drv2.UsedIdx(); got != 3 {
		t.Fatalf("restored used index %d, want 3", got)
	}
}
