// Package egress runs one sandbox's egress services on the host: the eBPF
// filter on its tap (ebpf/filter), its resolver (ebpf/dnsgate), its
// credential proxy (vmmproc/credproxy) and its audit log (ebpf/audit), kept
// consistent with one policy that can change while the sandbox runs.
//
// The tap's host address is the guest's gateway, resolver (port 53) and
// credential proxy (ports 80 and 443). The guest is told the proxy's CA
// certificate and its credential placeholders through the agent's re-sync
// line (Guest); it never gets a secret or the CA's key.
//
// A Sandbox is safe for concurrent use: mu serializes policy changes and
// the filter table updates that the resolver's answers cause.
package egress

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/ebpf/audit"
	"github.com/warrenvm/warren/ebpf/dnsgate"
	"github.com/warrenvm/warren/ebpf/filter"
	"github.com/warrenvm/warren/ebpf/policy"
	"github.com/warrenvm/warren/vmmproc/credproxy"
)

// Proxy ports on the tap's host address: plain HTTP and HTTPS.
const (
	ProxyHTTPPort  = 80
	ProxyHTTPSPort = 443
	DNSPort        = 53
)

// Config is what a sandbox's egress services start from.
type Config struct {
	// Sandbox names the sandbox in audit records.
	Sandbox string
	// Tap is the sandbox's tap device (it must exist).
	Tap string
	// HostAddr is the tap's host address with the guest subnet's prefix
	// length (10.200.0.1/24): it is added to the tap if missing.
	HostAddr netip.Prefix
	// GuestAddr is the only source address the guest may use; zero
	// leaves the source unchecked.
	GuestAddr netip.Addr
	// Policy is the starting policy.
	Policy policy.Policy
	// AuditPath is the JSON-lines audit log, appended to.
	AuditPath string
	// AuditRate and AuditBurst bound the audit log's rate, AuditMaxBytes
	// each of its two generations' size (0: audit defaults).
	AuditRate, AuditBurst int
	AuditMaxBytes         int64
	// Secrets is the host's secret store (nil: credproxy.EnvStore).
	Secrets credproxy.Store
	// CAPEM and CAKeyPEM are the sandbox's proxy CA from an earlier run
	// (a snapshot, a fork's parent); empty makes a new one.
	CAPEM, CAKeyPEM []byte
	// DNSUpstream is the resolver the sandbox's allowed names are asked
	// of ("ip:port"; empty: the host's /etc/resolv.conf).
	DNSUpstream string
	// Hosts are fixed addresses for names (an /etc/hosts-style file read
	// by ReadHosts): the resolver answers them without asking upstream
	// and the proxy connects to them.
	Hosts map[string][]netip.Addr
	// UpstreamCAs, when set, are the roots the proxy trusts upstream
	// instead of the system's.
	UpstreamCAs []byte
	// UpstreamAllow are the operator's prefixes the credential proxy may
	// connect to although they are loopback, private, link-local or the
	// host's own (policy.Guard.Allow): an upstream on 127.0.0.1 in tests,
	// an API on the LAN. Every tenant's credential host that resolves
	// there is then reached (on port 443 only). Never from a tenant.
	UpstreamAllow []netip.Prefix
	// PolicyOptions are the operator's allowances policies are checked
	// against (wildcard credential hosts).
	PolicyOptions policy.Options
	// DNSState is the resolver's allowed addresses from an earlier run
	// (dnsgate State), restored with their expiry.
	DNSState []byte
	// Attach is how the filter is attached; zero (AttachNone) means
	// filter.AttachAuto: tcx, else clsact.
	Attach filter.AttachMode
	// Dial, when set, opens the proxy's and resolver's upstream
	// connections (a fork child in its own network namespace dials from
	// its parent's).
	// It is given one address the proxy's guard has checked
	// ("203.0.113.7:443"); the connection's remote address is checked
	// again.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	Log  *slog.Logger
	// Prepared, when set, is the privileged part made already (Prepare,
	// maybe by a helper: PreparedFromFiles), for Tap, HostAddr, GuestAddr,
	// Policy.IPv6 and Attach; Start owns it from then on. Nil: Start
	// prepares it itself, which needs CAP_NET_ADMIN, CAP_BPF and
	// CAP_NET_BIND_SERVICE.
	Prepared *Prepared
}

// prepareConfig is the part of cfg that Prepare needs.
func (cfg Config) prepareConfig() PrepareConfig {
	return PrepareConfig{Tap: cfg.Tap, HostAddr: cfg.HostAddr, GuestAddr: cfg.GuestAddr, IPv6: cfg.Policy.IPv6, Attach: cfg.Attach}
}

