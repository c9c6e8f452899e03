package policy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Address classes a Guard refuses, with the reason it gives.
var (
	v4ThisNet   = netip.MustParsePrefix("0.0.0.0/8")
	v4CGNAT     = netip.MustParsePrefix("100.64.0.0/10")
	v4IETF      = netip.MustParsePrefix("192.0.0.0/24") // protocol assignments (RFC 6890), some clouds' metadata
	v4Benchmark = netip.MustParsePrefix("198.18.0.0/15")
	v4Reserved  = netip.MustParsePrefix("240.0.0.0/4") // includes 255.255.255.255
	v6Compat    = netip.MustParsePrefix("::/96")       // IPv4-compatible (deprecated), :: and ::1 among them
	v6NAT64     = netip.MustParsePrefix("64:ff9b::/96")
	v6NAT64Loc  = netip.MustParsePrefix("64:ff9b:1::/48")
	v6SiteLocal = netip.MustParsePrefix("fec0::/10")
	v66to4      = netip.MustParsePrefix("2002::/16")
	v6Teredo    = netip.MustParsePrefix("2001::/32")
)

// Reserved returns why a is never a destination the host's egress
// services (the credential proxy's upstream connections, the resolver's
// answers) may lead to, or "" for an ordinary public unicast address:
// "unspecified", "loopback", "link-local" (169.254/16 with the clouds'
// metadata address 169.254.169.254, fe80::/10), "multicast",
// "broadcast-or-reserved", "this-network" (0/8), "private" (RFC 1918 and
// the ULA fc00::/7, where AWS's IPv6 metadata fd00:ec2::254 is),
// "cgnat" (100.64/10, where Alibaba's metadata 100.100.100.200 is),
// "special" (192.0.0/24, 198.18/15, site-local, IPv4-compatible IPv6,
// 6to4 and Teredo, which embed an IPv4 address). IPv4-mapped and NAT64
// addresses are judged by the IPv4 address they hold.
func Reserved(a netip.Addr) string {
	if !a.IsValid() {
		return "invalid"
	}
	a = a.Unmap()
	if a.Is6() && (v6NAT64.Contains(a) || v6NAT64Loc.Contains(a)) {
		b := a.As16()
		if r := Reserved(netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})); r != "" {
			return r
		}
	}
	switch {
	case a.IsUnspecified():
		return "unspecified"
	case a.IsLoopback():
		return "loopback"
	case a.IsLinkLocalUnicast():
		return "link-local"
	case a.IsMulticast(), a.IsLinkLocalMulticast(), a.IsInterfaceLocalMulticast():
		return "multicast"
	case a.IsPrivate():
		return "private"
	}
	if a.Is4() {
		switch {
		case v4ThisNet.Contains(a):
			return "this-network"
		case v4CGNAT.Contains(a):
			return "cgnat"
		case v4Reserved.Contains(a):
			return "broadcast-or-reserved"
		case v4IETF.Contains(a), v4Benchmark.Contains(a):
			return "special"
		}
		return ""
	}
	switch {
	case v6Compat.Contains(a), v6SiteLocal.Contains(a), v66to4.Contains(a), v6Teredo.Contains(a):
		return "special"
	}
	return ""
}

// HostAddrsTTL is how long a Guard trusts its list of the host's own
// addresses before it lists them again.
const HostAddrsTTL = 5 * time.Second

