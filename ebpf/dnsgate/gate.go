package dnsgate

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/warrenvm/warren/ebpf/audit"
	"github.com/warrenvm/warren/ebpf/policy"
)

// Defaults and fixed values.
const (
	// DefaultMinTTL is the shortest time an answered address stays allowed.
	DefaultMinTTL = 5 * time.Second
	// DefaultMaxTTL is the longest time an answered address stays allowed.
	DefaultMaxTTL = time.Hour
	// DefaultMaxEntries caps the allow table.
	DefaultMaxEntries = 4096
	// ProxyTTL is the TTL of the answers that steer credential hosts to
	// the proxy.
	ProxyTTL = 60
	// StaticTTL is the TTL of answers from Config.Static (before clamping).
	StaticTTL = 300
	// UpstreamTimeout bounds one forwarded query, UDP and TCP retry
	// together.
	UpstreamTimeout = 2 * time.Second
	// MaxInFlight caps the upstream queries in flight at once.
	MaxInFlight = 64
	// maxUDPReply is the largest UDP reply sent, whatever EDNS size the
	// guest advertises (the DNS flag day 2020 value: no fragmentation).
	maxUDPReply = 1232
	// maxChain is the longest CNAME chain followed in an answer.
	maxChain = 16
)

// ErrClosed is returned by Serve after Close.
var ErrClosed = errors.New("dnsgate: closed")

// Config configures a Gate.
type Config struct {
	// Policy is the sandbox's egress policy (see SetPolicy to change it).
	Policy policy.Policy
	// ProxyAddr is the credential proxy's IPv4 address: credential hosts
	// resolve to it.
	ProxyAddr netip.Addr
	// Upstream is the DNS server ("ip:port") allowed names are forwarded
	// to. Empty means the first nameserver of /etc/resolv.conf, unless
	// Static is set, in which case only Static answers.
	Upstream string
	// Static holds fixed answers (name, lower case without the trailing
	// dot, to IPv4 and IPv6 addresses) used instead of the upstream for the
	// names it has, with TTL StaticTTL.
	Static map[string][]netip.Addr
	// Audit receives a record per query; nil discards them.
	Audit audit.Recorder
	// Sandbox names the sandbox in audit records.
	Sandbox string
	// OnChange is called with the whole current allow set whenever it
	// changes. Calls are serialized and made outside the table's lock, but
	// OnChange must not call SetPolicy, Restore or Expire (it may call
	// Hosts or Entries). A reply that added addresses is sent only after
	// the OnChange call that includes them has returned.
	OnChange func([]policy.HostRule)
	// MinTTL and MaxTTL clamp how long an answered address stays allowed
	// (defaults DefaultMinTTL and DefaultMaxTTL).
	MinTTL, MaxTTL time.Duration
	// MaxEntries caps the allow table (default DefaultMaxEntries).
	MaxEntries int
	// AllowPrivate keeps private addresses (RFC 1918, RFC 6598, fc00::/7)
	// in answers; by default they are dropped.
	AllowPrivate bool
	// Guard, when set, decides which answered addresses are kept instead
	// of the default (a policy.Guard with AllowPrivate): every
	// policy.Reserved address and the host's own addresses are dropped.
	Guard *policy.Guard
	// Now is the clock (default time.Now); tests set it.
	Now func() time.Time
}

// Gate is one sandbox's resolver. Its methods are safe for concurrent use.
type Gate struct {
	cfg      Config // fixed after New (Policy is in pol)
	upstream string // "" when only Static answers
	rec      audit.Recorder
	now      func() time.Time
	sem      chan struct{}
	ctx      context.Context
	cancel   context.CancelFunc

	// mu guards everything below it.
	mu      sync.Mutex
	pol     policy.Policy
	entries map[key]*entry
	timer   *time.Timer
	gen     uint64 // bumped at each change of the set of keys
	closed  bool
	servers []*server

	// changeMu serializes OnChange calls; notified is the gen of the last
	// one (guarded by changeMu).
	changeMu sync.Mutex
	notified uint64
}

type server struct {
	srv     *dns.Server
	started chan struct{}
	done    chan struct{}
}

