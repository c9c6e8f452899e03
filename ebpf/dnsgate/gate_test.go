package dnsgate

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/warrenvm/warren/ebpf/audit"
	"github.com/warrenvm/warren/ebpf/policy"
)

// upstream is a fake DNS server on loopback answering from zone.
type upstream struct {
	addr    string
	queries atomic.Int64
	mu      sync.Mutex
	zone    map[string][]dns.RR // by lower-case FQDN
}

func newUpstream(t testing.TB, records ...string) *upstream {
	t.Helper()
	u := &upstream{zone: map[string][]dns.RR{}}
	for _, s := range records {
		rr, err := dns.NewRR(s)
		if err != nil {
			t.Fatalf("record %q: %v", s, err)
		}
		n := strings.ToLower(rr.Header().Name)
		u.zone[n] = append(u.zone[n], rr)
	}
	pc, l := listenPair(t)
	u.addr = pc.LocalAddr().String()
	for _, s := range []*dns.Server{{PacketConn: pc, Handler: u}, {Listener: l, Handler: u}} {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		go s.ActivateAndServe()
		<-started
		t.Cleanup(func() { s.Shutdown() })
	}
	return u
}

// ServeDNS answers with the CNAME chain and the records of the asked type.
// "big." names are truncated over UDP.
func (u *upstream) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	u.queries.Add(1)
	m := new(dns.Msg)
	m.SetReply(r)
	q := r.Question[0]
	if _, udp := w.RemoteAddr().(*net.UDPAddr); udp && strings.HasPrefix(q.Name, "big.") {
		m.Truncated = true
		w.WriteMsg(m)
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	name := strings.ToLower(q.Name)
	if strings.HasPrefix(name, "fail.") {
		m.Rcode = dns.RcodeServerFailure
		w.WriteMsg(m)
		return
	}
	found := false
	for range 10 {
		rrs, ok := u.zone[name]
		if !ok {
			break
		}
		found = true
		next := ""
		for _, rr := range rrs {
			if c, ok := rr.(*dns.CNAME); ok {
				m.Answer = append(m.Answer, rr)
				next = strings.ToLower(c.Target)
			} else if rr.Header().Rrtype == q.Qtype {
				m.Answer = append(m.Answer, rr)
			}
		}
		if next == "" || q.Qtype == dns.TypeCNAME {
			break
		}
		name = next
	}
	if !found {
		m.Rcode = dns.RcodeNameError
	}
	// Something the gate must never pass on or allow.
	if strings.HasPrefix(q.Name, "inject.") {
		rr, _ := dns.NewRR("evil.test. 60 IN A 198.51.100.66")
		m.Answer = append(m.Answer, rr)
	}
	w.WriteMsg(m)
}

// listenPair listens on UDP and TCP on one loopback port, trying again when
// the TCP side of the port the UDP socket got is taken.
func listenPair(t testing.TB) (net.PacketConn, net.Listener) {
	t.Helper()
	for range 20 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, l
		}
		pc.Close()
	}
	t.Fatal("no loopback port free for both UDP and TCP")
	return nil, nil
}

// recorder is an audit.Recorder for tests.
type recorder struct{ audit.Memory }

// last returns the last record for name.
func (r *recorder) last(t *testing.T, name string) audit.Record {
	t.Helper()
	recs := r.Records()
	for i := len(recs) - 1; i >= 0; i-- {
		if recs[i].Name == name {
			return recs[i]
		}
	}
	t.Fatalf("no audit record for %s in %+v", name, recs)
	return audit.Record{}
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// changes records OnChange calls.
type changes struct {
	mu    sync.Mutex
	calls [][]policy.HostRule
	ch    chan []policy.HostRule
}

func (c *changes) on(h []policy.HostRule) {
	c.mu.Lock()
	c.calls = append(c.calls, h)
	c.mu.Unlock()
	select {
	case c.ch <- h:
	default:
	}
}

func (c *changes) lastCall(t *testing.T) []policy.HostRule {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.calls) == 0 {
		t.Fatal("OnChange was never called")
	}
	return c.calls[len(c.calls)-1]
}

func (c *changes) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.calls)
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

type env struct {
	gate    *Gate
	addr    string
	up      *upstream
	audit   *recorder
	changes *changes
	clock   *clock
}

