package vnet

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"net"
	"testing"
	"time"

	"github.com/warrenvm/warren/devices/virtio"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
	"github.com/warrenvm/warren/internal/kvmtest"
)

var hostMAC = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x02}

func TestConfigAndFeatures(t *testing.T) {
	b, _ := fakeTap(t)
	r := newRig(t, b, featMrg)
	cfg := make([]byte, 8)
	r.tr.Read(0x100, cfg)
	if !bytes.Equal(cfg[:6], guestMAC) || binary.LittleEndian.Uint16(cfg[6:]) != StatusLinkUp {
		t.Fatalf("config % x", cfg)
	}
	one := make([]byte, 1)
	r.tr.Read(0x100+5, one)
	if one[0] != guestMAC[5] {
		t.Errorf("byte read of mac[5]: %#x", one[0])
	}
	if vt.Read32(r.tr, 8) != virtio.TypeNet {
		t.Error("device ID")
	}
	if _, err := NewBackend(b, net.HardwareAddr{1, 0, 0, 0, 0, 1}, Options{}); err == nil {
		t.Error("multicast MAC accepted")
	}
	if _, err := NewBackend(b, guestMAC, Options{QueueSize: 100}); err == nil {
		t.Error("queue size 100 accepted")
	}
}

func TestTransmit(t *testing.T) {
	b, peer := fakeTap(t)
	r := newRig(t, b, featMrg)
	f := frame(hostMAC, guestMAC, 100, 1)
	pkt := withHeader(f)
	head, _ := r.tx.Offer(vt.Buf{Data: pkt[:5]}, vt.Buf{Data: pkt[5:40]}, vt.Buf{Data: pkt[40:]})
	r.tr.Notify(txQueue)
	got := make([]byte, 70000)
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := peer.Read(got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:HeaderLen], make([]byte, HeaderLen)) || !bytes.Equal(got[HeaderLen:n], f) {
		t.Fatalf("backend got % x", got[:n])
	}
	if u := waitUsed(t, r.tx, 1); u[0] != [2]uint32{uint32(head), 0} {
		t.Fatalf("used %v", u)
	}
	kvmtest.WaitFor(t, 5*time.Second, "metrics", func() bool { return r.dev.Metrics.TxPackets.Load() == 1 })
	if r.dev.Metrics.TxBytes.Load() != 100 {
		t.Errorf("tx bytes %d", r.dev.Metrics.TxBytes.Load())
	}
	// A runt frame is dropped, not a driver fault.
	r.tx.Offer(vt.Buf{Data: withHeader([]byte{1, 2, 3})})
	r.tr.Notify(txQueue)
	waitUsed(t, r.tx, 1)
	if r.dev.Metrics.TxDrops.Load() != 1 || r.tr.Status()&virtio.StatusNeedsReset != 0 {
		t.Errorf("runt: drops %d status %#x", r.dev.Metrics.TxDrops.Load(), r.tr.Status())
	}
}

func TestReceive(t *testing.T) {
	for _, tc := range []struct {
		name     string
		features uint64
	}{{"mergeable", featMrg}, {"single", featNoMrg}} {
		t.Run(tc.name, func(t *testing.T) {
			b, peer := fakeTap(t)
			r := newRig(t, b, tc.features)
			head, addrs := r.rx.Offer(vt.Buf{Len: 4, Writable: true}, vt.Buf{Len: 2000, Writable: true})
			r.tr.Notify(rxQueue)
			f := frame(guestMAC, hostMAC, 60, 7)
			if _, err := peer.Write(withHeader(f)); err != nil {
				t.Fatal(err)
			}
			if u := waitUsed(t, r.rx, 1); u[0] != [2]uint32{uint32(head), uint32(HeaderLen + len(f))} {
				t.Fatalf("used %v", u)
			}
			got := append(append([]byte(nil), r.mem[addrs[0]:addrs[0]+4]...), r.mem[addrs[1]:addrs[1]+uint64(HeaderLen-4+len(f))]...)
			want := append([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0}, f...)
			if !bytes.Equal(got, want) {
				t.Fatalf("guest got % x\nwant % x", got, want)
			}
			select {
			case <-r.irq.C:
			case <-time.After(5 * time.Second):
				t.Fatal("no interrupt")
			}
			if r.dev.Metrics.RxPackets.Load() != 1 || r.dev.Metrics.RxBytes.Load() != 60 {
				t.Errorf("metrics %d packets %d bytes", r.dev.Metrics.RxPackets.Load(), r.dev.Metrics.RxBytes.Load())
			}
		})
	}
}

