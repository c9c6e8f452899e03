package vsock

import (
	"slices"
	"testing"
)

const (
	guestCID  = 3
	hostPort  = 1024
	guestPort = 52
)

// gp is a packet from the guest on the test connection.
func gp(op uint16, flags uint32, data string) func(*Conn) {
	return func(c *Conn) {
		h := Header{SrcCID: guestCID, DstCID: CIDHost, SrcPort: guestPort, DstPort: hostPort,
			Len: uint32(len(data)), Type: TypeStream, Op: op, Flags: flags, BufAlloc: 1000}
		if err := h.Validate(); err != nil {
			panic(err)
		}
		c.HandleGuest(h, []byte(data))
	}
}

func consume(n int) func(*Conn)            { return func(c *Conn) { c.Consume(n) } }
func shutdown(f uint32) func(*Conn)        { return func(c *Conn) { c.Shutdown(f) } }
func hostReset() func(*Conn)               { return func(c *Conn) { c.Reset() } }
func drain(c *Conn) (ops []uint16)         { return drainHeaders(c, nil) }
func step(fs ...func(*Conn)) []func(*Conn) { return fs }

func drainHeaders(c *Conn, hs *[]Header) (ops []uint16) {
	for {
		h, ok := c.Next()
		if !ok {
			return ops
		}
		if h.SrcCID != CIDHost || h.DstCID != guestCID || h.SrcPort != hostPort || h.DstPort != guestPort || h.Type != TypeStream {
			panic("misaddressed packet")
		}
		if hs != nil {
			*hs = append(*hs, h)
		}
		ops = append(ops, h.Op)
	}
}

// established returns a connection the guest opened, its RESPONSE taken.
func established(bufAlloc uint32) *Conn {
	c := Accept(Header{SrcCID: guestCID, DstCID: CIDHost, SrcPort: guestPort, DstPort: hostPort,
		Type: TypeStream, Op: OpRequest, BufAlloc: 1000}, bufAlloc)
	drain(c)
	return c
}

