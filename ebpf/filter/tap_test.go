//go:build linux

package filter

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/ebpf/audit"
	"github.com/warrenvm/warren/ebpf/policy"
)

// TestTap attaches the filter to a real tap in a fresh network namespace
// and acts as the guest by writing frames into the tap: what the filter
// allows must reach the host's stack (a SYN-ACK, an echo reply, a datagram
// at a listener), what it denies must not.
func TestTap(t *testing.T) {
	eachAttach(t, testTap)
}

const tapName = "wtap0"

var (
	tapHost   = netip.MustParseAddr("10.201.0.1")
	tapGuest  = netip.MustParseAddr("10.201.0.2")
	tapOther  = netip.MustParseAddr("10.201.0.3") // another host on the link: spoofing
	dstWeb    = netip.MustParseAddr("198.51.100.7")
	dstUDP    = netip.MustParseAddr("198.51.100.8")
	dstNoRule = netip.MustParseAddr("198.51.100.9")
)

// enterNetns moves the calling goroutine, locked to its thread, into a new
// network namespace for the rest of the test.
func enterNetns(t *testing.T) {
	t.Helper()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	ns, err := netns.New()
	if err != nil {
		orig.Close()
		runtime.UnlockOSThread()
		t.Skipf("cannot create a network namespace: %v", err)
	}
	t.Cleanup(func() {
		ns.Close()
		if err := netns.Set(orig); err != nil {
			// Leave the thread locked: it dies with the goroutine.
			t.Errorf("restore namespace: %v", err)
			return
		}
		orig.Close()
		runtime.UnlockOSThread()
	})
}

func sysctl(t *testing.T, path, value string) {
	t.Helper()
	if err := os.WriteFile("/proc/sys/"+path, []byte(value), 0o644); err != nil {
		t.Fatalf("sysctl %s: %v", path, err)
	}
}

// openTap creates the tap (IFF_TAP|IFF_NO_PI) and returns its fd as a
// pollable file.
func openTap(t *testing.T, name string) *os.File {
	t.Helper()
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Skipf("no /dev/net/tun: %v", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		t.Fatal(err)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		t.Fatalf("TUNSETIFF: %v", err)
	}
	f := os.NewFile(uintptr(fd), "/dev/net/tun")
	t.Cleanup(func() { f.Close() })
	return f
}

// replies collects what the host sends back through the tap.
type replies struct {
	mu   sync.Mutex
	seen map[string]int
}

func (r *replies) add(k string) {
	r.mu.Lock()
	r.seen[k]++
	r.mu.Unlock()
}

func (r *replies) has(k string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[k] > 0
}

// tcpKey, udpKey and icmpKey name a probe's flow (from the guest's side)
// and so the reply or the delivery that proves it got through.
func tcpKey(src, dst netip.Addr, sport, dport uint16) string {
	return fmt.Sprintf("tcp %v:%d>%v:%d", src, sport, dst, dport)
}

func udpKey(src, dst netip.Addr, sport, dport uint16) string {
	return fmt.Sprintf("udp %v:%d>%v:%d", src, sport, dst, dport)
}

func icmpKey(src, dst netip.Addr, id uint16) string {
	return fmt.Sprintf("icmp %v>%v id %d", src, dst, id)
}

// readTap records the host's answers: SYN-ACKs and RSTs, echo replies and
// any ICMP error (as "icmp-error ...").
func readTap(tap *os.File, r *replies) {
	buf := make([]byte, 65536)
	for {
		n, err := tap.Read(buf)
		if err != nil {
			return
		}
		b := buf[:n]
		if n < 14+20 || binary.BigEndian.Uint16(b[12:]) != 0x0800 {
			continue
		}
		ipb := b[14:]
		ihl := int(ipb[0]&0xf) * 4
		if len(ipb) < ihl+8 {
			continue
		}
		src := netip.AddrFrom4([4]byte(ipb[12:16]))
		dst := netip.AddrFrom4([4]byte(ipb[16:20]))
		l4 := ipb[ihl:]
		switch ipb[9] {
		case 6:
			sport, dport := binary.BigEndian.Uint16(l4[0:]), binary.BigEndian.Uint16(l4[2:])
			if len(l4) >= 14 && l4[13]&0x12 == 0x12 || len(l4) >= 14 && l4[13]&0x04 != 0 {
				r.add(tcpKey(dst, src, dport, sport))
			}
		case 1:
			switch l4[0] {
			case 0: // echo reply
				r.add(icmpKey(dst, src, binary.BigEndian.Uint16(l4[4:])))
			case 3, 11, 12:
				r.add("icmp-error " + src.String())
			}
		}
	}
}

