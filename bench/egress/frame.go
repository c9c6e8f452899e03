package main

import (
	"encoding/binary"
	"errors"
	"net/netip"
)

// The frames the fake guest writes into the tap and reads back: Ethernet,
// IPv4 (no options) and UDP, with a payload that starts with payloadMagic
// and a sequence number.

const (
	ethHeaderLen  = 14
	ipv4HeaderLen = 20
	udpHeaderLen  = 8
	etherTypeIPv4 = 0x0800
	protoUDP      = 17
	// payloadMagic starts every probe's payload (8 bytes).
	payloadMagic = "WRNEGRS1"
	// minPayload is the magic and the sequence number.
	minPayload = 16
)

// udpFlow is one direction of a UDP flow between two Ethernet hosts.
type udpFlow struct {
	SrcMAC, DstMAC [6]byte
	Src, Dst       netip.Addr // IPv4
	SrcPort        uint16
	DstPort        uint16
}

// csum is the Internet checksum (RFC 1071) of b, starting from the partial
// sum sum.
func csum(sum uint32, b []byte) uint16 {
	for len(b) >= 2 {
		sum += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// pseudoSum is the partial sum of the IPv4 pseudo-header.
func pseudoSum(src, dst netip.Addr, proto uint8, l4len int) uint32 {
	s, d := src.As4(), dst.As4()
	var sum uint32
	sum += uint32(binary.BigEndian.Uint16(s[0:])) + uint32(binary.BigEndian.Uint16(s[2:]))
	sum += uint32(binary.BigEndian.Uint16(d[0:])) + uint32(binary.BigEndian.Uint16(d[2:]))
	sum += uint32(proto) + uint32(l4len)
	return sum
}

// probePayload writes the payload of probe seq, size bytes (at least
// minPayload), into buf and returns it.
func probePayload(buf []byte, seq uint64, size int) []byte {
	size = max(size, minPayload)
	buf = append(buf[:0], payloadMagic...)
	buf = binary.BigEndian.AppendUint64(buf, seq)
	for len(buf) < size {
		buf = append(buf, byte(len(buf)))
	}
	return buf
}

// probeSeq returns the sequence number of a probe's payload.
func probeSeq(p []byte) (uint64, bool) {
	if len(p) < minPayload || string(p[:8]) != payloadMagic {
		return 0, false
	}
	return binary.BigEndian.Uint64(p[8:16]), true
}

// appendUDPFrame appends the frame carrying payload on f to buf, with valid
// IPv4 header and UDP checksums.
func appendUDPFrame(buf []byte, f udpFlow, id uint16, payload []byte) []byte {
	buf = append(buf, f.DstMAC[:]...)
	buf = append(buf, f.SrcMAC[:]...)
	buf = binary.BigEndian.AppendUint16(buf, etherTypeIPv4)
	ip := len(buf)
	udpLen := udpHeaderLen + len(payload)
	buf = append(buf, 0x45, 0)
	buf = binary.BigEndian.AppendUint16(buf, uint16(ipv4HeaderLen+udpLen))
	buf = binary.BigEndian.AppendUint16(buf, id)
	buf = binary.BigEndian.AppendUint16(buf, 0x4000) // DF
	buf = append(buf, 64, protoUDP, 0, 0)
	s, d := f.Src.As4(), f.Dst.As4()
	buf = append(buf, s[:]...)
	buf = append(buf, d[:]...)
	binary.BigEndian.PutUint16(buf[ip+10:], csum(0, buf[ip:ip+ipv4HeaderLen]))
	udp := len(buf)
	buf = binary.BigEndian.AppendUint16(buf, f.SrcPort)
	buf = binary.BigEndian.AppendUint16(buf, f.DstPort)
	buf = binary.BigEndian.AppendUint16(buf, uint16(udpLen))
	buf = append(buf, 0, 0)
	buf = append(buf, payload...)
	c := csum(pseudoSum(f.Src, f.Dst, protoUDP, udpLen), buf[udp:])
	if c == 0 {
		c = 0xffff // 0 means "no checksum" in UDP over IPv4
	}
	binary.BigEndian.PutUint16(buf[udp+6:], c)
	return buf
}

// Errors of parseUDPFrame.
var (
	errNotIPv4     = errors.New("not an IPv4 frame")
	errNotUDP      = errors.New("not UDP")
	errTruncated   = errors.New("truncated frame")
	errIPChecksum  = errors.New("bad IPv4 header checksum")
	errUDPChecksum = errors.New("bad UDP checksum")
	errFragment    = errors.New("IPv4 fragment")
)

// udpPacket is a parsed frame.
type udpPacket struct {
	Src, Dst netip.AddrPort
	Payload  []byte // aliases the frame
}

// parseUDPFrame parses an Ethernet frame holding an IPv4 UDP datagram and
// checks its checksums (a UDP checksum of 0 is "none").
func parseUDPFrame(b []byte) (udpPacket, error) {
	if len(b) < ethHeaderLen+ipv4HeaderLen {
		return udpPacket{}, errTruncated
	}
	if binary.BigEndian.Uint16(b[12:]) != etherTypeIPv4 {
		return udpPacket{}, errNotIPv4
	}
	ip := b[ethHeaderLen:]
	if ip[0]>>4 != 4 {
		return udpPacket{}, errNotIPv4
	}
	ihl := int(ip[0]&0xf) * 4
	total := int(binary.BigEndian.Uint16(ip[2:]))
	if ihl < ipv4HeaderLen || total < ihl || len(ip) < total {
		return udpPacket{}, errTruncated
	}
	ip = ip[:total]
	if csum(0, ip[:ihl]) != 0 {
		return udpPacket{}, errIPChecksum
	}
	if ip[9] != protoUDP {
		return udpPacket{}, errNotUDP
	}
	if binary.BigEndian.Uint16(ip[6:])&0x3fff != 0 {
		return udpPacket{}, errFragment
	}
	src := netip.AddrFrom4([4]byte(ip[12:16]))
	dst := netip.AddrFrom4([4]byte(ip[16:20]))
	udp := ip[ihl:]
	if len(udp) < udpHeaderLen {
		return udpPacket{}, errTruncated
	}
	ulen := int(binary.BigEndian.Uint16(udp[4:]))
	if ulen < udpHeaderLen || ulen > len(udp) {
		return udpPacket{}, errTruncated
	}
	udp = udp[:ulen]
	if binary.BigEndian.Uint16(udp[6:]) != 0 && csum(pseudoSum(src, dst, protoUDP, ulen), udp) != 0 {
		return udpPacket{}, errUDPChecksum
	}
	return udpPacket{
		Src:     netip.AddrPortFrom(src, binary.BigEndian.Uint16(udp[0:])),
		Dst:     netip.AddrPortFrom(dst, binary.BigEndian.Uint16(udp[2:])),
		Payload: udp[udpHeaderLen:],
	}, nil
}
