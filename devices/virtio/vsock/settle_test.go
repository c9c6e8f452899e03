package vsock

import (
	"context"
	"io"
	"net"
	"testing"
	"time"
)

// TestConnectWaitsForResetSettle: after a TRANSPORT_RESET, a host CONNECT
// is not sent to the guest until the guest shows it handled the reset by
// opening a connection of its own; without one, the settle deadline
// releases it.
func TestConnectWaitsForResetSettle(t *testing.T) {
	d := hostDevice(t, func(d *Device) { d.timeouts.settle = time.Hour })
	g := newGuest(t, d, 4096, true)
	g.do(func() { g.listen[52] = modeEcho })
	d.TransportReset()
	g.waitFor("TRANSPORT_RESET event", func() bool { return len(g.events) == 1 })

	type dialed struct {
		c   net.Conn
		err error
	}
	done := make(chan dialed, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, err := Dial(ctx, d.UDSPath, 52)
		done <- dialed{c, err}
	}()
	time.Sleep(300 * time.Millisecond)
	g.do(func() {
		if len(g.conns) != 0 {
			t.Error("a host connection reached the guest before it handled the transport reset")
		}
	})
	select {
	case r := <-done:
		t.Fatalf("the CONNECT was answered while held: %v", r.err)
	default:
	}
	// The guest connects to the host (its agent's re-sync, say): it is
	// past the reset, and the held CONNECT goes through.
	g.connect(7000, 9999, modeEcho) // no such host service: refused, but it shows the guest is live
	var r dialed
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the held CONNECT was not released by the guest's own connection")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.c.Close()
	io.WriteString(r.c, "x")
	b := make([]byte, 1)
	r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(r.c, b); err != nil || b[0] != 'x' {
		t.Fatalf("echo after release: %q, %v", b, err)
	}

	// A guest that never connects: the deadline releases the CONNECT.
	d2 := hostDevice(t, func(d *Device) { d.timeouts.settle = 200 * time.Millisecond })
	g2 := newGuest(t, d2, 4096, true)
	g2.do(func() { g2.listen[52] = modeEcho })
	d2.TransportReset()
	g2.waitFor("TRANSPORT_RESET event", func() bool { return len(g2.events) == 1 })
	start := time.Now()
	c2 := dialGuest(t, d2, 52)
	if w := time.Since(start); w < 150*time.Millisecond {
		t.Errorf("CONNECT answered %v after a reset, before the settle deadline", w)
	}
	io.WriteString(c2, "y")
	c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c2, b); err != nil || b[0] != 'y' {
		t.Fatalf("echo after the deadline: %q, %v", b, err)
	}
}
