package main

import (
	"bytes"
	"encoding/hex"
	"errors"
	"net/netip"
	"testing"

	"github.com/warrenvm/warren/ebpf/policy"
)

func TestCsumKnownVectors(t *testing.T) {
	// RFC 1071, section 3: the sum of these bytes is 0xddf2.
	if got := csum(0, []byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}); got != ^uint16(0xddf2) {
		t.Errorf("RFC 1071 example: %#04x, want %#04x", got, ^uint16(0xddf2))
	}
	// An IPv4 header whose checksum is b861.
	h, _ := hex.DecodeString("450000730000400040110000c0a80001c0a800c7")
	if got := csum(0, h); got != 0xb861 {
		t.Errorf("IPv4 header checksum %#04x, want 0xb861", got)
	}
	h[10], h[11] = 0xb8, 0x61
	if got := csum(0, h); got != 0 {
		t.Errorf("a header with its checksum sums to %#04x, want 0", got)
	}
	// Odd length: the last byte is padded with a zero.
	if got, want := csum(0, []byte{0x12, 0x34, 0x56}), csum(0, []byte{0x12, 0x34, 0x56, 0x00}); got != want {
		t.Errorf("odd length %#04x, want %#04x", got, want)
	}
}

var testFlow = udpFlow{
	SrcMAC:  [6]byte{2, 0, 0, 0, 0xb, 2},
	DstMAC:  [6]byte{2, 0, 0, 0, 0xb, 1},
	Src:     netip.MustParseAddr("10.210.0.2"),
	Dst:     netip.MustParseAddr("198.51.100.7"),
	SrcPort: 40000,
	DstPort: 7,
}

func TestFrameRoundTrip(t *testing.T) {
	for _, size := range []int{0, 16, 17, 64, 1400} {
		payload := probePayload(nil, 123456789, size)
		if want := max(size, minPayload); len(payload) != want {
			t.Fatalf("payload of %d bytes, want %d", len(payload), want)
		}
		fr := appendUDPFrame([]byte("junk"), testFlow, 42, payload)[4:]
		if len(fr) != ethHeaderLen+ipv4HeaderLen+udpHeaderLen+len(payload) {
			t.Fatalf("frame of %d bytes", len(fr))
		}
		if !bytes.Equal(fr[0:6], testFlow.DstMAC[:]) || !bytes.Equal(fr[6:12], testFlow.SrcMAC[:]) {
			t.Errorf("MACs % x", fr[:12])
		}
		pk, err := parseUDPFrame(fr)
		if err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if pk.Src != netip.AddrPortFrom(testFlow.Src, testFlow.SrcPort) || pk.Dst != netip.AddrPortFrom(testFlow.Dst, testFlow.DstPort) {
			t.Errorf("flow %v > %v", pk.Src, pk.Dst)
		}
		if !bytes.Equal(pk.Payload, payload) {
			t.Errorf("payload differs")
		}
		if seq, ok := probeSeq(pk.Payload); !ok || seq != 123456789 {
			t.Errorf("seq %d %v", seq, ok)
		}
	}
}

// TestFrameTrailingBytes: a frame padded past the IP total length (as
// Ethernet minimum sizes make them) parses to the datagram alone.
func TestFrameTrailingBytes(t *testing.T) {
	payload := probePayload(nil, 1, 16)
	fr := appendUDPFrame(nil, testFlow, 1, payload)
	fr = append(fr, 0, 0, 0, 0, 0, 0)
	pk, err := parseUDPFrame(fr)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pk.Payload, payload) {
		t.Errorf("payload % x", pk.Payload)
	}
}

func TestFrameErrors(t *testing.T) {
	good := appendUDPFrame(nil, testFlow, 7, probePayload(nil, 9, 64))
	mod := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	for _, tc := range []struct {
		name  string
		frame []byte
		want  error
	}{
		{"short", good[:20], errTruncated},
		{"ipv6 ethertype", mod(func(b []byte) []byte { b[12], b[13] = 0x86, 0xdd; return b }), errNotIPv4},
		{"ip checksum", mod(func(b []byte) []byte { b[ethHeaderLen+8]--; return b }), errIPChecksum},
		{"udp checksum", mod(func(b []byte) []byte { b[len(b)-1] ^= 0xff; return b }), errUDPChecksum},
		{"cut datagram", good[:len(good)-1], errTruncated},
	} {
		if _, err := parseUDPFrame(tc.frame); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// A UDP checksum of 0 means none.
	noSum := mod(func(b []byte) []byte {
		b[ethHeaderLen+ipv4HeaderLen+6], b[ethHeaderLen+ipv4HeaderLen+7] = 0, 0
		b[len(b)-1] ^= 0xff
		return b
	})
	if _, err := parseUDPFrame(noSum); err != nil {
		t.Errorf("no UDP checksum: %v", err)
	}
	if _, ok := probeSeq([]byte("not a probe payload")); ok {
		t.Error("probeSeq accepted a foreign payload")
	}
}

func TestBenchPolicy(t *testing.T) {
	rules := benchPolicy()
	if len(rules) != policyRules {
		t.Fatalf("%d rules, want %d", len(rules), policyRules)
	}
	bits := map[int]bool{}
	for _, r := range rules {
		bits[r.CIDR.Bits()] = true
	}
	if len(bits) < 10 {
		t.Errorf("only %d distinct prefix lengths", len(bits))
	}
	table, err := policy.Compile(rules, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := policy.Lookup(table, echoIP, policy.ProtoUDP, echoPort); !ok || r.RuleID != 1 {
		t.Errorf("the echo server is allowed by %+v, %v; want rule 1", r, ok)
	}
	if _, ok := policy.Lookup(table, echoIP, policy.ProtoUDP, echoPort+1); ok {
		t.Error("the echo server's other ports are allowed")
	}
}
