package dnsgate

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/warrenvm/warren/ebpf/audit"
	"github.com/warrenvm/warren/ebpf/policy"
)

// ServeDNS answers one query (it makes Gate a dns.Handler).
func (g *Gate) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	resp := g.answer(r)
	// EDNS: echo an OPT record, and fit UDP replies into what the guest
	// takes.
	size := dns.MinMsgSize
	if opt := r.IsEdns0(); opt != nil {
		size = min(max(int(opt.UDPSize()), dns.MinMsgSize), maxUDPReply)
		resp.SetEdns0(maxUDPReply, false)
	}
	if _, isUDP := w.RemoteAddr().(*net.UDPAddr); isUDP {
		resp.Truncate(size)
	}
	w.WriteMsg(resp)
}

// reply starts a reply to r with rcode.
func reply(r *dns.Msg, rcode int) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(r, rcode)
	m.RecursionAvailable = true
	m.Authoritative = false
	return m
}

// audit records a DNS decision.
func (g *Gate) audit(name string, qtype uint16, verdict, reason string, ruleID uint32, addrs []string, detail string) {
	d := dns.TypeToString[qtype]
	if d == "" {
		d = fmt.Sprintf("TYPE%d", qtype)
	}
	if detail != "" {
		d += ": " + detail
	}
	g.rec.Record(audit.Record{Time: g.now(), Sandbox: g.cfg.Sandbox, Source: audit.SourceDNS, Verdict: verdict,
		Reason: reason, Name: name, RuleID: ruleID, Addrs: addrs, Detail: d})
}

// answer decides the reply to r.
func (g *Gate) answer(r *dns.Msg) *dns.Msg {
	if r.Opcode != dns.OpcodeQuery {
		return reply(r, dns.RcodeNotImplemented)
	}
	if len(r.Question) != 1 {
		return reply(r, dns.RcodeFormatError)
	}
	q := r.Question[0]
	name := canonical(q.Name)
	if _, ok := dns.IsDomainName(q.Name); !ok {
		return reply(r, dns.RcodeFormatError)
	}
	if opt := r.IsEdns0(); opt != nil && opt.Version() != 0 {
		m := reply(r, dns.RcodeBadVers)
		return m
	}
	if q.Qclass != dns.ClassINET {
		g.audit(name, q.Qtype, audit.Deny, "class-not-allowed", 0, nil, dns.ClassToString[q.Qclass])
		return reply(r, dns.RcodeRefused)
	}
	switch q.Qtype {
	case dns.TypePTR, dns.TypeAXFR, dns.TypeIXFR, dns.TypeANY:
		g.audit(name, q.Qtype, audit.Deny, "type-not-allowed", 0, nil, "")
		return reply(r, dns.RcodeRefused)
	}

	g.mu.Lock()
	pol := g.pol
	g.mu.Unlock()

	if pol.CredentialHost(name) {
		return g.steer(r, name, q.Qtype)
	}
	d, ok := pol.Domain(name)
	if !ok {
		g.audit(name, q.Qtype, audit.Deny, "name-not-allowed", 0, nil, "")
		return reply(r, dns.RcodeNameError)
	}
	switch {
	case q.Qtype == dns.TypeA, q.Qtype == dns.TypeCNAME, q.Qtype == dns.TypeAAAA && pol.IPv6:
		return g.forward(r, name, q.Qtype, d)
	case q.Qtype == dns.TypeAAAA:
		g.audit(name, q.Qtype, audit.Allow, "no-ipv6", d.ID, nil, "")
		return reply(r, dns.RcodeSuccess)
	default:
		g.audit(name, q.Qtype, audit.Deny, "type-not-allowed", d.ID, nil, "")
		return reply(r, dns.RcodeSuccess)
	}
}

// steer answers a credential host with the proxy's address.
func (g *Gate) steer(r *dns.Msg, name string, qtype uint16) *dns.Msg {
	switch qtype {
	case dns.TypeA:
		if !g.cfg.ProxyAddr.IsValid() {
			g.audit(name, qtype, audit.Deny, "no-proxy", 0, nil, "credential host but no proxy address configured")
			return reply(r, dns.RcodeServerFailure)
		}
		m := reply(r, dns.RcodeSuccess)
		m.Answer = append(m.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: ProxyTTL},
			A:   g.cfg.ProxyAddr.AsSlice(),
		})
		g.audit(name, qtype, audit.Allow, "steered", 0, []string{g.cfg.ProxyAddr.String()}, "")
		return m
	case dns.TypeAAAA, dns.TypeCNAME:
		g.audit(name, qtype, audit.Allow, "steered", 0, nil, "")
	default:
		g.audit(name, qtype, audit.Deny, "type-not-allowed", 0, nil, "")
	}
	return reply(r, dns.RcodeSuccess)
}

