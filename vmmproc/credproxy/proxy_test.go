package credproxy

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenvm/warren/ebpf/audit"
	"github.com/warrenvm/warren/ebpf/policy"
)

const (
	apiSecret   = "sk-live-SECRETVALUE-0123456789"
	apiPH       = "warren-placeholder-API_KEY"
	otherSecret = "sk-other-SECRET-abcdef"
	otherPH     = "other-ph-123456"
	missingPH   = "missing-ph-12345"
)

func testPolicy() policy.Policy {
	return policy.Policy{Credentials: []policy.Credential{
		{Secret: "API_KEY", Hosts: []string{"api.test"}, Substitute: []string{"headers", "path", "query"}},
		{Secret: "OTHER_KEY", Placeholder: otherPH, Hosts: []string{"other.test"}},
		{Secret: "MISSING", Placeholder: missingPH, Hosts: []string{"api.test"}},
	}}
}

// memAudit records audit records in memory.
type memAudit struct{ audit.Memory }

func (m *memAudit) find(reason string) (audit.Record, bool) {
	for _, r := range m.Records() {
		if r.Reason == reason {
			return r, true
		}
	}
	return audit.Record{}, false
}

// lockedStore is a MapStore safe to change while the proxy runs.
type lockedStore struct {
	mu sync.Mutex
	m  map[string]string
}

func (s *lockedStore) Secret(name string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return MapStore(s.m).Secret(name)
}

func (s *lockedStore) set(name, v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[name] = v
}

// seen is what the upstream received.
type seen struct {
	Host, Path, Query, Auth, Other, Body string
	Header                               http.Header
}

type env struct {
	t         *testing.T
	ca        *CA
	proxy     *Proxy
	audit     *memAudit
	store     *lockedStore
	tlsAddr   string
	plainAddr string
	upAddr    string // the upstream's TLS listener (127.0.0.1:port)

	mu       sync.Mutex
	dials    []string
	upstream []seen
}

func (e *env) lastSeen() seen {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.upstream) == 0 {
		e.t.Fatal("upstream saw no request")
	}
	return e.upstream[len(e.upstream)-1]
}

func (e *env) dialCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.dials)
}

func (e *env) upstreamHandler(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	s := seen{Host: r.Host, Path: r.URL.Path, Query: r.URL.RawQuery, Auth: r.Header.Get("Authorization"),
		Other: r.Header.Get("X-Other"), Body: string(b), Header: r.Header.Clone()}
	e.mu.Lock()
	e.upstream = append(e.upstream, s)
	e.mu.Unlock()
	switch r.URL.Path {
	case "/len":
		body := "key=" + s.Auth
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		io.WriteString(w, body)
	case "/gzip":
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			io.WriteString(w, "not compressed: "+s.Auth)
			return
		}
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		io.WriteString(zw, "compressed: "+s.Auth)
		zw.Close()
	case "/br":
		w.Header().Set("Content-Encoding", "br")
		io.WriteString(w, s.Auth)
	default:
		w.Header().Set("X-Echo-Auth", s.Auth)
		w.Header().Set("X-Echo-Query", s.Query)
		w.Header().Set("X-Echo-Other", s.Other)
		fl := w.(http.Flusher)
		io.WriteString(w, "auth=")
		for i := 0; i < len(s.Auth); i++ { // split the secret across writes
			io.WriteString(w, s.Auth[i:i+1])
			fl.Flush()
		}
		io.WriteString(w, "\nquery="+s.Query+"\nother="+s.Other+"\n")
	}
}

