package rng

import (
	"bytes"
	"testing"
	"time"

	"github.com/warrenvm/warren/devices/virtio"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
)

const features = virtio.FeatureVersion1 | virtio.FeatureEventIdx

func waitUsed(t *testing.T, d *vt.Driver, n int) [][2]uint32 { return vt.WaitUsed(t, d, n) }

func TestEntropyRequest(t *testing.T) {
	mem := make(vt.Memory, vt.MemSize)
	dev := New()
	irq := vt.NewSignals()
	tr := virtio.NewMMIO("rng", dev, mem, irq, nil)
	defer tr.Shutdown()
	drv := vt.NewDriver(mem, 0, 8)
	if st := vt.Bring(tr, features, drv); st&virtio.StatusDriverOK == 0 || st&virtio.StatusNeedsReset != 0 {
		t.Fatalf("status %#x", st)
	}
	head, addrs := drv.Offer(vt.Buf{Len: 64, Writable: true})
	vt.Write32(tr, 0x050, 0) // QueueNotify
	used := waitUsed(t, drv, 1)
	if used[0] != [2]uint32{uint32(head), 64} {
		t.Fatalf("used %v", used)
	}
	if bytes.Equal(mem[addrs[0]:addrs[0]+64], make([]byte, 64)) {
		t.Error("buffer still zero")
	}
	select {
	case <-irq.C:
	case <-time.After(5 * time.Second):
		t.Fatal("no interrupt")
	}
	if vt.Read32(tr, 0x060)&1 == 0 {
		t.Error("InterruptStatus lacks the used-buffer bit")
	}
	if dev.Metrics.Bytes.Load() != 64 {
		t.Errorf("metrics bytes %d", dev.Metrics.Bytes.Load())
	}
}

func TestMalformedChainNeedsReset(t *testing.T) {
	mem := make(vt.Memory, vt.MemSize)
	tr := virtio.NewMMIO("rng", New(), mem, vt.NewSignals(), nil)
	defer tr.Shutdown()
	drv := vt.NewDriver(mem, 0, 8)
	vt.Bring(tr, features, drv)
	drv.PutDesc(0, vt.BufBase, 16, 1|2, 0) // loops onto itself
	drv.Publish(0)
	tr.Notify(0)
	deadline := time.Now().Add(5 * time.Second)
	for tr.Status()&virtio.StatusNeedsReset == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if tr.Status()&virtio.StatusNeedsReset == 0 {
		t.Fatal("device not marked NEEDS_RESET")
	}
	// A reset by the driver brings it back. The rings are cleared after
	// the reset: the first driver's avail index still points at the
	// looping chain, which the device would read again as soon as the new
	// driver sets DRIVER_OK, before it offers its own buffer (seen under
	// load).
	vt.Write32(tr, 0x070, 0) // Status: reset
	clear(mem)
	drv2 := vt.NewDriver(mem, 0, 8)
	if st := vt.Bring(tr, features, drv2); st&virtio.StatusNeedsReset != 0 || st&virtio.StatusDriverOK == 0 {
		t.Fatalf("after reset: status %#x", st)
	}
	drv2.Offer(vt.Buf{Len: 8, Writable: true})
	tr.Notify(0)
	waitUsed(t, drv2, 1)
}

func TestFeatureNegotiation(t *testing.T) {
	mem := make(vt.Memory, vt.MemSize)
	tr := virtio.NewMMIO("rng", New(), mem, vt.NewSignals(), nil)
	// Without VERSION_1 FEATURES_OK must not stick.
	if st := vt.Bring(tr, virtio.FeatureEventIdx); st&virtio.StatusFeaturesOK != 0 {
		t.Errorf("legacy driver accepted: status %#x", st)
	}
	// Features the device did not offer are refused.
	if st := vt.Bring(tr, virtio.FeatureVersion1|1<<40); st&virtio.StatusFeaturesOK != 0 {
		t.Errorf("unoffered feature accepted: status %#x", st)
	}
	if vt.Read32(tr, 0) != 0x74726976 || vt.Read32(tr, 4) != 2 || vt.Read32(tr, 8) != virtio.TypeRNG {
		t.Error("identification registers")
	}
}

func TestSaveRestore(t *testing.T) {
	mem := make(vt.Memory, vt.MemSize)
	dev := New()
	tr := virtio.NewMMIO("rng", dev, mem, vt.NewSignals(), nil)
	drv := vt.NewDriver(mem, 0, 8)
	vt.Bring(tr, features, drv)
	drv.Offer(vt.Buf{Len: 16, Writable: true})
	tr.Notify(0)
	waitUsed(t, drv, 1)
	tr.Shutdown() // quiesce, as a paused VM would be
	st, err := tr.Save()
	if err != nil {
		t.Fatal(err)
	}
	if st.Queues[0].NextAvail != 1 || st.Queues[0].NextUsed != 1 || st.Status&virtio.StatusDriverOK == 0 {
		t.Fatalf("saved %+v", st)
	}

	dev2 := New()
	tr2 := virtio.NewMMIO("rng", dev2, mem, vt.NewSignals(), nil)
	defer tr2.Shutdown()
	if err := tr2.Restore(st); err != nil {
		t.Fatal(err)
	}
	if dev2.Metrics.Bytes.Load() != 16 {
		t.Errorf("restored counter %d", dev2.Metrics.Bytes.Load())
	}
	drv.Offer(vt.Buf{Len: 8, Writable: true})
	tr2.Notify(0)
	if u := waitUsed(t, drv, 1); u[0][1] != 8 {
		t.Errorf("after restore: used %v", u)
	}

	bad := st
	bad.Version = 99
	if err := virtio.NewMMIO("rng", New(), mem, nil, nil).Restore(bad); err == nil {
		t.Error("wrong version accepted")
	}
	bad = st
	bad.DeviceType = virtio.TypeBlock
	if err := virtio.NewMMIO("rng", New(), mem, nil, nil).Restore(bad); err == nil {
		t.Error("wrong device type accepted")
	}
	bad = st
	bad.Queues = append([]virtio.QueueState(nil), st.Queues...)
	bad.Queues[0].Desc = vt.MemSize + 0x1000
	if err := virtio.NewMMIO("rng", New(), mem, nil, nil).Restore(bad); err == nil {
		t.Error("queue outside RAM accepted")
	}
}
