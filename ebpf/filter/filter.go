//go:build linux

package filter

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/ebpf/audit"
	"github.com/warrenvm/warren/ebpf/policy"
)

// Reserved rule ids reported for the infrastructure allows. They are above
// every id a policy gives its rules and domains.
const (
	// RuleARP allows ARP.
	RuleARP uint32 = 0xFFFF0001
	// RuleDHCP allows DHCP (UDP to port 67) to the gateway or broadcast.
	RuleDHCP uint32 = 0xFFFF0002
	// RuleDNS allows DNS (UDP or TCP port 53) to the sandbox's resolver.
	RuleDNS uint32 = 0xFFFF0003
	// RuleProxy allows TCP to the gateway on one of the proxy ports.
	RuleProxy uint32 = 0xFFFF0004
	// RuleIPv6 allows IPv6 when the configuration enables it.
	RuleIPv6 uint32 = 0xFFFF0005
)

// MaxProxyPorts is the most proxy ports a Config may name.
const MaxProxyPorts = 4

// Sizes of the filter's maps (as in bpf/egress.c).
const (
	// RingBufferSize is the size in bytes of the audit event ring buffer.
	RingBufferSize = 256 * 1024
	// FlowsSize is the number of flows the allow-audit LRU remembers.
	FlowsSize = 16384
	// MaxPrefixes is the most prefixes the allow_v4 table holds.
	MaxPrefixes = 4096
)

// Reasons of denials, as the program numbers them (index) and as audit
// records name them.
var reasons = [...]string{
	0: "",
	1: "spoofed-source",
	2: "dns-not-resolver",
	3: "no-rule",
	4: "port",
	5: "proto",
	6: "ipv6",
	7: "ethertype",
	8: "malformed",
	9: "fragment",
}

// Config is the sandbox's own part of the filter's configuration.
type Config struct {
	// GuestIP is the guest's IPv4 address; packets from any other source
	// are denied ("spoofed-source"), but DHCP from 0.0.0.0. The zero Addr
	// turns the check off.
	GuestIP netip.Addr
	// Gateway is the host's IPv4 address on the tap: the sandbox's
	// resolver, DHCP server and credential proxy.
	Gateway netip.Addr
	// ProxyPorts are the TCP ports of the gateway the guest may reach
	// (at most MaxProxyPorts; 0 is ignored).
	ProxyPorts []uint16
	// IPv6 allows all IPv6 traffic; by default it is denied.
	IPv6 bool
}

// AttachMode says how the program is attached to the tap.
type AttachMode int

// Attach modes.
const (
	// AttachNone: not attached.
	AttachNone AttachMode = iota
	// AttachAuto uses tcx where the kernel has it (6.6 and later) and
	// clsact otherwise.
	AttachAuto
	// AttachTCX attaches a tcx ingress link.
	AttachTCX
	// AttachClsact adds a direct-action cls_bpf filter to the clsact
	// qdisc's ingress, creating the qdisc when the device has none.
	AttachClsact
)

// String names the mode.
func (m AttachMode) String() string {
	switch m {
	case AttachNone:
		return "none"
	case AttachAuto:
		return "auto"
	case AttachTCX:
		return "tcx"
	case AttachClsact:
		return "clsact"
	}
	return "AttachMode(" + strconv.Itoa(int(m)) + ")"
}

// Counters are the filter's totals since it was loaded.
type Counters struct {
	AllowedPackets, AllowedBytes uint64
	DeniedPackets, DeniedBytes   uint64
	// EventsDropped counts audit events lost because the ring buffer was
	// full.
	EventsDropped uint64
}

// Filter is one sandbox's loaded filter. Its methods are safe for
// concurrent use, but only one Events call may run at a time.
type Filter struct {
	mu     sync.Mutex
	objs   egressObjects
	reader *ringbuf.Reader
	cfg    Config
	gen    uint32
	table  map[netip.Prefix]egressAllowVal
	closed bool

	mode    AttachMode
	tcx     link.Link
	clsact  *netlink.BpfFilter
	qdisc   *netlink.GenericQdisc // the clsact qdisc, when we created it
	nlh     *netlink.Handle       // netlink in the device's namespace
	link    *os.File              // an adopted tcx link (FromFiles), closed by Close
	monoOff time.Duration         // wall clock minus CLOCK_MONOTONIC
}