func newEnv(t *testing.T, mod func(*Config)) *env {
	t.Helper()
	e := &env{t: t, audit: &memAudit{}, store: &lockedStore{m: map[string]string{"API_KEY": apiSecret, "OTHER_KEY": otherSecret}}}
	var err error
	if e.ca, err = NewCA("sb-test"); err != nil {
		t.Fatal(err)
	}
	upCA, err := NewCA("upstream")
	if err != nil {
		t.Fatal(err)
	}
	upTLS := httptest.NewUnstartedServer(http.HandlerFunc(e.upstreamHandler))
	upTLS.TLS = &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return upCA.Leaf(h.ServerName) }}
	upTLS.StartTLS()
	t.Cleanup(upTLS.Close)
	e.upAddr = upTLS.Listener.Addr().String()
	upPort := upTLS.Listener.Addr().(*net.TCPAddr).Port
	loop := netip.MustParseAddr("127.0.0.1")

	cfg := Config{
		Policy:  testPolicy(),
		CA:      e.ca,
		Store:   e.store,
		Audit:   e.audit,
		Sandbox: "sb-test",
		Upstream: Upstream{
			RootCAs: upCA.Pool(),
			Timeout: 5 * time.Second,
			// The test's upstreams are on loopback: the operator's
			// allowance names that one address, and the port is fixed.
			Resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
				switch host {
				case "api.test", "other.test":
					return []netip.Addr{loop}, nil
				}
				return nil, errors.New("test resolver: no such host " + host)
			},
			Guard: &policy.Guard{Allow: []netip.Prefix{netip.PrefixFrom(loop, 32)}},
			Port:  upPort,
			Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
				e.mu.Lock()
				e.dials = append(e.dials, addr)
				e.mu.Unlock()
				var d net.Dialer
				return d.DialContext(ctx, network, addr)
			},
		},
	}
	if mod != nil {
		mod(&cfg)
	}
	if e.proxy, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	for _, useTLS := range []bool{true, false} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if useTLS {
			e.tlsAddr = l.Addr().String()
		} else {
			e.plainAddr = l.Addr().String()
		}
		done := make(chan error, 1)
		go func(useTLS bool) { done <- e.proxy.Serve(l, useTLS) }(useTLS)
		t.Cleanup(func() {
			if err := <-done; !errors.Is(err, http.ErrServerClosed) {
				t.Errorf("Serve: %v", err)
			}
		})
	}
	t.Cleanup(func() { e.proxy.Close() })
	return e
}

// recordConn keeps every byte read (after TLS) from the proxy.
type recordConn struct {
	net.Conn
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (c recordConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.mu.Lock()
	c.buf.Write(b[:n])
	c.mu.Unlock()
	return n, err
}

// guest is the guest's HTTP client, with everything it received.
type guest struct {
	*http.Client
	mu       sync.Mutex
	received bytes.Buffer
}

func (g *guest) receivedBytes() []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]byte(nil), g.received.Bytes()...)
}

// tlsGuest connects to the proxy's TLS listener, trusting only the
// sandbox CA; sni overrides the server name when not empty.
func (e *env) tlsGuest(sni string) *guest {
	return e.dialingGuest(true, func(ctx context.Context, addr string) (net.Conn, error) {
		raw, err := (&net.Dialer{}).DialContext(ctx, "tcp", e.tlsAddr)
		if err != nil {
			return nil, err
		}
		name, _, _ := net.SplitHostPort(addr)
		if sni != "" {
			name = sni
		}
		c := tls.Client(raw, &tls.Config{RootCAs: e.ca.Pool(), ServerName: name})
		if err := c.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, err
		}
		return c, nil
	})
}

// plainGuest connects to the proxy's plain HTTP listener.
func (e *env) plainGuest() *guest {
	return e.dialingGuest(false, func(ctx context.Context, addr string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", e.plainAddr)
	})
}

// dialingGuest returns a guest whose client reaches every address over a
// connection from dial (a TLS one when isTLS), recording what it receives.
func (e *env) dialingGuest(isTLS bool, dial func(ctx context.Context, addr string) (net.Conn, error)) *guest {
	g := &guest{}
	recorded := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, addr)
		if err != nil {
			return nil, err
		}
		return recordConn{Conn: c, mu: &g.mu, buf: &g.received}, nil
	}
	tr := &http.Transport{DisableCompression: true}
	if isTLS {
		tr.DialTLSContext = recorded
	} else {
		tr.DialContext = recorded
	}
	e.t.Cleanup(tr.CloseIdleConnections)
	g.Client = &http.Client{Transport: tr, Timeout: 10 * time.Second}
	return g
}

func (e *env) do(g *guest, method, url string, hdr map[string]string) (*http.Response, string) {
	e.t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := g.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp, string(b)
}

// noSecrets fails if any secret is in the audit records or in b.
func (e *env) noSecrets(b []byte) {
	e.t.Helper()
	j, _ := json.Marshal(e.audit.Records())
	for _, s := range []string{apiSecret, otherSecret} {
		if bytes.Contains(b, []byte(s)) {
			e.t.Errorf("the guest received secret %q", s)
		}
		if bytes.Contains(j, []byte(s)) {
			e.t.Errorf("the audit log holds secret %q", s)
		}
	}
}