func testPolicy() policy.Policy {
	p := policy.Policy{
		Domains: []policy.Domain{
			{Name: "api.example.test", Proto: "tcp", Ports: "443"},
			{Name: "*.wild.test", Proto: "tcp", Ports: "80-443"},
			{Name: "cdn.example.test", Proto: "tcp"},
			{Name: "inject.example.test"},
			{Name: "private.example.test"},
			{Name: "big.example.test"},
			{Name: "fail.example.test"},
			{Name: "ttl.example.test"},
			{Name: "many.example.test"},
			{Name: "static.test"},
		},
		Credentials: []policy.Credential{{Secret: "gh", Hosts: []string{"api.github.test"}}},
	}
	p.Normalize()
	if err := p.Validate(); err != nil {
		panic(err)
	}
	return p
}

var zone = []string{
	"api.example.test. 120 IN A 203.0.113.1",
	"api.example.test. 120 IN A 203.0.113.2",
	"api.example.test. 120 IN AAAA 2001:db8::1",
	"a.wild.test. 30 IN A 203.0.113.10",
	"wild.test. 30 IN A 203.0.113.11",
	"cdn.example.test. 600 IN CNAME edge.cdn.net.",
	"edge.cdn.net. 20 IN A 198.51.100.9",
	"inject.example.test. 60 IN A 203.0.113.20",
	"private.example.test. 60 IN A 10.1.2.3",
	"private.example.test. 60 IN A 127.0.0.1",
	"private.example.test. 60 IN A 0.0.0.0",
	"private.example.test. 60 IN A 169.254.169.254",
	"private.example.test. 60 IN A 203.0.113.30",
	"big.example.test. 60 IN A 203.0.113.40",
	"ttl.example.test. 1 IN A 203.0.113.50",
	"ttl.example.test. 86400 IN A 203.0.113.51",
	"many.example.test. 60 IN A 203.0.113.61",
	"many.example.test. 60 IN A 203.0.113.62",
	"many.example.test. 60 IN A 203.0.113.63",
	"other.test. 60 IN A 203.0.113.99",
}

