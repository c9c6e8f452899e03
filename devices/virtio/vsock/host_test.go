package vsock

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// hostDevice returns a listening device with its socket in a temporary
// directory, configured by opts first.
func hostDevice(t *testing.T, opts ...func(*Device)) *Device {
	t.Helper()
	d := &Device{UDSPath: filepath.Join(t.TempDir(), "v.sock")}
	for _, o := range opts {
		o(d)
	}
	if err := d.Listen(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// sinkGuest makes a device listening on its socket (hostDevice) and a
// guest on it (posting an event buffer when postEvent) whose port 80
// takes whatever it is sent.
func sinkGuest(t *testing.T, postEvent bool) (*Device, *fakeGuest) {
	t.Helper()
	d := hostDevice(t)
	g := newGuest(t, d, 4096, postEvent)
	g.do(func() { g.listen[80] = modeSink })
	return d, g
}

func dialGuest(t *testing.T, d *Device, port uint32) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, d.UDSPath, port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// expectClosed checks that c is closed by the device within a few seconds,
// without any byte.
func expectClosed(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	if len(b) != 0 || (err != nil && !errors.Is(err, syscall.ECONNRESET)) {
		t.Fatalf("read %q, %v; want a bare close", b, err)
	}
}

func TestHostConnectRoundTrip(t *testing.T) {
	d := hostDevice(t, func(d *Device) { d.timeouts.close = 200 * time.Millisecond })
	g := newGuest(t, d, 1000, true) // small rx buffers: many packets, chunks split
	g.do(func() { g.listen[5000] = modeEcho })
	c := dialGuest(t, d, 5000)

	data := make([]byte, 4<<20)
	rand.Read(data)
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.(*net.UnixConn).CloseWrite()
		}
		werr <- err
	}()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(c) // EOF: the echoing guest half-closed after us
	if err != nil {
		t.Fatal(err)
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(got) != sha256.Sum256(data) {
		t.Fatalf("echo of %d bytes came back as %d different bytes", len(data), len(got))
	}
	m := &d.Metrics
	if m.BytesToGuest.Load() != uint64(len(data)) || m.BytesToHost.Load() != uint64(len(data)) || m.ConnsOpened.Load() != 1 {
		t.Errorf("metrics: to guest %d, to host %d, opened %d", m.BytesToGuest.Load(), m.BytesToHost.Load(), m.ConnsOpened.Load())
	}
	if p := d.peakBuffered.Load(); p > uint64(d.bufAlloc()) {
		t.Errorf("a connection buffered %d bytes, more than buf_alloc %d", p, d.bufAlloc())
	}
	// Both sides done: the device shut the connection both ways; the
	// fake guest does not answer with an RST, so the close timeout does.
	g.waitFor("guest told both directions are shut", func() bool {
		gc := g.conn(5000, firstEphemeral)
		return gc != nil && gc.peerShut == ShutdownRecv|ShutdownSend
	})
	g.waitFor("RST after the close timeout", func() bool { return g.conn(5000, firstEphemeral).rst })
}

func TestHostConnectOKLine(t *testing.T) {
	d := hostDevice(t)
	g := newGuest(t, d, 4096, true)
	g.do(func() { g.listen[52] = modeEcho })
	c, err := net.Dial("unix", d.UDSPath)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The CONNECT line and data in one write: the data must not be eaten
	// by the handshake.
	io.WriteString(c, "CONNECT 52\nping")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	want := "OK 1073741824\nping"
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != want {
		t.Fatalf("read %q, %v; want %q", got, err, want)
	}
	// A second connection gets the next port.
	c2 := dialGuest(t, d, 52)
	io.WriteString(c2, "x")
	if _, err := io.ReadFull(c2, got[:1]); err != nil || got[0] != 'x' {
		t.Fatalf("second connection: %q, %v", got[:1], err)
	}
	g.do(func() {
		if g.conn(52, firstEphemeral+1) == nil {
			t.Error("second connection not from the next ephemeral port")
		}
	})
}

func TestHostConnectRefused(t *testing.T) {
	d := hostDevice(t, func(d *Device) { d.timeouts.connect = 200 * time.Millisecond })
	g := newGuest(t, d, 4096, true)
	g.do(func() { g.listen[53] = modeIgnore })
	for _, port := range []uint32{99, 53} { // RST; no answer at all
		start := time.Now()
		_, err := Dial(context.Background(), d.UDSPath, port)
		if err == nil || !strings.Contains(err.Error(), "without OK") ||
			!strings.Contains(err.Error(), d.UDSPath) {
			t.Fatalf("port %d: %v", port, err)
		}
		if time.Since(start) > 3*time.Second {
			t.Fatalf("port %d: refusal took %v", port, time.Since(start))
		}
	}
	if got := d.Metrics.ConnsRefused.Load(); got != 2 {
		t.Errorf("refused %d, want 2", got)
	}
	// The unanswered REQUEST was withdrawn with an RST.
	g.waitFor("RST for the timed-out connect", func() bool {
		return g.dev.Metrics.Resets.Load() >= 1
	})
}

func TestHostConnectMalformed(t *testing.T) {
	d := hostDevice(t, func(d *Device) { d.timeouts.handshake = 300 * time.Millisecond })
	newGuest(t, d, 4096, true)
	for name, line := range map[string]string{
		"not connect":   "HELLO 52\n",
		"no port":       "CONNECT \n",
		"hex port":      "CONNECT 0x34\n",
		"port too big":  "CONNECT 4294967296\n",
		"negative":      "CONNECT -1\n",
		"trailing junk": "CONNECT 52 x\n",
		"too long":      "CONNECT 0000000000000000000000000000052\n",
		"no newline":    "CONNECT 52",
	} {
		t.Run(name, func(t *testing.T) {
			c, err := net.Dial("unix", d.UDSPath)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			io.WriteString(c, line)
			expectClosed(t, c)
		})
	}
}

func TestDialContext(t *testing.T) {
	// A socket that accepts and never answers: ctx ends the handshake.
	path := filepath.Join(t.TempDir(), "mute.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			defer c.Close()
			io.Copy(io.Discard, c)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := Dial(ctx, path, 7); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want deadline exceeded", err)
	}
	if _, err := Dial(context.Background(), filepath.Join(t.TempDir(), "none"), 7); err == nil ||
		!strings.Contains(err.Error(), "connect to guest port 7 via") {
		t.Fatalf("missing socket: %v", err)
	}
}

func TestListen(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, []byte("x"), 0o644)
	if err := (&Device{UDSPath: file}).Listen(); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("listen over a file: %v", err)
	}
	if _, err := os.Stat(file); err != nil {
		t.Fatal("the file was removed")
	}
	// A stale socket (nobody listening) is replaced.
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	d := &Device{UDSPath: stale}
	if err := d.Listen(); err != nil {
		t.Fatal(err)
	}
	if err := d.Listen(); err == nil {
		t.Error("second Listen succeeded")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left after Close: %v", err)
	}
}

