package credproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenvm/warren/ebpf/policy"
)

// countingListener is a stand-in for something on the host a guest must
// never reach through the proxy (the daemon's --listen or metrics port,
// a metadata service): it counts the connections it accepts.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func newCountingListener(t *testing.T) *countingListener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &countingListener{Listener: l}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			c.n.Add(1)
			io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nreach!")
			conn.Close()
		}
	}()
	t.Cleanup(func() { l.Close() })
	return c
}

func (c *countingListener) port() int { return c.Addr().(*net.TCPAddr).Port }

// rawRequest writes req to the proxy's listener at addr (over TLS with
// server name sni when sni is not empty) and returns the status line.
func (e *env) rawRequest(addr, sni, req string) string {
	e.t.Helper()
	raw, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		e.t.Fatal(err)
	}
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(10 * time.Second))
	var c net.Conn = raw
	if sni != "" {
		tc := tls.Client(raw, &tls.Config{RootCAs: e.ca.Pool(), ServerName: sni})
		if err := tc.Handshake(); err != nil {
			return "handshake: " + err.Error()
		}
		c = tc
	}
	io.WriteString(c, req)
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "read: " + err.Error()
	}
	return strings.TrimSpace(line)
}

// TestSSRFHostHeaders is a guest aiming the proxy at the host: the
// metadata address, the daemon's port on loopback, localhost, and a
// credential host with the daemon's port. None reaches anything but the
// credential host's upstream on its fixed port.
func TestSSRFHostHeaders(t *testing.T) {
	e := newEnv(t, nil)
	daemon := newCountingListener(t)
	dp := daemon.port()
	auth := "Authorization: Bearer " + apiPH + "\r\n"
	cases := []struct {
		name, addr, sni, host, want string
	}{
		{"metadata over http", e.plainAddr, "", "169.254.169.254", "403"},
		{"metadata path over http", e.plainAddr, "", "169.254.169.254:80", "403"},
		{"daemon port over http", e.plainAddr, "", fmt.Sprintf("127.0.0.1:%d", dp), "403"},
		{"localhost over http", e.plainAddr, "", fmt.Sprintf("localhost:%d", dp), "403"},
		{"credential host with the daemon's port over http", e.plainAddr, "", fmt.Sprintf("api.test:%d", dp), "403"},
		{"daemon port under a steered SNI", e.tlsAddr, "api.test", fmt.Sprintf("127.0.0.1:%d", dp), "421"},
		{"metadata under a steered SNI", e.tlsAddr, "api.test", "169.254.169.254", "421"},
		{"metadata as SNI", e.tlsAddr, "169.254.169.254", "169.254.169.254", "handshake"},
		{"localhost as SNI", e.tlsAddr, "localhost", fmt.Sprintf("localhost:%d", dp), "handshake"},
	}
	for _, c := range cases {
		req := "GET /latest/meta-data/ HTTP/1.1\r\nHost: " + c.host + "\r\n" + auth + "Connection: close\r\n\r\n"
		if got := e.rawRequest(c.addr, c.sni, req); !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	// The credential host with the daemon's port over TLS: the port is
	// ignored, the request goes to the real upstream (on its own port)
	// with the Host it expects.
	req := fmt.Sprintf("GET /v1/x HTTP/1.1\r\nHost: api.test:%d\r\n%sConnection: close\r\n\r\n", dp, auth)
	if got := e.rawRequest(e.tlsAddr, "api.test", req); !strings.Contains(got, "200") {
		t.Fatalf("api.test:%d over TLS: %q", dp, got)
	}
	if up := e.lastSeen(); up.Host != "api.test" || up.Auth != "Bearer "+apiSecret {
		t.Errorf("upstream saw Host %q Authorization %q", up.Host, up.Auth)
	}
	for _, d := range e.dials {
		if d != e.upAddr {
			t.Errorf("dialled %s, want only the upstream %s", d, e.upAddr)
		}
	}
	if n := daemon.n.Load(); n != 0 {
		t.Fatalf("the daemon's port got %d connections through the proxy", n)
	}
	// A tenant cannot make such names credential hosts either.
	for _, h := range []string{"169.254.169.254", "127.0.0.1", "localhost", "metadata.google.internal", "*.test"} {
		pol := testPolicy()
		pol.Credentials[0].Hosts = []string{h}
		if err := e.proxy.SetPolicy(pol); err == nil {
			t.Errorf("SetPolicy with credential host %q accepted", h)
		}
	}
}

// TestUpstreamAddressRefused is a tenant whose credential hosts are
// public-looking names that resolve to the host, its metadata service or
// its LAN (DNS rebinding, or a name the tenant controls). The proxy
// resolves them itself and refuses each such address before connecting;
// nothing reaches the listener there, and no secret leaves.
func TestUpstreamAddressRefused(t *testing.T) {
	target := newCountingListener(t)
	resolved := map[string][]netip.Addr{
		"rebind.example.com": {netip.MustParseAddr("127.0.0.1")},
		"meta.example.com":   {netip.MustParseAddr("169.254.169.254")},
		"lan.example.com":    {netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("192.168.1.1")},
		"v6.example.com":     {netip.MustParseAddr("::1"), netip.MustParseAddr("::ffff:127.0.0.1"), netip.MustParseAddr("fd00:ec2::254")},
		"cgnat.example.com":  {netip.MustParseAddr("100.100.100.200")},
	}
	e := newEnv(t, func(c *Config) {
		c.Policy = policy.Policy{Credentials: []policy.Credential{{Secret: "API_KEY",
			Hosts: []string{"rebind.example.com", "meta.example.com", "lan.example.com", "v6.example.com", "cgnat.example.com"}}}}
		c.Upstream.Resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			if as, ok := resolved[host]; ok {
				return as, nil
			}
			return nil, errors.New("no such host")
		}
		c.Upstream.Guard = &policy.Guard{} // no allowance
		c.Upstream.Port = target.port()
		c.Upstream.Dial = nil // the real dialer, with the guard as its Control hook
	})
	g := e.tlsGuest("")
	for name := range resolved {
		resp, body := e.do(g, "GET", "https://"+name+"/latest/meta-data/", map[string]string{"Authorization": apiPH})
		if resp.StatusCode != http.StatusBadGateway {
			t.Errorf("%s: status %d %q", name, resp.StatusCode, body)
		}
	}
	if n := target.n.Load(); n != 0 {
		t.Fatalf("%d connections reached the loopback listener", n)
	}
	n := 0
	for _, r := range e.audit.Records() {
		if r.Reason == ReasonUpstreamAddr {
			n++
		}
	}
	if n != len(resolved) {
		t.Errorf("%d %s records for %d hosts: %+v", n, ReasonUpstreamAddr, len(resolved), e.audit.Records())
	}
	e.noSecrets(g.receivedBytes())
}