var memlockOnce sync.Once

// Load loads the program and its maps into the kernel with configuration
// cfg and an empty policy (everything but the infrastructure is denied).
// A verifier rejection is returned with the verifier's full log.
func Load(cfg Config) (*Filter, error) {
	memlockOnce.Do(func() { _ = rlimit.RemoveMemlock() })
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	spec, err := loadEgress()
	if err != nil {
		return nil, fmt.Errorf("ebpf/filter: %w", err)
	}
	f := &Filter{table: map[netip.Prefix]egressAllowVal{}}
	if err := spec.LoadAndAssign(&f.objs, nil); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("ebpf/filter: load: %+v", verr)
		}
		return nil, fmt.Errorf("ebpf/filter: load: %w", err)
	}
	if f.reader, err = ringbuf.NewReader(f.objs.EventsRingbuf); err != nil {
		f.objs.Close()
		return nil, fmt.Errorf("ebpf/filter: ring buffer: %w", err)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err == nil {
		f.monoOff = time.Duration(time.Now().UnixNano() - ts.Nano())
	}
	f.cfg = cfg
	f.gen = 1
	if err := f.writeConfigLocked(); err != nil {
		f.reader.Close()
		f.objs.Close()
		return nil, err
	}
	return f, nil
}

func checkConfig(cfg Config) error {
	if cfg.GuestIP.IsValid() && !cfg.GuestIP.Is4() {
		return fmt.Errorf("ebpf/filter: guest address %v is not IPv4", cfg.GuestIP)
	}
	if cfg.Gateway.IsValid() && !cfg.Gateway.Is4() {
		return fmt.Errorf("ebpf/filter: gateway %v is not IPv4", cfg.Gateway)
	}
	if len(cfg.ProxyPorts) > MaxProxyPorts {
		return fmt.Errorf("ebpf/filter: %d proxy ports, at most %d", len(cfg.ProxyPorts), MaxProxyPorts)
	}
	return nil
}

// addr32 is a as the program compares it: its 4 bytes in memory order.
func addr32(a netip.Addr) uint32 {
	if !a.IsValid() {
		return 0
	}
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

func (f *Filter) writeConfigLocked() error {
	c := egressConfig{GuestIp: addr32(f.cfg.GuestIP), Gateway: addr32(f.cfg.Gateway), Generation: f.gen}
	copy(c.ProxyPorts[:], f.cfg.ProxyPorts)
	if f.cfg.IPv6 {
		c.Ipv6 = 1
	}
	if err := f.objs.ConfigMap.Update(uint32(0), &c, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("ebpf/filter: config: %w", err)
	}
	return nil
}

// SetConfig replaces the configuration of the running filter. It bumps the
// policy generation, so that flows are audited again.
func (f *Filter) SetConfig(cfg Config) error {
	if err := checkConfig(cfg); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return os.ErrClosed
	}
	f.cfg = cfg
	f.cfg.ProxyPorts = append([]uint16(nil), cfg.ProxyPorts...)
	f.gen++
	return f.writeConfigLocked()
}

// Generation is the current policy generation: it starts at 1 and grows
// with every SetConfig and every Sync that changes the table.
func (f *Filter) Generation() uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gen
}

func entryValue(e policy.Entry) (netip.Prefix, egressAllowVal, error) {
	var v egressAllowVal
	p := e.Prefix.Masked()
	if !p.IsValid() || !p.Addr().Is4() {
		return p, v, fmt.Errorf("ebpf/filter: prefix %v is not IPv4", e.Prefix)
	}
	if len(e.Rules) > policy.MaxPortRules {
		return p, v, fmt.Errorf("ebpf/filter: prefix %v: %d port rules, at most %d", p, len(e.Rules), policy.MaxPortRules)
	}
	v.Count = uint32(len(e.Rules))
	for i, r := range e.Rules {
		v.Rules[i] = egressPortRule{Proto: r.Proto, Lo: r.Lo, Hi: r.Hi, RuleId: r.RuleID}
	}
	return p, v, nil
}