// echoService echoes and closes its end at EOF.
func echoService(c net.Conn) {
	defer c.Close()
	io.Copy(c, c)
}

func TestGuestConnect(t *testing.T) {
	d := &Device{UDSPath: filepath.Join(t.TempDir(), "v.sock"),
		Services: map[uint32]func(net.Conn){700: echoService}}
	// A host program listening for guest connections to port 701.
	ln, err := net.Listen("unix", d.UDSPath+"_701")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	g := newGuest(t, d, 4096, true)

	// Service: the data comes back, the guest's half-close reaches it as
	// EOF, and its close reaches the guest as a SHUTDOWN.
	g.connect(3000, 700, modeSink)
	g.do(func() { g.conn(3000, 700).keep = true })
	g.waitFor("service RESPONSE", func() bool { return g.conn(3000, 700).established })
	g.do(func() {
		c := g.conn(3000, 700)
		c.out = []byte("hello, service")
		c.closeAfterOut = true
	})
	g.waitFor("echo and SHUTDOWN", func() bool {
		c := g.conn(3000, 700)
		return string(c.data) == "hello, service" && c.peerShut&ShutdownSend != 0
	})

	// Unix socket <path>_701.
	g.connect(3001, 701, modeSink)
	g.do(func() { g.conn(3001, 701).keep = true })
	g.waitFor("socket RESPONSE", func() bool { return g.conn(3001, 701).established })
	hc := <-accepted
	defer hc.Close()
	io.WriteString(hc, "from host")
	g.waitFor("host data", func() bool { return string(g.conn(3001, 701).data) == "from host" })
	g.do(func() { g.conn(3001, 701).out = []byte("from guest") })
	buf := make([]byte, 10)
	hc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(hc, buf); err != nil || string(buf) != "from guest" {
		t.Fatalf("host read %q, %v", buf, err)
	}
	// Guest RST closes the host socket.
	g.sendPacket(3001, 701, OpRst, 0)
	if b, err := io.ReadAll(hc); err != nil || len(b) != 0 {
		t.Fatalf("after RST: %q, %v", b, err)
	}

	// Nobody on port 702 (no service, no socket): RST.
	g.connect(3002, 702, modeSink)
	g.waitFor("RST for port 702", func() bool { return g.conn(3002, 702).rst })
	if got := d.Metrics.ConnsOpened.Load(); got != 2 {
		t.Errorf("opened %d, want 2", got)
	}
	if got := d.Metrics.ConnsRefused.Load(); got != 1 {
		t.Errorf("refused %d, want 1", got)
	}
}

