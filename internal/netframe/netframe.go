// Package netframe builds and parses the Ethernet frames that tests and
// benchmarks put on a tap or hand to a device: IPv4 (no options) carrying
// UDP, with the Internet checksum (RFC 1071) and its IPv4 pseudo-header.
// It is the one copy of that arithmetic outside the kernel and the eBPF
// program; nothing in a sandbox's data path uses it.
package netframe

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
)

// Header sizes and field values of the frames this package handles.
const (
	EthHeaderLen  = 14
	IPv4HeaderLen = 20
	UDPHeaderLen  = 8
	EtherTypeIPv4 = 0x0800
	ProtoUDP      = 17
)

// Checksum is the Internet checksum (RFC 1071) of b, starting from the
// partial sum sum (0, or PseudoSum's): the value to store in a header, or
// 0 when b already holds a correct one.
func Checksum(sum uint32, b []byte) uint16 {
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

// PseudoSum is the partial sum of the IPv4 pseudo-header of a transport
// segment of l4len bytes and protocol proto from src to dst (IPv4).
func PseudoSum(src, dst netip.Addr, proto uint8, l4len int) uint32 {
	s, d := src.As4(), dst.As4()
	var sum uint32
	sum += uint32(binary.BigEndian.Uint16(s[0:])) + uint32(binary.BigEndian.Uint16(s[2:]))
	sum += uint32(binary.BigEndian.Uint16(d[0:])) + uint32(binary.BigEndian.Uint16(d[2:]))
	sum += uint32(proto) + uint32(l4len)
	return sum
}

// UDPFlow is one direction of a UDP flow between two Ethernet hosts.
type UDPFlow struct {
	SrcMAC, DstMAC net.HardwareAddr
	Src, Dst       netip.Addr // IPv4
	SrcPort        uint16
	DstPort        uint16
}

// AppendUDP appends to buf the frame carrying payload on f, with IP
// identification id, DF set, TTL 64, and valid IPv4 header and UDP
// checksums.
func AppendUDP(buf []byte, f UDPFlow, id uint16, payload []byte) []byte {
	buf = append(buf, f.DstMAC[:6]...)
	buf = append(buf, f.SrcMAC[:6]...)
	buf = binary.BigEndian.AppendUint16(buf, EtherTypeIPv4)
	ip := len(buf)
	udpLen := UDPHeaderLen + len(payload)
	buf = append(buf, 0x45, 0)
	buf = binary.BigEndian.AppendUint16(buf, uint16(IPv4HeaderLen+udpLen))
	buf = binary.BigEndian.AppendUint16(buf, id)
	buf = binary.BigEndian.AppendUint16(buf, 0x4000) // DF
	buf = append(buf, 64, ProtoUDP, 0, 0)
	s, d := f.Src.As4(), f.Dst.As4()
	buf = append(buf, s[:]...)
	buf = append(buf, d[:]...)
	binary.BigEndian.PutUint16(buf[ip+10:], Checksum(0, buf[ip:ip+IPv4HeaderLen]))
	udp := len(buf)
	buf = binary.BigEndian.AppendUint16(buf, f.SrcPort)
	buf = binary.BigEndian.AppendUint16(buf, f.DstPort)
	buf = binary.BigEndian.AppendUint16(buf, uint16(udpLen))
	buf = append(buf, 0, 0)
	buf = append(buf, payload...)
	c := Checksum(PseudoSum(f.Src, f.Dst, ProtoUDP, udpLen), buf[udp:])
	if c == 0 {
		c = 0xffff // 0 means "no checksum" in UDP over IPv4
	}
	binary.BigEndian.PutUint16(buf[udp+6:], c)
	return buf
}

// Errors of ParseUDP.
var (
	ErrNotIPv4     = errors.New("not an IPv4 frame")
	ErrNotUDP      = errors.New("not UDP")
	ErrTruncated   = errors.New("truncated frame")
	ErrIPChecksum  = errors.New("bad IPv4 header checksum")
	ErrUDPChecksum = errors.New("bad UDP checksum")
	ErrFragment    = errors.New("IPv4 fragment")
)

// Datagram is a parsed UDP frame.
type Datagram struct {
	Src, Dst netip.AddrPort
	Payload  []byte // aliases the frame
}

// ParseUDP parses an Ethernet frame holding an unfragmented IPv4 UDP
// datagram and checks its checksums (a UDP checksum of 0 is "none").
// Bytes past the IP total length (Ethernet padding) are ignored.
func ParseUDP(b []byte) (Datagram, error) {
	if len(b) < EthHeaderLen+IPv4HeaderLen {
		return Datagram{}, ErrTruncated
	}
	if binary.BigEndian.Uint16(b[12:]) != EtherTypeIPv4 {
		return Datagram{}, ErrNotIPv4
	}
	ip := b[EthHeaderLen:]
	if ip[0]>>4 != 4 {
		return Datagram{}, ErrNotIPv4
	}
	ihl := int(ip[0]&0xf) * 4
	total := int(binary.BigEndian.Uint16(ip[2:]))
	if ihl < IPv4HeaderLen || total < ihl || len(ip) < total {
		return Datagram{}, ErrTruncated
	}
	ip = ip[:total]
	if Checksum(0, ip[:ihl]) != 0 {
		return Datagram{}, ErrIPChecksum
	}
	if ip[9] != ProtoUDP {
		return Datagram{}, ErrNotUDP
	}
	if binary.BigEndian.Uint16(ip[6:])&0x3fff != 0 {
		return Datagram{}, ErrFragment
	}
	src := netip.AddrFrom4([4]byte(ip[12:16]))
	dst := netip.AddrFrom4([4]byte(ip[16:20]))
	udp := ip[ihl:]
	if len(udp) < UDPHeaderLen {
		return Datagram{}, ErrTruncated
	}
	ulen := int(binary.BigEndian.Uint16(udp[4:]))
	if ulen < UDPHeaderLen || ulen > len(udp) {
		return Datagram{}, ErrTruncated
	}
	udp = udp[:ulen]
	if binary.BigEndian.Uint16(udp[6:]) != 0 && Checksum(PseudoSum(src, dst, ProtoUDP, ulen), udp) != 0 {
		return Datagram{}, ErrUDPChecksum
	}
	return Datagram{
		Src:     netip.AddrPortFrom(src, binary.BigEndian.Uint16(udp[0:])),
		Dst:     netip.AddrPortFrom(dst, binary.BigEndian.Uint16(udp[2:])),
		Payload: udp[UDPHeaderLen:],
	}, nil
}