// Sandbox is one sandbox's running egress services.
type Sandbox struct {
	cfg    Config
	log    *audit.Log
	filter *filter.Filter
	gate   *dnsgate.Gate
	proxy  *credproxy.Proxy
	ca     *credproxy.CA
	cancel context.CancelFunc
	done   chan struct{} // closed when the filter's event reader returns
	// served are the proxy's listeners, handed to its Serve goroutines:
	// Close closes them itself, so that the gateway's ports are free when
	// it returns even if a goroutine has not begun to serve (a restart
	// binds them again at once).
	served []net.Listener

	mu  sync.Mutex
	pol policy.Policy // +checklocks:mu
}

// Start starts the services: it configures the tap's host address, loads
// and attaches the filter (allowing nothing yet but infrastructure), starts
// the resolver and the proxy on the host address, and installs the policy.
// On error everything started is stopped.
func Start(cfg Config) (_ *Sandbox, err error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if !cfg.HostAddr.IsValid() || !cfg.HostAddr.Addr().Is4() {
		return nil, fmt.Errorf("egress: host address %v is not an IPv4 prefix", cfg.HostAddr)
	}
	if cfg.GuestAddr.IsValid() && !cfg.HostAddr.Contains(cfg.GuestAddr) {
		return nil, fmt.Errorf("egress: guest address %v is outside %v", cfg.GuestAddr, cfg.HostAddr)
	}
	cfg.Policy.Normalize()
	if err := cfg.Policy.ValidateWith(cfg.PolicyOptions); err != nil {
		return nil, err
	}
	s := &Sandbox{cfg: cfg, done: make(chan struct{}), pol: cfg.Policy}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	prep := cfg.Prepared
	if prep == nil {
		if prep, err = Prepare(cfg.prepareConfig()); err != nil {
			return nil, err
		}
	}
	s.filter = prep.Filter
	closeSockets := func() {
		for _, c := range []io.Closer{prep.DNSUDP, prep.DNSTCP, prep.HTTP, prep.HTTPS} {
			if c != nil {
				c.Close()
			}
		}
	}
	defer func() {
		if err != nil {
			closeSockets()
		}
	}()
	if s.log, err = audit.Open(cfg.AuditPath, cfg.Sandbox, cfg.AuditRate, cfg.AuditBurst, cfg.AuditMaxBytes); err != nil {
		return nil, err
	}
	if len(cfg.CAPEM) > 0 {
		s.ca, err = credproxy.LoadCA(cfg.CAPEM, cfg.CAKeyPEM)
	} else {
		s.ca, err = credproxy.NewCA(cfg.Sandbox)
	}
	if err != nil {
		return nil, fmt.Errorf("egress: proxy CA: %w", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() {
		defer close(s.done)
		if err := s.filter.Events(ctx, s.log); err != nil && ctx.Err() == nil {
			cfg.Log.Warn("egress: filter events stopped", "err", err)
		}
	}()
	if err := s.syncLocked(nil); err != nil {
		return nil, err
	}

	// The resolver.
	s.gate, err = dnsgate.New(dnsgate.Config{Policy: cfg.Policy, ProxyAddr: cfg.HostAddr.Addr(),
		Upstream: cfg.DNSUpstream, Static: cfg.Hosts, Audit: s.log, Sandbox: cfg.Sandbox,
		OnChange: s.hostsChanged})
	if err != nil {
		return nil, fmt.Errorf("egress: resolver: %w", err)
	}
	udp, tcp := prep.DNSUDP, prep.DNSTCP
	go s.gate.Serve(udp, tcp)
	if len(cfg.DNSState) > 0 {
		if err := s.gate.Restore(cfg.DNSState); err != nil {
			return nil, fmt.Errorf("egress: resolver state: %w", err)
		}
	}

	// The credential proxy.
	// The proxy's guard lists the host's addresses now, from another
	// goroutine: this one may be locked to a thread in the sandbox's
	// private network namespace, and the proxy dials from the host's.
	guard := &policy.Guard{Allow: cfg.UpstreamAllow}
	primed := make(chan error, 1)
	go func() { primed <- guard.Prime() }()
	if err := <-primed; err != nil {
		cfg.Log.Warn("egress: cannot list the host's addresses yet; the proxy refuses upstreams until it can", "err", err)
	}
	up := credproxy.Upstream{Resolve: s.proxyResolve, Guard: guard, Dial: cfg.Dial}
	if len(cfg.UpstreamCAs) > 0 {
		up.RootCAs = x509Pool(cfg.UpstreamCAs)
		if up.RootCAs == nil {
			return nil, errors.New("egress: the upstream CA file holds no PEM certificate")
		}
	}
	store := cfg.Secrets
	if store == nil {
		store = credproxy.EnvStore{}
	}
	s.proxy, err = credproxy.New(credproxy.Config{Policy: cfg.Policy, CA: s.ca, Store: store, Audit: s.log,
		Sandbox: cfg.Sandbox, Upstream: up, PolicyOptions: cfg.PolicyOptions})
	if err != nil {
		return nil, fmt.Errorf("egress: proxy: %w", err)
	}
	s.served = []net.Listener{prep.HTTP, prep.HTTPS}
	go s.proxy.Serve(prep.HTTP, false)
	go s.proxy.Serve(prep.HTTPS, true)
	s.log.Record(audit.Record{Source: audit.SourcePolicy, Reason: "start", Detail: summary(cfg.Policy) +
		", filter attached with " + s.filter.AttachedMode().String()})
	return s, nil
}

// proxyResolve resolves a credential host for the proxy: from Hosts when
// it has the name, else with the host's resolver. The proxy's guard
// checks every address either way.
func (s *Sandbox) proxyResolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if as := s.cfg.Hosts[strings.ToLower(host)]; len(as) > 0 {
		return as, nil
	}
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// hostsChanged is the resolver's OnChange: the addresses it answered with
// go into the filter's table beside the policy's rules.
func (s *Sandbox) hostsChanged(hosts []policy.HostRule) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.syncLocked(hosts); err != nil {
		s.cfg.Log.Warn("egress: filter update after a DNS answer failed", "err", err)
		s.log.Record(audit.Record{Source: audit.SourcePolicy, Reason: "sync-failed", Detail: err.Error()})
	}
}

// syncLocked compiles the policy's rules with hosts into the filter's table.
func (s *Sandbox) syncLocked(hosts []policy.HostRule) error {
	table, err := policy.Compile(s.pol.Rules, hosts)
	if err != nil {
		return fmt.Errorf("egress: %w", err)
	}
	return s.filter.Sync(table)
}

// SetPolicy replaces the policy while the sandbox runs: the resolver drops
// addresses of names no longer allowed, the proxy's credentials change, and
// the filter's table and IPv6 verdict change, in that order, before it
// returns. An invalid policy changes nothing.
func (s *Sandbox) SetPolicy(p policy.Policy) error {
	p.Normalize()
	if err := p.ValidateWith(s.cfg.PolicyOptions); err != nil {
		return err
	}
	s.mu.Lock()
	s.pol = p
	s.mu.Unlock()
	// The gate calls hostsChanged (taking mu) from SetPolicy when it drops
	// addresses, so mu is not held across it.
	s.gate.SetPolicy(p)
	if err := s.proxy.SetPolicy(p); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.filter.SetConfig(filter.Config{GuestIP: s.cfg.GuestAddr, Gateway: s.cfg.HostAddr.Addr(),
		ProxyPorts: []uint16{ProxyHTTPPort, ProxyHTTPSPort}, IPv6: p.IPv6}); err != nil {
		return err
	}
	if err := s.syncLocked(s.gate.Hosts()); err != nil {
		return err
	}
	s.log.Record(audit.Record{Source: audit.SourcePolicy, Reason: "update", Detail: summary(p)})
	return nil
}

// Policy returns the policy in force.
func (s *Sandbox) Policy() policy.Policy {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pol
}

// Guest returns what the guest agent is told (with each re-sync): the
// proxy's CA certificate and one environment variable per credential,
// named after its secret, holding its placeholder.
func (s *Sandbox) Guest() *agentwire.Egress {
	p := s.Policy()
	e := &agentwire.Egress{TrustPEM: string(s.ca.CertPEM()), Env: map[string]string{}}
	for _, c := range p.Credentials {
		e.Env[c.Secret] = c.PlaceholderFor()
	}
	return e
}

// State is what a snapshot or a fork child needs to bring the services
// back as they were: the policy, the CA and the resolver's allowed
// addresses (with their expiry).
type State struct {
	Policy   policy.Policy   `json:"policy"`
	CAPEM    []byte          `json:"ca_pem"`
	CAKeyPEM []byte          `json:"ca_key_pem"`
	DNS      json.RawMessage `json:"dns,omitempty"`
}

// State returns the current State.
func (s *Sandbox) State() (State, error) {
	cert, key, err := s.ca.MarshalPEM()
	if err != nil {
		return State{}, err
	}
	st := State{Policy: s.Policy(), CAPEM: cert, CAKeyPEM: key}
	if b, err := s.gate.State(); err != nil {
		return State{}, err
	} else if len(b) > 0 {
		st.DNS = b
	}
	return st, nil
}

// Stats are the services' counters.
type Stats struct {
	Filter filter.Counters `json:"filter"`
	Proxy  credproxy.Stats `json:"proxy"`
	// AuditWritten and AuditSuppressed count the audit log's records.
	AuditWritten    uint64 `json:"audit_written"`
	AuditSuppressed uint64 `json:"audit_suppressed"`
	// Attach is how the filter is attached (tcx or clsact).
	Attach string `json:"attach"`
	// AllowedHosts is how many resolver answers are allowed now.
	AllowedHosts int `json:"allowed_hosts"`
}

// Stats returns the counters.
func (s *Sandbox) Stats() (Stats, error) {
	c, err := s.filter.Counters()
	if err != nil {
		return Stats{}, err
	}
	w, sup := s.log.Stats()
	return Stats{Filter: c, Proxy: s.proxy.Stats(), AuditWritten: w, AuditSuppressed: sup,
		Attach: s.filter.AttachedMode().String(), AllowedHosts: len(s.gate.Hosts())}, nil
}

// FlushAudit writes buffered audit records to the file.
func (s *Sandbox) FlushAudit() error { return s.log.Flush() }

// Close stops the services and detaches the filter (the tap then passes
// everything again: close it together with the tap). It may be called
// more than once.
func (s *Sandbox) Close() error {
	if s.proxy != nil {
		s.proxy.Close()
		s.proxy = nil
	}
	for _, l := range s.served {
		l.Close()
	}
	s.served = nil
	if s.gate != nil {
		s.gate.Close()
		s.gate = nil
	}
	if s.cancel != nil {
		s.cancel()
	}
	var err error
	if s.filter != nil {
		err = s.filter.Close()
		s.filter = nil
	}
	if s.cancel != nil {
		<-s.done
		s.cancel = nil
	}
	if s.log != nil {
		s.log.Close()
		s.log = nil
	}
	return err
}

func summary(p policy.Policy) string {
	return fmt.Sprintf("%d rules, %d domains, %d credentials, ipv6 %v", len(p.Rules), len(p.Domains), len(p.Credentials), p.IPv6)
}

// HostMAC is the MAC address the tap's host end gets for host address a:
// 02:57 (locally administered, "W") followed by a's four bytes. It depends
// on the address alone, so that a guest restored from a snapshot, or forked
// onto a new tap, finds its gateway at the MAC its ARP cache still holds.
func HostMAC(a netip.Addr) net.HardwareAddr {
	b := a.As4()
	return net.HardwareAddr{0x02, 0x57, b[0], b[1], b[2], b[3]}
}

// setHostAddr gives the tap its host address (if it lacks it) and its
// HostMAC, and brings it up.
func setHostAddr(tap string, addr netip.Prefix) error {
	link, err := netlink.LinkByName(tap)
	if err != nil {
		return fmt.Errorf("egress: tap %s: %w", tap, err)
	}
	if err := netlink.LinkSetHardwareAddr(link, HostMAC(addr.Addr())); err != nil {
		return fmt.Errorf("egress: tap %s: set MAC: %w", tap, err)
	}
	a, err := netlink.ParseAddr(addr.String())
	if err != nil {
		return err
	}
	if err := netlink.AddrReplace(link, a); err != nil {
		return fmt.Errorf("egress: tap %s: add %v: %w", tap, addr, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("egress: tap %s: up: %w", tap, err)
	}
	return nil
}

// ReadHosts reads an /etc/hosts-style file: "ADDRESS NAME [NAME...]" per
// line, '#' comments. Names are lower-cased.
func ReadHosts(path string) (map[string][]netip.Addr, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("hosts: %w", err)
	}
	defer f.Close()
	out := map[string][]netip.Addr{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		a, err := netip.ParseAddr(fields[0])
		if err != nil || len(fields) < 2 {
			return nil, fmt.Errorf("hosts %s:%d: want ADDRESS NAME...", path, n)
		}
		for _, name := range fields[1:] {
			name = strings.TrimSuffix(strings.ToLower(name), ".")
			out[name] = append(out[name], a)
		}
	}
	return out, sc.Err()
}

// x509Pool returns a pool of the PEM certificates in b, or nil if none.
func x509Pool(b []byte) *x509.CertPool {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil
	}
	return pool
}