func newEnv(t testing.TB, mod func(*Config)) *env {
	t.Helper()
	e := &env{up: newUpstream(t, zone...), audit: &recorder{}, changes: &changes{ch: make(chan []policy.HostRule, 16)},
		clock: &clock{t: t0}}
	cfg := Config{
		Policy:    testPolicy(),
		ProxyAddr: netip.MustParseAddr("192.0.2.53"),
		Upstream:  e.up.addr,
		Audit:     e.audit,
		Sandbox:   "sb1",
		OnChange:  e.changes.on,
		Now:       e.clock.Now,
	}
	if mod != nil {
		mod(&cfg)
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.gate = g
	pc, l := listenPair(t)
	e.addr = pc.LocalAddr().String()
	done := make(chan error, 1)
	go func() { done <- g.Serve(pc, l) }()
	t.Cleanup(func() {
		g.Close()
		if err := <-done; err != nil && err != ErrClosed {
			t.Errorf("Serve: %v", err)
		}
	})
	return e
}

func (e *env) query(t *testing.T, netw, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	c := &dns.Client{Net: netw, Timeout: 5 * time.Second}
	r, _, err := c.Exchange(m, e.addr)
	if err != nil {
		t.Fatalf("%s %s over %s: %v", name, dns.TypeToString[qtype], netw, err)
	}
	return r
}

// answer queries name (qtype, over netw) and checks that the gate answers
// with exactly the addresses want (sorted; none: an empty answer). It
// returns the reply.
func (e *env) answer(t *testing.T, netw, name string, qtype uint16, want ...string) *dns.Msg {
	t.Helper()
	r := e.query(t, netw, name, qtype)
	wantRcode(t, r, dns.RcodeSuccess)
	if len(want) == 0 && len(r.Answer) != 0 || len(want) != 0 && !slices.Equal(addrs(r), want) {
		t.Fatalf("%s %s over %s: answer %v, want %v", name, dns.TypeToString[qtype], netw, r.Answer, want)
	}
	return r
}

// reply queries name (qtype, over UDP) and checks that the gate replies
// with rcode and n answer records. It returns the reply.
func (e *env) reply(t *testing.T, name string, qtype uint16, rcode, n int) *dns.Msg {
	t.Helper()
	r := e.query(t, "udp", name, qtype)
	wantRcode(t, r, rcode)
	if len(r.Answer) != n {
		t.Fatalf("answer %v", r.Answer)
	}
	return r
}

func addrs(r *dns.Msg) []string {
	var out []string
	for _, rr := range r.Answer {
		if a, typ := rrAddr(rr); typ != 0 {
			out = append(out, a.String())
		}
	}
	slices.Sort(out)
	return out
}

func wantRcode(t *testing.T, r *dns.Msg, rcode int) {
	t.Helper()
	if r.Rcode != rcode {
		t.Fatalf("rcode %s, want %s\n%v", dns.RcodeToString[r.Rcode], dns.RcodeToString[rcode], r)
	}
}

func host(a string, rule policy.PortRule) policy.HostRule {
	return policy.HostRule{Addr: netip.MustParseAddr(a), Rule: rule}
}

func TestAllowedName(t *testing.T) {
	e := newEnv(t, nil)
	r := e.answer(t, "udp", "API.Example.Test", dns.TypeA, "203.0.113.1", "203.0.113.2")
	if r.Answer[0].Header().Name != "API.Example.Test." {
		t.Errorf("owner %q, want the question's spelling", r.Answer[0].Header().Name)
	}
	rule := policy.PortRule{Proto: policy.ProtoTCP, Lo: 443, Hi: 443, RuleID: 10001}
	want := []policy.HostRule{host("203.0.113.1", rule), host("203.0.113.2", rule)}
	if got := e.changes.lastCall(t); !slices.Equal(got, want) {
		t.Fatalf("OnChange %v, want %v", got, want)
	}
	if got := e.gate.Hosts(); !slices.Equal(got, want) {
		t.Fatalf("Hosts %v, want %v", got, want)
	}
	for _, en := range e.gate.Entries() {
		if !en.Expires.Equal(t0.Add(120*time.Second)) || en.Domain != "api.example.test" {
			t.Errorf("entry %+v: want expiry t0+120s, domain api.example.test", en)
		}
	}
	rec := e.audit.last(t, "api.example.test")
	if rec.Verdict != audit.Allow || rec.Source != audit.SourceDNS || rec.Sandbox != "sb1" || rec.RuleID != 10001 ||
		!slices.Equal(rec.Addrs, []string{"203.0.113.1", "203.0.113.2"}) {
		t.Errorf("audit %+v", rec)
	}
	// Asking again changes no key: no new OnChange call.
	n := e.changes.count()
	e.query(t, "udp", "api.example.test", dns.TypeA)
	if e.changes.count() != n {
		t.Errorf("OnChange called again for the same keys")
	}
}

func TestWildcard(t *testing.T) {
	e := newEnv(t, nil)
	r := e.answer(t, "udp", "a.wild.test", dns.TypeA, "203.0.113.10")
	if h := e.gate.Hosts(); len(h) != 1 || h[0].Rule != (policy.PortRule{Proto: policy.ProtoTCP, Lo: 80, Hi: 443, RuleID: 10002}) {
		t.Fatalf("Hosts %v", h)
	}
	r = e.query(t, "udp", "wild.test", dns.TypeA)
	wantRcode(t, r, dns.RcodeNameError)
	if rec := e.audit.last(t, "wild.test"); rec.Verdict != audit.Deny || rec.Reason != "name-not-allowed" {
		t.Errorf("audit %+v", rec)
	}
}

func TestDenied(t *testing.T) {
	e := newEnv(t, nil)
	r := e.reply(t, "other.test", dns.TypeA, dns.RcodeNameError, 0)
	if rec := e.audit.last(t, "other.test"); rec.Verdict != audit.Deny || rec.Reason != "name-not-allowed" {
		t.Errorf("audit %+v", rec)
	}
	wantRcode(t, e.query(t, "udp", "1.113.0.203.in-addr.arpa", dns.TypePTR), dns.RcodeRefused)
	wantRcode(t, e.query(t, "udp", "api.example.test", dns.TypeANY), dns.RcodeRefused)
	e.answer(t, "udp", "api.example.test", dns.TypeTXT)
	if rec := e.audit.last(t, "api.example.test"); rec.Verdict != audit.Deny || rec.Reason != "type-not-allowed" {
		t.Errorf("audit %+v", rec)
	}
	if n := e.up.queries.Load(); n != 0 {
		t.Errorf("upstream asked %d times, want 0", n)
	}
	if h := e.gate.Hosts(); len(h) != 0 {
		t.Errorf("Hosts %v", h)
	}
	// Two questions: FORMERR.
	m := new(dns.Msg)
	m.SetQuestion("api.example.test.", dns.TypeA)
	m.Question = append(m.Question, dns.Question{Name: "a.wild.test.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	r, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(m, e.addr)
	if err != nil {
		t.Fatal(err)
	}
	wantRcode(t, r, dns.RcodeFormatError)
}

func TestCredentialHost(t *testing.T) {
	e := newEnv(t, nil)
	if r := e.answer(t, "udp", "api.github.test", dns.TypeA, "192.0.2.53"); r.Answer[0].Header().Ttl != 60 {
		t.Fatalf("answer %v, want a TTL of 60", r.Answer)
	}
	if rec := e.audit.last(t, "api.github.test"); rec.Verdict != audit.Allow || rec.Reason != "steered" {
		t.Errorf("audit %+v", rec)
	}
	e.answer(t, "udp", "api.github.test", dns.TypeAAAA)
	if n := e.up.queries.Load(); n != 0 {
		t.Errorf("upstream asked %d times, want 0", n)
	}
	if h := e.gate.Hosts(); len(h) != 0 {
		t.Errorf("the proxy went into Hosts: %v", h)
	}
}

func TestAAAA(t *testing.T) {
	e := newEnv(t, nil)
	e.answer(t, "udp", "api.example.test", dns.TypeAAAA)
	if n := e.up.queries.Load(); n != 0 {
		t.Errorf("upstream asked %d times, want 0", n)
	}

	e = newEnv(t, func(c *Config) { c.Policy.IPv6 = true })
	e.answer(t, "udp", "api.example.test", dns.TypeAAAA, "2001:db8::1")
	if h := e.gate.Hosts(); len(h) != 0 {
		t.Errorf("AAAA went into Hosts (IPv6 is allowed wholesale): %v", h)
	}
}

func TestTCP(t *testing.T) {
	e := newEnv(t, nil)
	e.answer(t, "tcp", "api.example.test", dns.TypeA, "203.0.113.1", "203.0.113.2")
	// The upstream truncates big.*: the gate retries over TCP.
	e.answer(t, "udp", "big.example.test", dns.TypeA, "203.0.113.40")
}

func TestCNAMEAndInjection(t *testing.T) {
	e := newEnv(t, nil)
	r := e.reply(t, "cdn.example.test", dns.TypeA, dns.RcodeSuccess, 2)
	c, ok := r.Answer[0].(*dns.CNAME)
	if !ok || c.Target != "edge.cdn.net." {
		t.Fatalf("first record %v, want the CNAME", r.Answer[0])
	}
	// The CNAME may not outlive the address it leads to.
	if c.Hdr.Ttl != 20 {
		t.Errorf("CNAME TTL %d, want 20", c.Hdr.Ttl)
	}
	rule := policy.PortRule{Proto: policy.ProtoTCP, Lo: 0, Hi: 65535, RuleID: 10003}
	if h := e.gate.Hosts(); !slices.Equal(h, []policy.HostRule{host("198.51.100.9", rule)}) {
		t.Fatalf("Hosts %v", h)
	}
	// The target itself is not an allowed name.
	wantRcode(t, e.query(t, "udp", "edge.cdn.net", dns.TypeA), dns.RcodeNameError)

	r = e.query(t, "udp", "inject.example.test", dns.TypeA)
	if got := addrs(r); !slices.Equal(got, []string{"203.0.113.20"}) {
		t.Fatalf("answer %v: the injected record must be dropped", got)
	}
	for _, h := range e.gate.Hosts() {
		if h.Addr == netip.MustParseAddr("198.51.100.66") {
			t.Fatal("the injected address was allowed")
		}
	}
}

func TestNonDestinationsDropped(t *testing.T) {
	e := newEnv(t, nil)
	r := e.query(t, "udp", "private.example.test", dns.TypeA)
	if got := addrs(r); !slices.Equal(got, []string{"203.0.113.30"}) {
		t.Fatalf("answer %v", got)
	}
	e = newEnv(t, func(c *Config) { c.AllowPrivate = true })
	r = e.query(t, "udp", "private.example.test", dns.TypeA)
	if got := addrs(r); !slices.Equal(got, []string{"10.1.2.3", "203.0.113.30"}) {
		t.Fatalf("answer with AllowPrivate %v", got)
	}
}

func TestExpiryFakeClock(t *testing.T) {
	e := newEnv(t, nil)
	e.query(t, "udp", "a.wild.test", dns.TypeA)      // 30 s
	e.query(t, "udp", "api.example.test", dns.TypeA) // 120 s
	if n := len(e.gate.Hosts()); n != 3 {
		t.Fatalf("%d hosts, want 3", n)
	}
	e.clock.Advance(29 * time.Second)
	e.gate.Expire()
	if n := len(e.gate.Hosts()); n != 3 {
		t.Fatalf("%d hosts after 29 s, want 3", n)
	}
	e.clock.Advance(time.Second)
	e.gate.Expire()
	if h := e.changes.lastCall(t); len(h) != 2 || h[0].Rule.RuleID != 10001 {
		t.Fatalf("OnChange after 30 s: %v", h)
	}
	// A later answer extends the expiry; it never shortens it.
	e.clock.Advance(60 * time.Second) // t0+90
	e.query(t, "udp", "api.example.test", dns.TypeA)
	for _, en := range e.gate.Entries() {
		if !en.Expires.Equal(t0.Add(210 * time.Second)) {
			t.Errorf("entry %+v: want expiry t0+210s", en)
		}
	}
	e.clock.Advance(120 * time.Second)
	e.gate.Expire()
	if h := e.changes.lastCall(t); len(h) != 0 {
		t.Fatalf("OnChange after every expiry: %v", h)
	}
}

func TestExpiryTimer(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.Now = nil
		c.MinTTL = 20 * time.Millisecond
		c.MaxTTL = 50 * time.Millisecond
	})
	r := e.query(t, "udp", "api.example.test", dns.TypeA)
	if r.Answer[0].Header().Ttl != 0 {
		t.Errorf("TTL %d, want 0 (allowed for 50 ms only)", r.Answer[0].Header().Ttl)
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case h := <-e.changes.ch:
			if len(h) == 0 {
				if n := len(e.gate.Hosts()); n != 0 {
					t.Fatalf("Hosts has %d after the timer", n)
				}
				return
			}
		case <-deadline:
			t.Fatal("the timer did not expire the entries")
		}
	}
}