// New checks cfg and returns a Gate; it serves nothing until Serve or
// ListenAndServe.
func New(cfg Config) (*Gate, error) {
	if cfg.MinTTL <= 0 {
		cfg.MinTTL = DefaultMinTTL
	}
	if cfg.MaxTTL <= 0 {
		cfg.MaxTTL = DefaultMaxTTL
	}
	if cfg.MaxTTL < cfg.MinTTL {
		return nil, fmt.Errorf("dnsgate: MaxTTL %v is shorter than MinTTL %v", cfg.MaxTTL, cfg.MinTTL)
	}
	if cfg.MaxEntries <= 0 {
		cfg.MaxEntries = DefaultMaxEntries
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ProxyAddr.IsValid() {
		cfg.ProxyAddr = cfg.ProxyAddr.Unmap()
		if !cfg.ProxyAddr.Is4() {
			return nil, fmt.Errorf("dnsgate: proxy address %v is not IPv4", cfg.ProxyAddr)
		}
	}
	rec := cfg.Audit
	if rec == nil {
		rec = audit.Discard{}
	}
	up := cfg.Upstream
	if up == "" && cfg.Static == nil {
		cc, err := dns.ClientConfigFromFile("/etc/resolv.conf")
		if err != nil {
			return nil, fmt.Errorf("dnsgate: no upstream given and %w", err)
		}
		if len(cc.Servers) == 0 {
			return nil, errors.New("dnsgate: no upstream given and /etc/resolv.conf has no nameserver")
		}
		up = net.JoinHostPort(cc.Servers[0], cc.Port)
	}
	if up != "" {
		if _, err := netip.ParseAddrPort(up); err != nil {
			return nil, fmt.Errorf("dnsgate: upstream %q: want ip:port: %w", up, err)
		}
	}
	if cfg.Guard == nil {
		cfg.Guard = &policy.Guard{AllowPrivate: cfg.AllowPrivate}
	}
	static := make(map[string][]netip.Addr, len(cfg.Static))
	for n, as := range cfg.Static {
		static[canonical(n)] = as
	}
	cfg.Static = static
	ctx, cancel := context.WithCancel(context.Background())
	g := &Gate{
		cfg:      cfg,
		upstream: up,
		rec:      rec,
		now:      cfg.Now,
		sem:      make(chan struct{}, MaxInFlight),
		ctx:      ctx,
		cancel:   cancel,
		pol:      clonePolicy(cfg.Policy),
		entries:  map[key]*entry{},
	}
	g.cfg.Policy = policy.Policy{}
	return g, nil
}

// clonePolicy returns a normalized deep copy of the parts of p the gate
// reads, so that the caller's slices are neither kept nor changed.
func clonePolicy(p policy.Policy) policy.Policy {
	q := policy.Policy{IPv6: p.IPv6}
	q.Domains = append([]policy.Domain(nil), p.Domains...)
	for _, c := range p.Credentials {
		c.Hosts = append([]string(nil), c.Hosts...)
		q.Credentials = append(q.Credentials, c)
	}
	q.Rules = append([]policy.Rule(nil), p.Rules...)
	q.Normalize()
	return q
}

// canonical lower-cases n and drops its trailing dot.
func canonical(n string) string { return strings.TrimSuffix(strings.ToLower(n), ".") }

// ListenAndServe serves UDP and TCP on addr ("ip:port"; with port 0 the
// TCP listener takes the port the UDP socket got) until Close.
func (g *Gate) ListenAndServe(addr string) error {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return fmt.Errorf("dnsgate: %w", err)
	}
	l, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		pc.Close()
		return fmt.Errorf("dnsgate: %w", err)
	}
	return g.Serve(pc, l)
}

// Serve serves queries on udp and tcp (either may be nil) until Close, and
// then returns nil; it returns the first error of either server otherwise.
// The sockets are closed when it returns.
func (g *Gate) Serve(udp net.PacketConn, tcp net.Listener) error {
	var ss []*server
	if udp != nil {
		ss = append(ss, g.newServer(&dns.Server{PacketConn: udp}))
	}
	if tcp != nil {
		ss = append(ss, g.newServer(&dns.Server{Listener: tcp}))
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		if udp != nil {
			udp.Close()
		}
		if tcp != nil {
			tcp.Close()
		}
		return ErrClosed
	}
	g.servers = append(g.servers, ss...)
	g.mu.Unlock()
	errc := make(chan error, len(ss))
	for _, s := range ss {
		go func() {
			defer close(s.done)
			errc <- s.srv.ActivateAndServe()
		}()
	}
	var first error
	for range ss {
		if err := <-errc; err != nil && first == nil {
			first = err
			// Stop the other one too: Serve serves both or neither.
			for _, o := range ss {
				o.shutdown()
			}
		}
	}
	if udp != nil {
		udp.Close()
	}
	if tcp != nil {
		tcp.Close()
	}
	g.mu.Lock()
	closed := g.closed
	g.mu.Unlock()
	if closed {
		return nil
	}
	if first != nil {
		return fmt.Errorf("dnsgate: %w", first)
	}
	return nil
}

func (g *Gate) newServer(srv *dns.Server) *server {
	s := &server{srv: srv, started: make(chan struct{}), done: make(chan struct{})}
	srv.Handler = g
	srv.NotifyStartedFunc = func() { close(s.started) }
	srv.ReadTimeout = 5 * time.Second
	srv.WriteTimeout = 5 * time.Second
	srv.IdleTimeout = func() time.Duration { return 10 * time.Second }
	// The TCP server keeps a connection for one query at most 128 times.
	srv.MaxTCPQueries = 128
	return s
}

// shutdown stops s once it has started (or returns when it never will).
func (s *server) shutdown() {
	select {
	case <-s.started:
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		s.srv.ShutdownContext(ctx)
		cancel()
	case <-s.done:
	}
}

// Close stops serving, cancels upstream queries in flight and stops the
// expiry timer. The allow table is kept (State still works).
func (g *Gate) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	ss := g.servers
	g.servers = nil
	if g.timer != nil {
		g.timer.Stop()
		g.timer = nil
	}
	g.mu.Unlock()
	g.cancel()
	for _, s := range ss {
		s.shutdown()
	}
	return nil
}

// Policy returns the gate's current policy.
func (g *Gate) Policy() policy.Policy {
	g.mu.Lock()
	defer g.mu.Unlock()
	return clonePolicy(g.pol)
}
