package policy

import (
	"errors"
	"net"
	"net/netip"
	"testing"
)

func TestReserved(t *testing.T) {
	refused := map[string]string{
		"127.0.0.1": "loopback", "127.255.0.9": "loopback", "::1": "loopback",
		"169.254.169.254": "link-local", "fe80::1": "link-local",
		"10.1.2.3": "private", "172.16.0.1": "private", "192.168.1.1": "private",
		"fc00::1": "private", "fd00:ec2::254": "private",
		"100.64.0.1": "cgnat", "100.100.100.200": "cgnat",
		"0.0.0.0": "unspecified", "::": "unspecified", "0.1.2.3": "this-network",
		"224.0.0.1": "multicast", "ff02::1": "multicast",
		"255.255.255.255": "broadcast-or-reserved", "240.0.0.1": "broadcast-or-reserved",
		"192.0.0.192":            "special",
		"::ffff:127.0.0.1":       "loopback", // IPv4-mapped
		"::ffff:169.254.169.254": "link-local",
		"64:ff9b::a9fe:a9fe":     "link-local", // NAT64 of the metadata address
		"64:ff9b::7f00:1":        "loopback",
		"::127.0.0.1":            "special", // IPv4-compatible
		"2002:7f00:1::1":         "special", // 6to4 of 127.0.0.1
		"fec0::1":                "special",
	}
	for s, want := range refused {
		if got := Reserved(netip.MustParseAddr(s)); got != want {
			t.Errorf("Reserved(%s) = %q, want %q", s, got, want)
		}
	}
	for _, s := range []string{"8.8.8.8", "203.0.113.7", "198.51.100.10", "2606:4700::1111", "64:ff9b::808:808"} {
		if got := Reserved(netip.MustParseAddr(s)); got != "" {
			t.Errorf("Reserved(%s) = %q, want public", s, got)
		}
	}
}

func TestGuard(t *testing.T) {
	own := netip.MustParseAddr("203.0.113.5") // the host's public address
	g := &Guard{HostAddrs: func() ([]netip.Addr, error) { return []netip.Addr{own, netip.MustParseAddr("127.0.0.1")}, nil }}
	for _, s := range []string{"127.0.0.1:443", "169.254.169.254:80", "10.0.0.1:443", "[::1]:443", "203.0.113.5:443", "[::ffff:203.0.113.5]:443"} {
		err := g.Control("tcp", s, nil)
		var re *RefusedError
		if !errors.As(err, &re) {
			t.Errorf("Control(%s) = %v, want a refusal", s, err)
		}
	}
	if err := g.Control("tcp", "203.0.113.6:443", nil); err != nil {
		t.Errorf("a public address: %v", err)
	}
	// The operator's allowance, and nothing else.
	g.Allow = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	if err := g.Control("tcp", "127.0.0.1:443", nil); err != nil {
		t.Errorf("allowed loopback: %v", err)
	}
	if err := g.Control("tcp", "127.0.0.2:443", nil); err == nil {
		t.Error("127.0.0.2 passed an allowance of 127.0.0.1/32")
	}
	// Private addresses with AllowPrivate, but never loopback or metadata.
	p := &Guard{AllowPrivate: true, HostAddrs: func() ([]netip.Addr, error) { return []netip.Addr{own}, nil }}
	if p.Check(netip.MustParseAddr("10.0.0.1")) != nil || p.Check(netip.MustParseAddr("169.254.169.254")) == nil ||
		p.Check(netip.MustParseAddr("127.0.0.1")) == nil {
		t.Error("AllowPrivate")
	}
	// No list of the host's addresses: nothing passes (but Allow).
	f := &Guard{HostAddrs: func() ([]netip.Addr, error) { return nil, errors.New("no netlink") }}
	if f.Check(netip.MustParseAddr("8.8.8.8")) == nil {
		t.Error("passed without the host's addresses")
	}
	// A failure after a good listing keeps the good list.
	calls := 0
	k := &Guard{HostAddrs: func() ([]netip.Addr, error) {
		calls++
		if calls == 1 {
			return []netip.Addr{own}, nil
		}
		return nil, errors.New("no netlink")
	}}
	if err := k.Prime(); err != nil {
		t.Fatal(err)
	}
	k.mu.Lock()
	k.hostAt = k.hostAt.Add(-2 * HostAddrsTTL)
	k.mu.Unlock()
	if k.Check(netip.MustParseAddr("8.8.8.8")) != nil || k.Check(own) == nil || calls != 2 {
		t.Errorf("after a failed refresh (calls %d)", calls)
	}
}

// TestGuardDial dials a real loopback listener through a net.Dialer with
// the Guard's Control hook: the connection is refused before connect.
func TestGuardDial(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := l.Accept(); err == nil {
			accepted <- struct{}{}
			c.Close()
		}
	}()
	g := &Guard{}
	d := net.Dialer{Control: g.Control}
	if c, err := d.Dial("tcp", l.Addr().String()); err == nil {
		c.Close()
		t.Fatal("dialled loopback")
	}
	select {
	case <-accepted:
		t.Fatal("the listener accepted a connection")
	default:
	}
	g.Allow = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	c, err := d.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatalf("with the allowance: %v", err)
	}
	c.Close()
}
