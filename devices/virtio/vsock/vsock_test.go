package vsock

import (
	"errors"
	"math"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	h := Header{SrcCID: 3, DstCID: CIDHost, SrcPort: 1234, DstPort: 52, Len: 5, Type: TypeStream,
		Op: OpRW, BufAlloc: 1 << 18, FwdCnt: 77}
	b := make([]byte, HeaderLen)
	h.Encode(b)
	got, err := ParseHeader(b)
	if err != nil || got != h {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
}

func TestHeaderValidation(t *testing.T) {
	ok := Header{Type: TypeStream, Op: OpRW, Len: 10}
	bad := map[string]func(h *Header){
		"seqpacket":          func(h *Header) { h.Type = 2 },
		"invalid op":         func(h *Header) { h.Op = OpInvalid },
		"unknown op":         func(h *Header) { h.Op = 99 },
		"oversized payload":  func(h *Header) { h.Len = MaxPayload + 1 },
		"payload on request": func(h *Header) { h.Op = OpRequest },
		"flags on rw":        func(h *Header) { h.Flags = 1 },
		"bad shutdown flags": func(h *Header) { h.Op, h.Len, h.Flags = OpShutdown, 0, 4 },
		"huge len wraps":     func(h *Header) { h.Len = math.MaxUint32 },
	}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range bad {
		h := ok
		mod(&h)
		if err := h.Validate(); !errors.Is(err, ErrBadPacket) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := ParseHeader(make([]byte, HeaderLen-1)); !errors.Is(err, ErrBadPacket) {
		t.Errorf("short header: %v", err)
	}
}

func TestCreditFlow(t *testing.T) {
	c := NewCredit(1000)
	c.Update(Header{BufAlloc: 100, FwdCnt: 0})
	if c.PeerFree() != 100 {
		t.Fatalf("peer free %d", c.PeerFree())
	}
	c.Sent(60)
	if c.PeerFree() != 40 {
		t.Fatalf("after sending 60: %d", c.PeerFree())
	}
	c.Update(Header{BufAlloc: 100, FwdCnt: 50}) // peer consumed 50
	if c.PeerFree() != 90 {
		t.Fatalf("after peer consumed 50: %d", c.PeerFree())
	}
	c.Update(Header{BufAlloc: 100, FwdCnt: 500}) // claims more than we sent
	if c.PeerFree() != 0 {
		t.Fatalf("lying peer gets %d credit", c.PeerFree())
	}
}

func TestCreditWrapAround(t *testing.T) {
	c := NewCredit(1000)
	c.txCnt = math.MaxUint32 - 10
	c.Update(Header{BufAlloc: 100, FwdCnt: math.MaxUint32 - 10})
	c.Sent(30) // txCnt wraps past zero
	if c.PeerFree() != 70 {
		t.Fatalf("across wrap-around: %d", c.PeerFree())
	}
}

func TestReceiveBound(t *testing.T) {
	c := NewCredit(100)
	if !c.Received(80) || c.Received(30) {
		t.Fatal("a peer exceeding our buffer was not caught")
	}
	var h Header
	c.Stamp(&h)
	if h.BufAlloc != 100 || h.FwdCnt != 0 || c.NeedUpdate() {
		t.Fatalf("stamp %+v", h)
	}
	c.Consumed(60)
	if !c.NeedUpdate() {
		t.Error("no credit update after freeing more than half the buffer")
	}
	c.Stamp(&h)
	if h.FwdCnt != 60 || c.NeedUpdate() {
		t.Errorf("after stamping: %+v need=%v", h, c.NeedUpdate())
	}
	if !c.Received(80) {
		t.Error("freed space not reusable")
	}
}

// FuzzParseHeader: any 44+ bytes from the guest decode without panicking,
// and whatever is accepted re-encodes to the same bytes.
func FuzzParseHeader(f *testing.F) {
	b := make([]byte, HeaderLen)
	Header{SrcCID: 3, DstCID: 2, SrcPort: 1, DstPort: 2, Type: TypeStream, Op: OpRequest, BufAlloc: 4096}.Encode(b)
	f.Add(b)
	f.Fuzz(func(t *testing.T, in []byte) {
		h, err := ParseHeader(in)
		if err != nil {
			return
		}
		out := make([]byte, HeaderLen)
		h.Encode(out)
		if string(out) != string(in[:HeaderLen]) {
			t.Fatalf("re-encoding differs")
		}
	})
}
