package vmmproc

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/warrenvm/warren/ebpf/policy"
	"github.com/warrenvm/warren/internal/testtls"
	"github.com/warrenvm/warren/vmmproc/jail"
	"golang.org/x/sys/unix"
)

// TestPrivateNet opens a VM's network the way `warren run --private-net
// --tap --egress` does (no VM: the tap and its egress services only) and
// checks the split it promises:
// the tap and the resolver's and proxy's listening sockets are in the
// private namespace (the resolver answers there; the host side has no
// such tap and reaches nothing on the tap's address), while the proxy's
// upstream connection leaves through the host side: an HTTPS request to
// the proxy, made inside the private namespace, reaches a server that
// listens only on the host side's loopback (the operator's
// --upstream-allow) and gets the real secret in place of the
// placeholder; the same request over plain HTTP is refused and reaches
// nothing. Two such VMs use the same tap name and addresses at once: the
// first made in this process, the second by a helper (as jail-init makes
// a jailed VMM's, nethelper.go) and handed over as descriptors.
// Needs root (namespaces, taps, eBPF) and the host's 127.0.0.1:443 (the
// proxy always connects upstream on 443); it puts nothing on the host's
// network but that listener.
func TestPrivateNet(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root (network namespaces, a tap and eBPF)")
	}
	dir := t.TempDir()
	secrets := filepath.Join(dir, "secrets.json")
	if err := os.WriteFile(secrets, []byte(`{"API_KEY": "s3cret-value"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	hosts := filepath.Join(dir, "hosts")
	os.WriteFile(hosts, []byte("127.0.0.1 api.test\n"), 0o644)
	p, err := policy.Parse([]byte(`{"credentials": [{"secret": "API_KEY", "hosts": ["api.test"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	placeholder := p.Credentials[0].PlaceholderFor()

	// The upstream, on the host's loopback, port 443. The Go runtime's
	// threads are all in the host's namespace, so the host side here is
	// the real one.
	if _, err := netlink.LinkByName("wt0"); err == nil {
		t.Skip("skipped: this host has a wt0 of its own")
	}
	caPEM, cert := testtls.Upstream(t, "api.test")
	upCA := filepath.Join(dir, "upstream-ca.pem")
	os.WriteFile(upCA, caPEM, 0o644)
	upLn, err := tls.Listen("tcp4", "127.0.0.1:443", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Skipf("skipped: the upstream needs 127.0.0.1:443: %v", err)
	}
	seen := make(chan string, 4)
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("Authorization")
		fmt.Fprintf(w, "upstream saw %s\n", r.Header.Get("Authorization"))
	})}
	go up.Serve(upLn)
	defer up.Close()
	host, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()

	open := func(name string) vmDevices {
		t.Helper()
		eg := &EgressOptions{HostAddr: netip.MustParsePrefix("10.205.0.1/24"), GuestAddr: netip.MustParseAddr("10.205.0.2"),
			Audit: filepath.Join(dir, name+".jsonl"), Secrets: secrets, Hosts: hosts, Sandbox: name,
			UpstreamCA: upCA, UpstreamAllow: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}
		eg.State.Policy = p
		o := vmOptions{tap: "wt0", mac: net.HardwareAddr{0x02, 0, 0, 0, 0, 1}, privateNet: true, egress: eg, log: slog.New(slog.DiscardHandler)}
		d := vmDevices{netns: -1}
		var closers []func() error
		var conn *os.File
		if name == "b" {
			conn = startNetHelper(t)
		}
		if _, err := openNetWith(conn, o, &d, &closers); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			for _, c := range closers {
				c()
			}
		})
		return d
	}
	a, b := open("a"), open("b")
	if !a.netns.IsOpen() || !b.netns.IsOpen() || a.netns.Equal(host) || a.netns.Equal(b.netns) {
		t.Fatalf("namespaces: a %v, b %v, host %v", a.netns, b.netns, host)
	}

	// The host side has no wt0 and no 10.205.0.1 (the proxy's and the
	// resolver's address is not one of its own).
	if _, err := netlink.LinkByName("wt0"); err == nil {
		t.Error("the host side has a wt0")
	}
	if hasAddr(t, "10.205.0.1") {
		t.Error("the host side has 10.205.0.1")
	}

	for _, d := range []vmDevices{a, b} {
		err := inNetns(d.netns, func() error {
			if _, err := netlink.LinkByName("wt0"); err != nil {
				return fmt.Errorf("no wt0 in the private namespace: %w", err)
			}
			if !hasAddr(t, "10.205.0.1") {
				return fmt.Errorf("no 10.205.0.1 in the private namespace")
			}
			// The resolver answers there: the credential host is the proxy.
			m := new(dns.Msg)
			m.SetQuestion("api.test.", dns.TypeA)
			r, err := dns.Exchange(m, "10.205.0.1:53")
			if err != nil {
				return fmt.Errorf("resolver: %w", err)
			}
			if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "10.205.0.1" {
				return fmt.Errorf("api.test: %v", r.Answer)
			}
			m.SetQuestion("denied.test.", dns.TypeA)
			if r, err = dns.Exchange(m, "10.205.0.1:53"); err != nil || r.Rcode != dns.RcodeNameError {
				return fmt.Errorf("denied.test: %v %v", r, err)
			}
			// The proxy, reached inside, goes upstream through the host
			// side, over TLS only: plain HTTP with a placeholder is refused.
			get := func(port string, useTLS bool) (*http.Response, string, error) {
				raw, err := net.DialTimeout("tcp4", "10.205.0.1:"+port, 5*time.Second)
				if err != nil {
					return nil, "", err
				}
				defer raw.Close()
				raw.SetDeadline(time.Now().Add(10 * time.Second))
				c := raw
				if useTLS {
					pool := x509.NewCertPool()
					pool.AppendCertsFromPEM([]byte(d.egress.Guest().TrustPEM))
					c = tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: "api.test"})
				}
				fmt.Fprintf(c, "GET /v1 HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n", placeholder)
				res, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					return nil, "", err
				}
				body, _ := io.ReadAll(res.Body)
				return res, string(body), nil
			}
			res, body, err := get("80", false)
			if err != nil || res.StatusCode != http.StatusForbidden || strings.Contains(body, "s3cret-value") {
				return fmt.Errorf("plain HTTP with a placeholder: %v %v %q", res, err, body)
			}
			res, body, err = get("443", true)
			if err != nil {
				return fmt.Errorf("proxy: %w", err)
			}
			if res.StatusCode != 200 || strings.Contains(body, "s3cret-value") {
				return fmt.Errorf("proxy answered %d %q", res.StatusCode, body)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-seen:
			if got != "Bearer s3cret-value" {
				t.Fatalf("upstream saw %q", got)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the upstream saw nothing")
		}
	}
}

