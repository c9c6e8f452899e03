package vsock

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/warrenvm/warren/devices/virtio"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
)

const devFeatures = virtio.FeatureVersion1 | virtio.FeatureEventIdx

type rig struct {
	t       *testing.T
	mem     vt.Memory
	tr      *virtio.MMIO
	dev     *Device
	rx, tx  *vt.Driver
	rxAddrs map[uint16]uint64
}

// hold is a service that keeps its connection open, reading nothing,
// until the test ends.
func hold(t *testing.T) func(net.Conn) {
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	return func(c net.Conn) {
		<-done
		c.Close()
	}
}

func newRig(t *testing.T, services map[uint32]func(net.Conn)) *rig {
	mem := make(vt.Memory, vt.MemSize)
	dev := &Device{CID: guestCID, BufAlloc: 16, Services: services}
	tr := virtio.NewMMIO("vsock", dev, mem, vt.NewSignals(), nil)
	t.Cleanup(tr.Shutdown)
	r := &rig{t: t, mem: mem, tr: tr, dev: dev, rxAddrs: map[uint16]uint64{},
		rx: vt.NewDriver(mem, 0, 16), tx: vt.NewDriver(mem, 1, 16)}
	ev := vt.NewDriver(mem, 2, 16)
	if st := vt.Bring(tr, devFeatures, r.rx, r.tx, ev); st&virtio.StatusDriverOK == 0 || st&virtio.StatusNeedsReset != 0 {
		t.Fatalf("status %#x", st)
	}
	return r
}

// offerRx gives the device n rx buffers of 64 bytes each.
func (r *rig) offerRx(n int) {
	for range n {
		head, addrs := r.rx.Offer(vt.Buf{Len: 64, Writable: true})
		r.rxAddrs[head] = addrs[0]
	}
	r.tr.Notify(queueRx)
}

// send puts one packet on tx, the header split over two buffers to
// exercise gathering, and waits for the device to take it.
func (r *rig) send(h Header, payload string) {
	r.t.Helper()
	h.Len = uint32(len(payload))
	b := make([]byte, HeaderLen)
	h.Encode(b)
	bufs := []vt.Buf{{Data: b[:10]}, {Data: b[10:]}}
	if payload != "" {
		bufs = append(bufs, vt.Buf{Data: []byte(payload)})
	}
	r.tx.Offer(bufs...)
	r.tr.Notify(queueTx)
	vt.WaitUsed(r.t, r.tx, 1)
}

// recv waits for n packets on rx.
func (r *rig) recv(n int) []Header {
	r.t.Helper()
	var out []Header
	for _, u := range vt.WaitUsed(r.t, r.rx, n) {
		if u[1] != HeaderLen {
			r.t.Fatalf("rx used length %d", u[1])
		}
		a := r.rxAddrs[uint16(u[0])]
		h, err := ParseHeader(r.mem[a : a+HeaderLen])
		if err != nil {
			r.t.Fatal(err)
		}
		out = append(out, h)
	}
	return out
}

func (r *rig) noRecv() {
	r.t.Helper()
	time.Sleep(20 * time.Millisecond)
	if u := r.rx.Used(); len(u) != 0 {
		r.t.Fatalf("unexpected rx packets %v", u)
	}
}

func fromGuest(op uint16, src, dst uint32) Header {
	return Header{SrcCID: guestCID, DstCID: CIDHost, SrcPort: src, DstPort: dst, Type: TypeStream, Op: op, BufAlloc: 4096}
}

func TestDeviceConfig(t *testing.T) {
	d := &Device{CID: 0x1122334455667788}
	b := make([]byte, 8)
	d.ReadConfig(0, b)
	if binary.LittleEndian.Uint64(b) != d.CID {
		t.Fatalf("config %x", b)
	}
	b = make([]byte, 4)
	d.ReadConfig(4, b)
	if binary.LittleEndian.Uint32(b) != 0x11223344 {
		t.Fatalf("upper half %x", b)
	}
	d.ReadConfig(6, b)
	if b[0] != 0x22 || b[1] != 0x11 || b[2] != 0 || b[3] != 0 {
		t.Fatalf("straddling read %x", b)
	}
	d.ReadConfig(1<<63, b)
	if b[0] != 0 {
		t.Fatalf("far read %x", b)
	}
	if d.Type() != virtio.TypeVsock || len(d.QueueSizes()) != 3 {
		t.Fatal("type or queues")
	}
}

