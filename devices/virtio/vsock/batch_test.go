package vsock

import (
	"context"
	"net"
	"testing"

	"github.com/warrenvm/warren/devices/virtio"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
)

// TestOneInterruptPerPass: one service pass that takes several tx packets
// and answers each on rx (both queues asking for an interrupt) publishes
// them all and raises the shared interrupt line once.
func TestOneInterruptPerPass(t *testing.T) {
	const n = 4
	mem := make(vt.Memory, vt.MemSize)
	svc := map[uint32]func(net.Conn){}
	for i := range n {
		svc[uint32(60+i)] = hold(t)
	}
	dev := &Device{CID: guestCID, BufAlloc: 16, Services: svc}
	irq := vt.NewSignals()
	tr := virtio.NewMMIO("vsock", dev, mem, irq, nil)
	t.Cleanup(tr.Shutdown)
	r := &rig{t: t, mem: mem, tr: tr, dev: dev, rxAddrs: map[uint16]uint64{},
		rx: vt.NewDriver(mem, 0, 16), tx: vt.NewDriver(mem, 1, 16)}
	if st := vt.Bring(tr, devFeatures, r.rx, r.tx, vt.NewDriver(mem, 2, 16)); st&virtio.StatusDriverOK == 0 {
		t.Fatalf("status %#x", st)
	}
	r.offerRx(n)
	vt.Quiet(t, irq, r.rx, r.tx)
	irq.Drain()
	// Quiesced, the device takes nothing: all n requests wait for one pass.
	if err := tr.Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		h := fromGuest(OpRequest, uint32(1000+i), uint32(60+i))
		b := make([]byte, HeaderLen)
		h.Encode(b)
		r.tx.Offer(vt.Buf{Data: b})
	}
	if err := tr.Resume(); err != nil {
		t.Fatal(err)
	}
	vt.WaitUsed(t, r.tx, n)
	for _, h := range r.recv(n) {
		if h.Op != OpResponse {
			t.Fatalf("got %+v, want a RESPONSE", h)
		}
	}
	vt.Quiet(t, nil, r.rx, r.tx)
	if got := irq.Drain(); got != 1 {
		t.Fatalf("%d interrupts for one pass over tx and rx, want 1", got)
	}
}

// TestConnSmallPacketsDoNotAllocate: a connection passing small packets
// through (buffered, then consumed by the host side) reuses its spare
// buffer instead of allocating per packet.
func TestConnSmallPacketsDoNotAllocate(t *testing.T) {
	c := Accept(Header{SrcCID: guestCID, DstCID: CIDHost, SrcPort: 5, DstPort: 6, Type: TypeStream, Op: OpRequest, BufAlloc: 1 << 20}, 1<<20)
	p := make([]byte, 300)
	h := Header{SrcCID: guestCID, DstCID: CIDHost, SrcPort: 5, DstPort: 6, Type: TypeStream, Op: OpRW, Len: uint32(len(p)), BufAlloc: 1 << 20}
	pass := func() {
		c.HandleGuest(h, p)
		c.Consume(len(c.Peek()))
	}
	pass()
	if a := testing.AllocsPerRun(100, pass); a != 0 {
		t.Fatalf("%v allocations per small packet, want 0", a)
	}
	if c.State() != StateEstablished {
		t.Fatalf("state %v", c.State())
	}
}

// TestPayloadInPlace: a tx payload in one buffer is read where it lies in
// guest memory; one split over buffers is gathered, whole.
func TestPayloadInPlace(t *testing.T) {
	var s session
	hdr := make([]byte, HeaderLen)
	data := []byte("hello, world")
	got := s.payloadOf([][]byte{hdr, data}, uint32(len(data)))
	if string(got) != string(data) || &got[0] != &data[0] {
		t.Fatalf("single buffer: %q (in place: %v)", got, len(got) > 0 && &got[0] == &data[0])
	}
	got = s.payloadOf([][]byte{hdr[:10], append(hdr[10:], data[:5]...), data[5:]}, uint32(len(data)))
	if string(got) != string(data) {
		t.Fatalf("split: %q, want %q", got, data)
	}
}