func TestTTLClamp(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MinTTL = 5 * time.Second; c.MaxTTL = time.Hour })
	r := e.query(t, "udp", "ttl.example.test", dns.TypeA)
	ttls := map[string]uint32{}
	for _, rr := range r.Answer {
		ttls[rr.(*dns.A).A.String()] = rr.Header().Ttl
	}
	if ttls["203.0.113.50"] != 1 || ttls["203.0.113.51"] != 3600 {
		t.Errorf("guest TTLs %v, want 1 and 3600", ttls)
	}
	exp := map[string]time.Time{}
	for _, en := range e.gate.Entries() {
		exp[en.Addr.String()] = en.Expires
	}
	if !exp["203.0.113.50"].Equal(t0.Add(5*time.Second)) || !exp["203.0.113.51"].Equal(t0.Add(time.Hour)) {
		t.Errorf("expiries %v, want t0+5s and t0+1h", exp)
	}
}

func TestSetPolicy(t *testing.T) {
	e := newEnv(t, nil)
	e.query(t, "udp", "a.wild.test", dns.TypeA)
	e.query(t, "udp", "api.example.test", dns.TypeA)
	e.query(t, "udp", "cdn.example.test", dns.TypeA)
	if n := len(e.gate.Hosts()); n != 4 {
		t.Fatalf("%d hosts, want 4", n)
	}
	p := testPolicy()
	p.Domains[1].Ports = "443"                                                      // *.wild.test: port rule changed
	p.Domains = slices.Delete(p.Domains, 2, 3)                                      // cdn.example.test: gone
	p.Domains = append(p.Domains, policy.Domain{ID: 10003, Name: "cdn.other.test"}) // its id reused
	e.gate.SetPolicy(p)
	rule := policy.PortRule{Proto: policy.ProtoTCP, Lo: 443, Hi: 443, RuleID: 10001}
	want := []policy.HostRule{host("203.0.113.1", rule), host("203.0.113.2", rule)}
	if got := e.changes.lastCall(t); !slices.Equal(got, want) {
		t.Fatalf("OnChange %v, want %v", got, want)
	}
	wantRcode(t, e.query(t, "udp", "cdn.example.test", dns.TypeA), dns.RcodeNameError)
}