func TestSubstituteTLS(t *testing.T) {
	e := newEnv(t, nil)
	g := e.tlsGuest("")
	url := "https://api.test/v1/x?key=" + apiPH + "&n=1"
	resp, body := e.do(g, "GET", url, map[string]string{
		"Authorization":       "Bearer " + apiPH,
		"Connection":          "X-Hop",
		"X-Hop":               "must-not-pass",
		"Proxy-Authorization": "Basic must-not-pass",
	})
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	up := e.lastSeen()
	if up.Auth != "Bearer "+apiSecret {
		t.Errorf("upstream Authorization %q", up.Auth)
	}
	if up.Query != "key="+apiSecret+"&n=1" {
		t.Errorf("upstream query %q", up.Query)
	}
	if up.Host != "api.test" || up.Path != "/v1/x" {
		t.Errorf("upstream host %q path %q", up.Host, up.Path)
	}
	for _, h := range []string{"X-Hop", "Proxy-Authorization", "X-Forwarded-For", "Forwarded", "Via"} {
		if v := up.Header.Get(h); v != "" {
			t.Errorf("upstream got %s: %q", h, v)
		}
	}
	if got := resp.Header.Get("X-Echo-Auth"); got != "Bearer "+apiPH {
		t.Errorf("guest X-Echo-Auth %q", got)
	}
	if got := resp.Header.Get("X-Echo-Query"); got != "key="+apiPH+"&n=1" {
		t.Errorf("guest X-Echo-Query %q", got)
	}
	want := "auth=Bearer " + apiPH + "\nquery=key=" + apiPH + "&n=1\nother=\n"
	if body != want {
		t.Errorf("guest body %q, want %q", body, want)
	}
	e.noSecrets(g.receivedBytes())
	if !bytes.Contains(g.receivedBytes(), []byte(apiPH)) {
		t.Error("recorder saw nothing: the check above is vacuous")
	}
	recs := e.audit.Records()
	if len(recs) != 1 {
		t.Fatalf("audit records %+v", recs)
	}
	r := recs[0]
	if r.Verdict != audit.Allow || r.Source != audit.SourceProxy || r.Name != "api.test" || r.Method != "GET" ||
		r.Path != "/v1/x" || r.Credential != "API_KEY" || r.Status != 200 || r.Sandbox != "sb-test" {
		t.Errorf("audit record %+v", r)
	}
	if st := e.proxy.Stats(); st.Requests != 1 || st.Substituted != 1 || st.Denied != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestPathSubstitution(t *testing.T) {
	e := newEnv(t, nil)
	resp, body := e.do(e.tlsGuest(""), "GET", "https://api.test/keys/"+apiPH+"/info", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if up := e.lastSeen(); up.Path != "/keys/"+apiSecret+"/info" {
		t.Errorf("upstream path %q", up.Path)
	}
	if r := e.audit.Records()[0]; r.Path != "/keys/"+apiPH+"/info" {
		t.Errorf("audit path %q", r.Path)
	}
	_ = body
}

func TestContentLengthDropped(t *testing.T) {
	e := newEnv(t, nil)
	g := e.tlsGuest("")
	resp, body := e.do(g, "GET", "https://api.test/len", map[string]string{"Authorization": apiPH})
	if body != "key="+apiPH {
		t.Fatalf("body %q", body)
	}
	if resp.ContentLength != -1 && resp.ContentLength != int64(len(body)) {
		t.Fatalf("Content-Length %d for %d bytes", resp.ContentLength, len(body))
	}
	e.noSecrets(g.receivedBytes())
}

func TestGzipResponseScrubbed(t *testing.T) {
	e := newEnv(t, nil)
	g := e.tlsGuest("")
	resp, body := e.do(g, "GET", "https://api.test/gzip", map[string]string{"Authorization": apiPH, "Accept-Encoding": "gzip"})
	if resp.StatusCode != 200 || body != "compressed: "+apiPH {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	e.noSecrets(g.receivedBytes())
}

func TestUnscrubbableEncodingRefused(t *testing.T) {
	e := newEnv(t, nil)
	g := e.tlsGuest("")
	resp, _ := e.do(g, "GET", "https://api.test/br", map[string]string{"Authorization": apiPH})
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if r, ok := e.audit.find(ReasonEncoding); !ok || r.Verdict != audit.Deny {
		t.Fatalf("audit %+v", e.audit.Records())
	}
	e.noSecrets(g.receivedBytes())
}

func TestOutOfScopePlaceholder(t *testing.T) {
	e := newEnv(t, nil)
	g := e.tlsGuest("")
	resp, body := e.do(g, "GET", "https://api.test/v1/x", map[string]string{
		"Authorization": "Bearer " + apiPH,
		"X-Other":       otherPH,
	})
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	up := e.lastSeen()
	if up.Other != otherPH {
		t.Errorf("upstream X-Other %q, want the placeholder untouched", up.Other)
	}
	if up.Auth != "Bearer "+apiSecret {
		t.Errorf("upstream Authorization %q", up.Auth)
	}
	if !strings.Contains(body, "other="+otherPH) {
		t.Errorf("body %q", body)
	}
	r, ok := e.audit.find(ReasonOutOfScope)
	if !ok || r.Credential != "OTHER_KEY" || r.Name != "api.test" {
		t.Fatalf("no out-of-scope record: %+v", e.audit.Records())
	}
	e.noSecrets(g.receivedBytes())
}

func TestNotSteered(t *testing.T) {
	e := newEnv(t, nil)
	resp, _ := e.do(e.plainGuest(), "GET", "http://evil.test/?key="+apiPH, map[string]string{"Authorization": apiPH})
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("plain: status %d", resp.StatusCode)
	}
	r, ok := e.audit.find(ReasonNotSteered)
	if !ok || r.Verdict != audit.Deny || r.Name != "evil.test" || r.Status != 403 || r.Path != "/" {
		t.Fatalf("audit %+v", e.audit.Records())
	}
	// With TLS the handshake itself is refused: no certificate is minted
	// for a name the policy does not steer.
	if _, err := e.tlsGuest("").Get("https://evil.test/"); err == nil {
		t.Fatal("TLS to a host not steered: no error")
	}
	n := 0
	for _, r := range e.audit.Records() {
		if r.Reason == ReasonNotSteered && r.Name == "evil.test" && r.Verdict == audit.Deny {
			n++
		}
	}
	if n != 2 {
		t.Fatalf("%d not-steered records: %+v", n, e.audit.Records())
	}
	if e.dialCount() != 0 {
		t.Fatal("dialed upstream")
	}
	if st := e.proxy.Stats(); st.Denied != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSNIHostMismatch(t *testing.T) {
	e := newEnv(t, nil)
	// SNI api.test, Host other.test: both are steered, but they differ.
	resp, _ := e.do(e.tlsGuest("api.test"), "GET", "https://other.test/", map[string]string{"Authorization": otherPH})
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if _, ok := e.audit.find(ReasonSNIMismatch); !ok {
		t.Fatalf("audit %+v", e.audit.Records())
	}
	if e.dialCount() != 0 {
		t.Fatal("dialed upstream")
	}
}

func TestNoSNIRefused(t *testing.T) {
	e := newEnv(t, nil)
	raw, err := net.Dial("tcp", e.tlsAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	c := tls.Client(raw, &tls.Config{InsecureSkipVerify: true}) // no ServerName: no SNI
	if err := c.Handshake(); err == nil {
		t.Fatal("handshake without SNI succeeded")
	}
	if _, ok := e.audit.find(ReasonNoSNI); !ok {
		t.Fatalf("audit %+v", e.audit.Records())
	}
}

func TestMissingSecret(t *testing.T) {
	e := newEnv(t, nil)
	resp, _ := e.do(e.tlsGuest(""), "GET", "https://api.test/v1/x", map[string]string{"Authorization": missingPH})
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if e.dialCount() != 0 {
		t.Fatal("the request was forwarded")
	}
	r, ok := e.audit.find(ReasonSecretUnavailable)
	if !ok || r.Verdict != audit.Deny || r.Credential != "MISSING" || r.Status != 502 {
		t.Fatalf("audit %+v", e.audit.Records())
	}
	// A missing secret whose placeholder is not used does not matter.
	resp, _ = e.do(e.tlsGuest(""), "GET", "https://api.test/v1/x", map[string]string{"Authorization": apiPH})
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// An empty secret counts as missing, never as "replace with nothing".
	e.store.set("API_KEY", "")
	resp, _ = e.do(e.tlsGuest(""), "GET", "https://api.test/v1/x", map[string]string{"Authorization": apiPH})
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("empty secret: status %d", resp.StatusCode)
	}
}

func TestSetPolicyAndRotation(t *testing.T) {
	e := newEnv(t, nil)
	g := e.tlsGuest("")
	hdr := map[string]string{"Authorization": apiPH}
	e.do(g, "GET", "https://api.test/v1/x", hdr)
	if up := e.lastSeen(); up.Auth != apiSecret {
		t.Fatalf("upstream %q", up.Auth)
	}
	// Rotation: the store is read per request.
	e.store.set("API_KEY", "sk-rotated-NEWVALUE")
	resp, body := e.do(g, "GET", "https://api.test/v1/x", hdr)
	if up := e.lastSeen(); up.Auth != "sk-rotated-NEWVALUE" {
		t.Fatalf("after rotation upstream got %q", up.Auth)
	}
	if strings.Contains(body, "NEWVALUE") || strings.Contains(resp.Header.Get("X-Echo-Auth"), "NEWVALUE") {
		t.Fatal("rotated secret reached the guest")
	}
	// Scope API_KEY to another host: api.test is no longer steered, on
	// the same (kept-alive) connection too.
	pol := testPolicy()
	pol.Credentials[0].Hosts = []string{"elsewhere.test"}
	pol.Credentials = pol.Credentials[:2]
	if err := e.proxy.SetPolicy(pol); err != nil {
		t.Fatal(err)
	}
	dials := e.dialCount()
	resp, _ = e.do(g, "GET", "https://api.test/v1/x", hdr)
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("after SetPolicy: status %d", resp.StatusCode)
	}
	if e.dialCount() != dials || e.lastSeen().Auth != "sk-rotated-NEWVALUE" {
		t.Fatal("forwarded after SetPolicy")
	}
	if err := e.proxy.SetPolicy(policy.Policy{Credentials: []policy.Credential{{Secret: "x"}}}); err == nil {
		t.Fatal("invalid policy accepted")
	}
}

func TestHeaderLimit(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxHeaderBytes = 1024 })
	c, err := net.Dial("tcp", e.plainAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: api.test\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", 8<<10))
	line, _ := bufio.NewReader(c).ReadString('\n')
	if !strings.Contains(line, "431") {
		t.Fatalf("response %q, want 431", line)
	}
	if e.dialCount() != 0 {
		t.Fatal("forwarded")
	}
}

func TestShutdown(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.proxy.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	defer l.Close()
	if err := e.proxy.Serve(l, false); !errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("Serve after Shutdown: %v", err)
	}
}

