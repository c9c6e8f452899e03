//go:build linux

package filter

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/ebpf/audit"
	"github.com/warrenvm/warren/ebpf/policy"
)

var (
	guestIP  = netip.MustParseAddr("10.201.0.2")
	gateway  = netip.MustParseAddr("10.201.0.1")
	testConf = Config{GuestIP: guestIP, Gateway: gateway, ProxyPorts: []uint16{3128, 8443}}
	zeroAddr = netip.MustParseAddr("0.0.0.0")
	bcast    = netip.MustParseAddr("255.255.255.255")
)

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

// testTable is a small compiled policy used by the case table.
func testTable(t *testing.T) []policy.Entry {
	t.Helper()
	rules := []policy.Rule{
		{ID: 1, CIDR: netip.MustParsePrefix("93.184.216.0/24"), Proto: "tcp", Ports: "443"},
		{ID: 2, CIDR: netip.MustParsePrefix("93.184.216.34/32"), Proto: "udp", Ports: "8000-8100"},
		{ID: 3, CIDR: netip.MustParsePrefix("192.0.2.0/24"), Proto: "icmp"},
		{ID: 4, CIDR: netip.MustParsePrefix("198.51.100.0/24"), Proto: "any"},
		{ID: 5, CIDR: netip.MustParsePrefix("203.0.113.0/24"), Proto: "tcp"},
	}
	return compile(t, rules)
}

// compile compiles rules.
func compile(t *testing.T, rules []policy.Rule) []policy.Entry {
	t.Helper()
	table, err := policy.Compile(rules, nil)
	if err != nil {
		t.Fatal(err)
	}
	return table
}

// syncRules compiles rules and syncs f to the table.
func syncRules(t *testing.T, f *Filter, rules []policy.Rule) {
	t.Helper()
	if err := f.Sync(compile(t, rules)); err != nil {
		t.Fatal(err)
	}
}