// A frame larger than one buffer spans several with MRG_RXBUF, published to
// the driver at once.
func TestReceiveMerged(t *testing.T) {
	b, peer := fakeTap(t)
	r := newRig(t, b, featMrg)
	h0, a0 := r.rx.Offer(vt.Buf{Len: 1024, Writable: true})
	r.tr.Notify(rxQueue)
	f := frame(guestMAC, hostMAC, 3000, 3)
	if _, err := peer.Write(withHeader(f)); err != nil {
		t.Fatal(err)
	}
	kvmtest.WaitFor(t, 5*time.Second, "frame read", func() bool { return b.reads.Load() >= 1 })
	time.Sleep(20 * time.Millisecond)
	if len(r.rx.Used()) != 0 {
		t.Fatal("partial frame delivered")
	}
	h1, a1 := r.rx.Offer(vt.Buf{Len: 1024, Writable: true})
	h2, a2 := r.rx.Offer(vt.Buf{Len: 1024, Writable: true})
	r.tr.Notify(rxQueue)
	u := waitUsed(t, r.rx, 3)
	want := [][2]uint32{{uint32(h0), 1024}, {uint32(h1), 1024}, {uint32(h2), uint32(HeaderLen + 3000 - 2048)}}
	for i := range want {
		if u[i] != want[i] {
			t.Fatalf("used %v, want %v", u, want)
		}
	}
	var got []byte
	for _, a := range []uint64{a0[0], a1[0], a2[0]} {
		got = append(got, r.mem[a:a+1024]...)
	}
	if n := binary.LittleEndian.Uint16(got[10:]); n != 3 {
		t.Errorf("num_buffers %d", n)
	}
	if !bytes.Equal(got[HeaderLen:HeaderLen+3000], f) {
		t.Error("frame corrupted")
	}
}

// With too few buffers for a merged frame deliver takes nothing and, with
// event-idx, asks for a kick at the driver's current available index: the
// driver is past the chains deliver gave back and would never kick for an
// index behind it.
func TestDeliverWaitsForBuffers(t *testing.T) {
	b, _ := fakeTap(t)
	dev, err := NewBackend(b, guestMAC, Options{})
	if err != nil {
		t.Fatal(err)
	}
	mem := make(vt.Memory, vt.MemSize)
	drv := vt.NewDriver(mem, 0, 16)
	drv.Q.EventIdx = true
	drv.Offer(vt.Buf{Len: 1024, Writable: true})
	drv.Offer(vt.Buf{Len: 1024, Writable: true})
	pkt := withHeader(frame(guestMAC, hostMAC, 3000, 0))
	res, err := dev.deliver(mem, drv.Q, pkt, true)
	if err != nil || res != rxWait {
		t.Fatalf("deliver: %v, %v; want rxWait", res, err)
	}
	if drv.Q.NextAvail != 0 {
		t.Errorf("chains kept: next avail %d", drv.Q.NextAvail)
	}
	if ev := binary.LittleEndian.Uint16(mem[drv.Q.Used+4+8*16:]); ev != 2 {
		t.Errorf("avail_event %d, want 2", ev)
	}
	drv.Offer(vt.Buf{Len: 1024, Writable: true})
	if res, err := dev.deliver(mem, drv.Q, pkt, true); err != nil || res != rxDone {
		t.Fatalf("deliver: %v, %v; want rxDone", res, err)
	}
	if u := drv.Used(); len(u) != 3 {
		t.Fatalf("used %v", u)
	}
	// Frames no ring of this size can hold are dropped, chains given back.
	big := withHeader(frame(guestMAC, hostMAC, 60000, 0))
	for range 16 {
		drv.Offer(vt.Buf{Len: 12, Writable: true})
	}
	if res, err := dev.deliver(mem, drv.Q, big, true); err != nil || res != rxDropped || drv.Q.NextAvail != 3 {
		t.Fatalf("deliver: %v, %v, next avail %d; want rxDropped", res, err, drv.Q.NextAvail)
	}
}