// startNetHelper serves jail-init's network helper in this process (on a
// goroutine) and returns the requester's end of its socket.
func startNetHelper(t *testing.T) *os.File {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "helper"), os.NewFile(uintptr(fds[1]), "helper-vmm")
	devNet, err := openDevNet()
	if err != nil {
		t.Fatal(err)
	}
	go jail.ServeHelper(ours, newFamilyHelper(devNet, nil))
	t.Cleanup(func() { theirs.Close(); ours.Close() })
	return theirs
}

// hasAddr reports whether the calling thread's network namespace has the
// IPv4 address a on one of its links.
func hasAddr(t *testing.T, a string) bool {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range addrs {
		if x.IP.String() == a {
			return true
		}
	}
	return false
}

// TestEgressOverrides: warren restore's --egress, --secrets and --audit
// change a snapshot's egress options, and are refused for a snapshot
// without egress or with a bad file.
func TestEgressOverrides(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "p.json")
	os.WriteFile(pol, []byte(`{"rules": [{"cidr": "192.0.2.0/24", "proto": "tcp", "ports": "443"}]}`), 0o644)
	sec := filepath.Join(dir, "s.json")
	os.WriteFile(sec, []byte(`{"K": "v"}`), 0o600)
	loose := filepath.Join(dir, "loose.json")
	os.WriteFile(loose, []byte(`{"K": "v"}`), 0o644)
	ov := func(p, s, a string) EgressOverrides { return EgressOverrides{Policy: p, Secrets: s, Audit: a} }

	if err := ov("", "", "").apply(nil); err != nil {
		t.Fatalf("no flags: %v", err)
	}
	if err := ov(pol, "", "").apply(nil); err == nil || !strings.Contains(err.Error(), "need a snapshot of a VM with egress") {
		t.Fatalf("no egress: %v", err)
	}
	e := &EgressOptions{Audit: "/old.jsonl", Secrets: "/old.json"}
	e.State.DNS = []byte(`{"x": 1}`)
	if err := ov(pol, sec, filepath.Join(dir, "a.jsonl")).apply(e); err != nil {
		t.Fatal(err)
	}
	if len(e.State.Policy.Rules) != 1 || e.State.DNS != nil || e.Secrets != sec || e.Audit != filepath.Join(dir, "a.jsonl") {
		t.Fatalf("applied: %+v", e)
	}
	if err := ov("", loose, "").apply(e); err == nil {
		t.Fatal("a secrets file readable by others was taken")
	}
	if err := ov(filepath.Join(dir, "missing.json"), "", "").apply(e); err == nil {
		t.Fatal("a missing policy was taken")
	}
}