// listenUDP binds a UDP listener in the namespace; every datagram it gets
// is recorded under its flow's key.
func listenUDP(t *testing.T, r *replies, addr netip.Addr, port uint16) {
	t.Helper()
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, port)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			_, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			r.add(udpKey(from.Addr().Unmap(), addr, from.Port(), port))
		}
	}()
}

func listenTCP(t *testing.T, addr netip.Addr, port uint16) {
	t.Helper()
	l, err := net.Listen("tcp4", netip.AddrPortFrom(addr, port).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
}

// probe is one packet the guest sends and what must come of it.
type probe struct {
	name   string
	frame  []byte
	key    string // the reply or delivery that shows it got through
	allow  bool
	rule   uint32 // allows: the rule in the audit record
	reason string // denies: the reason in the audit record
	match  func(audit.Record) bool
}

func flowMatch(proto string, src, dst netip.Addr, sport, dport uint16) func(audit.Record) bool {
	return func(r audit.Record) bool {
		return r.Proto == proto && r.Src == src.String() && r.Dst == dst.String() && r.SrcPort == sport && r.DstPort == dport
	}
}

func testTap(t *testing.T, mode AttachMode) {
	enterNetns(t)
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{dstWeb, dstUDP, dstNoRule} {
		if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
			t.Fatal(err)
		}
	}
	tap := openTap(t, tapName)
	tl, err := netlink.LinkByName(tapName)
	if err != nil {
		t.Fatal(err)
	}
	sysctl(t, "net/ipv6/conf/"+tapName+"/disable_ipv6", "1")
	for _, c := range []string{"all", "default", tapName} {
		sysctl(t, "net/ipv4/conf/"+c+"/rp_filter", "0")
	}
	if err := netlink.AddrAdd(tl, &netlink.Addr{IPNet: &net.IPNet{IP: tapHost.AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(tl); err != nil {
		t.Fatal(err)
	}
	for _, a := range []netip.Addr{tapGuest, tapOther} {
		n := &netlink.Neigh{LinkIndex: tl.Attrs().Index, IP: a.AsSlice(), HardwareAddr: guestMAC, State: netlink.NUD_PERMANENT}
		if err := netlink.NeighAdd(n); err != nil {
			t.Fatal(err)
		}
	}
	// The tap has carrier once its fd is attached and the link is up.
	if !waitFor(3*time.Second, func() bool {
		l, err := netlink.LinkByName(tapName)
		return err == nil && l.Attrs().RawFlags&unix.IFF_LOWER_UP != 0 && l.Attrs().Flags&net.FlagUp != 0
	}) {
		l, _ := netlink.LinkByName(tapName)
		t.Fatalf("the tap did not come up: %+v", l.Attrs())
	}
	tl, _ = netlink.LinkByName(tapName)
	tapMAC := tl.Attrs().HardwareAddr

	r := &replies{seen: map[string]int{}}
	go readTap(tap, r)
	listenTCP(t, dstWeb, 8080)
	listenTCP(t, dstWeb, 8081)
	listenTCP(t, dstNoRule, 8080)
	listenTCP(t, tapHost, 3128)
	listenTCP(t, tapHost, 22)
	listenUDP(t, r, dstUDP, 9000)
	listenUDP(t, r, dstUDP, 9002)
	listenUDP(t, r, dstNoRule, 9000)
	listenUDP(t, r, tapHost, 53)
	listenUDP(t, r, dstNoRule, 53)

	f := loadOrSkip(t, Config{GuestIP: tapGuest, Gateway: tapHost, ProxyPorts: []uint16{3128}})
	syncRules(t, f, []policy.Rule{
		{ID: 1, CIDR: netip.PrefixFrom(dstWeb, 32), Proto: "tcp", Ports: "8080"},
		{ID: 2, CIDR: netip.PrefixFrom(dstWeb, 32), Proto: "icmp"},
		{ID: 3, CIDR: netip.PrefixFrom(dstUDP, 32), Proto: "udp", Ports: "9000-9001"},
	})
	if err := f.Attach(tapName, mode); err != nil {
		t.Fatal(err)
	}
	got := f.AttachedMode()
	if mode == AttachClsact && got != AttachClsact || mode == AttachAuto && got != AttachTCX && got != AttachClsact {
		t.Fatalf("attached with %v, asked %v", got, mode)
	}
	t.Logf("attached with %v", got)
	if err := f.Attach(tapName, mode); err == nil {
		t.Fatal("a second Attach succeeded")
	}
	sink := &collector{}
	ctx, cancel := context.WithCancel(context.Background())
	evDone := make(chan error, 1)
	go func() { evDone <- f.Events(ctx, sink) }()
	defer func() {
		cancel()
		<-evDone
	}()

	write := func(fr []byte) {
		t.Helper()
		if _, err := tap.Write(fr); err != nil {
			t.Fatalf("write to the tap: %v", err)
		}
	}
	// The tap can drop the first packets while its queue comes up: send
	// allowed echo requests until one is answered.
	warm := false
	for seq := uint16(1); seq < 100 && !warm; seq++ {
		write(icmpFrame(tapMAC, tapGuest, dstWeb, 1, seq))
		warm = waitFor(50*time.Millisecond, func() bool { return r.has(icmpKey(tapGuest, dstWeb, 1)) })
	}
	if !warm {
		t.Fatal("no echo reply through the tap within 5 s")
	}

	sport := uint16(20000)
	next := func() uint16 { sport++; return sport }
	tcpProbe := func(name string, src, dst netip.Addr, dport uint16, allow bool, rule uint32, reason string) probe {
		sp := next()
		return probe{name, tcpFrame(tapMAC, src, dst, sp, dport), tcpKey(src, dst, sp, dport), allow, rule, reason, flowMatch("tcp", src, dst, sp, dport)}
	}
	udpProbe := func(name string, dst netip.Addr, dport uint16, allow bool, rule uint32, reason string) probe {
		sp := next()
		return probe{name, udpFrame(tapMAC, tapGuest, dst, sp, dport, []byte(name)), udpKey(tapGuest, dst, sp, dport), allow, rule, reason, flowMatch("udp", tapGuest, dst, sp, dport)}
	}
	icmpProbe := func(name string, dst netip.Addr, allow bool, rule uint32, reason string) probe {
		id := next()
		return probe{name, icmpFrame(tapMAC, tapGuest, dst, id, 1), icmpKey(tapGuest, dst, id), allow, rule, reason, flowMatch("icmp", tapGuest, dst, 0, 0)}
	}
	probes := []probe{
		tcpProbe("tcp allowed port", tapGuest, dstWeb, 8080, true, 1, ""),
		tcpProbe("tcp other port", tapGuest, dstWeb, 8081, false, 0, "port"),
		tcpProbe("tcp no rule", tapGuest, dstNoRule, 8080, false, 0, "no-rule"),
		tcpProbe("tcp spoofed source", tapOther, dstWeb, 8080, false, 0, "spoofed-source"),
		tcpProbe("tcp proxy port", tapGuest, tapHost, 3128, true, RuleProxy, ""),
		tcpProbe("tcp gateway ssh", tapGuest, tapHost, 22, false, 0, "no-rule"),
		udpProbe("udp allowed port", dstUDP, 9000, true, 3, ""),
		udpProbe("udp other port", dstUDP, 9002, false, 0, "port"),
		udpProbe("udp no rule", dstNoRule, 9000, false, 0, "no-rule"),
		udpProbe("dns to the resolver", tapHost, 53, true, RuleDNS, ""),
		udpProbe("dns elsewhere", dstNoRule, 53, false, 0, "dns-not-resolver"),
		icmpProbe("icmp allowed", dstWeb, true, 2, ""),
		icmpProbe("icmp not a rule's protocol", dstUDP, false, 0, "proto"),
		icmpProbe("icmp to the gateway", tapHost, false, 0, "no-rule"),
	}
	runProbes(t, f, r, sink, write, probes)

	// A truncated IPv4 header (which BPF_PROG_TEST_RUN refuses) is denied
	// as malformed.
	write(ethFrame(tapMAC, 0x0800, []byte{0x45, 0, 0, 20}))
	if !waitFor(2*time.Second, func() bool {
		_, ok := sink.find(func(r audit.Record) bool { return r.Reason == "malformed" })
		return ok
	}) {
		t.Error("no malformed record for a truncated IPv4 header")
	}

	// A live policy change: 8081 instead of 8080.
	syncRules(t, f, []policy.Rule{
		{ID: 11, CIDR: netip.PrefixFrom(dstWeb, 32), Proto: "tcp", Ports: "8081"},
		{ID: 2, CIDR: netip.PrefixFrom(dstWeb, 32), Proto: "icmp"},
		{ID: 3, CIDR: netip.PrefixFrom(dstUDP, 32), Proto: "udp", Ports: "9000-9001"},
	})
	runProbes(t, f, r, sink, write, []probe{
		tcpProbe("after sync: 8081 allowed", tapGuest, dstWeb, 8081, true, 11, ""),
		tcpProbe("after sync: 8080 denied", tapGuest, dstWeb, 8080, false, 0, "port"),
	})

	c, err := f.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c.AllowedPackets < 7 || c.DeniedPackets < 11 || c.EventsDropped != 0 {
		t.Errorf("counters %+v", c)
	}
	t.Logf("counters %+v", c)

	// Close detaches: what was denied gets through.
	cancel()
	<-evDone
	evDone <- nil
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if mode == AttachClsact {
		qs, err := netlink.QdiscList(tl)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			if q.Type() == "clsact" {
				t.Error("Close left the clsact qdisc it created")
			}
		}
	}
	p := tcpProbe("after close", tapGuest, dstNoRule, 8080, true, 0, "")
	write(p.frame)
	if !waitFor(2*time.Second, func() bool { return r.has(p.key) }) {
		t.Error("after Close the tap still filters")
	}
}

// runProbes writes each probe once and checks that exactly the allowed
// ones get through and that each has its audit record.
func runProbes(t *testing.T, f *Filter, r *replies, sink *collector, write func([]byte), probes []probe) {
	t.Helper()
	before, err := f.Counters()
	if err != nil {
		t.Fatal(err)
	}
	nAllow := 0
	for _, p := range probes {
		write(p.frame)
		if p.allow {
			nAllow++
		}
	}
	for _, p := range probes {
		if p.allow && !waitFor(2*time.Second, func() bool { return r.has(p.key) }) {
			t.Errorf("%s: allowed, but nothing got through", p.name)
		}
	}
	// Denied probes: give the host as long again as the allowed ones
	// took, and then some, to answer.
	time.Sleep(200 * time.Millisecond)
	for _, p := range probes {
		if !p.allow && r.has(p.key) {
			t.Errorf("%s: denied, but it got through", p.name)
		}
	}
	if r.has("icmp-error " + tapHost.String()) {
		t.Errorf("the host answered with an ICMP error")
	}
	for _, p := range probes {
		verdict := audit.Deny
		if p.allow {
			verdict = audit.Allow
		}
		ok := waitFor(2*time.Second, func() bool {
			_, ok := sink.find(func(rec audit.Record) bool {
				return p.match(rec) && rec.Verdict == verdict && rec.Reason == p.reason && rec.RuleID == p.rule
			})
			return ok
		})
		if !ok {
			t.Errorf("%s: no %s record with rule %#x and reason %q", p.name, verdict, p.rule, p.reason)
		}
	}
	after, err := f.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if d := after.DeniedPackets - before.DeniedPackets; d != uint64(len(probes)-nAllow) {
		t.Errorf("%d packets denied, want %d", d, len(probes)-nAllow)
	}
	if a := after.AllowedPackets - before.AllowedPackets; a != uint64(nAllow) {
		// The host sends nothing through the tap's ingress, so every
		// allowed packet is a probe's.
		t.Errorf("%d packets allowed, want %d", a, nAllow)
	}
}

// TestClsactExistingQdisc checks that a clsact attach leaves a clsact qdisc
// it did not create, and removes only its own filter.
func TestClsactExistingQdisc(t *testing.T) {
	needRoot(t)
	enterNetns(t)
	openTap(t, tapName)
	tl, err := netlink.LinkByName(tapName)
	if err != nil {
		t.Fatal(err)
	}
	q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: tl.Attrs().Index,
		Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
	if err := netlink.QdiscAdd(q); err != nil {
		t.Fatal(err)
	}
	f := loadOrSkip(t, Config{})
	if err := f.Attach(tapName, AttachClsact); err != nil {
		t.Fatal(err)
	}
	filters := func() int {
		fs, err := netlink.FilterList(tl, netlink.HANDLE_MIN_INGRESS)
		if err != nil {
			t.Fatal(err)
		}
		return len(fs)
	}
	if n := filters(); n != 1 {
		t.Fatalf("%d ingress filters after Attach, want 1", n)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if n := filters(); n != 0 {
		t.Fatalf("%d ingress filters after Close, want 0", n)
	}
	qs, err := netlink.QdiscList(tl)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, q := range qs {
		found = found || q.Type() == "clsact"
	}
	if !found {
		t.Fatal("Close removed a clsact qdisc it did not create")
	}
}