func TestStateRestore(t *testing.T) {
	e := newEnv(t, nil)
	e.query(t, "udp", "a.wild.test", dns.TypeA)      // t0+30s
	e.query(t, "udp", "api.example.test", dns.TypeA) // t0+120s
	want := e.gate.Entries()
	b, err := e.gate.State()
	if err != nil {
		t.Fatal(err)
	}

	e2 := newEnv(t, nil)
	if err := e2.gate.Restore(b); err != nil {
		t.Fatal(err)
	}
	if got := e2.gate.Entries(); !slices.EqualFunc(got, want, func(a, b Entry) bool {
		return a.Addr == b.Addr && a.Rule == b.Rule && a.Domain == b.Domain && a.Expires.Equal(b.Expires)
	}) {
		t.Fatalf("restored %v, want %v", got, want)
	}
	if h := e2.changes.lastCall(t); len(h) != 3 {
		t.Fatalf("OnChange after Restore: %v", h)
	}

	// Restored later: the wildcard's entry has expired.
	e3 := newEnv(t, nil)
	e3.clock.Advance(time.Minute)
	if err := e3.gate.Restore(b); err != nil {
		t.Fatal(err)
	}
	if h := e3.changes.lastCall(t); len(h) != 2 || h[0].Rule.RuleID != 10001 {
		t.Fatalf("OnChange after a late Restore: %v", h)
	}

	// Restored under a policy without api.example.test.
	e4 := newEnv(t, func(c *Config) { c.Policy.Domains = c.Policy.Domains[1:] })
	if err := e4.gate.Restore(b); err != nil {
		t.Fatal(err)
	}
	if h := e4.gate.Hosts(); len(h) != 1 || h[0].Rule.RuleID != 10002 {
		t.Fatalf("Hosts after Restore under a narrower policy: %v", h)
	}

	if err := e4.gate.Restore([]byte(`{"version":9}`)); err == nil {
		t.Error("Restore took an unknown version")
	}
}