// forward answers an allowed name from Static or the upstream.
func (g *Gate) forward(r *dns.Msg, name string, qtype uint16, d policy.Domain) *dns.Msg {
	rule, err := d.PortRule()
	if err != nil { // Validate refuses such a policy; be safe anyway
		g.audit(name, qtype, audit.Deny, "bad-domain-rule", d.ID, nil, err.Error())
		return reply(r, dns.RcodeServerFailure)
	}
	var up *dns.Msg
	if as, ok := g.cfg.Static[name]; ok {
		up = g.staticAnswer(name, qtype, as)
	} else if g.upstream == "" {
		g.audit(name, qtype, audit.Allow, "nxdomain", d.ID, nil, "no static answer and no upstream")
		return reply(r, dns.RcodeNameError)
	} else {
		select {
		case g.sem <- struct{}{}:
		default:
			g.audit(name, qtype, audit.Deny, "busy", d.ID, nil, "too many upstream queries in flight")
			return reply(r, dns.RcodeServerFailure)
		}
		up, err = g.exchange(name, qtype)
		<-g.sem
		if err != nil {
			g.audit(name, qtype, audit.Deny, "upstream-failure", d.ID, nil, err.Error())
			return reply(r, dns.RcodeServerFailure)
		}
	}
	switch up.Rcode {
	case dns.RcodeSuccess:
	case dns.RcodeNameError:
		g.audit(name, qtype, audit.Allow, "nxdomain", d.ID, nil, "")
		return reply(r, dns.RcodeNameError)
	default:
		g.audit(name, qtype, audit.Deny, "upstream-failure", d.ID, nil, "upstream rcode "+dns.RcodeToString[up.Rcode])
		return reply(r, dns.RcodeServerFailure)
	}

	rrs, dropped := g.chain(name, qtype, up.Answer)
	// Clamp: each address is allowed for clamp(ttl) and the guest may
	// cache it no longer than that; the CNAMEs no longer than the shortest
	// allow in the answer (so the guest never holds a CNAME whose target
	// it would have to resolve on its own: the target is not an allowed
	// name).
	var gs []grant
	var addrs []string
	capSecs := uint32(g.cfg.MaxTTL / time.Second)
	for _, rr := range rrs {
		a, ok := rr.(*dns.A)
		if !ok {
			continue
		}
		ip, _ := netip.AddrFromSlice(a.A)
		ttl := min(max(time.Duration(a.Hdr.Ttl)*time.Second, g.cfg.MinTTL), g.cfg.MaxTTL)
		gs = append(gs, grant{addr: ip.Unmap(), ttl: ttl})
		addrs = append(addrs, ip.Unmap().String())
		capSecs = min(capSecs, uint32(ttl/time.Second))
	}
	for _, rr := range rrs {
		h := rr.Header()
		if h.Rrtype == dns.TypeA {
			allowed := min(max(time.Duration(h.Ttl)*time.Second, g.cfg.MinTTL), g.cfg.MaxTTL)
			h.Ttl = min(h.Ttl, uint32(allowed/time.Second))
		} else {
			h.Ttl = min(h.Ttl, capSecs)
		}
	}
	if err := g.add(d, rule, gs); err != nil {
		g.audit(name, qtype, audit.Deny, "table-full", d.ID, addrs, err.Error())
		return reply(r, dns.RcodeServerFailure)
	}
	detail := ""
	if dropped > 0 {
		detail = fmt.Sprintf("dropped %d address(es) not allowed as destinations", dropped)
	}
	for _, rr := range rrs {
		if aaaa, ok := rr.(*dns.AAAA); ok {
			addrs = append(addrs, aaaa.AAAA.String())
		}
	}
	g.audit(name, qtype, audit.Allow, "", d.ID, addrs, detail)
	m := reply(r, dns.RcodeSuccess)
	// Records keep the guest's spelling of the question's name.
	for _, rr := range rrs {
		if strings.EqualFold(rr.Header().Name, r.Question[0].Name) {
			rr.Header().Name = r.Question[0].Name
		}
	}
	m.Answer = rrs
	return m
}

