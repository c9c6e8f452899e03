package policy

import (
	"math/rand"
	"net/netip"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	p, err := Parse([]byte(`{
		"rules": [{"cidr": "10.1.2.3/16", "proto": "tcp", "ports": "443"},
		          {"id": 7, "cidr": "192.0.2.0/24", "proto": "udp", "ports": "1000-2000"}],
		"domains": [{"name": "API.Example.com.", "proto": "tcp", "ports": "443"}],
		"credentials": [{"secret": "KEY", "hosts": ["api.example.com"]}]
	}`))
	if err != nil {
		t.Fatal(err)
	}
	if p.Rules[0].ID != 1 || p.Rules[1].ID != 7 || p.Domains[0].ID != 10001 {
		t.Errorf("ids: %d %d %d", p.Rules[0].ID, p.Rules[1].ID, p.Domains[0].ID)
	}
	if p.Rules[0].CIDR.String() != "10.1.0.0/16" {
		t.Errorf("cidr not masked: %v", p.Rules[0].CIDR)
	}
	if _, ok := p.Domain("api.EXAMPLE.com"); !ok {
		t.Error("domain lookup is not case-insensitive")
	}
	if !p.CredentialHost("api.example.com.") || p.CredentialHost("example.com") {
		t.Error("CredentialHost")
	}
	if got := p.Credentials[0].PlaceholderFor(); got != "warren-placeholder-KEY" {
		t.Errorf("placeholder %q", got)
	}
}

func TestParseRefuses(t *testing.T) {
	bad := map[string]string{
		"unknown field":   `{"rulez": []}`,
		"ipv6 cidr":       `{"rules": [{"cidr": "::/0"}]}`,
		"no cidr":         `{"rules": [{"proto": "tcp"}]}`,
		"bad proto":       `{"rules": [{"cidr": "10.0.0.0/8", "proto": "sctp"}]}`,
		"bad ports":       `{"rules": [{"cidr": "10.0.0.0/8", "proto": "tcp", "ports": "99999"}]}`,
		"reversed ports":  `{"rules": [{"cidr": "10.0.0.0/8", "proto": "tcp", "ports": "20-10"}]}`,
		"icmp ports":      `{"rules": [{"cidr": "10.0.0.0/8", "proto": "icmp", "ports": "1"}]}`,
		"bad name":        `{"domains": [{"name": "a..b"}]}`,
		"name chars":      `{"domains": [{"name": "a b.com"}]}`,
		"no secret":       `{"credentials": [{"hosts": ["a.com"]}]}`,
		"no hosts":        `{"credentials": [{"secret": "K"}]}`,
		"short ph":        `{"credentials": [{"secret": "K", "placeholder": "x", "hosts": ["a.com"]}]}`,
		"dup placeholder": `{"credentials": [{"secret": "K", "hosts": ["a.com"]}, {"secret": "K", "hosts": ["b.com"]}]}`,
		"trailing":        `{} {}`,
	}
	for name, js := range bad {
		if _, err := Parse([]byte(js)); err == nil {
			t.Errorf("%s: accepted %s", name, js)
		}
	}
}

func TestMatchName(t *testing.T) {
	for _, c := range []struct {
		pattern, name string
		want          bool
	}{
		{"a.com", "a.com", true},
		{"a.com", "b.a.com", false},
		{"*.a.com", "b.a.com", true},
		{"*.a.com", "c.b.a.com", true},
		{"*.a.com", "a.com", false},
		{"*.a.com", "xa.com", false},
	} {
		if got := MatchName(c.pattern, c.name); got != c.want {
			t.Errorf("MatchName(%q, %q) = %v", c.pattern, c.name, got)
		}
	}
}