func TestProgramCases(t *testing.T) {
	f := loadOrSkip(t, testConf)
	if err := f.Sync(testTable(t)); err != nil {
		t.Fatal(err)
	}
	g := guestIP
	truncTCP := ethFrame(hostMAC, 0x0800, ipv4Packet(g, ip("93.184.216.34"), 6, 0, false, make([]byte, 10)))
	truncUDP := ethFrame(hostMAC, 0x0800, ipv4Packet(g, ip("93.184.216.34"), 17, 0, false, make([]byte, 6)))
	badIHL := ethFrame(hostMAC, 0x0800, ipv4Packet(g, ip("198.51.100.1"), 6, 0, false, nil))
	badIHL[14] = 0x4f // ihl 15: 60 bytes of header, the frame has 20
	badVersion := tcpFrame(hostMAC, g, ip("198.51.100.1"), 1, 80)
	badVersion[14] = 0x65
	shortIHL := tcpFrame(hostMAC, g, ip("198.51.100.1"), 1, 80)
	shortIHL[14] = 0x44
	fragTCP := func(dst netip.Addr) []byte {
		return ethFrame(hostMAC, 0x0800, ipv4Packet(g, dst, 6, 100, false, make([]byte, 32)))
	}
	firstFrag := ethFrame(hostMAC, 0x0800, ipv4Packet(g, ip("93.184.216.10"), 6, 0, true, tcpSyn(g, ip("93.184.216.10"), 4000, 443)))

	cases := []struct {
		name   string
		frame  []byte
		allow  bool
		rule   uint32
		reason string
		event  bool // an event is expected (allows: first of flow)
	}{
		{"arp", arpRequest(g, gateway), true, RuleARP, "", false},
		{"arp from a spoofed sender", arpRequest(ip("10.9.9.9"), gateway), true, RuleARP, "", false},
		{"dhcp discover from 0.0.0.0", udpFrame(bcast6(), zeroAddr, bcast, 68, 67, nil), true, RuleDHCP, "", true},
		{"dhcp request to gateway", udpFrame(hostMAC, g, gateway, 68, 67, nil), true, RuleDHCP, "", true},
		{"dhcp to elsewhere", udpFrame(hostMAC, g, ip("8.8.8.8"), 68, 67, nil), false, 0, "no-rule", true},
		{"dhcp from 0.0.0.0 to elsewhere", udpFrame(hostMAC, zeroAddr, ip("8.8.8.8"), 68, 67, nil), false, 0, "spoofed-source", true},
		{"dhcp from 0.0.0.0, wrong source port", udpFrame(hostMAC, zeroAddr, bcast, 67, 67, nil), false, 0, "spoofed-source", true},
		{"0.0.0.0 but not dhcp", udpFrame(hostMAC, zeroAddr, gateway, 68, 53, nil), false, 0, "spoofed-source", true},
		{"dns udp to resolver", udpFrame(hostMAC, g, gateway, 5353, 53, nil), true, RuleDNS, "", true},
		{"dns tcp to resolver", tcpFrame(hostMAC, g, gateway, 5354, 53), true, RuleDNS, "", true},
		{"dns udp elsewhere", udpFrame(hostMAC, g, ip("8.8.8.8"), 5355, 53, nil), false, 0, "dns-not-resolver", true},
		{"dns tcp elsewhere (even allowed by a rule)", tcpFrame(hostMAC, g, ip("198.51.100.53"), 5356, 53), false, 0, "dns-not-resolver", true},
		{"proxy port 1", tcpFrame(hostMAC, g, gateway, 40000, 3128), true, RuleProxy, "", true},
		{"proxy port 2", tcpFrame(hostMAC, g, gateway, 40001, 8443), true, RuleProxy, "", true},
		{"gateway other tcp port", tcpFrame(hostMAC, g, gateway, 40002, 22), false, 0, "no-rule", true},
		{"proxy port over udp", udpFrame(hostMAC, g, gateway, 40003, 3128, nil), false, 0, "no-rule", true},
		{"spoofed source", tcpFrame(hostMAC, ip("10.201.0.99"), ip("93.184.216.34"), 40004, 443), false, 0, "spoofed-source", true},
		{"rule tcp 443", tcpFrame(hostMAC, g, ip("93.184.216.34"), 40005, 443), true, 1, "", true},
		{"rule tcp 443 from /24", tcpFrame(hostMAC, g, ip("93.184.216.1"), 40006, 443), true, 1, "", true},
		{"rule udp range low", udpFrame(hostMAC, g, ip("93.184.216.34"), 40007, 8000, nil), true, 2, "", true},
		{"rule udp range high", udpFrame(hostMAC, g, ip("93.184.216.34"), 40008, 8100, nil), true, 2, "", true},
		{"udp past range", udpFrame(hostMAC, g, ip("93.184.216.34"), 40009, 8101, nil), false, 0, "port", true},
		{"udp on /24 only tcp", udpFrame(hostMAC, g, ip("93.184.216.1"), 40010, 8000, nil), false, 0, "proto", true},
		{"tcp wrong port", tcpFrame(hostMAC, g, ip("93.184.216.34"), 40011, 80), false, 0, "port", true},
		{"icmp rule", icmpFrame(hostMAC, g, ip("192.0.2.7"), 1, 1), true, 3, "", true},
		{"tcp to icmp-only prefix", tcpFrame(hostMAC, g, ip("192.0.2.7"), 40012, 80), false, 0, "proto", true},
		{"any proto rule, gre", ethFrame(hostMAC, 0x0800, ipv4Packet(g, ip("198.51.100.9"), 47, 0, false, make([]byte, 8))), true, 4, "", true},
		{"no rule", tcpFrame(hostMAC, g, ip("1.1.1.1"), 40013, 443), false, 0, "no-rule", true},
		{"icmp no rule", icmpFrame(hostMAC, g, ip("1.1.1.1"), 1, 1), false, 0, "no-rule", true},
		{"ipv6 denied", ipv6Frame(ip("fd00::2"), ip("2001:db8::1")), false, 0, "ipv6", true},
		{"other ethertype", ethFrame(hostMAC, 0x88cc, make([]byte, 46)), false, 0, "ethertype", true},
		{"vlan tag", ethFrame(hostMAC, 0x8100, make([]byte, 46)), false, 0, "ethertype", true},
		{"truncated ipv4 header", ethFrame(hostMAC, 0x0800, make([]byte, 10)), false, 0, "malformed", true},
		{"truncated ipv6 header", ethFrame(hostMAC, 0x86DD, make([]byte, 30)), false, 0, "malformed", true},
		{"truncated tcp", truncTCP, false, 0, "malformed", true},
		{"truncated udp", truncUDP, false, 0, "malformed", true},
		{"ihl past the end", badIHL, false, 0, "malformed", true},
		{"ihl below 5", shortIHL, false, 0, "malformed", true},
		{"ip version 6 in an ipv4 frame", badVersion, false, 0, "malformed", true},
		{"first fragment is checked as usual", firstFrag, true, 1, "", true},
		{"later fragment, port-limited rule", fragTCP(ip("93.184.216.34")), false, 0, "fragment", true},
		{"later fragment, all-ports tcp rule", fragTCP(ip("203.0.113.5")), true, 5, "", true},
		{"later fragment, any rule", fragTCP(ip("198.51.100.5")), true, 4, "", true},
		{"later fragment, no rule", fragTCP(ip("1.1.1.1")), false, 0, "no-rule", true},
		{"later fragment to the resolver port unknown", fragTCP(gateway), false, 0, "no-rule", true},
	}
	var wantAllowed, wantDenied, allowBytes, deniedBytes uint64
	for _, c := range cases {
		ret, err := f.objs.EgressFilter.Run(&ebpf.RunOptions{Data: c.frame})
		if err != nil && errors.Is(err, unix.EINVAL) && len(c.frame) < 14+40 && c.reason == "malformed" {
			// BPF_PROG_TEST_RUN refuses a frame whose IP header is
			// incomplete; TestTap writes one into a real tap instead.
			t.Logf("%s: the kernel's test run refuses the frame (%v)", c.name, err)
			continue
		}
		if err != nil {
			t.Fatalf("%s: test run: %v", c.name, err)
		}
		want := uint32(actShot)
		if c.allow {
			want = actOK
			wantAllowed++
			allowBytes += uint64(len(c.frame))
		} else {
			wantDenied++
			deniedBytes += uint64(len(c.frame))
		}
		if ret != want {
			t.Errorf("%s: verdict %d, want %d", c.name, ret, want)
		}
		evs := readEvents(t, f)
		if !c.event {
			if len(evs) != 0 {
				t.Errorf("%s: unexpected events %+v", c.name, evs)
			}
			continue
		}
		if len(evs) != 1 {
			t.Errorf("%s: %d events, want 1: %+v", c.name, len(evs), evs)
			continue
		}
		e := evs[0]
		if e.Allowed != c.allow || e.Reason != c.reason || e.RuleID != c.rule {
			t.Errorf("%s: event %+v, want allowed=%v reason=%q rule=%#x", c.name, e, c.allow, c.reason, c.rule)
		}
	}
	cnt, err := f.Counters()
	if err != nil {
		t.Fatal(err)
	}
	want := Counters{AllowedPackets: wantAllowed, AllowedBytes: allowBytes, DeniedPackets: wantDenied, DeniedBytes: deniedBytes}
	if cnt != want {
		t.Errorf("counters %+v, want %+v", cnt, want)
	}
}

