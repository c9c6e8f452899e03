// Package policy is a sandbox's egress policy: what the guest may reach,
// which names its resolver answers, and which credentials the host adds
// to its requests. It is plain data, read from JSON, checked, compared
// (a fork's child may only narrow its parent's policy) and compiled into
// the longest-prefix-match table that the eBPF filter (ebpf/filter) holds
// in its maps.
//
// The model is default deny: a packet from the guest passes only when a
// rule, a resolved allowed name, or the sandbox's own infrastructure
// (ARP, DHCP, DNS to its resolver, the credential proxy) allows it.
package policy

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/warrenvm/warren/internal/strictjson"
)

// Protocol numbers used by rules (IANA, as in the IPv4 header).
const (
	ProtoAny  uint8 = 0
	ProtoICMP uint8 = 1
	ProtoTCP  uint8 = 6
	ProtoUDP  uint8 = 17
)

// Limits that keep a policy within what the filter's maps hold.
const (
	// MaxRules is the most CIDR rules a policy may have.
	MaxRules = 1024
	// MaxDomains is the most names a policy may allow.
	MaxDomains = 256
	// MaxPortRules is the most (protocol, port range) pairs one prefix of
	// the compiled table can carry, its own and those of every shorter
	// prefix that contains it. The filter's map value has this many slots.
	MaxPortRules = 8
	// MaxCredentials is the most credentials a policy may scope.
	MaxCredentials = 64
)

// Policy is one sandbox's egress policy. The zero Policy denies everything
// but the sandbox's infrastructure traffic.
type Policy struct {
	// Rules allow IPv4 destinations by CIDR, protocol and port range.
	Rules []Rule `json:"rules,omitempty"`
	// Domains are the names the sandbox's resolver answers; each address
	// it answers with is allowed, for the record's TTL, with the domain's
	// protocol and ports.
	Domains []Domain `json:"domains,omitempty"`
	// IPv6 allows all IPv6 traffic when true; by default IPv6 is denied.
	IPv6 bool `json:"ipv6,omitempty"`
	// Credentials are the secrets the host proxy adds to the guest's HTTP(S)
	// requests, each only for its own hosts.
	Credentials []Credential `json:"credentials,omitempty"`
}

// Rule allows IPv4 traffic to CIDR with protocol Proto ("tcp", "udp",
// "icmp" or "any"/empty) to destination ports Ports ("443", "8000-8100";
// empty: every port; ignored for icmp).
type Rule struct {
	// ID names the rule in audit records; 0 gets the rule's 1-based index.
	ID    uint32       `json:"id,omitempty"`
	CIDR  netip.Prefix `json:"cidr"`
	Proto string       `json:"proto,omitempty"`
	Ports string       `json:"ports,omitempty"`
}

// Domain allows the resolver to answer Name ("api.example.com", or
// "*.example.com" for any name below example.com, not example.com itself)
// and the guest to reach the answers with Proto and Ports as in Rule.
type Domain struct {
	ID    uint32 `json:"id,omitempty"`
	Name  string `json:"name"`
	Proto string `json:"proto,omitempty"`
	Ports string `json:"ports,omitempty"`
}

// Credential is a secret the guest never holds. The guest sends
// Placeholder; the host proxy replaces it with the secret named Secret (from
// the host's secret store) in requests to Hosts only, and leaves it as it is
// anywhere else. Names in Hosts are steered to the proxy by the resolver.
type Credential struct {
	// Secret is the name of the secret in the host's store.
	Secret string `json:"secret"`
	// Placeholder is what the guest holds instead of the secret; empty
	// means "warren-placeholder-" followed by Secret.
	Placeholder string `json:"placeholder,omitempty"`
	// Hosts are the host names whose requests get the secret: public DNS
	// names with at least one dot (CheckCredentialHost). "*.example.com"
	// (any name below example.com) only where the operator allows
	// wildcard credential hosts (Options.WildcardCredentials).
	Hosts []string `json:"hosts"`
	// Substitute lists the parts of a request in which the proxy replaces
	// Placeholder with the secret: "headers", "path", "query" and "body".
	// Empty means header values only: a placeholder in the URL or the
	// body is forwarded unchanged unless the policy names that part.
	Substitute []string `json:"substitute,omitempty"`
}