// Without buffers the device reads exactly one frame from the backend and
// holds it; the rest wait in the backend. Posting buffers resumes delivery
// in order.
func TestReceiveBackpressure(t *testing.T) {
	b, peer := fakeTap(t)
	r := newRig(t, b, featMrg)
	const n = 10
	for i := range n {
		if _, err := peer.Write(withHeader(frame(guestMAC, hostMAC, 100, byte(i)))); err != nil {
			t.Fatal(err)
		}
	}
	kvmtest.WaitFor(t, 5*time.Second, "first read", func() bool { return b.reads.Load() >= 1 })
	time.Sleep(50 * time.Millisecond)
	if got := b.reads.Load(); got != 1 {
		t.Fatalf("%d reads without guest buffers, want 1", got)
	}
	var addrs []uint64
	for range n {
		_, a := r.rx.Offer(vt.Buf{Len: 1526, Writable: true})
		addrs = append(addrs, a[0])
	}
	r.tr.Notify(rxQueue)
	r.wantFrames(t, addrs, 100)
}

// Without MRG_RXBUF a frame larger than the guest's buffer is dropped and
// the buffer is kept for the next frame.
func TestReceiveTooLarge(t *testing.T) {
	b, peer := fakeTap(t)
	r := newRig(t, b, featNoMrg)
	head, _ := r.rx.Offer(vt.Buf{Len: 200, Writable: true})
	r.tr.Notify(rxQueue)
	peer.Write(withHeader(frame(guestMAC, hostMAC, 500, 0)))
	peer.Write(withHeader(frame(guestMAC, hostMAC, 100, 0)))
	if u := waitUsed(t, r.rx, 1); u[0] != [2]uint32{uint32(head), HeaderLen + 100} {
		t.Fatalf("used %v", u)
	}
	if r.dev.Metrics.RxDrops.Load() != 1 {
		t.Errorf("drops %d", r.dev.Metrics.RxDrops.Load())
	}
}

func TestMalformedNeedsReset(t *testing.T) {
	b, peer := fakeTap(t)
	r := newRig(t, b, featMrg)
	cases := []struct {
		name  string
		queue int
		bufs  []vt.Buf
	}{
		{"tx without header", txQueue, []vt.Buf{{Data: []byte{0, 0, 0, 0}}}},
		{"tx writable buffer", txQueue, []vt.Buf{{Data: make([]byte, 40)}, {Len: 8, Writable: true}}},
		{"tx oversized frame", txQueue, []vt.Buf{{Data: make([]byte, HeaderLen+MaxFrame+1)}}},
		{"rx readable buffer", rxQueue, []vt.Buf{{Data: make([]byte, 8)}, {Len: 2000, Writable: true}}},
		{"rx buffer smaller than header", rxQueue, []vt.Buf{{Len: 8, Writable: true}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r.bring(t, featMrg)
			d := r.tx
			if tc.queue == rxQueue {
				d = r.rx
				peer.Write(withHeader(frame(guestMAC, hostMAC, 60, 0)))
			}
			d.Offer(tc.bufs...)
			r.tr.Notify(uint32(tc.queue))
			kvmtest.WaitFor(t, 5*time.Second, "NEEDS_RESET", func() bool { return r.tr.Status()&virtio.StatusNeedsReset != 0 })
		})
	}
	// After a reset the device works again.
	r.bring(t, featMrg)
	r.tx.Offer(vt.Buf{Data: withHeader(frame(hostMAC, guestMAC, 60, 0))})
	r.tr.Notify(txQueue)
	waitUsed(t, r.tx, 1)
}

