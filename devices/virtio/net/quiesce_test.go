package vnet

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/warrenvm/warren/devices/virtio"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
	"github.com/warrenvm/warren/internal/kvmtest"
)

// noFrame checks that nothing reaches the backend's peer for a while.
func noFrame(t *testing.T, peer *os.File) {
	t.Helper()
	peer.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	if n, err := peer.Read(make([]byte, 2000)); err == nil {
		t.Fatalf("the backend got a %d-byte packet while quiesced", n)
	}
}

func readFrame(t *testing.T, peer *os.File) []byte {
	t.Helper()
	b := make([]byte, 2000)
	peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := peer.Read(b)
	if err != nil {
		t.Fatal(err)
	}
	return b[:n]
}

// Frames the host sends while the device is quiesced wait: the receive
// goroutine reads one and holds it, the others stay in the backend; after
// Resume all are delivered, in order.
func TestQuiesceReceive(t *testing.T) {
	b, peer := fakeTap(t)
	r := newRig(t, b, featMrg)
	const n = 5
	var addrs []uint64
	for range n {
		_, a := r.rx.Offer(vt.Buf{Len: 1526, Writable: true})
		addrs = append(addrs, a[0])
	}
	r.tr.Notify(rxQueue)
	kvmtest.WaitFor(t, 5*time.Second, "a pending backend read", func() bool { return b.reads.Load() >= 1 })
	time.Sleep(10 * time.Millisecond)
	if err := r.tr.Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := b.reads.Load()
	for i := range n {
		if _, err := peer.Write(withHeader(frame(guestMAC, hostMAC, 100, byte(i)))); err != nil {
			t.Fatal(err)
		}
	}
	vt.Quiet(t, r.irq, r.rx, r.tx)
	// The read pending at Quiesce took the first frame; no other began.
	if got := b.reads.Load(); got != before {
		t.Fatalf("%d backend reads while quiesced, want none beyond the one pending", got-before)
	}
	if err := r.tr.Resume(); err != nil {
		t.Fatal(err)
	}
	r.wantFrames(t, addrs, 100)
}

// A frame with no receive buffer is held across a quiesce; buffers posted
// while quiesced are used after Resume.
func TestQuiesceReceiveWaitingForBuffers(t *testing.T) {
	b, peer := fakeTap(t)
	r := newRig(t, b, featMrg)
	if _, err := peer.Write(withHeader(frame(guestMAC, hostMAC, 60, 3))); err != nil {
		t.Fatal(err)
	}
	kvmtest.WaitFor(t, 5*time.Second, "the frame read", func() bool { return b.reads.Load() >= 1 })
	time.Sleep(10 * time.Millisecond)
	if err := r.tr.Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, a := r.rx.Offer(vt.Buf{Len: 1526, Writable: true})
	r.tr.Notify(rxQueue)
	vt.Quiet(t, r.irq, r.rx, r.tx)
	if err := r.tr.Resume(); err != nil {
		t.Fatal(err)
	}
	waitUsed(t, r.rx, 1)
	if !bytes.Equal(r.mem[a[0]+HeaderLen:a[0]+HeaderLen+60], frame(guestMAC, hostMAC, 60, 3)) {
		t.Fatal("held frame lost")
	}
}

func TestQuiesceTransmit(t *testing.T) {
	b, peer := fakeTap(t)
	r := newRig(t, b, featMrg)
	if err := r.tr.Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	f := frame(hostMAC, guestMAC, 90, 4)
	head, _ := r.tx.Offer(vt.Buf{Data: withHeader(f)})
	r.tr.Notify(txQueue)
	vt.Quiet(t, r.irq, r.rx, r.tx)
	noFrame(t, peer)
	if err := r.tr.Resume(); err != nil {
		t.Fatal(err)
	}
	if got := readFrame(t, peer); !bytes.Equal(got[HeaderLen:], f) {
		t.Fatalf("backend got % x", got)
	}
	if u := waitUsed(t, r.tx, 1); u[0] != [2]uint32{uint32(head), 0} {
		t.Fatalf("used %v", u)
	}
}