func TestConnStateMachine(t *testing.T) {
	both := uint32(ShutdownRecv | ShutdownSend)
	cases := []struct {
		name    string
		host    bool // host-initiated (Connect) rather than accepted
		steps   []func(*Conn)
		state   State
		ops     []uint16 // control packets pending afterwards, in order
		rx      string
		hostEOF bool
	}{
		{name: "host connect pending", host: true, state: StateConnecting, ops: []uint16{OpRequest}},
		{name: "host connect answered", host: true, steps: step(gp(OpResponse, 0, "")), state: StateEstablished},
		{name: "host connect refused", host: true, steps: step(gp(OpRst, 0, "")), state: StateClosed, hostEOF: true},
		{name: "host connect bogus answer", host: true, steps: step(gp(OpRW, 0, "x")), state: StateClosed, ops: []uint16{OpRst}, hostEOF: true},
		{name: "data buffered", steps: step(gp(OpRW, 0, "hi"), gp(OpRW, 0, " there")), state: StateEstablished, rx: "hi there"},
		{name: "partial consume", steps: step(gp(OpRW, 0, "hello"), consume(2)), state: StateEstablished, rx: "llo"},
		{name: "overrun resets", steps: step(gp(OpRW, 0, "0123456789"), gp(OpRW, 0, "x")), state: StateClosed, ops: []uint16{OpRst}, hostEOF: true},
		{name: "exactly buf_alloc is fine", steps: step(gp(OpRW, 0, "0123456789")), state: StateEstablished, rx: "0123456789"},
		{name: "consume frees credit and updates", steps: step(gp(OpRW, 0, "0123456789"), consume(5), gp(OpRW, 0, "abcde")),
			state: StateEstablished, rx: "56789abcde", ops: []uint16{OpCreditUpdate}},
		{name: "small consume: no update", steps: step(gp(OpRW, 0, "0123456789"), consume(4)), state: StateEstablished, rx: "456789"},
		{name: "credit request answered", steps: step(gp(OpCreditRequest, 0, "")), state: StateEstablished, ops: []uint16{OpCreditUpdate}},
		{name: "credit update quiet", steps: step(gp(OpCreditUpdate, 0, "")), state: StateEstablished},
		{name: "guest half-close send", steps: step(gp(OpRW, 0, "ab"), gp(OpShutdown, ShutdownSend, "")), state: StateEstablished, rx: "ab"},
		{name: "guest half-close then eof", steps: step(gp(OpRW, 0, "ab"), gp(OpShutdown, ShutdownSend, ""), consume(2)), state: StateEstablished, hostEOF: true},
		{name: "data after guest send shutdown", steps: step(gp(OpShutdown, ShutdownSend, ""), gp(OpRW, 0, "x")), state: StateClosed, ops: []uint16{OpRst}, hostEOF: true},
		{name: "guest close, nothing buffered", steps: step(gp(OpShutdown, both, "")), state: StateClosed, ops: []uint16{OpRst}, hostEOF: true},
		{name: "guest close in two halves", steps: step(gp(OpShutdown, ShutdownRecv, ""), gp(OpShutdown, ShutdownSend, "")), state: StateClosed, ops: []uint16{OpRst}, hostEOF: true},
		{name: "guest close drains first", steps: step(gp(OpRW, 0, "abc"), gp(OpShutdown, both, "")), state: StatePeerClosed, rx: "abc"},
		{name: "guest close drained", steps: step(gp(OpRW, 0, "abc"), gp(OpShutdown, both, ""), consume(3)), state: StateClosed, ops: []uint16{OpRst}, hostEOF: true},
		{name: "peer closed, host stops sending, still reads", steps: step(gp(OpRW, 0, "abc"), gp(OpShutdown, both, ""), shutdown(ShutdownSend)), state: StatePeerClosed, rx: "abc"},
		{name: "peer closed, host stops reading", steps: step(gp(OpRW, 0, "abc"), gp(OpShutdown, both, ""), shutdown(ShutdownRecv)), state: StateClosed, ops: []uint16{OpRst}, hostEOF: true},
		{name: "guest rst drops data", steps: step(gp(OpRW, 0, "abc"), gp(OpRst, 0, "")), state: StateClosed, hostEOF: true},
		{name: "request on open connection", steps: step(gp(OpRequest, 0, "")), state: StateClosed, ops: []uint16{OpRst}, hostEOF: true},
		{name: "response on open connection", steps: step(gp(OpResponse, 0, "")), state: StateClosed, ops: []uint16{OpRst}, hostEOF: true},
		{name: "host half-close", steps: step(shutdown(ShutdownSend)), state: StateEstablished, ops: []uint16{OpShutdown}},
		{name: "host half-close twice sends once", steps: step(shutdown(ShutdownSend), shutdown(ShutdownSend)), state: StateEstablished, ops: []uint16{OpShutdown}},
		{name: "host close", steps: step(shutdown(both)), state: StateLocalClosed, ops: []uint16{OpShutdown}},
		{name: "host close answered", steps: step(shutdown(both), gp(OpRst, 0, "")), state: StateClosed, hostEOF: true},
		{name: "host close crosses guest close", steps: step(shutdown(both), gp(OpShutdown, both, "")), state: StateClosed, ops: []uint16{OpRst}, hostEOF: true},
		{name: "host stops reading drops buffer", steps: step(gp(OpRW, 0, "abc"), shutdown(ShutdownRecv)), state: StateEstablished, ops: []uint16{OpShutdown}},
		{name: "data after host stops reading is dropped", steps: step(shutdown(ShutdownRecv), gp(OpRW, 0, "0123456789"), gp(OpRW, 0, "0123456789")),
			state: StateEstablished, ops: []uint16{OpShutdown, OpCreditUpdate}},
		{name: "host close on connecting resets", host: true, steps: step(shutdown(ShutdownSend)), state: StateClosed, ops: []uint16{OpRst}, hostEOF: true},
		{name: "host reset", steps: step(gp(OpRW, 0, "abc"), gp(OpCreditRequest, 0, ""), hostReset()), state: StateClosed, ops: []uint16{OpRst}, hostEOF: true},
		{name: "closed ignores everything", steps: step(gp(OpRst, 0, ""), gp(OpRW, 0, "x"), gp(OpRequest, 0, ""), shutdown(both), hostReset(), consume(1)), state: StateClosed, hostEOF: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c *Conn
			if tc.host {
				c = Connect(guestCID, hostPort, guestPort, 10)
			} else {
				c = established(10)
			}
			for _, s := range tc.steps {
				s(c)
			}
			if c.State() != tc.state {
				t.Errorf("state %v, want %v", c.State(), tc.state)
			}
			if got := string(c.Peek()); got != tc.rx {
				t.Errorf("buffered %q, want %q", got, tc.rx)
			}
			if c.HostEOF() != tc.hostEOF {
				t.Errorf("host EOF %v, want %v", c.HostEOF(), tc.hostEOF)
			}
			if ops := drain(c); !slices.Equal(ops, tc.ops) {
				t.Errorf("sent %v, want %v", ops, tc.ops)
			}
			if want := tc.state == StateClosed; c.Done() != want {
				t.Errorf("done %v after draining, want %v", c.Done(), want)
			}
		})
	}
}