func bcast6() []byte { return []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff} }

func TestIPv6Config(t *testing.T) {
	f := loadOrSkip(t, testConf)
	fr := ipv6Frame(ip("fd00::2"), ip("2001:db8::1"))
	if ret := run(t, f, fr); ret != actShot {
		t.Fatalf("ipv6 off: verdict %d", ret)
	}
	cfg := testConf
	cfg.IPv6 = true
	if err := f.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	readEvents(t, f)
	if ret := run(t, f, fr); ret != actOK {
		t.Fatalf("ipv6 on: verdict %d", ret)
	}
	evs := readEvents(t, f)
	if len(evs) != 1 || !evs[0].Allowed || evs[0].RuleID != RuleIPv6 || evs[0].Src != ip("fd00::2") || evs[0].Dst != ip("2001:db8::1") || evs[0].ProtoName() != "ipv6" {
		t.Fatalf("events %+v", evs)
	}
	// The guest-address check is IPv4 only; a zero GuestIP turns it off.
	cfg = Config{Gateway: gateway}
	if err := f.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if ret := run(t, f, udpFrame(hostMAC, ip("10.9.9.9"), gateway, 1, 53, nil)); ret != actOK {
		t.Fatalf("no guest ip: verdict %d", ret)
	}
}

// TestFlowAudit checks that allowed flows are audited once per policy
// generation and denied packets every time.
func TestFlowAudit(t *testing.T) {
	f := loadOrSkip(t, testConf)
	table := testTable(t)
	if err := f.Sync(table); err != nil {
		t.Fatal(err)
	}
	allowed := tcpFrame(hostMAC, guestIP, ip("93.184.216.34"), 50000, 443)
	denied := tcpFrame(hostMAC, guestIP, ip("93.184.216.34"), 50000, 444)
	count := func() (allows, denies int) {
		for _, e := range readEvents(t, f) {
			if e.Allowed {
				allows++
			} else {
				denies++
			}
		}
		return
	}
	for range 5 {
		run(t, f, allowed)
		run(t, f, denied)
	}
	if a, d := count(); a != 1 || d != 5 {
		t.Fatalf("5 packets each: %d allow and %d deny events, want 1 and 5", a, d)
	}
	// The same table again changes nothing: no new generation.
	gen := f.Generation()
	if err := f.Sync(table); err != nil {
		t.Fatal(err)
	}
	if f.Generation() != gen {
		t.Fatalf("an unchanged Sync bumped the generation")
	}
	run(t, f, allowed)
	if a, _ := count(); a != 0 {
		t.Fatalf("unchanged policy: %d allow events, want 0", a)
	}
	// A policy change audits flows again.
	table2 := compile(t, []policy.Rule{{ID: 7, CIDR: netip.MustParsePrefix("93.184.216.34/32"), Proto: "tcp", Ports: "443"}})
	if err := f.Sync(table2); err != nil {
		t.Fatal(err)
	}
	if f.Generation() == gen {
		t.Fatalf("a changed Sync kept the generation")
	}
	run(t, f, allowed)
	run(t, f, allowed)
	evs := readEvents(t, f)
	if len(evs) != 1 || !evs[0].Allowed || evs[0].RuleID != 7 {
		t.Fatalf("after a policy change: %+v, want one allow with rule 7", evs)
	}
	// The old table's other prefixes are gone.
	if ret := run(t, f, icmpFrame(hostMAC, guestIP, ip("192.0.2.7"), 1, 1)); ret != actShot {
		t.Fatalf("a deleted prefix still allows")
	}
	var k egressLpmKey
	var v egressAllowVal
	n := 0
	for it := f.objs.AllowV4.Iterate(); it.Next(&k, &v); {
		n++
	}
	if n != len(table2) {
		t.Fatalf("allow_v4 holds %d prefixes, want %d", n, len(table2))
	}
	// SetConfig bumps the generation too.
	if err := f.SetConfig(testConf); err != nil {
		t.Fatal(err)
	}
	readEvents(t, f)
	run(t, f, allowed)
	if a, _ := count(); a != 1 {
		t.Fatalf("after SetConfig: %d allow events, want 1", a)
	}
}