// Parts of a request a credential may be substituted in (Credential.Substitute).
const (
	PartHeaders = "headers"
	PartPath    = "path"
	PartQuery   = "query"
	PartBody    = "body"
)

// SubstitutesIn reports whether the proxy replaces c's placeholder in part
// (one of the Part* constants).
func (c Credential) SubstitutesIn(part string) bool {
	if len(c.Substitute) == 0 {
		return part == PartHeaders
	}
	for _, s := range c.Substitute {
		if s == part {
			return true
		}
	}
	return false
}

// Options are the operator's allowances a policy is checked against
// (ParseWith, ValidateWith). The zero Options is the strict default.
type Options struct {
	// WildcardCredentials allows credential hosts such as "*.example.com":
	// the secret then goes to every name below the suffix that the guest
	// asks for, which the tenant may not control.
	WildcardCredentials bool
}

// PlaceholderFor returns the placeholder the guest holds for c.
func (c Credential) PlaceholderFor() string {
	if c.Placeholder != "" {
		return c.Placeholder
	}
	return "warren-placeholder-" + c.Secret
}

// PortRule is one (protocol, port range) pair of a compiled entry, with
// the rule id reported when it matches. Lo..Hi is inclusive; 0..65535 and
// ProtoICMP ignore ports.
type PortRule struct {
	Proto  uint8
	Lo, Hi uint16
	RuleID uint32
}

// Matches reports whether a packet with protocol proto to port port
// matches r.
func (r PortRule) Matches(proto uint8, port uint16) bool {
	if r.Proto != ProtoAny && r.Proto != proto {
		return false
	}
	if proto != ProtoTCP && proto != ProtoUDP {
		return true
	}
	return port >= r.Lo && port <= r.Hi
}

// Covers reports whether every packet r2 matches is matched by r.
func (r PortRule) Covers(r2 PortRule) bool {
	if r.Proto != ProtoAny && r.Proto != r2.Proto {
		return false
	}
	if r.Proto == ProtoICMP {
		return true
	}
	return r.Lo <= r2.Lo && r2.Hi <= r.Hi
}

// Entry is one prefix of the compiled table: the IPv4 prefix and every
// port rule that applies to addresses whose longest matching prefix is
// this one (its own rules and those of every shorter prefix containing it).
type Entry struct {
	Prefix netip.Prefix
	Rules  []PortRule
}

// ParseProto parses a rule's protocol name.
func ParseProto(s string) (uint8, error) {
	switch strings.ToLower(s) {
	case "", "any":
		return ProtoAny, nil
	case "tcp":
		return ProtoTCP, nil
	case "udp":
		return ProtoUDP, nil
	case "icmp":
		return ProtoICMP, nil
	}
	return 0, fmt.Errorf("protocol %q: want tcp, udp, icmp or any", s)
}

// ParsePorts parses "", "443" or "8000-8100" into an inclusive range.
func ParsePorts(s string) (lo, hi uint16, err error) {
	if s == "" {
		return 0, 65535, nil
	}
	a, b, isRange := strings.Cut(s, "-")
	l, err := strconv.ParseUint(strings.TrimSpace(a), 10, 16)
	if err != nil {
		return 0, 0, fmt.Errorf("ports %q: %w", s, err)
	}
	h := l
	if isRange {
		if h, err = strconv.ParseUint(strings.TrimSpace(b), 10, 16); err != nil {
			return 0, 0, fmt.Errorf("ports %q: %w", s, err)
		}
	}
	if h < l {
		return 0, 0, fmt.Errorf("ports %q: range ends before it starts", s)
	}
	return uint16(l), uint16(h), nil
}