func TestConnAcceptResponds(t *testing.T) {
	c := Accept(Header{SrcCID: guestCID, DstCID: CIDHost, SrcPort: guestPort, DstPort: hostPort,
		Type: TypeStream, Op: OpRequest, BufAlloc: 500}, 4096)
	if c.Key() != (Key{HostPort: hostPort, GuestPort: guestPort}) || c.State() != StateEstablished {
		t.Fatalf("key %+v state %v", c.Key(), c.State())
	}
	var hs []Header
	if ops := drainHeaders(c, &hs); !slices.Equal(ops, []uint16{OpResponse}) {
		t.Fatalf("sent %v", ops)
	}
	if hs[0].BufAlloc != 4096 || hs[0].FwdCnt != 0 {
		t.Errorf("response credit %+v", hs[0])
	}
	if w := c.SendWindow(); w != 500 {
		t.Errorf("window %d, want the guest's 500", w)
	}
}

// TestConnSendCredit: host data is limited by the guest's credit, a
// stalled sender asks for credit once, and the guest's update reopens the
// window.
func TestConnSendCredit(t *testing.T) {
	c := established(10) // guest advertised 1000
	if w := c.SendWindow(); w != 1000 {
		t.Fatalf("window %d", w)
	}
	h := c.RWHeader(600)
	if h.Op != OpRW || h.Len != 600 || h.BufAlloc != 10 {
		t.Fatalf("rw header %+v", h)
	}
	c.RWHeader(400)
	if w := c.SendWindow(); w != 0 {
		t.Fatalf("window %d after using all credit", w)
	}
	c.RequestCredit()
	c.RequestCredit()
	if ops := drain(c); !slices.Equal(ops, []uint16{OpCreditRequest}) {
		t.Fatalf("sent %v, want one credit request", ops)
	}
	// An answer that frees nothing does not re-arm the request (no
	// request/update ping-pong with a guest that is not reading).
	c.HandleGuest(Header{SrcCID: guestCID, DstCID: CIDHost, SrcPort: guestPort, DstPort: hostPort,
		Type: TypeStream, Op: OpCreditUpdate, BufAlloc: 1000, FwdCnt: 0}, nil)
	c.RequestCredit()
	if ops := drain(c); len(ops) != 0 {
		t.Fatalf("sent %v after an update without credit, want nothing", ops)
	}
	c.HandleGuest(Header{SrcCID: guestCID, DstCID: CIDHost, SrcPort: guestPort, DstPort: hostPort,
		Type: TypeStream, Op: OpCreditUpdate, BufAlloc: 1000, FwdCnt: 700}, nil)
	if w := c.SendWindow(); w != 700 {
		t.Fatalf("window %d after the guest consumed 700", w)
	}
	c.RWHeader(700)
	c.RequestCredit()
	if ops := drain(c); !slices.Equal(ops, []uint16{OpCreditRequest}) {
		t.Fatalf("sent %v after new figures, want a fresh credit request", ops)
	}
	defer func() {
		if recover() == nil {
			t.Error("RW beyond the window did not panic")
		}
	}()
	c.RWHeader(1)
}

func TestConnSendWindowClosed(t *testing.T) {
	big := func(c *Conn) {
		c.HandleGuest(Header{SrcCID: guestCID, DstCID: CIDHost, SrcPort: guestPort, DstPort: hostPort,
			Type: TypeStream, Op: OpCreditUpdate, BufAlloc: 1 << 30}, nil)
	}
	for name, f := range map[string]func(*Conn){
		"connecting":       func(c *Conn) { *c = *Connect(guestCID, hostPort, guestPort, 10) },
		"host shut send":   func(c *Conn) { c.Shutdown(ShutdownSend) },
		"guest shut recv":  gp(OpShutdown, ShutdownRecv, ""),
		"closed":           hostReset(),
		"guest closed":     gp(OpShutdown, ShutdownRecv|ShutdownSend, ""),
		"host closed both": shutdown(ShutdownRecv | ShutdownSend),
	} {
		c := established(10)
		f(c)
		if w := c.SendWindow(); w != 0 {
			t.Errorf("%s: window %d", name, w)
		}
	}
	c := established(10)
	big(c)
	if w := c.SendWindow(); w != MaxPayload {
		t.Errorf("window %d, want MaxPayload", w)
	}
}