func TestUpstreamFailure(t *testing.T) {
	// A port nobody listens on: the kernel refuses at once.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := pc.LocalAddr().String()
	pc.Close()
	e := newEnv(t, func(c *Config) { c.Upstream = dead })
	start := time.Now()
	r := e.query(t, "udp", "api.example.test", dns.TypeA)
	wantRcode(t, r, dns.RcodeServerFailure)
	if time.Since(start) > 3*time.Second {
		t.Errorf("took %v", time.Since(start))
	}
	if rec := e.audit.last(t, "api.example.test"); rec.Reason != "upstream-failure" || rec.Verdict != audit.Deny {
		t.Errorf("audit %+v", rec)
	}
	if h := e.gate.Hosts(); len(h) != 0 {
		t.Errorf("Hosts %v", h)
	}

	// The upstream answers SERVFAIL.
	e = newEnv(t, nil)
	wantRcode(t, e.query(t, "udp", "fail.example.test", dns.TypeA), dns.RcodeServerFailure)
	if rec := e.audit.last(t, "fail.example.test"); rec.Reason != "upstream-failure" {
		t.Errorf("audit %+v", rec)
	}
	// NXDOMAIN from upstream passes through.
	wantRcode(t, e.query(t, "udp", "nope.wild.test", dns.TypeA), dns.RcodeNameError)
}