func TestHostShutdownAndReset(t *testing.T) {
	d, g := sinkGuest(t, true)

	// Host half-close: the guest sees SHUTDOWN(send) after the data.
	c := dialGuest(t, d, 80)
	io.WriteString(c, "last words")
	c.(*net.UnixConn).CloseWrite()
	g.waitFor("data then SHUTDOWN", func() bool {
		gc := g.conn(80, firstEphemeral)
		return gc != nil && gc.recv == 10 && gc.peerShut == ShutdownSend
	})
	// The guest can still send on the half-closed connection.
	g.do(func() { g.conn(80, firstEphemeral).out = []byte("reply") })
	buf := make([]byte, 5)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "reply" {
		t.Fatalf("reply %q, %v", buf, err)
	}
	// Guest SHUTDOWN(send): the host reads EOF.
	g.sendPacket(80, firstEphemeral, OpShutdown, ShutdownSend)
	if b, err := io.ReadAll(c); err != nil || len(b) != 0 {
		t.Fatalf("after guest shutdown: %q, %v", b, err)
	}

	// Guest RST: the host socket is closed.
	c2 := dialGuest(t, d, 80)
	g.sendPacket(80, firstEphemeral+1, OpRst, 0)
	expectClosed(t, c2)

	// Host full close, then the guest writes: the write fails and the
	// connection is reset.
	c3 := dialGuest(t, d, 80)
	c3.Close()
	g.waitFor("SHUTDOWN for the closed client", func() bool {
		return g.conn(80, firstEphemeral+2).peerShut&ShutdownSend != 0
	})
	g.do(func() { g.conn(80, firstEphemeral+2).out = bytes.Repeat([]byte("x"), 1000) })
	g.waitFor("RST after writing to a closed client", func() bool { return g.conn(80, firstEphemeral+2).rst })
	if d.Metrics.HostErrors.Load() == 0 {
		t.Error("no host error counted")
	}
}

func TestCloseResetsConnections(t *testing.T) {
	d, g := sinkGuest(t, true)
	c := dialGuest(t, d, 80)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, c)
	g.waitFor("RST", func() bool { return g.conn(80, firstEphemeral).rst })
	if _, err := os.Stat(d.UDSPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left after Close: %v", err)
	}
}

// TestSlowPeersStallOnlyTheirConnection runs three connections at once:
// a guest sending to a host service that never reads, a host client
// sending to a guest that never reads, and a host client echoing
// megabytes through the guest. The first two stall on credit, with
// nothing buffered beyond it; the third finishes.
func TestSlowPeersStallOnlyTheirConnection(t *testing.T) {
	d := hostDevice(t, func(d *Device) {
		d.BufAlloc = 64 << 10
		d.Services = map[uint32]func(net.Conn){900: hold(t)}
	})
	g := newGuest(t, d, 4096, true)
	g.do(func() {
		g.listen[5000] = modeEcho
		g.listen[5001] = modeStall
	})

	// Guest → host service that never reads.
	g.connect(4000, 900, modeSink)
	g.waitFor("service RESPONSE", func() bool { return g.conn(4000, 900).established })
	g.do(func() { g.conn(4000, 900).out = make([]byte, 16<<20) })

	// Host → guest that never reads.
	stalled := dialGuest(t, d, 5001)
	go func() {
		stalled.Write(make([]byte, 16<<20)) // blocks; fails at cleanup
	}()

	// Meanwhile, 2 MiB through the echo connection.
	c := dialGuest(t, d, 5000)
	data := make([]byte, 2<<20)
	rand.Read(data)
	go func() {
		c.Write(data)
		c.(*net.UnixConn).CloseWrite()
	}()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("echo: %d of %d bytes, %v", len(got), len(data), err)
	}

	g.do(func() {
		s := g.conn(4000, 900)
		if len(s.out) == 0 {
			t.Error("the guest sent 16 MiB to a service that reads nothing")
		}
		h := g.conn(5001, firstEphemeral)
		if h.held > gBufAlloc {
			t.Errorf("device sent %d bytes to a guest with buf_alloc %d", h.held, gBufAlloc)
		}
		t.Logf("stalled: guest→service sent %d bytes, host→guest delivered %d", s.txCnt, h.held)
	})
	if p := d.peakBuffered.Load(); p > uint64(d.BufAlloc) {
		t.Errorf("a connection buffered %d bytes, more than buf_alloc %d", p, d.BufAlloc)
	}
}