func lpmKey(p netip.Prefix) egressLpmKey {
	return egressLpmKey{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As4()}
}

// Sync makes the filter's policy table equal to table (as compiled by
// policy.Compile): it inserts or updates the entries that changed first,
// then deletes those no longer present, so that no address loses a rule it
// keeps in between. When anything changed it bumps the policy generation,
// so that flows are audited again under the new policy.
func (f *Filter) Sync(table []policy.Entry) error {
	want := make(map[netip.Prefix]egressAllowVal, len(table))
	for _, e := range table {
		p, v, err := entryValue(e)
		if err != nil {
			return err
		}
		if _, dup := want[p]; dup {
			return fmt.Errorf("ebpf/filter: prefix %v twice in the table", p)
		}
		want[p] = v
	}
	if len(want) > MaxPrefixes {
		return fmt.Errorf("ebpf/filter: %d prefixes, at most %d", len(want), MaxPrefixes)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return os.ErrClosed
	}
	changed := false
	var err error
	for p, v := range want {
		if old, ok := f.table[p]; ok && old == v {
			continue
		}
		k := lpmKey(p)
		if err = f.objs.AllowV4.Update(&k, &v, ebpf.UpdateAny); err != nil {
			err = fmt.Errorf("ebpf/filter: update %v: %w", p, err)
			break
		}
		f.table[p] = v
		changed = true
	}
	if err == nil {
		for p := range f.table {
			if _, ok := want[p]; ok {
				continue
			}
			k := lpmKey(p)
			if derr := f.objs.AllowV4.Delete(&k); derr != nil && !errors.Is(derr, ebpf.ErrKeyNotExist) {
				err = fmt.Errorf("ebpf/filter: delete %v: %w", p, derr)
				break
			}
			delete(f.table, p)
			changed = true
		}
	}
	if changed {
		f.gen++
		if cerr := f.writeConfigLocked(); err == nil {
			err = cerr
		}
	}
	return err
}

// Counters returns the filter's totals, summed over the CPUs.
func (f *Filter) Counters() (Counters, error) {
	var per []egressCounters
	if err := f.objs.CountersMap.Lookup(uint32(0), &per); err != nil {
		return Counters{}, fmt.Errorf("ebpf/filter: counters: %w", err)
	}
	var c Counters
	for _, p := range per {
		c.AllowedPackets += p.AllowedPackets
		c.AllowedBytes += p.AllowedBytes
		c.DeniedPackets += p.DeniedPackets
		c.DeniedBytes += p.DeniedBytes
		c.EventsDropped += p.EventsDropped
	}
	return c, nil
}

// Event is one decision as the program reports it.
type Event struct {
	// Monotonic is the time of the decision, CLOCK_MONOTONIC in ns.
	Monotonic uint64
	// Src and Dst are the packet's addresses (invalid for non-IP
	// packets). Ports are 0 where the packet has none (or they are
	// unknown: IPv6, non-first fragments).
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	// Proto is the IPv4 protocol or the IPv6 next header.
	Proto uint8
	// IPVersion is 4, 6 or 0 (not IP, or malformed before the IP header).
	IPVersion uint8
	// Allowed is the verdict.
	Allowed bool
	// Reason says why a packet was denied ("" for allows).
	Reason string
	// RuleID is the policy rule or infrastructure rule (RuleARP, ...) that
	// allowed the packet.
	RuleID uint32
}

// EventSize is the size of an encoded event.
const EventSize = 56

