package egress

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"

	"github.com/warrenvm/warren/ebpf/filter"
)

// The privileged part of a sandbox's egress services, apart from the rest
// so that a helper with privileges (a VMM family's jail-init) can make it
// and hand it to a VMM without any (vmmproc/jail's helper): the tap's host
// address and MAC, the filter loaded and attached, and the listening
// sockets of the resolver (port 53, UDP and TCP) and of the proxy (80,
// 443) on the host address. Every one is bound to the network namespace
// of the thread that made it, which a VMM need never enter.

// PrepareConfig is what Prepare needs: Config's fields of the same names
// (IPv6 is the policy's).
type PrepareConfig struct {
	Tap       string
	HostAddr  netip.Prefix
	GuestAddr netip.Addr
	IPv6      bool
	Attach    filter.AttachMode
}

func (c PrepareConfig) filterConfig() filter.Config {
	return filter.Config{GuestIP: c.GuestAddr, Gateway: c.HostAddr.Addr(),
		ProxyPorts: []uint16{ProxyHTTPPort, ProxyHTTPSPort}, IPv6: c.IPv6}
}

// Prepared is the privileged part made (Prepare, PreparedFromFiles).
type Prepared struct {
	Filter              *filter.Filter
	DNSUDP              net.PacketConn
	DNSTCP, HTTP, HTTPS net.Listener
}

// Prepare configures the tap c.Tap (in the calling thread's network
// namespace), loads and attaches the filter with only infrastructure
// allowed, and listens on the host address.
func Prepare(c PrepareConfig) (_ *Prepared, err error) {
	if !c.HostAddr.IsValid() || !c.HostAddr.Addr().Is4() {
		return nil, fmt.Errorf("egress: host address %v is not an IPv4 prefix", c.HostAddr)
	}
	if err := setHostAddr(c.Tap, c.HostAddr); err != nil {
		return nil, err
	}
	p := &Prepared{}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	if p.Filter, err = filter.Load(c.filterConfig()); err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	mode := c.Attach
	if mode == filter.AttachNone {
		mode = filter.AttachAuto
	}
	if err := p.Filter.Attach(c.Tap, mode); err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	host := c.HostAddr.Addr().String()
	if p.DNSUDP, err = net.ListenPacket("udp4", net.JoinHostPort(host, fmt.Sprint(DNSPort))); err != nil {
		return nil, fmt.Errorf("egress: resolver: %w", err)
	}
	if p.DNSTCP, err = net.Listen("tcp4", net.JoinHostPort(host, fmt.Sprint(DNSPort))); err != nil {
		return nil, fmt.Errorf("egress: resolver: %w", err)
	}
	if p.HTTP, err = net.Listen("tcp4", net.JoinHostPort(host, fmt.Sprint(ProxyHTTPPort))); err != nil {
		return nil, fmt.Errorf("egress: proxy: %w", err)
	}
	if p.HTTPS, err = net.Listen("tcp4", net.JoinHostPort(host, fmt.Sprint(ProxyHTTPSPort))); err != nil {
		return nil, fmt.Errorf("egress: proxy: %w", err)
	}
	return p, nil
}

func (p *Prepared) sockets() []io.Closer {
	var cs []io.Closer
	for _, c := range []io.Closer{p.DNSUDP, p.DNSTCP, p.HTTP, p.HTTPS} {
		if c != nil {
			cs = append(cs, c)
		}
	}
	return cs
}

// Close closes the sockets and the filter (detaching it).
func (p *Prepared) Close() error {
	var err error
	for _, c := range p.sockets() {
		c.Close()
	}
	if p.Filter != nil {
		err = p.Filter.Close()
	}
	return err
}

// Files returns copies of the descriptors PreparedFromFiles takes, in its
// order (the sockets, then the filter's: filter.Files), and the attach
// mode in force; the caller closes them, then Releases p.
func (p *Prepared) Files() ([]*os.File, filter.AttachMode, error) {
	var files []*os.File
	fail := func(err error) ([]*os.File, filter.AttachMode, error) {
		for _, f := range files {
			f.Close()
		}
		return nil, 0, err
	}
	for _, c := range p.sockets() {
		fc, ok := c.(interface{ File() (*os.File, error) })
		if !ok {
			return fail(errors.New("egress: a socket without a descriptor"))
		}
		f, err := fc.File()
		if err != nil {
			return fail(fmt.Errorf("egress: %w", err))
		}
		files = append(files, f)
	}
	if len(files) != 4 || p.Filter == nil {
		return fail(errors.New("egress: hand over an incomplete Prepared"))
	}
	ff, err := p.Filter.Files()
	if err != nil {
		return fail(err)
	}
	return append(files, ff...), p.Filter.AttachedMode(), nil
}

// Release closes p's sockets and lets go of the filter without detaching
// it, once its Files are handed over.
func (p *Prepared) Release() {
	for _, c := range p.sockets() {
		c.Close()
	}
	if p.Filter != nil {
		p.Filter.Release()
	}
}

// PreparedFromFiles adopts what another process's Prepare made, from the
// files its Files gave (taken: closed whatever the outcome), for c, whose
// filter was attached with mode.
func PreparedFromFiles(c PrepareConfig, mode filter.AttachMode, files []*os.File) (_ *Prepared, err error) {
	if len(files) < 4 {
		for _, f := range files {
			f.Close()
		}
		return nil, fmt.Errorf("egress: %d descriptors handed over, want the 4 sockets and the filter's", len(files))
	}
	socks, rest := files[:4], files[4:]
	p := &Prepared{}
	defer func() {
		for _, f := range socks {
			f.Close() // net.File* made their own copies
		}
		if err != nil {
			p.Close()
		}
	}()
	if p.DNSUDP, err = net.FilePacketConn(socks[0]); err == nil {
		if _, ok := p.DNSUDP.(*net.UDPConn); !ok {
			err = errors.New("not a UDP socket")
		}
	}
	if err != nil {
		for _, f := range rest {
			f.Close()
		}
		return nil, fmt.Errorf("egress: the resolver's UDP socket: %w", err)
	}
	for i, l := range []*net.Listener{&p.DNSTCP, &p.HTTP, &p.HTTPS} {
		if *l, err = net.FileListener(socks[1+i]); err == nil {
			if _, ok := (*l).(*net.TCPListener); !ok {
				err = errors.New("not a TCP listener")
			}
		}
		if err != nil {
			for _, f := range rest {
				f.Close()
			}
			return nil, fmt.Errorf("egress: listening socket %d: %w", 1+i, err)
		}
	}
	if p.Filter, err = filter.FromFiles(c.filterConfig(), mode, rest); err != nil {
		return nil, err
	}
	return p, nil
}