func portRule(proto, ports string, id uint32) (PortRule, error) {
	p, err := ParseProto(proto)
	if err != nil {
		return PortRule{}, err
	}
	lo, hi, err := ParsePorts(ports)
	if err != nil {
		return PortRule{}, err
	}
	if p == ProtoICMP || p == ProtoAny {
		if ports != "" && p == ProtoICMP {
			return PortRule{}, errors.New("icmp takes no ports")
		}
	}
	return PortRule{Proto: p, Lo: lo, Hi: hi, RuleID: id}, nil
}

// PortRule returns the compiled form of r (with its id as given).
func (r Rule) PortRule() (PortRule, error) { return portRule(r.Proto, r.Ports, r.ID) }

// PortRule returns the compiled form of d's protocol and ports.
func (d Domain) PortRule() (PortRule, error) { return portRule(d.Proto, d.Ports, d.ID) }

// Load reads a policy from a JSON file and checks it (strict Options).
func Load(path string) (Policy, error) { return LoadWith(path, Options{}) }

// Parse decodes a JSON policy (unknown fields are refused), fills in rule
// ids and checks it with the strict default Options.
func Parse(b []byte) (Policy, error) { return ParseWith(b, Options{}) }

// LoadWith is Load checking with the operator's allowances o.
func LoadWith(path string, o Options) (Policy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Policy{}, fmt.Errorf("egress policy: %w", err)
	}
	return ParseWith(b, o)
}

// ParseWith is Parse checking with the operator's allowances o.
func ParseWith(b []byte, o Options) (Policy, error) {
	var p Policy
	if err := strictjson.Unmarshal(b, &p); err != nil {
		return Policy{}, fmt.Errorf("egress policy: %w", err)
	}
	p.Normalize()
	if err := p.ValidateWith(o); err != nil {
		return Policy{}, err
	}
	return p, nil
}

// Normalize gives rules and domains without an id their 1-based index (rules)
// or 10000 plus their 1-based index (domains), and lower-cases names.
func (p *Policy) Normalize() {
	for i := range p.Rules {
		if p.Rules[i].ID == 0 {
			p.Rules[i].ID = uint32(i + 1)
		}
		p.Rules[i].CIDR = p.Rules[i].CIDR.Masked()
	}
	for i := range p.Domains {
		if p.Domains[i].ID == 0 {
			p.Domains[i].ID = uint32(10000 + i + 1)
		}
		p.Domains[i].Name = strings.TrimSuffix(strings.ToLower(p.Domains[i].Name), ".")
	}
	for i := range p.Credentials {
		for j, h := range p.Credentials[i].Hosts {
			p.Credentials[i].Hosts[j] = strings.TrimSuffix(strings.ToLower(h), ".")
		}
	}
}

// Validate checks every field and the limits with the strict default
// Options (no wildcard credential hosts).
func (p Policy) Validate() error { return p.ValidateWith(Options{}) }