// TestCompileLongestMatch checks that a more specific prefix keeps the
// port rules of the prefixes containing it, so the longest match alone
// decides as the filter does.
func TestCompileLongestMatch(t *testing.T) {
	rules := []Rule{
		{ID: 1, CIDR: netip.MustParsePrefix("10.0.0.0/8"), Proto: "tcp", Ports: "443"},
		{ID: 2, CIDR: netip.MustParsePrefix("10.1.0.0/16"), Proto: "udp", Ports: "53"},
		{ID: 3, CIDR: netip.MustParsePrefix("10.1.2.0/24"), Proto: "tcp", Ports: "400-500"},
	}
	table, err := Compile(rules, []HostRule{{Addr: netip.MustParseAddr("10.1.2.3"), Rule: PortRule{Proto: ProtoICMP, RuleID: 9}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(table) != 4 {
		t.Fatalf("%d entries, want 4: %+v", len(table), table)
	}
	check := func(dst string, proto uint8, port uint16, wantOK bool, wantID uint32) {
		t.Helper()
		r, ok := Lookup(table, netip.MustParseAddr(dst), proto, port)
		if ok != wantOK || (ok && r.RuleID != wantID) {
			t.Errorf("%s proto %d port %d: ok=%v rule=%d, want %v %d", dst, proto, port, ok, r.RuleID, wantOK, wantID)
		}
	}
	check("10.9.9.9", ProtoTCP, 443, true, 1)
	check("10.9.9.9", ProtoUDP, 53, false, 0)
	check("10.1.9.9", ProtoUDP, 53, true, 2)
	check("10.1.9.9", ProtoTCP, 443, true, 1)
	check("10.1.2.9", ProtoTCP, 450, true, 3)
	check("10.1.2.9", ProtoTCP, 443, true, 3) // rule 3 covers rule 1 here
	check("10.1.2.9", ProtoICMP, 0, false, 0)
	check("10.1.2.3", ProtoICMP, 0, true, 9)
	check("11.0.0.1", ProtoTCP, 443, false, 0)
	// Rule 3 (tcp 400-500) covers rule 1 (tcp 443): only 2 and 3 stay.
	for _, e := range table {
		if e.Prefix.String() == "10.1.2.0/24" && len(e.Rules) != 2 {
			t.Errorf("10.1.2.0/24 has %d rules: %+v", len(e.Rules), e.Rules)
		}
	}
}

func TestCompileDropsCovered(t *testing.T) {
	rules := []Rule{
		{ID: 1, CIDR: netip.MustParsePrefix("0.0.0.0/0"), Proto: "any"},
		{ID: 2, CIDR: netip.MustParsePrefix("10.0.0.0/8"), Proto: "tcp", Ports: "443"},
	}
	table, err := Compile(rules, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range table {
		if len(e.Rules) != 1 || e.Rules[0].RuleID != 1 {
			t.Errorf("%v: %+v, want only rule 1", e.Prefix, e.Rules)
		}
	}
}

func TestCompileTooManyRules(t *testing.T) {
	var rules []Rule
	for i := 0; i < MaxPortRules+1; i++ {
		rules = append(rules, Rule{ID: uint32(i + 1), CIDR: netip.MustParsePrefix("10.0.0.0/8"), Proto: "tcp", Ports: string(rune('1' + i))})
	}
	if _, err := Compile(rules, nil); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Errorf("err = %v", err)
	}
}

// TestCompileRandom compares the compiled table with a direct evaluation
// of the rules ("some rule whose CIDR contains dst matches").
func TestCompileRandom(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	protos := []string{"tcp", "udp", "icmp", "any"}
	for iter := 0; iter < 200; iter++ {
		var rules []Rule
		for i := 0; i < 1+rng.Intn(6); i++ {
			a := netip.AddrFrom4([4]byte{10, byte(rng.Intn(3)), byte(rng.Intn(3)), byte(rng.Intn(3))})
			pr := protos[rng.Intn(len(protos))]
			ports := ""
			if pr == "tcp" || pr == "udp" {
				lo := rng.Intn(100)
				ports = strings.TrimSpace(strings.Join([]string{itoa(lo), itoa(lo + rng.Intn(20))}, "-"))
			}
			rules = append(rules, Rule{ID: uint32(i + 1), CIDR: netip.PrefixFrom(a, []int{8, 16, 24, 32}[rng.Intn(4)]).Masked(), Proto: pr, Ports: ports})
		}
		table, err := Compile(rules, nil)
		if err != nil {
			continue // too many rules for one prefix: refused, fine
		}
		for k := 0; k < 200; k++ {
			dst := netip.AddrFrom4([4]byte{10, byte(rng.Intn(3)), byte(rng.Intn(3)), byte(rng.Intn(3))})
			proto := []uint8{ProtoTCP, ProtoUDP, ProtoICMP}[rng.Intn(3)]
			port := uint16(rng.Intn(130))
			want := false
			for _, r := range rules {
				pr, _ := r.PortRule()
				if r.CIDR.Contains(dst) && pr.Matches(proto, port) {
					want = true
				}
			}
			if _, got := Lookup(table, dst, proto, port); got != want {
				t.Fatalf("rules %+v: %v proto %d port %d: table says %v, rules say %v", rules, dst, proto, port, got, want)
			}
		}
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}

func TestNarrows(t *testing.T) {
	wild := Options{WildcardCredentials: true}
	parent, err := ParseWith([]byte(`{
		"rules": [{"cidr": "10.0.0.0/8", "proto": "tcp", "ports": "400-500"}],
		"domains": [{"name": "*.example.com", "proto": "tcp", "ports": "443"}],
		"credentials": [{"secret": "K", "hosts": ["api.example.com", "*.svc.example.com"], "substitute": ["headers", "query"]}]
	}`), wild)
	if err != nil {
		t.Fatal(err)
	}
	ok := []string{
		`{}`,
		`{"rules": [{"cidr": "10.1.0.0/16", "proto": "tcp", "ports": "443"}]}`,
		`{"domains": [{"name": "a.example.com", "proto": "tcp", "ports": "443"}]}`,
		`{"domains": [{"name": "*.b.example.com", "proto": "tcp", "ports": "443"}]}`,
		`{"credentials": [{"secret": "K", "hosts": ["x.svc.example.com"]}]}`,
		`{"credentials": [{"secret": "K", "hosts": ["api.example.com"], "substitute": ["query"]}]}`,
	}
	for _, js := range ok {
		c, err := ParseWith([]byte(js), wild)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Narrows(parent); err != nil {
			t.Errorf("%s: %v", js, err)
		}
	}
	widen := []string{
		`{"ipv6": true}`,
		`{"rules": [{"cidr": "10.0.0.0/7", "proto": "tcp", "ports": "443"}]}`,
		`{"rules": [{"cidr": "10.1.0.0/16", "proto": "tcp", "ports": "443-501"}]}`,
		`{"rules": [{"cidr": "10.1.0.0/16", "proto": "udp", "ports": "443"}]}`,
		`{"rules": [{"cidr": "10.1.0.0/16"}]}`,
		`{"domains": [{"name": "example.com", "proto": "tcp", "ports": "443"}]}`,
		`{"domains": [{"name": "a.example.com"}]}`,
		`{"credentials": [{"secret": "K", "hosts": ["other.example.com"]}]}`,
		`{"credentials": [{"secret": "K2", "hosts": ["api.example.com"]}]}`,
		`{"credentials": [{"secret": "K", "placeholder": "another-placeholder", "hosts": ["api.example.com"]}]}`,
		`{"credentials": [{"secret": "K", "hosts": ["api.example.com"], "substitute": ["body"]}]}`,
		`{"credentials": [{"secret": "K", "hosts": ["api.example.com"], "substitute": ["headers", "path"]}]}`,
	}
	for _, js := range widen {
		c, err := ParseWith([]byte(js), wild)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Narrows(parent); err == nil {
			t.Errorf("%s: accepted as a narrowing", js)
		}
	}
}

// TestCredentialHostsRefused is what a tenant would try to point the
// credential proxy (which dials from the host) at the host itself, its
// metadata service or its LAN: every such credential host is refused
// when the policy is parsed, before any proxy exists.
func TestCredentialHostsRefused(t *testing.T) {
	bad := []string{
		"169.254.169.254", "127.0.0.1", "10.0.0.1", "0.0.0.0", "::1", "[::1]", "fd00:ec2::254",
		"2130706433",          // 127.0.0.1 as one number
		"0x7f.0.0.1", "127.1", // inet_aton spellings
		"1.2.3.4.5",      // numeric last label
		"127.0.0.1:9464", // with a port
		"localhost", "LOCALHOST", "api.localhost", "metadata", "kubernetes",
		"metadata.google.internal", "printer.local", "db.localdomain", "nas.home.arpa",
		"router.lan", "1.0.0.127.in-addr.arpa", "x.internal",
		"*.example.com", "*.com", "*",
		"-api.example.com", "api_key.example.com", "a..b", "api.example.com:443",
	}
	for _, h := range bad {
		js := `{"credentials": [{"secret": "K", "hosts": [` + strconvQuote(h) + `]}]}`
		if p, err := Parse([]byte(js)); err == nil {
			t.Errorf("credential host %q accepted: %+v", h, p.Credentials)
		}
	}
	good := []string{"api.example.com", "api.openai.com", "API.Example.COM.", "api.test", "xn--bcher-kva.example", "a-b.c0m"}
	for _, h := range good {
		js := `{"credentials": [{"secret": "K", "hosts": [` + strconvQuote(h) + `]}]}`
		if _, err := Parse([]byte(js)); err != nil {
			t.Errorf("credential host %q refused: %v", h, err)
		}
	}
	// Wildcards only with the operator's allowance, and never over a
	// single label or an internal suffix.
	wild := Options{WildcardCredentials: true}
	if _, err := ParseWith([]byte(`{"credentials": [{"secret": "K", "hosts": ["*.svc.example.com"]}]}`), wild); err != nil {
		t.Errorf("wildcard with the allowance: %v", err)
	}
	for _, h := range []string{"*.com", "*.internal", "*.local", "*.*.example.com", "*.10.0.0.1"} {
		js := `{"credentials": [{"secret": "K", "hosts": [` + strconvQuote(h) + `]}]}`
		if _, err := ParseWith([]byte(js), wild); err == nil {
			t.Errorf("wildcard %q accepted with the allowance", h)
		}
	}
	// Domains (names the resolver answers) keep their wildcards.
	if _, err := Parse([]byte(`{"domains": [{"name": "*.example.com"}]}`)); err != nil {
		t.Errorf("wildcard domain: %v", err)
	}
	if _, err := Parse([]byte(`{"credentials": [{"secret": "K", "hosts": ["a.com"], "substitute": ["cookies"]}]}`)); err == nil {
		t.Error("unknown substitute part accepted")
	}
}

func strconvQuote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"` }

func TestSubstitutesIn(t *testing.T) {
	def := Credential{Secret: "K"}
	if !def.SubstitutesIn(PartHeaders) || def.SubstitutesIn(PartQuery) || def.SubstitutesIn(PartPath) || def.SubstitutesIn(PartBody) {
		t.Error("default: want headers only")
	}
	c := Credential{Secret: "K", Substitute: []string{PartQuery, PartBody}}
	if c.SubstitutesIn(PartHeaders) || !c.SubstitutesIn(PartQuery) || !c.SubstitutesIn(PartBody) {
		t.Error("explicit parts")
	}
}
