//go:build linux

package filter

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// TestDecodeEvent needs no privileges: it checks the event layout and the
// protocol names.
func TestDecodeEvent(t *testing.T) {
	b := make([]byte, EventSize)
	binary.NativeEndian.PutUint64(b[0:], 42)
	copy(b[8:], []byte{10, 201, 0, 2})
	copy(b[24:], []byte{1, 1, 1, 1})
	binary.NativeEndian.PutUint16(b[40:], 1234)
	binary.NativeEndian.PutUint16(b[42:], 443)
	b[44], b[45], b[46], b[47] = 6, 4, 2, 4
	binary.NativeEndian.PutUint32(b[48:], 0)
	e, err := DecodeEvent(b)
	if err != nil {
		t.Fatal(err)
	}
	want := Event{Monotonic: 42, Src: netip.MustParseAddr("10.201.0.2"), Dst: netip.MustParseAddr("1.1.1.1"),
		SrcPort: 1234, DstPort: 443, Proto: 6, IPVersion: 4, Reason: "port"}
	if e != want {
		t.Fatalf("decoded %+v, want %+v", e, want)
	}
	for _, c := range []struct {
		ver, proto uint8
		name       string
	}{{4, 6, "tcp"}, {4, 17, "udp"}, {4, 1, "icmp"}, {4, 47, "47"}, {6, 17, "ipv6"}, {0, 0, ""}} {
		if got := (Event{IPVersion: c.ver, Proto: c.proto}).ProtoName(); got != c.name {
			t.Errorf("ProtoName(%d, %d) = %q, want %q", c.ver, c.proto, got, c.name)
		}
	}
	if _, err := DecodeEvent(b[:10]); err == nil {
		t.Error("a short event decoded")
	}
	if AttachClsact.String() != "clsact" || AttachTCX.String() != "tcx" {
		t.Error("AttachMode names")
	}
}