// TestDialledElsewhereRefused: a name resolving to a public address whose
// connection ends up on loopback (a Dial that does not go where it was
// asked) is caught on the connection's remote address.
func TestDialledElsewhereRefused(t *testing.T) {
	target := newCountingListener(t)
	e := newEnv(t, func(c *Config) {
		c.Upstream.Resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("203.0.113.9")}, nil
		}
		c.Upstream.Guard = &policy.Guard{}
		c.Upstream.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, target.Addr().String())
		}
	})
	resp, _ := e.do(e.tlsGuest(""), "GET", "https://api.test/v1/x", map[string]string{"Authorization": apiPH})
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if _, ok := e.audit.find(ReasonUpstreamAddr); !ok {
		t.Fatalf("audit %+v", e.audit.Records())
	}
}

// TestPlainHTTPNeverForwardsSecrets: a guest sending its placeholder over
// plain HTTP, in any part of the request, gets a refusal; the upstream
// never sees the request and no secret crosses the wire in cleartext.
// Without a placeholder the guest is redirected to https.
func TestPlainHTTPNeverForwardsSecrets(t *testing.T) {
	e := newEnv(t, nil)
	g := e.plainGuest()
	g.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	for _, c := range []struct {
		url string
		hdr map[string]string
	}{
		{"http://api.test/v1/x", map[string]string{"Authorization": "Bearer " + apiPH}},
		{"http://api.test/v1/x?key=" + apiPH, nil},
		{"http://api.test/keys/" + apiPH, nil},
		{"http://other.test/v1/x", map[string]string{"X-Other": otherPH}},
		{"http://api.test:8080/v1/x", map[string]string{"X-Api-Key": apiPH}},
	} {
		resp, body := e.do(g, "GET", c.url, c.hdr)
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: status %d %q", c.url, resp.StatusCode, body)
		}
	}
	req, _ := http.NewRequest("POST", "http://api.test/v1/x", strings.NewReader("key="+apiPH))
	req.Header.Set("Authorization", apiPH)
	if resp, err := g.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST with a placeholder: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if e.dialCount() != 0 || len(e.upstream) != 0 {
		t.Fatalf("the upstream was contacted over plain HTTP: dials %v", e.dials)
	}
	if r, ok := e.audit.find(ReasonPlaintext); !ok || r.Status != 403 || r.Credential == "" {
		t.Fatalf("audit %+v", e.audit.Records())
	}
	// No placeholder: a redirect to the same URL over https, nothing sent.
	resp, _ := e.do(g, "GET", "http://api.test:8080/v1/x?n=1", nil)
	if resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != "https://api.test/v1/x?n=1" {
		t.Fatalf("no placeholder: status %d Location %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	if e.dialCount() != 0 {
		t.Fatal("dialled for a redirect")
	}
	e.noSecrets(g.receivedBytes())
	if st := e.proxy.Stats(); st.Substituted != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestSubstituteOnlyWhereThePolicySays: a credential without Substitute
// has its placeholder replaced in header values only; in the query, path
// and body it goes upstream as it is. Body substitution is opt-in.
func TestSubstituteOnlyWhereThePolicySays(t *testing.T) {
	e := newEnv(t, nil) // OTHER_KEY has no Substitute: headers only
	g := e.tlsGuest("")
	req, _ := http.NewRequest("POST", "https://other.test/keys/"+otherPH+"?k="+otherPH, strings.NewReader("k="+otherPH))
	req.Header.Set("X-Other", otherPH)
	resp, err := g.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	up := e.lastSeen()
	if up.Other != otherSecret {
		t.Errorf("header: upstream %q", up.Other)
	}
	if up.Path != "/keys/"+otherPH || up.Query != "k="+otherPH || up.Body != "k="+otherPH {
		t.Errorf("path %q query %q body %q: want the placeholder untouched", up.Path, up.Query, up.Body)
	}
	// With "body": replaced in the body too, streamed, also when split.
	pol := testPolicy()
	pol.Credentials[1].Substitute = []string{"headers", "body"}
	if err := e.proxy.SetPolicy(pol); err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	go func() {
		io.WriteString(pw, `{"key": "`+otherPH[:5])
		time.Sleep(10 * time.Millisecond)
		io.WriteString(pw, otherPH[5:]+`", "n": 1}`)
		pw.Close()
	}()
	req, _ = http.NewRequest("POST", "https://other.test/v1/x", pr)
	resp, err = g.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if up := e.lastSeen(); up.Body != `{"key": "`+otherSecret+`", "n": 1}` {
		t.Errorf("body %q", up.Body)
	}
	e.noSecrets(g.receivedBytes())
}