// ValidateWith checks every field and the limits, with the operator's
// allowances o.
func (p Policy) ValidateWith(o Options) error {
	if len(p.Rules) > MaxRules {
		return fmt.Errorf("egress policy: %d rules, at most %d", len(p.Rules), MaxRules)
	}
	if len(p.Domains) > MaxDomains {
		return fmt.Errorf("egress policy: %d domains, at most %d", len(p.Domains), MaxDomains)
	}
	if len(p.Credentials) > MaxCredentials {
		return fmt.Errorf("egress policy: %d credentials, at most %d", len(p.Credentials), MaxCredentials)
	}
	for i, r := range p.Rules {
		if !r.CIDR.IsValid() || !r.CIDR.Addr().Is4() {
			return fmt.Errorf("egress policy: rule %d: cidr %v is not an IPv4 prefix", i+1, r.CIDR)
		}
		if _, err := r.PortRule(); err != nil {
			return fmt.Errorf("egress policy: rule %d: %w", i+1, err)
		}
	}
	for i, d := range p.Domains {
		if err := checkName(d.Name); err != nil {
			return fmt.Errorf("egress policy: domain %d: %w", i+1, err)
		}
		if _, err := d.PortRule(); err != nil {
			return fmt.Errorf("egress policy: domain %d (%s): %w", i+1, d.Name, err)
		}
	}
	seen := map[string]bool{}
	for i, c := range p.Credentials {
		if c.Secret == "" || strings.ContainsAny(c.Secret, " \t\r\n/=") {
			return fmt.Errorf("egress policy: credential %d: secret name %q is empty or has a space, '/' or '='", i+1, c.Secret)
		}
		ph := c.PlaceholderFor()
		if len(ph) < 8 {
			return fmt.Errorf("egress policy: credential %s: placeholder %q is shorter than 8 bytes", c.Secret, ph)
		}
		if seen[ph] {
			return fmt.Errorf("egress policy: credential %s: placeholder %q used twice", c.Secret, ph)
		}
		seen[ph] = true
		if len(c.Hosts) == 0 {
			return fmt.Errorf("egress policy: credential %s: no hosts", c.Secret)
		}
		for _, h := range c.Hosts {
			if err := CheckCredentialHost(h, o); err != nil {
				return fmt.Errorf("egress policy: credential %s: %w", c.Secret, err)
			}
		}
		for _, part := range c.Substitute {
			switch part {
			case PartHeaders, PartPath, PartQuery, PartBody:
			default:
				return fmt.Errorf("egress policy: credential %s: substitute %q: want headers, path, query or body", c.Secret, part)
			}
		}
	}
	return nil
}

// internalSuffixes are names that resolve (or are meant to resolve) to
// the host, its LAN or a cloud's private network, never to a public API:
// special-use names (RFC 6761, RFC 6762, RFC 8375, RFC 9476), reverse
// zones, and suffixes in common private use.
var internalSuffixes = []string{
	"localhost", "local", "localdomain", "internal", "intranet", "private",
	"lan", "home", "corp", "home.arpa", "in-addr.arpa", "ip6.arpa",
	"invalid", "onion", "alt",
}

// CheckCredentialHost accepts a credential host (lower case, no trailing
// dot): a DNS host name of letters, digits and hyphens with at least two
// labels, whose last label is not all digits (so no IP literal in any
// spelling), and which is not localhost or under an internal suffix
// (internalSuffixes: "metadata.google.internal", "printer.local"). A
// leading "*." is accepted only with o.WildcardCredentials, and the rest
// must pass the same checks ("*.example.com", never "*.com").
func CheckCredentialHost(h string, o Options) error {
	name := h
	if rest, ok := strings.CutPrefix(h, "*."); ok {
		if !o.WildcardCredentials {
			return fmt.Errorf("host %q: wildcard credential hosts are not allowed on this host (the operator's --allow-wildcard-credentials)", h)
		}
		name = rest
	}
	if name == "" || len(name) > 253 {
		return fmt.Errorf("host %q: empty or longer than 253 bytes", h)
	}
	if _, err := netip.ParseAddr(name); err == nil || strings.ContainsAny(name, "[]:") {
		return fmt.Errorf("host %q: an IP address, not a DNS name", h)
	}
	labels := strings.Split(name, ".")
	if len(labels) < 2 {
		return fmt.Errorf("host %q: a single label; want a fully qualified DNS name such as api.example.com", h)
	}
	for _, label := range labels {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("host %q: empty or over-long label", h)
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("host %q: label %q starts or ends with '-'", h, label)
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("host %q: character %q (want letters, digits and '-')", h, c)
			}
		}
	}
	if tld := labels[len(labels)-1]; tld[0] < 'a' || tld[0] > 'z' {
		return fmt.Errorf("host %q: the top-level label %q does not start with a letter: an IP address, not a DNS name", h, tld)
	}
	for _, suf := range internalSuffixes {
		if name == suf || strings.HasSuffix(name, "."+suf) {
			return fmt.Errorf("host %q: an internal name (.%s), not a public host", h, suf)
		}
	}
	return nil
}