// TestGuestWithoutRxBuffers: a guest that stops posting rx buffers
// stalls only what must reach it. The worker keeps taking its tx packets
// and writing their data to the host, up to the credit the guest had
// (credit updates travel on rx too), and the host side's goroutines keep
// their one chunk each; once buffers come back, both directions finish.
func TestGuestWithoutRxBuffers(t *testing.T) {
	d := hostDevice(t)
	g := newGuest(t, d, 4096, true)
	g.do(func() { g.listen[5000] = modeSink })
	c := dialGuest(t, d, 5000)
	g.waitFor("established", func() bool { return g.conn(5000, firstEphemeral) != nil })
	g.postRx.Store(false)
	const size = 1 << 20
	werr := make(chan error, 1)
	go func() { _, err := c.Write(make([]byte, size)); werr <- err }() // stalls: no rx buffers
	time.Sleep(20 * time.Millisecond)
	g.do(func() { g.conn(5000, firstEphemeral).out = bytes.Repeat([]byte("y"), size) })
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := io.CopyN(io.Discard, c, int64(d.bufAlloc())); err != nil {
		t.Fatalf("host read %d bytes with rx starved: %v", n, err)
	}
	g.do(func() {
		// At most what fits in the buffers posted before it stopped.
		if got := g.conn(5000, firstEphemeral).recv; got > gQueueSize*4096 {
			t.Errorf("guest received %d bytes in %d buffers", got, gQueueSize)
		}
	})
	g.postRx.Store(true)
	g.do(func() {}) // wake the loop
	if n, err := io.CopyN(io.Discard, c, size-int64(d.bufAlloc())); err != nil {
		t.Fatalf("host read %d more bytes: %v", n, err)
	}
	g.waitFor("host data after rx buffers return", func() bool { return g.conn(5000, firstEphemeral).recv == size })
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
}

func TestTransportReset(t *testing.T) {
	for _, later := range []bool{false, true} {
		t.Run(map[bool]string{false: "buffer-posted", true: "buffer-later"}[later], func(t *testing.T) {
			d, g := sinkGuest(t, !later)
			c := dialGuest(t, d, 80)
			d.TransportReset()
			expectClosed(t, c)
			if later {
				time.Sleep(20 * time.Millisecond)
				g.do(func() {
					if len(g.events) != 0 {
						t.Error("event without a buffer")
					}
				})
				g.postEventBuf()
			}
			g.waitFor("TRANSPORT_RESET event", func() bool { return len(g.events) == 1 })
			g.do(func() {
				if g.events[0] != eventTransportReset {
					t.Errorf("event id %d", g.events[0])
				}
				if g.conn(80, firstEphemeral).rst {
					t.Error("RST sent on a transport reset")
				}
			})
			// The device works after it: a fresh connection.
			c2 := dialGuest(t, d, 80)
			io.WriteString(c2, "again")
			g.waitFor("data after reset", func() bool {
				gc := g.conn(80, firstEphemeral+1)
				return gc != nil && gc.recv == 5
			})
		})
	}
	// Before activation: the event is sent by the next activation.
	d := &Device{}
	d.TransportReset()
	g := newGuest(t, d, 4096, true)
	g.waitFor("pending TRANSPORT_RESET event", func() bool { return len(g.events) == 1 })
}

func TestState(t *testing.T) {
	d := &Device{CID: 42}
	d.Metrics.BytesToGuest.Store(7)
	d.Metrics.ConnsOpened.Store(3)
	raw, err := d.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	fresh := &Device{}
	if err := fresh.RestoreState(raw); err != nil {
		t.Fatal(err)
	}
	if fresh.CID != 42 || fresh.Metrics.BytesToGuest.Load() != 7 || fresh.Metrics.ConnsOpened.Load() != 3 {
		t.Fatalf("restored CID %d, counters %d %d", fresh.CID, fresh.Metrics.BytesToGuest.Load(), fresh.Metrics.ConnsOpened.Load())
	}
	// A forked child configured with its own CID keeps it.
	child := &Device{CID: 43}
	if err := child.RestoreState(raw); err != nil || child.CID != 43 {
		t.Fatalf("child CID %d, %v", child.CID, err)
	}
	var s map[string]any
	json.Unmarshal(raw, &s)
	s["version"] = 2
	bad, _ := json.Marshal(s)
	if err := (&Device{}).RestoreState(bad); err == nil || !strings.Contains(err.Error(), "version 2") {
		t.Fatalf("wrong version: %v", err)
	}
	if err := (&Device{}).RestoreState(json.RawMessage("{")); err == nil {
		t.Fatal("garbage accepted")
	}
}

func FuzzParseConnect(f *testing.F) {
	for _, s := range []string{"CONNECT 52", "CONNECT 4294967295", "CONNECT 4294967296", "CONNECT ", "CONNECT +5", "connect 5", "CONNECT 5 ", "CONNECT 052", "CONNECT 0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		port, err := parseConnect(line)
		if err != nil {
			return
		}
		if want := "CONNECT " + strconv.FormatUint(uint64(port), 10); line != want {
			t.Fatalf("%q accepted as port %d", line, port)
		}
	})
}