// TestQuiesceSaveRestore: a snapshot taken while quiesced, with a transmit
// chain offered but not served. The same process resumes and sends it; a
// fresh device restored over a copy of guest memory sends it too, and both
// rings continue where the snapshot left them.
func TestQuiesceSaveRestore(t *testing.T) {
	b, peer := fakeTap(t)
	r := newRig(t, b, featMrg)
	r.rx.Offer(vt.Buf{Len: 1526, Writable: true})
	_, rxAddr := r.rx.Offer(vt.Buf{Len: 1526, Writable: true})
	r.tr.Notify(rxQueue)
	if _, err := peer.Write(withHeader(frame(guestMAC, hostMAC, 70, 1))); err != nil {
		t.Fatal(err)
	}
	waitUsed(t, r.rx, 1)
	r.tx.Offer(vt.Buf{Data: withHeader(frame(hostMAC, guestMAC, 80, 2))})
	r.tr.Notify(txQueue)
	waitUsed(t, r.tx, 1)
	readFrame(t, peer)

	if err := r.tr.Quiesce(context.Background()); err != nil {
		t.Fatal(err)
	}
	f := frame(hostMAC, guestMAC, 90, 3)
	head, _ := r.tx.Offer(vt.Buf{Data: withHeader(f)})
	st := vt.SaveQuiesced(t, r.tr, txQueue, 1)
	mem2 := r.mem.Clone()
	rx2, tx2 := r.rx.Clone(mem2), r.tx.Clone(mem2)

	if err := r.tr.Resume(); err != nil {
		t.Fatal(err)
	}
	if got := readFrame(t, peer); !bytes.Equal(got[HeaderLen:], f) {
		t.Fatalf("after resume: backend got % x", got)
	}
	if u := waitUsed(t, r.tx, 1); u[0][0] != uint32(head) {
		t.Fatalf("after resume: used %v", u)
	}
	r.tr.Shutdown()

	b2, peer2 := fakeTap(t)
	dev2, err := NewBackend(b2, guestMAC, Options{QueueSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer dev2.Close()
	tr2 := virtio.NewMMIO("net", dev2, mem2, vt.NewSignals(), nil)
	defer tr2.Shutdown()
	if err := tr2.Restore(st); err != nil {
		t.Fatal(err)
	}
	if got := readFrame(t, peer2); !bytes.Equal(got[HeaderLen:], f) {
		t.Fatalf("after restore: backend got % x", got)
	}
	if u := vt.WaitUsed(t, tx2, 1); u[0][0] != uint32(head) || tx2.UsedIdx() != 2 {
		t.Fatalf("after restore: tx used %v, index %d", u, tx2.UsedIdx())
	}
	g := frame(guestMAC, hostMAC, 75, 4)
	if _, err := peer2.Write(withHeader(g)); err != nil {
		t.Fatal(err)
	}
	if u := vt.WaitUsed(t, rx2, 1); rx2.UsedIdx() != 2 || !bytes.Equal(mem2[rxAddr[0]+HeaderLen:rxAddr[0]+HeaderLen+75], g) {
		t.Fatalf("after restore: rx used %v, index %d", u, rx2.UsedIdx())
	}
}

// TestQuiesceStress quiesces and resumes the device again and again while
// frames flow both ways: while quiesced neither used index moves, and
// every frame arrives.
func TestQuiesceStress(t *testing.T) {
	b, peer := fakeTap(t)
	r := newRig(t, b, featMrg)
	const n = 200
	stop := make(chan struct{})
	guestDone := make(chan struct{})
	go func() { // the guest: keeps rx buffers posted, sends n frames
		defer close(guestDone)
		rxOut, txOut, sent := 0, 0, 0
		for {
			select {
			case <-stop:
				return
			default:
			}
			rxOut -= len(r.rx.Used())
			txOut -= len(r.tx.Used())
			for rxOut < 8 {
				r.rx.Offer(vt.Buf{Len: 1526, Writable: true})
				rxOut++
			}
			for txOut < 8 && sent < n {
				r.tx.Offer(vt.Buf{Data: withHeader(frame(hostMAC, guestMAC, 64, byte(sent)))})
				txOut++
				sent++
			}
			r.tr.Notify(rxQueue)
			r.tr.Notify(txQueue)
			time.Sleep(50 * time.Microsecond)
		}
	}()
	hostDone := make(chan int)
	go func() { // the host: sends n frames, reads what the guest sends
		buf := make([]byte, 2000)
		got := 0
		for i := range n {
			peer.Write(withHeader(frame(guestMAC, hostMAC, 64, byte(i))))
		}
		for got < n {
			peer.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := peer.Read(buf); err != nil {
				break
			}
			got++
		}
		hostDone <- got
	}()
	for range 40 {
		if err := r.tr.Quiesce(context.Background()); err != nil {
			t.Fatal(err)
		}
		rx, tx := r.rx.UsedIdx(), r.tx.UsedIdx()
		time.Sleep(200 * time.Microsecond)
		if rx2, tx2 := r.rx.UsedIdx(), r.tx.UsedIdx(); rx2 != rx || tx2 != tx {
			t.Fatalf("used indexes moved while quiesced: rx %d->%d, tx %d->%d", rx, rx2, tx, tx2)
		}
		if err := r.tr.Resume(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Microsecond)
	}
	if got := <-hostDone; got != n {
		t.Errorf("host got %d frames, want %d", got, n)
	}
	kvmtest.WaitFor(t, 5*time.Second, "every frame delivered", func() bool { return r.dev.Metrics.RxPackets.Load() == n })
	close(stop)
	<-guestDone
	if r.dev.Metrics.RxDrops.Load() != 0 || r.tr.Status()&virtio.StatusNeedsReset != 0 {
		t.Errorf("drops %d, status %#x", r.dev.Metrics.RxDrops.Load(), r.tr.Status())
	}
}