// staticAnswer builds an upstream-like reply from Config.Static.
func (g *Gate) staticAnswer(name string, qtype uint16, as []netip.Addr) *dns.Msg {
	m := new(dns.Msg)
	fq := dns.Fqdn(name)
	for _, a := range as {
		a = a.Unmap()
		switch {
		case qtype == dns.TypeA && a.Is4():
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: fq, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: StaticTTL}, A: a.AsSlice()})
		case qtype == dns.TypeAAAA && a.Is6():
			m.Answer = append(m.Answer, &dns.AAAA{Hdr: dns.RR_Header{Name: fq, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: StaticTTL}, AAAA: a.AsSlice()})
		}
	}
	return m
}

// exchange asks the upstream, over UDP and then TCP if the reply was
// truncated, within UpstreamTimeout.
func (g *Gate) exchange(name string, qtype uint16) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(g.ctx, UpstreamTimeout)
	defer cancel()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), qtype)
	q.RecursionDesired = true
	q.SetEdns0(maxUDPReply, false)
	c := &dns.Client{Net: "udp", UDPSize: maxUDPReply, Timeout: UpstreamTimeout}
	resp, _, err := c.ExchangeContext(ctx, q, g.upstream)
	if err == nil && resp.Truncated {
		c.Net = "tcp"
		resp, _, err = c.ExchangeContext(ctx, q, g.upstream)
	}
	if err != nil {
		return nil, err
	}
	if len(resp.Question) != 1 || !strings.EqualFold(resp.Question[0].Name, q.Question[0].Name) ||
		resp.Question[0].Qtype != qtype {
		return nil, errors.New("upstream answered another question")
	}
	return resp, nil
}

// chain returns the records of ans on the CNAME chain from name that answer
// qtype: the CNAMEs, then the A or AAAA records of the chain's names. It
// drops everything else the upstream sent, and addresses that must never be
// destinations (their count is returned).
func (g *Gate) chain(name string, qtype uint16, ans []dns.RR) (out []dns.RR, dropped int) {
	cur := dns.Fqdn(name)
	onChain := map[string]bool{cur: true}
	for range maxChain {
		var next string
		for _, rr := range ans {
			if c, ok := rr.(*dns.CNAME); ok && rr.Header().Class == dns.ClassINET && strings.EqualFold(c.Hdr.Name, cur) {
				next = strings.ToLower(dns.Fqdn(c.Target))
				c2 := dns.Copy(c).(*dns.CNAME)
				out = append(out, c2)
				break
			}
		}
		if next == "" || onChain[next] {
			break
		}
		onChain[next] = true
		cur = next
		if qtype == dns.TypeCNAME {
			break // a CNAME query gets the first link only
		}
	}
	if qtype == dns.TypeCNAME {
		return out, 0
	}
	for _, rr := range ans {
		h := rr.Header()
		if h.Class != dns.ClassINET || !onChain[strings.ToLower(h.Name)] {
			continue
		}
		ip, typ := rrAddr(rr)
		if typ == 0 || typ != qtype {
			continue
		}
		if !g.destination(ip) {
			dropped++
			continue
		}
		out = append(out, dns.Copy(rr))
	}
	return out, dropped
}

// destination reports whether ip may be allowed as a destination: not a
// policy.Reserved address (private ones only with AllowPrivate) and not
// one of the host's own addresses (Config.Guard).
func (g *Gate) destination(ip netip.Addr) bool {
	return g.cfg.Guard.Check(ip) == nil
}

// rrAddr returns the address of an A or AAAA record, unmapped (invalid
// where the record's bytes are no address), and its type, dns.TypeA or
// dns.TypeAAAA; 0 for other records.
func rrAddr(rr dns.RR) (netip.Addr, uint16) {
	var ip netip.Addr
	var typ uint16
	switch v := rr.(type) {
	case *dns.A:
		ip, _ = netip.AddrFromSlice(v.A)
		typ = dns.TypeA
	case *dns.AAAA:
		ip, _ = netip.AddrFromSlice(v.AAAA)
		typ = dns.TypeAAAA
	default:
		return netip.Addr{}, 0
	}
	return ip.Unmap(), typ
}
