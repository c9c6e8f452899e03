//go:build linux

package filter

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/warrenvm/warren/ebpf/audit"
	"github.com/warrenvm/warren/internal/netframe"
)

// tc verdicts the program returns.
const (
	actOK   = 0 // TC_ACT_OK
	actShot = 2 // TC_ACT_SHOT
)

var (
	guestMAC = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x02}
	hostMAC  = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x01}
)

// needRoot skips t unless it runs as root: the tests load BPF programs,
// make taps and enter network namespaces.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("ebpf/filter: the test loads BPF programs and needs root")
	}
}

// eachAttach runs test (as root) once per attachment a caller asks for:
// auto (tcx where the kernel has it, else clsact) and clsact.
func eachAttach(t *testing.T, test func(t *testing.T, mode AttachMode)) {
	needRoot(t)
	for _, mode := range []AttachMode{AttachAuto, AttachClsact} {
		t.Run(mode.String(), func(t *testing.T) { test(t, mode) })
	}
}

// loadOrSkip loads a filter, skipping the test where BPF is unavailable
// (not root, or a kernel without it).
func loadOrSkip(t *testing.T, cfg Config) *Filter {
	t.Helper()
	needRoot(t)
	f, err := Load(cfg)
	if err != nil {
		var verr *ebpf.VerifierError
		if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, os.ErrPermission) {
			t.Skipf("ebpf/filter: BPF unavailable: %v", err)
		}
		if errors.As(err, &verr) {
			t.Fatalf("verifier: %+v", verr)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// run runs the program on frame with BPF_PROG_TEST_RUN.
func run(t *testing.T, f *Filter, frame []byte) uint32 {
	t.Helper()
	ret, err := f.objs.EgressFilter.Run(&ebpf.RunOptions{Data: frame})
	if err != nil {
		t.Fatalf("prog test run (frame of %d bytes): %v", len(frame), err)
	}
	return ret
}

// readEvents returns the events now in the ring buffer (the program
// submits them before BPF_PROG_TEST_RUN returns).
func readEvents(t *testing.T, f *Filter) []Event {
	t.Helper()
	var out []Event
	for {
		f.reader.SetDeadline(time.Now())
		rec, err := f.reader.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out
		}
		if err != nil {
			t.Fatalf("ring buffer: %v", err)
		}
		e, err := DecodeEvent(rec.RawSample)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
}

// collector is an audit.Recorder for tests.
type collector struct{ audit.Memory }

// find returns the first record matching m.
func (c *collector) find(m func(audit.Record) bool) (audit.Record, bool) {
	for _, r := range c.Records() {
		if m(r) {
			return r, true
		}
	}
	return audit.Record{}, false
}

// waitFor polls until cond holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ethFrame is an Ethernet frame from the guest to the host.
func ethFrame(dst net.HardwareAddr, ethertype uint16, payload []byte) []byte {
	b := make([]byte, 14, 14+len(payload))
	copy(b[0:6], dst)
	copy(b[6:12], guestMAC)
	binary.BigEndian.PutUint16(b[12:], ethertype)
	return append(b, payload...)
}

// ipv4Packet is an IPv4 header (fragment offset fragOff in 8-byte units,
// more-fragments flag mf) followed by l4.
func ipv4Packet(src, dst netip.Addr, proto uint8, fragOff uint16, mf bool, l4 []byte) []byte {
	h := make([]byte, 20, 20+len(l4))
	h[0] = 0x45
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(l4)))
	binary.BigEndian.PutUint16(h[4:], 0x1234)
	fo := fragOff & 0x1fff
	if mf {
		fo |= 0x2000
	}
	binary.BigEndian.PutUint16(h[6:], fo)
	h[8] = 64
	h[9] = proto
	s, d := src.As4(), dst.As4()
	copy(h[12:16], s[:])
	copy(h[16:20], d[:])
	binary.BigEndian.PutUint16(h[10:], netframe.Checksum(0, h))
	return append(h, l4...)
}

// tcpSyn is a TCP SYN segment with a valid checksum.
func tcpSyn(src, dst netip.Addr, sport, dport uint16) []byte {
	b := make([]byte, 20)
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint32(b[4:], 1000)
	b[12] = 5 << 4
	b[13] = 0x02 // SYN
	binary.BigEndian.PutUint16(b[14:], 65535)
	binary.BigEndian.PutUint16(b[16:], netframe.Checksum(netframe.PseudoSum(src, dst, 6, len(b)), b))
	return b
}

// icmpEcho is an ICMP echo request.
func icmpEcho(id, seq uint16) []byte {
	b := make([]byte, 16)
	b[0] = 8
	binary.BigEndian.PutUint16(b[4:], id)
	binary.BigEndian.PutUint16(b[6:], seq)
	copy(b[8:], "warren!!")
	binary.BigEndian.PutUint16(b[2:], netframe.Checksum(0, b))
	return b
}

// Frames from the guest to the host.
func tcpFrame(dstMAC net.HardwareAddr, src, dst netip.Addr, sport, dport uint16) []byte {
	return ethFrame(dstMAC, 0x0800, ipv4Packet(src, dst, 6, 0, false, tcpSyn(src, dst, sport, dport)))
}

func udpFrame(dstMAC net.HardwareAddr, src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	f := netframe.UDPFlow{SrcMAC: guestMAC, DstMAC: dstMAC, Src: src, Dst: dst, SrcPort: sport, DstPort: dport}
	return netframe.AppendUDP(nil, f, 0x1234, payload)
}

func icmpFrame(dstMAC net.HardwareAddr, src, dst netip.Addr, id, seq uint16) []byte {
	return ethFrame(dstMAC, 0x0800, ipv4Packet(src, dst, 1, 0, false, icmpEcho(id, seq)))
}

// ipv6Frame is an IPv6 UDP packet (the payload is not checked by the
// filter).
func ipv6Frame(src, dst netip.Addr) []byte {
	h := make([]byte, 40+8)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], 8)
	h[6] = 17
	h[7] = 64
	s, d := src.As16(), dst.As16()
	copy(h[8:24], s[:])
	copy(h[24:40], d[:])
	binary.BigEndian.PutUint16(h[40:], 1000)
	binary.BigEndian.PutUint16(h[42:], 2000)
	binary.BigEndian.PutUint16(h[44:], 8)
	return ethFrame(hostMAC, 0x86DD, h)
}

// arpRequest is an ARP request from the guest.
func arpRequest(sender, target netip.Addr) []byte {
	b := make([]byte, 28)
	binary.BigEndian.PutUint16(b[0:], 1)
	binary.BigEndian.PutUint16(b[2:], 0x0800)
	b[4], b[5] = 6, 4
	binary.BigEndian.PutUint16(b[6:], 1)
	copy(b[8:14], guestMAC)
	s, d := sender.As4(), target.As4()
	copy(b[14:18], s[:])
	copy(b[24:28], d[:])
	return ethFrame(net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 0x0806, b)
}

// ebpfRunRepeat runs a frame n times in one BPF_PROG_TEST_RUN.
type ebpfRunRepeat struct {
	frame []byte
	n     int
}

func (r ebpfRunRepeat) opts() *ebpf.RunOptions {
	return &ebpf.RunOptions{Data: r.frame, Repeat: uint32(r.n)}
}