// TestEventsAPI checks Events: the records it gives, and that it ends with
// the context and with Close.
func TestEventsAPI(t *testing.T) {
	f := loadOrSkip(t, testConf)
	if err := f.Sync(testTable(t)); err != nil {
		t.Fatal(err)
	}
	var sink collector
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Events(ctx, &sink) }()
	before := time.Now().Add(-time.Second)
	run(t, f, tcpFrame(hostMAC, guestIP, ip("93.184.216.34"), 1234, 443))
	run(t, f, udpFrame(hostMAC, guestIP, ip("8.8.8.8"), 1235, 53, nil))
	run(t, f, ethFrame(hostMAC, 0x0800, ipv4Packet(guestIP, ip("198.51.100.3"), 132, 0, false, nil)))
	if !waitFor(2*time.Second, func() bool { return len(sink.Records()) == 3 }) {
		t.Fatalf("records: %+v", sink.Records())
	}
	recs := sink.Records()
	want := []audit.Record{
		{Source: audit.SourceFilter, Verdict: audit.Allow, Proto: "tcp", Src: "10.201.0.2", Dst: "93.184.216.34", SrcPort: 1234, DstPort: 443, RuleID: 1},
		{Source: audit.SourceFilter, Verdict: audit.Deny, Proto: "udp", Src: "10.201.0.2", Dst: "8.8.8.8", SrcPort: 1235, DstPort: 53, Reason: "dns-not-resolver"},
		{Source: audit.SourceFilter, Verdict: audit.Allow, Proto: "132", Src: "10.201.0.2", Dst: "198.51.100.3", RuleID: 4},
	}
	for i, r := range recs {
		if r.Time.Before(before) || r.Time.After(time.Now().Add(time.Second)) {
			t.Errorf("record %d: time %v is not now", i, r.Time)
		}
		r.Time = time.Time{}
		if r.Src != want[i].Src || r.Dst != want[i].Dst || r.Proto != want[i].Proto || r.Verdict != want[i].Verdict ||
			r.SrcPort != want[i].SrcPort || r.DstPort != want[i].DstPort || r.RuleID != want[i].RuleID ||
			r.Reason != want[i].Reason || r.Source != want[i].Source {
			t.Errorf("record %d: %+v, want %+v", i, r, want[i])
		}
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Events after cancel: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Events did not end with its context")
	}
	go func() { done <- f.Events(context.Background(), &sink) }()
	time.Sleep(50 * time.Millisecond)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Events after Close: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Events did not end with Close")
	}
}