// checkName accepts a lower-case DNS name, optionally starting with "*.".
func checkName(n string) error {
	s := strings.TrimPrefix(n, "*.")
	if s == "" || len(s) > 253 {
		return fmt.Errorf("name %q: empty or longer than 253 bytes", n)
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("name %q: empty or over-long label", n)
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("name %q: character %q", n, c)
			}
		}
	}
	return nil
}

// MatchName reports whether name (lower case, no trailing dot) matches
// pattern ("host" or "*.suffix").
func MatchName(pattern, name string) bool {
	if rest, ok := strings.CutPrefix(pattern, "*."); ok {
		return strings.HasSuffix(name, "."+rest)
	}
	return pattern == name
}

// Domain returns the first domain of p that allows name, if any.
func (p Policy) Domain(name string) (Domain, bool) {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	for _, d := range p.Domains {
		if MatchName(d.Name, name) {
			return d, true
		}
	}
	return Domain{}, false
}

// CredentialHost reports whether name is a host of one of p's credentials
// (and so is steered to the credential proxy).
func (p Policy) CredentialHost(name string) bool {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	for _, c := range p.Credentials {
		for _, h := range c.Hosts {
			if MatchName(h, name) {
				return true
			}
		}
	}
	return false
}

// HostRule is an allowed single address (from the resolver) with its port
// rule, added to the compiled table beside the policy's rules.
type HostRule struct {
	Addr netip.Addr
	Rule PortRule
}

// Compile turns the rules and the extra single-address rules into the
// longest-prefix-match table: for each distinct prefix, the union of the
// port rules of every prefix that contains it (so that the longest match
// alone decides). Rules covered by another in the same entry are dropped;
// an entry needing more than MaxPortRules slots is an error.
func Compile(rules []Rule, hosts []HostRule) ([]Entry, error) {
	type src struct {
		prefix netip.Prefix
		rule   PortRule
	}
	var all []src
	for i, r := range rules {
		pr, err := r.PortRule()
		if err != nil {
			return nil, fmt.Errorf("rule %d: %w", i+1, err)
		}
		all = append(all, src{r.CIDR.Masked(), pr})
	}
	for _, h := range hosts {
		if !h.Addr.Is4() {
			continue
		}
		all = append(all, src{netip.PrefixFrom(h.Addr, 32), h.Rule})
	}
	prefixes := map[netip.Prefix]bool{}
	for _, s := range all {
		prefixes[s.prefix] = true
	}
	var out []Entry
	for pfx := range prefixes {
		var rs []PortRule
		for _, s := range all {
			if s.prefix.Bits() <= pfx.Bits() && s.prefix.Contains(pfx.Addr()) {
				rs = append(rs, s.rule)
			}
		}
		rs = reduce(rs)
		if len(rs) > MaxPortRules {
			return nil, fmt.Errorf("prefix %v: %d protocol/port rules apply, at most %d", pfx, len(rs), MaxPortRules)
		}
		out = append(out, Entry{Prefix: pfx, Rules: rs})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Prefix.Bits() != out[j].Prefix.Bits() {
			return out[i].Prefix.Bits() < out[j].Prefix.Bits()
		}
		return out[i].Prefix.Addr().Less(out[j].Prefix.Addr())
	})
	return out, nil
}