// DecodeEvent decodes one ring buffer record of the program.
func DecodeEvent(b []byte) (Event, error) {
	if len(b) < EventSize {
		return Event{}, fmt.Errorf("ebpf/filter: event of %d bytes, want %d", len(b), EventSize)
	}
	ne := binary.NativeEndian
	e := Event{
		Monotonic: ne.Uint64(b[0:]),
		SrcPort:   ne.Uint16(b[40:]),
		DstPort:   ne.Uint16(b[42:]),
		Proto:     b[44],
		IPVersion: b[45],
		Allowed:   b[46] == 1,
		RuleID:    ne.Uint32(b[48:]),
	}
	if int(b[47]) < len(reasons) {
		e.Reason = reasons[b[47]]
	} else {
		e.Reason = "reason-" + strconv.Itoa(int(b[47]))
	}
	switch e.IPVersion {
	case 4:
		e.Src = netip.AddrFrom4([4]byte(b[8:12]))
		e.Dst = netip.AddrFrom4([4]byte(b[24:28]))
	case 6:
		e.Src = netip.AddrFrom16([16]byte(b[8:24]))
		e.Dst = netip.AddrFrom16([16]byte(b[24:40]))
	}
	return e, nil
}

// ProtoName names an event's protocol as audit records do: "tcp", "udp",
// "icmp", "ipv6" for any IPv6 packet, the number otherwise, and "" for
// packets that are not IP.
func (e Event) ProtoName() string {
	switch e.IPVersion {
	case 6:
		return "ipv6"
	case 4:
		switch e.Proto {
		case policy.ProtoTCP:
			return "tcp"
		case policy.ProtoUDP:
			return "udp"
		case policy.ProtoICMP:
			return "icmp"
		}
		return strconv.Itoa(int(e.Proto))
	}
	return ""
}

// record converts e to an audit record; monoOff is the wall clock minus
// CLOCK_MONOTONIC.
func (e Event) record(monoOff time.Duration) audit.Record {
	r := audit.Record{
		Time:    time.Unix(0, int64(e.Monotonic)+int64(monoOff)),
		Source:  audit.SourceFilter,
		Verdict: audit.Deny,
		Proto:   e.ProtoName(),
		SrcPort: e.SrcPort,
		DstPort: e.DstPort,
		RuleID:  e.RuleID,
		Reason:  e.Reason,
	}
	if e.Allowed {
		r.Verdict = audit.Allow
	}
	if e.Src.IsValid() {
		r.Src = e.Src.String()
		r.Dst = e.Dst.String()
	}
	return r
}

// Events reads the program's audit events and gives each to sink as an
// audit.Record, until ctx is done (it returns ctx.Err()) or the filter is
// closed (it returns nil). Denied packets give an event each; allowed ones
// one per flow (5-tuple) and policy generation. Only one Events call may
// run at a time.
func (f *Filter) Events(ctx context.Context, sink audit.Recorder) error {
	var rec ringbuf.Record
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		f.reader.SetDeadline(time.Now().Add(100 * time.Millisecond))
		err := f.reader.ReadInto(&rec)
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded):
			continue
		case errors.Is(err, ringbuf.ErrClosed), errors.Is(err, os.ErrClosed):
			return nil
		default:
			return fmt.Errorf("ebpf/filter: events: %w", err)
		}
		e, err := DecodeEvent(rec.RawSample)
		if err != nil {
			continue
		}
		sink.Record(e.record(f.monoOff))
	}
}

// Attach attaches the program to the ingress hook of the network device
// ifname (looked up in the calling thread's network namespace). A Filter
// is attached to one device at most.
func (f *Filter) Attach(ifname string, mode AttachMode) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return os.ErrClosed
	}
	if f.mode != AttachNone {
		return fmt.Errorf("ebpf/filter: already attached (%v)", f.mode)
	}
	// The handle's sockets stay in this thread's namespace, so that Close
	// finds the device from any thread.
	nlh, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("ebpf/filter: attach to %s: %w", ifname, err)
	}
	nl, err := nlh.LinkByName(ifname)
	if err != nil {
		nlh.Close()
		return fmt.Errorf("ebpf/filter: attach to %s: %w", ifname, err)
	}
	f.nlh = nlh
	defer func() {
		if f.mode == AttachNone {
			f.nlh.Close()
			f.nlh = nil
		}
	}()
	idx := nl.Attrs().Index
	switch mode {
	case AttachAuto, AttachTCX:
		l, err := link.AttachTCX(link.TCXOptions{Interface: idx, Program: f.objs.EgressFilter, Attach: ebpf.AttachTCXIngress})
		if err == nil {
			f.tcx, f.mode = l, AttachTCX
			return nil
		}
		if mode == AttachTCX || !errors.Is(err, ebpf.ErrNotSupported) {
			return fmt.Errorf("ebpf/filter: attach tcx to %s: %w", ifname, err)
		}
		fallthrough
	case AttachClsact:
		if err := f.attachClsactLocked(idx); err != nil {
			return fmt.Errorf("ebpf/filter: attach clsact to %s: %w", ifname, err)
		}
		f.mode = AttachClsact
		return nil
	}
	return fmt.Errorf("ebpf/filter: attach mode %v", mode)
}