// TestRingFull checks that events lost to a full ring buffer are counted.
func TestRingFull(t *testing.T) {
	f := loadOrSkip(t, testConf)
	fr := tcpFrame(hostMAC, guestIP, ip("1.1.1.1"), 1, 1)
	// Each record takes 8 bytes of header and 56 of event.
	n := RingBufferSize/64 + 100
	ret, err := f.objs.EgressFilter.Run(ebpfRunRepeat{fr, n}.opts())
	if err != nil || ret != actShot {
		t.Fatalf("run: %d %v", ret, err)
	}
	c, err := f.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c.DeniedPackets != uint64(n) || c.EventsDropped < 100 || c.EventsDropped > 200 {
		t.Fatalf("counters %+v after %d denied packets", c, n)
	}
}

// TestPolicyProperty compares the program with policy.Lookup on random
// policies and packets.
func TestPolicyProperty(t *testing.T) {
	f := loadOrSkip(t, testConf)
	rng := rand.New(rand.NewPCG(1, 2))
	var table []policy.Entry
	newPolicy := func() {
		for {
			var rules []policy.Rule
			for i := range 1 + rng.IntN(40) {
				rules = append(rules, randomRule(rng, uint32(i+1)))
			}
			tb, err := policy.Compile(rules, nil)
			if err != nil {
				continue // too many port rules on one prefix: draw again
			}
			table = tb
			break
		}
		if err := f.Sync(table); err != nil {
			t.Fatal(err)
		}
	}
	newPolicy()
	seen := map[[4]uint64]bool{}
	gen := f.Generation()
	allows, denies := 0, 0
	for i := range 2000 {
		if i%500 == 499 {
			newPolicy()
		}
		if g := f.Generation(); g != gen {
			gen, seen = g, map[[4]uint64]bool{}
		}
		dst := randomDst(rng, table)
		proto := []uint8{6, 6, 17, 17, 1, 47}[rng.IntN(6)]
		var dport, sport uint16
		var fr []byte
		switch proto {
		case 6, 17:
			dport = randomPort(rng)
			sport = uint16(1024 + rng.IntN(64))
			if proto == 6 {
				fr = tcpFrame(hostMAC, guestIP, dst, sport, dport)
			} else {
				fr = udpFrame(hostMAC, guestIP, dst, sport, dport, nil)
			}
		case 1:
			fr = icmpFrame(hostMAC, guestIP, dst, uint16(i), 1)
		default:
			fr = ethFrame(hostMAC, 0x0800, ipv4Packet(guestIP, dst, proto, 0, false, make([]byte, 8)))
		}
		rule, ok := policy.Lookup(table, dst, proto, dport)
		ret := run(t, f, fr)
		if ok != (ret == actOK) {
			t.Fatalf("packet %d %v proto %d port %d: verdict %d, Lookup says %v (%+v)", i, dst, proto, dport, ret, ok, rule)
		}
		evs := readEvents(t, f)
		a4 := dst.As4()
		key := [4]uint64{uint64(proto), uint64(sport), uint64(dport), uint64(a4[0])<<24 | uint64(a4[1])<<16 | uint64(a4[2])<<8 | uint64(a4[3])}
		if ok {
			allows++
			if seen[key] {
				if len(evs) != 0 {
					t.Fatalf("packet %d: a flow seen before has events %+v", i, evs)
				}
				continue
			}
			seen[key] = true
			if len(evs) != 1 || !evs[0].Allowed || evs[0].RuleID != rule.RuleID {
				t.Fatalf("packet %d %v proto %d port %d: events %+v, want allow with rule %d", i, dst, proto, dport, evs, rule.RuleID)
			}
			continue
		}
		denies++
		if len(evs) != 1 || evs[0].Allowed || evs[0].Reason != expectedReason(table, dst, proto) {
			t.Fatalf("packet %d %v proto %d port %d: events %+v, want a deny %q", i, dst, proto, dport, evs, expectedReason(table, dst, proto))
		}
	}
	if allows < 200 || denies < 200 {
		t.Fatalf("a lopsided draw: %d allowed, %d denied", allows, denies)
	}
	c, err := f.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c.AllowedPackets != uint64(allows) || c.DeniedPackets != uint64(denies) || c.EventsDropped != 0 {
		t.Fatalf("counters %+v, want %d allowed and %d denied", c, allows, denies)
	}
}