// TestCloseFreesAddress: the listeners Serve was given are closed when
// Close returns (an egress restart binds the same gateway ports at once),
// and a Serve called after Close closes its listener and returns
// http.ErrServerClosed instead of leaving it bound.
func TestCloseFreesAddress(t *testing.T) {
	ca, err := NewCA("sb-test")
	if err != nil {
		t.Fatal(err)
	}
	for _, serving := range []bool{true, false} {
		p, err := New(Config{Policy: testPolicy(), CA: ca, Store: EnvStore{}, Sandbox: "sb-test"})
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		done := make(chan error, 1)
		if serving {
			go func() { done <- p.Serve(l, false) }()
			// Until Serve answers: an HTTP answer, not a connection (the
			// kernel accepts those into the listener's backlog before Serve
			// runs; Close before Serve has the listener closes it only
			// when Serve comes, which lost a race to the Listen below
			// under CI's load).
			hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			for {
				res, err := hc.Get("http://" + addr + "/")
				if err == nil {
					res.Body.Close()
					break
				}
				time.Sleep(time.Millisecond)
			}
			p.Close()
		} else {
			p.Close()
			done <- p.Serve(l, false)
		}
		again, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("serving %v: %s still bound after Close: %v", serving, addr, err)
		}
		again.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Fatalf("serving %v: Serve: %v", serving, err)
		}
	}
}