// Reset returns promptly whether the receive goroutine is blocked reading
// the backend or holding a frame without buffers, and the device can be
// brought up again.
func TestResetPrompt(t *testing.T) {
	b, peer := fakeTap(t)
	r := newRig(t, b, featMrg)
	timed := func(what string) {
		start := time.Now()
		r.dev.Reset()
		if d := time.Since(start); d > time.Second {
			t.Errorf("Reset %s took %v", what, d)
		}
	}
	time.Sleep(10 * time.Millisecond) // let the goroutines block
	timed("while reading")
	r.bring(t, featMrg)
	peer.Write(withHeader(frame(guestMAC, hostMAC, 60, 0)))
	kvmtest.WaitFor(t, 5*time.Second, "frame read", func() bool { return b.reads.Load() >= 2 })
	timed("while holding a frame")
	r.bring(t, featMrg)
	r.rx.Offer(vt.Buf{Len: 1526, Writable: true})
	r.tr.Notify(rxQueue)
	peer.Write(withHeader(frame(guestMAC, hostMAC, 60, 9)))
	waitUsed(t, r.rx, 1)
}

func TestSaveRestore(t *testing.T) {
	b, peer := fakeTap(t)
	r := newRig(t, b, featMrg)
	r.tx.Offer(vt.Buf{Data: withHeader(frame(hostMAC, guestMAC, 80, 0))})
	r.tr.Notify(txQueue)
	waitUsed(t, r.tx, 1)
	got := make([]byte, 200)
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := peer.Read(got); err != nil {
		t.Fatal(err)
	}
	r.tr.Shutdown() // quiesce, as a paused VM would be
	st, err := r.tr.Save()
	if err != nil {
		t.Fatal(err)
	}
	var saved state
	if err := json.Unmarshal(st.Device, &saved); err != nil || saved.Tap != "fake0" || saved.MAC != guestMAC.String() || saved.TxPackets.Load() != 1 {
		t.Fatalf("saved %s (%v)", st.Device, err)
	}

	// Restore onto a new device on the same backend identity.
	b2, peer2 := fakeTap(t)
	dev2, err := NewBackend(b2, guestMAC, Options{QueueSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer dev2.Close()
	tr2 := virtio.NewMMIO("net", dev2, r.mem, vt.NewSignals(), nil)
	defer tr2.Shutdown()
	if err := tr2.Restore(st); err != nil {
		t.Fatal(err)
	}
	if dev2.Metrics.TxPackets.Load() != 1 || dev2.Metrics.TxBytes.Load() != 80 {
		t.Errorf("restored counters %d %d", dev2.Metrics.TxPackets.Load(), dev2.Metrics.TxBytes.Load())
	}
	r.tx.Offer(vt.Buf{Data: withHeader(frame(hostMAC, guestMAC, 90, 0))})
	tr2.Notify(txQueue)
	peer2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := peer2.Read(got); err != nil || n != HeaderLen+90 {
		t.Fatalf("after restore: read %d, %v", n, err)
	}

	// Identity mismatches are refused.
	devMAC, _ := NewBackend(b2, net.HardwareAddr{2, 0, 0, 0, 0, 9}, Options{})
	if err := devMAC.RestoreState(st.Device); err == nil {
		t.Error("state for another MAC accepted")
	} else {
		t.Log(err)
	}
	devTap, _ := NewBackend(namedBackend{b2, "tap9"}, guestMAC, Options{})
	if err := devTap.RestoreState(st.Device); err == nil {
		t.Error("state for another tap accepted")
	} else {
		t.Log(err)
	}
	// A fork child's device takes the state with its own tap and MAC.
	devFork, _ := NewBackend(namedBackend{b2, "tap9"}, net.HardwareAddr{2, 0, 0, 0, 0, 9}, Options{NewIdentity: true})
	if err := devFork.RestoreState(st.Device); err != nil {
		t.Errorf("a fork child's device refused its parent's state: %v", err)
	} else if devFork.Metrics.TxPackets.Load() != 1 || devFork.mac.String() != "02:00:00:00:00:09" {
		t.Errorf("fork child: counters %d, MAC %s", devFork.Metrics.TxPackets.Load(), devFork.mac)
	}
	bad := append(json.RawMessage(nil), st.Device...)
	bad = bytes.Replace(bad, []byte(`"version":1`), []byte(`"version":7`), 1)
	if err := dev2.RestoreState(bad); err == nil {
		t.Error("state version 7 accepted")
	}
}

// namedBackend renames a backend.
type namedBackend struct {
	Backend
	name string
}

func (n namedBackend) Name() string { return n.name }