func expectedReason(table []policy.Entry, dst netip.Addr, proto uint8) string {
	best := -1
	for i, e := range table {
		if e.Prefix.Contains(dst) && (best < 0 || e.Prefix.Bits() > table[best].Prefix.Bits()) {
			best = i
		}
	}
	if best < 0 {
		return "no-rule"
	}
	for _, r := range table[best].Rules {
		if r.Proto == policy.ProtoAny || r.Proto == proto {
			return "port"
		}
	}
	return "proto"
}

// Random rules live in 172.16.0.0/12, so that the gateway and the infra
// ports stay out of the draw.
var space = netip.MustParsePrefix("172.16.0.0/12")

func randomRule(rng *rand.Rand, id uint32) policy.Rule {
	bits := 12 + rng.IntN(21)
	a := space.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | rng.Uint32()&0x000fffff
	// Keep the addresses clustered so that prefixes nest.
	v = v&^0x0000ff00 | uint32(rng.IntN(4))<<8
	addr := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	r := policy.Rule{ID: id, CIDR: netip.PrefixFrom(addr, bits).Masked()}
	switch rng.IntN(5) {
	case 0:
		r.Proto = "any"
	case 1:
		r.Proto = "icmp"
	case 2, 3:
		r.Proto = "tcp"
	default:
		r.Proto = "udp"
	}
	if r.Proto == "tcp" || r.Proto == "udp" {
		switch rng.IntN(3) {
		case 0:
		case 1:
			r.Ports = itoa(100 + rng.IntN(40))
		default:
			lo := 100 + rng.IntN(40)
			r.Ports = itoa(lo) + "-" + itoa(lo+rng.IntN(10))
		}
	}
	return r
}

func itoa(i int) string { return string(appendInt(nil, i)) }

func appendInt(b []byte, i int) []byte {
	if i >= 10 {
		b = appendInt(b, i/10)
	}
	return append(b, byte('0'+i%10))
}

func randomDst(rng *rand.Rand, table []policy.Entry) netip.Addr {
	if rng.IntN(4) == 0 || len(table) == 0 {
		a := space.Addr().As4()
		v := uint32(a[0])<<24 | uint32(a[1])<<16 | rng.Uint32()&0x000fffff
		v = v&^0x0000ff00 | uint32(rng.IntN(4))<<8
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	p := table[rng.IntN(len(table))].Prefix
	a := p.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	if p.Bits() < 32 {
		host := uint32(1)<<(32-p.Bits()) - 1
		v |= rng.Uint32() & host
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func randomPort(rng *rand.Rand) uint16 {
	if rng.IntN(5) == 0 {
		for {
			p := uint16(rng.Uint32())
			if p != 53 && p != 67 {
				return p
			}
		}
	}
	return uint16(95 + rng.IntN(60))
}
