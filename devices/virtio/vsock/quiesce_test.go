package vsock

import (
	"bytes"
	"context"
	"io"
	"maps"
	"net"
	"testing"
	"time"

	"github.com/warrenvm/warren/devices/virtio"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
)

// Packets the guest sends while the device is quiesced are not taken, and
// nothing is put on rx, until Resume.
func TestQuiesceHoldsPackets(t *testing.T) {
	r := newRig(t, map[uint32]func(net.Conn){52: hold(t)})
	r.offerRx(2)
	if err := r.tr.Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	h := fromGuest(OpRequest, 1000, 52)
	b := make([]byte, HeaderLen)
	h.Encode(b)
	r.tx.Offer(vt.Buf{Data: b})
	r.tr.Notify(queueTx)
	vt.Quiet(t, nil, r.tx, r.rx)
	if err := r.tr.Resume(); err != nil {
		t.Fatal(err)
	}
	vt.WaitUsed(t, r.tx, 1)
	if h := r.recv(1)[0]; h.Op != OpResponse {
		t.Fatalf("after resume: %+v", h)
	}
}

// Host data written while the device is quiesced waits (one chunk read by
// the connection's reader, the rest in the host socket) and reaches the
// guest after Resume, whole and in order.
func TestQuiesceHostData(t *testing.T) {
	d, g := sinkGuest(t, true)
	c := dialGuest(t, d, 80)
	g.waitFor("connection", func() bool { gc := g.conn(80, firstEphemeral); return gc != nil && gc.established })
	g.do(func() { g.conn(80, firstEphemeral).keep = true })
	if err := g.tr.Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("0123456789abcdef"), 32<<10) // 512 KiB
	werr := make(chan error, 1)
	go func() { _, err := c.Write(data); werr <- err }()
	time.Sleep(50 * time.Millisecond)
	g.do(func() {
		if n := g.conn(80, firstEphemeral).recv; n != 0 {
			t.Errorf("guest got %d bytes while quiesced", n)
		}
	})
	if n := d.Metrics.BytesToGuest.Load(); n != 0 {
		t.Fatalf("%d bytes to the guest while quiesced", n)
	}
	if err := g.tr.Resume(); err != nil {
		t.Fatal(err)
	}
	g.waitFor("host data after resume", func() bool { return g.conn(80, firstEphemeral).recv == len(data) })
	g.do(func() {
		if !bytes.Equal(g.conn(80, firstEphemeral).data, data) {
			t.Error("data corrupted or reordered across the quiesce")
		}
	})
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
}

// guestSnap is a fake guest frozen at a snapshot: the device's transport
// state and the guest's memory and driver state, copied.
type guestSnap struct {
	st         virtio.TransportState
	mem        vt.Memory
	rx, tx, ev *vt.Driver
	rxLen      int
	txFree     []uint16
	rxHeld     []uint16
	listen     map[uint32]int
}

// snapshot quiesces g's device with the guest stopped (on its loop
// goroutine, as a paused VM), saves it, copies guest memory and the
// guest's state, and resumes.
func (g *fakeGuest) snapshot() guestSnap {
	g.t.Helper()
	var s guestSnap
	g.do(func() {
		if err := g.tr.Quiesce(context.Background()); err != nil {
			g.t.Fatal(err)
		}
		st, err := g.tr.Save()
		if err != nil {
			g.t.Fatal(err)
		}
		mem := g.mem.Clone()
		s = guestSnap{st: st, mem: mem, rx: g.rx.Clone(mem), tx: g.tx.Clone(mem), ev: g.ev.Clone(mem),
			rxLen: g.rxLen, txFree: append([]uint16(nil), g.txFree...), rxHeld: append([]uint16(nil), g.rxHeld...),
			listen: maps.Clone(g.listen)}
		if err := g.tr.Resume(); err != nil {
			g.t.Fatal(err)
		}
	})
	return s
}

// restoreGuest restores s into a fresh transport for dev over s's memory
// and runs the guest from there. The guest starts without connections, as
// Linux drops its sockets on the TRANSPORT_RESET the restorer sends.
func restoreGuest(t *testing.T, dev *Device, s guestSnap) *fakeGuest {
	t.Helper()
	tr := virtio.NewMMIO("vsock", dev, s.mem, vt.NewSignals(), nil)
	g := &fakeGuest{t: t, mem: s.mem, tr: tr, dev: dev, rxLen: s.rxLen, rx: s.rx, tx: s.tx, ev: s.ev,
		txFree: s.txFree, rxHeld: s.rxHeld, listen: s.listen, conns: map[Key]*gconn{},
		cmds: make(chan func()), stop: make(chan struct{}), done: make(chan struct{})}
	g.postRx.Store(true)
	if err := tr.Restore(s.st); err != nil {
		t.Fatal(err)
	}
	g.run()
	return g
}

// TestQuiesceSaveRestore snapshots a device with a connection open. The
// VM goes on in the same process, connection and all. A fresh device
// restored from the snapshot over a copy of guest memory, after
// TransportReset, gives the guest the TRANSPORT_RESET event and serves a
// new connection.
func TestQuiesceSaveRestore(t *testing.T) {
	d, g := sinkGuest(t, true)
	c := dialGuest(t, d, 80)
	io.WriteString(c, "hello")
	g.waitFor("data before the snapshot", func() bool { gc := g.conn(80, firstEphemeral); return gc != nil && gc.recv == 5 })

	s := g.snapshot()
	if len(s.st.Device) == 0 || s.st.Queues[queueEvent].NextAvail != 0 {
		t.Fatalf("saved %+v", s.st)
	}

	// At the safe point every chain taken had been returned, and the
	// saved progress matched the rings in the copied memory.
	for i, d := range []*vt.Driver{s.rx, s.tx, s.ev} {
		q := s.st.Queues[i]
		if q.NextUsed != q.NextAvail || d.UsedIdx() != q.NextUsed {
			t.Errorf("queue %d: saved next avail %d, next used %d; used index in memory %d", i, q.NextAvail, q.NextUsed, d.UsedIdx())
		}
	}

	// The same process: the connection goes on.
	io.WriteString(c, " again")
	g.waitFor("data after resume", func() bool { return g.conn(80, firstEphemeral).recv == 11 })

	// A new device restored from the snapshot (its CID from the state).
	d2 := hostDevice(t)
	g2 := restoreGuest(t, d2, s)
	if d2.CID != guestCID {
		t.Fatalf("restored CID %d", d2.CID)
	}
	d2.TransportReset()
	g2.waitFor("TRANSPORT_RESET event", func() bool { return len(g2.events) == 1 })
	g2.do(func() {
		if g2.events[0] != eventTransportReset {
			t.Errorf("event id %d", g2.events[0])
		}
		if i := g2.ev.UsedIdx(); i != 1 {
			t.Errorf("event used index %d", i)
		}
	})
	c2 := dialGuest(t, d2, 80)
	io.WriteString(c2, "restored")
	// It takes the next host port, not the one the saved guest's
	// connection had (its socket may still be around in the guest).
	g2.waitFor("data on a new connection after restore", func() bool {
		gc := g2.conn(80, firstEphemeral+1)
		return gc != nil && gc.recv == 8
	})
	g2.do(func() {
		if g2.conn(80, firstEphemeral) != nil {
			t.Error("the restored device reused the saved connection's host port")
		}
	})
}
