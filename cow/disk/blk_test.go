package disk

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"

	"github.com/warrenvm/warren/devices/virtio"
	"github.com/warrenvm/warren/devices/virtio/blk"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
)

// guest drives a virtio-blk disk through its transport with the fake
// driver.
type guest struct {
	t   *testing.T
	tr  *virtio.MMIO
	drv *vt.Driver
	mem vt.Memory
}

// do sends one request (header type and sector, then bufs) and returns
// its status, and the data of a read of n bytes.
func (g *guest) do(typ uint32, sector uint64, data []byte, readLen int) (byte, []byte) {
	g.t.Helper()
	h := make([]byte, 16)
	binary.LittleEndian.PutUint32(h, typ)
	binary.LittleEndian.PutUint64(h[8:], sector)
	bufs := []vt.Buf{{Data: h}}
	if data != nil {
		bufs = append(bufs, vt.Buf{Data: data[:len(data)/2]}, vt.Buf{Data: data[len(data)/2:]})
	}
	if readLen > 0 {
		bufs = append(bufs, vt.Buf{Len: readLen, Writable: true})
	}
	bufs = append(bufs, vt.Buf{Len: 1, Writable: true})
	head, addrs := g.drv.Offer(bufs...)
	g.tr.Notify(0)
	if u := vt.WaitUsed(g.t, g.drv, 1); u[0][0] != uint32(head) {
		g.t.Fatalf("used %v, want head %d", u, head)
	}
	st := g.mem[addrs[len(addrs)-1]]
	if readLen > 0 {
		a := addrs[len(addrs)-2]
		return st, bytes.Clone(g.mem[a : a+uint64(readLen)])
	}
	return st, nil
}

// TestBlkFork runs a virtio-blk disk on a writable raw image, forks it
// under the running device (quiesce, Fork, SwapBackend, resume), and
// checks that the guest goes on over the parent's overlay (reads,
// writes, flush, discard) while a child sees the disk as it was.
func TestBlkFork(t *testing.T) {
	const size = 2 << 20
	dir := t.TempDir()
	base := writeBase(t, dir, "disk.img", pattern(size, 11))
	r, err := OpenRaw(base, true)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := blk.NewWithBackend(r, base, blk.Options{ID: "fork"})
	if err != nil {
		t.Fatal(err)
	}
	mem := make(vt.Memory, vt.MemSize)
	g := &guest{t: t, tr: virtio.NewMMIO("blk", dev, mem, vt.NewSignals(), nil), drv: vt.NewDriver(mem, 0, 64), mem: mem}
	defer func() { g.tr.Shutdown(); dev.Close() }()
	feat := uint64(virtio.FeatureVersion1 | virtio.FeatureEventIdx | blk.FeatureFlush | blk.FeatureDiscard)
	if st := vt.Bring(g.tr, feat, g.drv); st&virtio.StatusDriverOK == 0 {
		t.Fatalf("status %#x", st)
	}
	model := pattern(size, 11)
	a := bytes.Repeat([]byte{0xa1}, 2*blk.SectorSize)
	if st, _ := g.do(blk.TypeOut, 10, a, 0); st != blk.StatusOK {
		t.Fatalf("write: status %d", st)
	}
	copy(model[10*blk.SectorSize:], a)

	if err := g.tr.Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	parent, kids, err := Fork(dev.Backend().(*Raw), 1, dir)
	if err != nil {
		t.Fatal(err)
	}
	if old, err := dev.SwapBackend(parent); err != nil || old != blk.Backend(r) {
		t.Fatalf("swap: %v", err)
	}
	if err := g.tr.Resume(); err != nil {
		t.Fatal(err)
	}

	pm := bytes.Clone(model)
	b := bytes.Repeat([]byte{0xb2}, 3*blk.SectorSize)
	if st, _ := g.do(blk.TypeOut, 11, b, 0); st != blk.StatusOK {
		t.Fatalf("write after fork: status %d", st)
	}
	copy(pm[11*blk.SectorSize:], b)
	if st, got := g.do(blk.TypeIn, 8, nil, 8*blk.SectorSize); st != blk.StatusOK || !bytes.Equal(got, pm[8*blk.SectorSize:16*blk.SectorSize]) {
		t.Fatalf("read after fork: status %d", st)
	}
	if st, _ := g.do(blk.TypeFlush, 0, nil, 0); st != blk.StatusOK || parent.Metrics.Syncs.Load() == 0 {
		t.Fatalf("flush after fork: status %d, %d syncs", st, parent.Metrics.Syncs.Load())
	}
	seg := make([]byte, 16)
	binary.LittleEndian.PutUint64(seg, 256) // 128 KiB at 128 KiB: two whole blocks
	binary.LittleEndian.PutUint32(seg[8:], 256)
	if st, _ := g.do(blk.TypeDiscard, 0, seg, 0); st != blk.StatusOK || parent.Metrics.ZeroedBlocks.Load() != 2 {
		t.Fatalf("discard after fork: status %d, %d zeroed blocks", st, parent.Metrics.ZeroedBlocks.Load())
	}
	clear(pm[128<<10 : 256<<10])
	checkView(t, parent, pm, false)
	checkView(t, r, model, false)

	k, err := OpenChain(kids[0], false)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	checkView(t, k, model, true)
}