// clsactPriority is the cls_bpf filter's priority on the clsact ingress.
const clsactPriority = 1

func (f *Filter) attachClsactLocked(idx int) error {
	qattrs := netlink.QdiscAttrs{
		LinkIndex: idx,
		Handle:    netlink.MakeHandle(0xffff, 0),
		Parent:    netlink.HANDLE_CLSACT,
	}
	qdiscs, err := f.nlh.QdiscList(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: idx}})
	if err != nil {
		return err
	}
	have := false
	for _, q := range qdiscs {
		if q.Type() == "clsact" {
			have = true
		}
	}
	var created *netlink.GenericQdisc
	if !have {
		q := &netlink.GenericQdisc{QdiscAttrs: qattrs, QdiscType: "clsact"}
		if err := f.nlh.QdiscAdd(q); err != nil {
			return fmt.Errorf("add clsact qdisc: %w", err)
		}
		created = q
	}
	flt := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: idx,
			Parent:    netlink.HANDLE_MIN_INGRESS,
			Handle:    netlink.MakeHandle(0, 1),
			Protocol:  unix.ETH_P_ALL,
			Priority:  clsactPriority,
		},
		Fd:           f.objs.EgressFilter.FD(),
		Name:         "warren-egress",
		DirectAction: true,
	}
	if err := f.nlh.FilterAdd(flt); err != nil {
		if created != nil {
			_ = f.nlh.QdiscDel(created)
		}
		return fmt.Errorf("add bpf filter: %w", err)
	}
	f.clsact, f.qdisc = flt, created
	return nil
}

// AttachedMode reports how the filter is attached: AttachTCX,
// AttachClsact, or AttachNone.
func (f *Filter) AttachedMode() AttachMode {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mode
}

// detachLocked undoes Attach. For clsact it deletes the filter it added,
// and the qdisc when Attach created it.
func (f *Filter) detachLocked() error {
	var err error
	switch {
	case f.tcx != nil:
		err = f.tcx.Close()
		f.tcx = nil
	case f.clsact != nil:
		if f.qdisc != nil {
			err = f.nlh.QdiscDel(f.qdisc)
		} else {
			err = f.nlh.FilterDel(f.clsact)
		}
		if errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT) {
			err = nil // the device (or its qdisc) is gone already
		}
		f.clsact, f.qdisc = nil, nil
	}
	f.mode = AttachNone
	if f.nlh != nil {
		f.nlh.Close()
		f.nlh = nil
	}
	if err != nil {
		return fmt.Errorf("ebpf/filter: detach: %w", err)
	}
	return nil
}

// Detach detaches the program from its device, if attached; the Filter
// stays loaded.
func (f *Filter) Detach() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.detachLocked()
}

// Close detaches the program, stops Events and releases the program and
// maps.
func (f *Filter) Close() error {
	return f.closeOnce(func() error {
		err := f.detachLocked()
		if f.link != nil {
			f.link.Close()
			f.link = nil
		}
		if rerr := f.reader.Close(); err == nil && rerr != nil {
			err = rerr
		}
		if oerr := f.objs.Close(); err == nil && oerr != nil {
			err = oerr
		}
		return err
	})
}

// closeOnce runs release with f.mu held on the first call of Close or
// Release; later calls return nil.
func (f *Filter) closeOnce(release func() error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	return release()
}