// TestConnSlowReader: a host side that stops reading stops the guest by
// credit; the buffer never exceeds buf_alloc however long the guest goes on.
func TestConnSlowReader(t *testing.T) {
	const bufAlloc = 64
	c := established(bufAlloc)
	fwd := uint32(0)
	for i := 0; i < 100; i++ {
		var hs []Header
		drainHeaders(c, &hs)
		for _, h := range hs {
			fwd = h.FwdCnt
		}
		// A well-behaved guest sends only within its credit: buf_alloc
		// minus what it sent and we have not reported consumed.
		free := bufAlloc - (uint32(i*8) - fwd)
		if free < 8 {
			if i < bufAlloc/8 {
				t.Fatalf("guest out of credit after %d packets", i)
			}
			break
		}
		gp(OpRW, 0, "12345678")(c)
		if len(c.Peek()) > bufAlloc {
			t.Fatalf("buffered %d > buf_alloc", len(c.Peek()))
		}
	}
	if len(c.Peek()) != bufAlloc || c.State() != StateEstablished {
		t.Fatalf("buffered %d, state %v", len(c.Peek()), c.State())
	}
	// Reading resumes: credit follows.
	c.Consume(bufAlloc)
	var hs []Header
	if ops := drainHeaders(c, &hs); !slices.Equal(ops, []uint16{OpCreditUpdate}) || hs[0].FwdCnt != bufAlloc {
		t.Fatalf("after reading: %v %+v", ops, hs)
	}
}

func TestResetFor(t *testing.T) {
	h := ResetFor(Header{SrcCID: guestCID, DstCID: CIDHost, SrcPort: guestPort, DstPort: 9, Type: TypeStream, Op: OpRequest})
	want := Header{SrcCID: CIDHost, DstCID: guestCID, SrcPort: 9, DstPort: guestPort, Type: TypeStream, Op: OpRst}
	if h != want {
		t.Fatalf("%+v", h)
	}
}

// FuzzConn drives a connection with arbitrary guest packets and host
// actions: nothing panics, the buffer never exceeds buf_alloc, and an RST
// is always the last packet.
func FuzzConn(f *testing.F) {
	f.Add([]byte{5, 0, 10, 6, 0, 0, 200, 4, 3, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		c := established(32)
		if len(in) > 0 && in[0]&1 == 1 {
			c = Connect(guestCID, hostPort, guestPort, 32)
		}
		for i := 0; i+1 < len(in); i += 2 {
			op, arg := in[i], in[i+1]
			switch op % 12 {
			case 8:
				c.Consume(int(arg))
			case 9:
				c.Shutdown(uint32(arg))
			case 10:
				if w := c.SendWindow(); w > 0 {
					c.RWHeader(min(w, uint32(arg)+1))
				} else {
					c.RequestCredit()
				}
			case 11:
				var hs []Header
				drainHeaders(c, &hs)
				for j, h := range hs {
					if h.Op == OpRst && j != len(hs)-1 {
						t.Fatalf("packet after RST: %+v", hs)
					}
				}
			default:
				o := uint16(op % 8)
				h := Header{SrcCID: guestCID, DstCID: CIDHost, SrcPort: guestPort, DstPort: hostPort,
					Type: TypeStream, Op: o, BufAlloc: uint32(arg) * 4, FwdCnt: uint32(arg)}
				var data []byte
				if o == OpRW {
					data = make([]byte, arg%40)
					h.Len = uint32(len(data))
				}
				if o == OpShutdown {
					h.Flags = uint32(arg) & 3
				}
				if h.Validate() != nil {
					continue
				}
				c.HandleGuest(h, data)
			}
			if len(c.Peek()) > 32 {
				t.Fatalf("buffered %d > 32", len(c.Peek()))
			}
		}
	})
}