// Guard decides which resolved addresses a host-side service may connect
// to (or let the guest reach) on a tenant's behalf. It refuses every
// Reserved address and every address of the host's own interfaces, except
// addresses in Allow, the operator's allowance. Its Control method is a
// net.Dialer.Control hook, so the check applies to the address actually
// connected to, after name resolution: a public name that resolves to
// 127.0.0.1 or 169.254.169.254 is refused like the literal. A Guard is
// safe for concurrent use; the zero Guard (with no Allow) lists the host's
// addresses with net.InterfaceAddrs.
type Guard struct {
	// Allow are the operator's prefixes that may be reached although
	// Reserved or the host's own (an upstream on loopback in tests, a
	// corporate API on the LAN). Never set from a tenant's input.
	Allow []netip.Prefix
	// AllowPrivate lets RFC 1918, ULA and CGNAT addresses through (the
	// resolver's Config.AllowPrivate); loopback, link-local and the rest
	// stay refused.
	AllowPrivate bool
	// HostAddrs lists the host's own addresses; nil: net.InterfaceAddrs.
	// It runs on the goroutine that checks, so in the network namespace
	// of that goroutine's thread.
	HostAddrs func() ([]netip.Addr, error)

	// mu protects the cached list of the host's addresses.
	mu      sync.Mutex
	host    map[netip.Addr]bool // +checklocks:mu
	hostAt  time.Time           // +checklocks:mu; zero: never listed
	hostErr error               // +checklocks:mu; the last listing's error
}

// RefusedError is a Guard's refusal.
type RefusedError struct {
	Addr   netip.Addr
	Reason string // a Reserved class, or "host-address"
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("egress: destination %v refused (%s)", e.Addr, e.Reason)
}

// Check returns nil when a may be connected to, else a *RefusedError (or
// an error saying the host's addresses could not be listed: without the
// list nothing is allowed, except Allow).
func (g *Guard) Check(a netip.Addr) error {
	a = a.Unmap()
	for _, p := range g.Allow {
		if p.Contains(a) {
			return nil
		}
	}
	if r := Reserved(a); r != "" {
		if !(g.AllowPrivate && (r == "private" || r == "cgnat")) {
			return &RefusedError{Addr: a, Reason: r}
		}
	}
	own, err := g.hostAddrs()
	if err != nil {
		return fmt.Errorf("egress: destination %v: cannot list the host's own addresses: %w", a, err)
	}
	if own[a] {
		return &RefusedError{Addr: a, Reason: "host-address"}
	}
	return nil
}

// Control is a net.Dialer.Control (and net.ListenConfig.Control) hook:
// it refuses to connect to an address Check refuses. address is the
// resolved "ip:port" the socket is about to connect to.
func (g *Guard) Control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("egress: dial %s %q: not an address", network, address)
	}
	return g.Check(ap.Addr())
}

// Prime lists the host's addresses now (call it from a thread in the
// host's network namespace before anything may make listing impossible:
// a seccomp filter without netlink). Later listings that fail keep the
// last good list.
func (g *Guard) Prime() error {
	_, err := g.hostAddrs()
	return err
}

func (g *Guard) hostAddrs() (map[netip.Addr]bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.hostAt.IsZero() && time.Since(g.hostAt) < HostAddrsTTL {
		return g.host, g.hostErr
	}
	list := g.HostAddrs
	if list == nil {
		list = InterfaceAddrs
	}
	as, err := list()
	g.hostAt = time.Now()
	if err != nil {
		if g.host != nil {
			return g.host, nil // keep the last good list
		}
		g.hostErr = err
		return nil, err
	}
	m := make(map[netip.Addr]bool, len(as))
	for _, a := range as {
		m[a.Unmap()] = true
	}
	g.host, g.hostErr = m, nil
	return m, nil
}

// InterfaceAddrs returns the addresses of the calling thread's network
// namespace's interfaces.
func InterfaceAddrs() ([]netip.Addr, error) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range as {
		var ip net.IP
		switch v := a.(type) {
		case *net.IPNet:
			ip = v.IP
		case *net.IPAddr:
			ip = v.IP
		}
		if x, ok := netip.AddrFromSlice(ip); ok {
			out = append(out, x.Unmap())
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no interface addresses")
	}
	return out, nil
}

// ParsePrefixes parses an operator's allowance (Guard.Allow): comma-
// separated addresses (single-address prefixes) or CIDRs; "" is none.
func ParsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		if a, err := netip.ParseAddr(f); err == nil {
			a = a.Unmap()
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("%q: want addresses or CIDRs", f)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