// reduce drops rules covered by another and sorts the rest by id.
func reduce(rs []PortRule) []PortRule {
	sort.SliceStable(rs, func(i, j int) bool { return rs[i].RuleID < rs[j].RuleID })
	var out []PortRule
	for i, r := range rs {
		covered := false
		for j, o := range rs {
			if i != j && o.Covers(r) && (!r.Covers(o) || j < i) {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, r)
		}
	}
	return out
}

// Lookup evaluates the compiled table as the filter does: the longest prefix
// containing dst, then its first matching port rule. It is the reference
// the filter's tests compare against.
func Lookup(table []Entry, dst netip.Addr, proto uint8, port uint16) (PortRule, bool) {
	best := -1
	for i, e := range table {
		if e.Prefix.Contains(dst) && (best < 0 || e.Prefix.Bits() > table[best].Prefix.Bits()) {
			best = i
		}
	}
	if best < 0 {
		return PortRule{}, false
	}
	for _, r := range table[best].Rules {
		if r.Matches(proto, port) {
			return r, true
		}
	}
	return PortRule{}, false
}

// Narrows reports, as nil, that every packet, name and credential child
// allows is also allowed by parent: a fork's child may narrow its parent's
// policy, never widen it. The error names the first thing child adds.
func (child Policy) Narrows(parent Policy) error {
	if child.IPv6 && !parent.IPv6 {
		return errors.New("egress policy: the child allows IPv6, its parent does not")
	}
	err := eachWithin(child.Rules, parent.Rules, func(c, p Rule) bool {
		return p.CIDR.Bits() <= c.CIDR.Bits() && p.CIDR.Contains(c.CIDR.Addr())
	}, func(r Rule) error {
		return fmt.Errorf("egress policy: the child's rule %s %s %s is not within a rule of its parent", r.CIDR, r.Proto, r.Ports)
	})
	if err != nil {
		return err
	}
	err = eachWithin(child.Domains, parent.Domains, func(c, p Domain) bool { return nameWithin(c.Name, p.Name) },
		func(d Domain) error {
			return fmt.Errorf("egress policy: the child's domain %s is not within a domain of its parent", d.Name)
		})
	if err != nil {
		return err
	}
	for _, c := range child.Credentials {
		ok := false
		for _, pc := range parent.Credentials {
			if pc.Secret != c.Secret || pc.PlaceholderFor() != c.PlaceholderFor() {
				continue
			}
			all := true
			for _, h := range c.Hosts {
				in := false
				for _, ph := range pc.Hosts {
					if nameWithin(h, ph) {
						in = true
						break
					}
				}
				all = all && in
			}
			for _, part := range []string{PartHeaders, PartPath, PartQuery, PartBody} {
				all = all && (!c.SubstitutesIn(part) || pc.SubstitutesIn(part))
			}
			if all {
				ok = true
				break
			}
		}
		if !ok {
			return fmt.Errorf("egress policy: the child's credential %s is not within one of its parent", c.Secret)
		}
	}
	return nil
}

// eachWithin reports, as nil, that each of children is within one of
// parents: within(child, parent) holds and the parent's ports cover the
// child's. For the first child that is not, it returns outside(child).
func eachWithin[T interface{ PortRule() (PortRule, error) }](children, parents []T, within func(c, p T) bool, outside func(c T) error) error {
	for _, c := range children {
		cr, err := c.PortRule()
		if err != nil {
			return err
		}
		ok := false
		for _, p := range parents {
			pr, err := p.PortRule()
			if err != nil {
				return err
			}
			if within(c, p) && pr.Covers(cr) {
				ok = true
				break
			}
		}
		if !ok {
			return outside(c)
		}
	}
	return nil
}

// nameWithin reports whether every name matching pattern a also matches b.
func nameWithin(a, b string) bool {
	if a == b {
		return true
	}
	if rest, ok := strings.CutPrefix(a, "*."); ok {
		// *.x.y is within *.y; never within an exact name.
		return MatchName(b, "_."+rest) && strings.HasPrefix(b, "*.")
	}
	return MatchName(b, a)
}
