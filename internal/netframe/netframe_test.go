package netframe

import (
	"bytes"
	"encoding/hex"
	"errors"
	"net"
	"net/netip"
	"testing"
)

func TestChecksumKnownVectors(t *testing.T) {
	// RFC 1071, section 3: the sum of these bytes is 0xddf2.
	if got := Checksum(0, []byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}); got != ^uint16(0xddf2) {
		t.Errorf("RFC 1071 example: %#04x, want %#04x", got, ^uint16(0xddf2))
	}
	// An IPv4 header whose checksum is b861.
	h, _ := hex.DecodeString("450000730000400040110000c0a80001c0a800c7")
	if got := Checksum(0, h); got != 0xb861 {
		t.Errorf("IPv4 header checksum %#04x, want 0xb861", got)
	}
	h[10], h[11] = 0xb8, 0x61
	if got := Checksum(0, h); got != 0 {
		t.Errorf("a header with its checksum sums to %#04x, want 0", got)
	}
	// Odd length: the last byte is padded with a zero.
	if got, want := Checksum(0, []byte{0x12, 0x34, 0x56}), Checksum(0, []byte{0x12, 0x34, 0x56, 0x00}); got != want {
		t.Errorf("odd length %#04x, want %#04x", got, want)
	}
}

var testFlow = UDPFlow{
	SrcMAC:  net.HardwareAddr{2, 0, 0, 0, 0xb, 2},
	DstMAC:  net.HardwareAddr{2, 0, 0, 0, 0xb, 1},
	Src:     netip.MustParseAddr("10.210.0.2"),
	Dst:     netip.MustParseAddr("198.51.100.7"),
	SrcPort: 40000,
	DstPort: 7,
}

func TestUDPRoundTrip(t *testing.T) {
	for _, size := range []int{0, 1, 16, 17, 64, 1400} {
		payload := bytes.Repeat([]byte{0xa5}, size)
		fr := AppendUDP([]byte("junk"), testFlow, 42, payload)[4:]
		if len(fr) != EthHeaderLen+IPv4HeaderLen+UDPHeaderLen+len(payload) {
			t.Fatalf("frame of %d bytes", len(fr))
		}
		if !bytes.Equal(fr[0:6], testFlow.DstMAC) || !bytes.Equal(fr[6:12], testFlow.SrcMAC) {
			t.Errorf("MACs % x", fr[:12])
		}
		d, err := ParseUDP(fr)
		if err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if d.Src != netip.AddrPortFrom(testFlow.Src, testFlow.SrcPort) || d.Dst != netip.AddrPortFrom(testFlow.Dst, testFlow.DstPort) {
			t.Errorf("flow %v > %v", d.Src, d.Dst)
		}
		if !bytes.Equal(d.Payload, payload) {
			t.Errorf("payload differs")
		}
	}
}

// TestUDPTrailingBytes: a frame padded past the IP total length (as
// Ethernet minimum sizes make them) parses to the datagram alone.
func TestUDPTrailingBytes(t *testing.T) {
	payload := []byte("sixteen bytes!!!")
	fr := AppendUDP(nil, testFlow, 1, payload)
	fr = append(fr, 0, 0, 0, 0, 0, 0)
	d, err := ParseUDP(fr)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(d.Payload, payload) {
		t.Errorf("payload % x", d.Payload)
	}
}

func TestParseUDPErrors(t *testing.T) {
	good := AppendUDP(nil, testFlow, 7, bytes.Repeat([]byte{1}, 64))
	mod := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for _, tc := range []struct {
		name  string
		frame []byte
		want  error
	}{
		{"short", good[:20], ErrTruncated},
		{"ipv6 ethertype", mod(func(b []byte) []byte { b[12], b[13] = 0x86, 0xdd; return b }), ErrNotIPv4},
		{"ip checksum", mod(func(b []byte) []byte { b[EthHeaderLen+8]--; return b }), ErrIPChecksum},
		{"udp checksum", mod(func(b []byte) []byte { b[len(b)-1] ^= 0xff; return b }), ErrUDPChecksum},
		{"cut datagram", good[:len(good)-1], ErrTruncated},
	} {
		if _, err := ParseUDP(tc.frame); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// A UDP checksum of 0 means none.
	noSum := mod(func(b []byte) []byte {
		b[EthHeaderLen+IPv4HeaderLen+6], b[EthHeaderLen+IPv4HeaderLen+7] = 0, 0
		b[len(b)-1] ^= 0xff
		return b
	})
	if _, err := ParseUDP(noSum); err != nil {
		t.Errorf("no UDP checksum: %v", err)
	}
}
