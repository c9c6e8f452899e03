package egress

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	vnet "github.com/warrenvm/warren/devices/virtio/net"
	"github.com/warrenvm/warren/ebpf/policy"
)

// inNetns runs the rest of the test on this goroutine, locked to its
// thread, in a new network namespace.
func inNetns(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root (a network namespace, a tap and eBPF)")
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.New()
	if err != nil {
		t.Skipf("cannot create a network namespace: %v", err)
	}
	t.Cleanup(func() {
		ns.Close()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		orig.Close()
	})
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestSandboxServices starts the services on a tap and checks what the
// host side can see without a guest: the tap's address, the resolver's
// answers (an allowed name, a credential host, a denied name), a live
// policy change, the guest's egress settings and the state a snapshot
// keeps (the CA survives a restart from it).
func TestSandboxServices(t *testing.T) {
	inNetns(t)
	tap, err := vnet.OpenTap("wegress0")
	if err != nil {
		t.Fatal(err)
	}
	defer tap.Close()
	dir := t.TempDir()
	pol, err := policy.Parse([]byte(`{
		"rules": [{"cidr": "192.0.2.0/24", "proto": "tcp", "ports": "443"}],
		"domains": [{"name": "www.allowed.test", "proto": "tcp", "ports": "8080"}],
		"credentials": [{"secret": "API_KEY", "hosts": ["api.test"]}]
	}`))
	if err != nil {
		t.Fatal(err)
	}
	host := netip.MustParsePrefix("10.203.0.1/24")
	cfg := Config{Sandbox: "sb", Tap: "wegress0", HostAddr: host, GuestAddr: netip.MustParseAddr("10.203.0.2"),
		Policy: pol, AuditPath: filepath.Join(dir, "audit.jsonl"),
		Hosts: map[string][]netip.Addr{"www.allowed.test": {netip.MustParseAddr("198.51.100.10")}}}
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	link, err := netlink.LinkByName("wegress0")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := link.Attrs().HardwareAddr.String(), HostMAC(host.Addr()).String(); got != want {
		t.Errorf("tap MAC %s, want %s (stable across restores)", got, want)
	}
	addrs, _ := netlink.AddrList(link, netlink.FAMILY_V4)
	if len(addrs) != 1 || addrs[0].IPNet.String() != host.String() {
		t.Errorf("tap addresses %v, want %v", addrs, host)
	}

	ask := func(name string) *dns.Msg {
		t.Helper()
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		c := &dns.Client{Timeout: 5 * time.Second}
		r, _, err := c.Exchange(m, net.JoinHostPort(host.Addr().String(), "53"))
		if err != nil {
			t.Fatalf("ask %s: %v", name, err)
		}
		return r
	}
	aOf := func(r *dns.Msg) []string {
		var out []string
		for _, rr := range r.Answer {
			if a, ok := rr.(*dns.A); ok {
				out = append(out, a.A.String())
			}
		}
		return out
	}
	if got := aOf(ask("www.allowed.test")); len(got) != 1 || got[0] != "198.51.100.10" {
		t.Errorf("www.allowed.test: %v", got)
	}
	if got := aOf(ask("api.test")); len(got) != 1 || got[0] != host.Addr().String() {
		t.Errorf("api.test (a credential host) answered %v, want the proxy %v", got, host.Addr())
	}
	if r := ask("denied.test"); r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
		t.Errorf("denied.test: rcode %d answers %v", r.Rcode, r.Answer)
	}
	st, err := s.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.AllowedHosts != 1 || st.Attach == "" {
		t.Errorf("stats %+v: want 1 allowed host and an attach mode", st)
	}

	g := s.Guest()
	if g.Env["API_KEY"] != "warren-placeholder-API_KEY" || !strings.Contains(g.TrustPEM, "BEGIN CERTIFICATE") ||
		strings.Contains(g.TrustPEM, "PRIVATE") {
		t.Errorf("guest egress settings: %+v", g)
	}

	// A live change: the domain goes, its answered address with it.
	pol2 := pol
	pol2.Domains = nil
	if err := s.SetPolicy(pol2); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Stats(); st.AllowedHosts != 0 {
		t.Errorf("after removing the domain, %d answered addresses are still allowed", st.AllowedHosts)
	}
	if r := ask("www.allowed.test"); r.Rcode != dns.RcodeNameError {
		t.Errorf("www.allowed.test after its removal: rcode %d", r.Rcode)
	}
	bad := pol2
	bad.Rules = append(bad.Rules, policy.Rule{CIDR: netip.MustParsePrefix("::/0")})
	if err := s.SetPolicy(bad); err == nil {
		t.Error("an invalid policy was accepted")
	}
	if got := s.Policy(); len(got.Rules) != 1 {
		t.Errorf("the invalid policy changed the one in force: %+v", got)
	}

	state, err := s.State()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Started again from the state (a restore): same CA, same policy;
	// this time its privileged part is made by one owner (as a VMM
	// family's helper does) and handed over as descriptors.
	cfg.Policy, cfg.CAPEM, cfg.CAKeyPEM, cfg.DNSState = state.Policy, state.CAPEM, state.CAKeyPEM, state.DNS
	prep, err := Prepare(cfg.prepareConfig())
	if err != nil {
		t.Fatal(err)
	}
	files, mode, err := prep.Files()
	if err != nil {
		t.Fatal(err)
	}
	prep.Release()
	if cfg.Prepared, err = PreparedFromFiles(cfg.prepareConfig(), mode, files); err != nil {
		t.Fatal(err)
	}
	s2, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if r := ask("denied.test"); r.Rcode != dns.RcodeNameError {
		t.Errorf("the handed-over resolver: denied.test rcode %d", r.Rcode)
	}
	if got := aOf(ask("api.test")); len(got) != 1 || got[0] != host.Addr().String() {
		t.Errorf("the handed-over resolver: api.test answered %v", got)
	}
	if st, err := s2.Stats(); err != nil || st.Attach != mode.String() {
		t.Errorf("the handed-over filter: stats %+v, %v; want attached with %v", st, err, mode)
	}
	if s2.Guest().TrustPEM != g.TrustPEM {
		t.Error("the CA changed across a restart from the saved state")
	}
	if len(s2.Policy().Domains) != 0 {
		t.Error("the restarted services did not keep the policy in force")
	}
	s2.FlushAudit()
	b, _ := os.ReadFile(cfg.AuditPath)
	for _, want := range []string{`"source":"dns"`, `"name":"denied.test"`, `"reason":"update"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("audit log lacks %s:\n%s", want, b)
		}
	}
}

func TestReadHosts(t *testing.T) {
	p := filepath.Join(t.TempDir(), "hosts")
	os.WriteFile(p, []byte("# comment\n198.51.100.1 A.test b.test. # tail\n\n198.51.100.2 a.test\n"), 0o644)
	h, err := ReadHosts(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(h["a.test"]) != 2 || h["b.test"][0].String() != "198.51.100.1" {
		t.Errorf("%v", h)
	}
	os.WriteFile(p, []byte("not-an-address x.test\n"), 0o644)
	if _, err := ReadHosts(p); err == nil {
		t.Error("a bad line was accepted")
	}
}