func TestTableFull(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxEntries = 3 })
	e.query(t, "udp", "api.example.test", dns.TypeA) // 2 entries
	r := e.query(t, "udp", "many.example.test", dns.TypeA)
	wantRcode(t, r, dns.RcodeServerFailure)
	if rec := e.audit.last(t, "many.example.test"); rec.Reason != "table-full" || rec.Verdict != audit.Deny {
		t.Errorf("audit %+v", rec)
	}
	if n := len(e.gate.Hosts()); n != 2 {
		t.Fatalf("%d hosts, want 2 (nothing added from a refused answer)", n)
	}
	// Known keys still refresh; once entries expire there is room again.
	wantRcode(t, e.query(t, "udp", "api.example.test", dns.TypeA), dns.RcodeSuccess)
	e.clock.Advance(121 * time.Second)
	wantRcode(t, e.query(t, "udp", "many.example.test", dns.TypeA), dns.RcodeSuccess)
	if h := e.gate.Hosts(); len(h) != 3 || h[0].Rule.RuleID != 10009 {
		t.Fatalf("Hosts %v", h)
	}
}

func TestStatic(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.Upstream = ""
		c.Static = map[string][]netip.Addr{"Static.Test.": {netip.MustParseAddr("203.0.113.77"), netip.MustParseAddr("2001:db8::77")}}
	})
	r := e.query(t, "udp", "static.test", dns.TypeA)
	if got := addrs(r); !slices.Equal(got, []string{"203.0.113.77"}) {
		t.Fatalf("answer %v", got)
	}
	if h := e.gate.Hosts(); len(h) != 1 || h[0].Rule.RuleID != 10010 {
		t.Fatalf("Hosts %v", h)
	}
	// Allowed but neither static nor upstream.
	wantRcode(t, e.query(t, "udp", "api.example.test", dns.TypeA), dns.RcodeNameError)
	if n := e.up.queries.Load(); n != 0 {
		t.Errorf("upstream asked %d times", n)
	}
}

func TestEDNSAndClose(t *testing.T) {
	e := newEnv(t, nil)
	m := new(dns.Msg)
	m.SetQuestion("api.example.test.", dns.TypeA)
	m.SetEdns0(4096, false)
	r, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(m, e.addr)
	if err != nil {
		t.Fatal(err)
	}
	if opt := r.IsEdns0(); opt == nil || opt.UDPSize() != maxUDPReply {
		t.Errorf("OPT %v", opt)
	}
	e.gate.Close()
	if err := e.gate.Serve(nil, nil); err != ErrClosed {
		t.Errorf("Serve after Close: %v", err)
	}
}

func TestNewErrors(t *testing.T) {
	if _, err := New(Config{Upstream: "dns.example:53"}); err == nil {
		t.Error("a host name as upstream was taken")
	}
	if _, err := New(Config{Upstream: "127.0.0.1:53", ProxyAddr: netip.MustParseAddr("::1")}); err == nil {
		t.Error("an IPv6 proxy address was taken")
	}
	if _, err := New(Config{Upstream: "127.0.0.1:53", MinTTL: time.Hour, MaxTTL: time.Second}); err == nil {
		t.Error("MaxTTL < MinTTL was taken")
	}
}

// TestConcurrentRepliesFollowOnChange checks that no reply leaves before the
// filter (OnChange) has its addresses, under concurrent queries.
func TestConcurrentRepliesFollowOnChange(t *testing.T) {
	var cur atomic.Pointer[[]policy.HostRule]
	e := newEnv(t, func(c *Config) {
		c.OnChange = func(h []policy.HostRule) {
			time.Sleep(time.Millisecond)
			cur.Store(&h)
		}
	})
	names := []string{"api.example.test", "a.wild.test", "b.wild.test", "cdn.example.test", "many.example.test", "ttl.example.test"}
	var zoneMu = &e.up.mu
	zoneMu.Lock()
	rr, _ := dns.NewRR("b.wild.test. 60 IN A 203.0.113.12")
	e.up.zone["b.wild.test."] = []dns.RR{rr}
	zoneMu.Unlock()
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Go(func() {
			name := names[i%len(names)]
			m := new(dns.Msg)
			m.SetQuestion(dns.Fqdn(name), dns.TypeA)
			r, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(m, e.addr)
			if err != nil {
				t.Error(err)
				return
			}
			set := map[string]bool{}
			if p := cur.Load(); p != nil {
				for _, h := range *p {
					set[h.Addr.String()] = true
				}
			}
			for _, a := range addrs(r) {
				if !set[a] {
					t.Errorf("%s: %s answered before OnChange had it", name, a)
				}
			}
		})
	}
	wg.Wait()
}