func TestDeviceConnectAndReset(t *testing.T) {
	r := newRig(t, map[uint32]func(net.Conn){52: hold(t)})
	r.offerRx(6)
	r.send(fromGuest(OpRequest, 1000, 52), "")
	h := r.recv(1)[0]
	if h.Op != OpResponse || h.SrcCID != CIDHost || h.DstCID != guestCID || h.SrcPort != 52 || h.DstPort != 1000 || h.BufAlloc != 16 {
		t.Fatalf("response %+v", h)
	}
	// Data is routed to the connection and credit-checked: 16 bytes fit
	// (and are written to the service's socket, freeing the credit), 17
	// in one packet overrun the buffer and reset.
	r.send(fromGuest(OpRW, 1000, 52), "0123456789abcdef")
	if h := r.recv(1)[0]; h.Op != OpCreditUpdate || h.FwdCnt != 16 {
		t.Fatalf("after 16 bytes: %+v", h)
	}
	r.send(fromGuest(OpRW, 1000, 52), "0123456789abcdefX")
	if h := r.recv(1)[0]; h.Op != OpRst || h.DstPort != 1000 {
		t.Fatalf("overrun answered %+v", h)
	}
	// Refused port, and a packet for no connection, get an RST; an RST
	// for no connection gets nothing.
	r.send(fromGuest(OpRequest, 1001, 53), "")
	r.send(fromGuest(OpRW, 1000, 52), "late")
	for _, h := range r.recv(2) {
		if h.Op != OpRst {
			t.Fatalf("got %+v, want RST", h)
		}
	}
	r.send(fromGuest(OpRst, 1002, 52), "")
	r.noRecv()
	if got := r.dev.Metrics.Resets.Load(); got != 3 {
		t.Errorf("resets %d", got)
	}
}

func TestDeviceDropsBadPackets(t *testing.T) {
	r := newRig(t, map[uint32]func(net.Conn){2: hold(t)})
	r.offerRx(2)
	spoofed := fromGuest(OpRequest, 1, 2)
	spoofed.SrcCID = 7
	r.send(spoofed, "")
	toGuest := fromGuest(OpRequest, 1, 2)
	toGuest.DstCID = 9
	r.send(toGuest, "")
	bad := fromGuest(OpRequest, 1, 2)
	bad.Type = 2
	r.send(bad, "")
	// Header claiming more payload than the chain carries.
	b := make([]byte, HeaderLen)
	h := fromGuest(OpRW, 1, 2)
	h.Len = 100
	h.Encode(b)
	r.tx.Offer(vt.Buf{Data: b})
	r.tr.Notify(queueTx)
	vt.WaitUsed(t, r.tx, 1)
	// Short chain.
	r.tx.Offer(vt.Buf{Data: b[:20]})
	r.tr.Notify(queueTx)
	vt.WaitUsed(t, r.tx, 1)
	r.noRecv()
	if got := r.dev.Metrics.Dropped.Load(); got != 5 {
		t.Errorf("dropped %d, want 5", got)
	}
	if r.tr.Status()&virtio.StatusNeedsReset != 0 {
		t.Error("bad packets broke the device")
	}
}

func TestDeviceWaitsForRxBuffers(t *testing.T) {
	r := newRig(t, map[uint32]func(net.Conn){52: hold(t)})
	r.send(fromGuest(OpRequest, 1000, 52), "")
	r.noRecv()
	r.offerRx(1)
	if h := r.recv(1)[0]; h.Op != OpResponse {
		t.Fatalf("%+v", h)
	}
}

func TestDeviceStrayResetsBounded(t *testing.T) {
	r := newRig(t, nil)
	for i := range maxStrayRst + 10 {
		r.send(fromGuest(OpRequest, uint32(i), 52), "")
	}
	if got := r.dev.Metrics.Dropped.Load(); got != 10 {
		t.Fatalf("dropped %d, want 10", got)
	}
}
