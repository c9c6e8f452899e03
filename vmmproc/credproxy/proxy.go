package credproxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenvm/warren/ebpf/audit"
	"github.com/warrenvm/warren/ebpf/policy"
)

// Defaults for the limits in Config.
const (
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout       = 90 * time.Second
	DefaultMaxConns          = 256
	DefaultUpstreamTimeout   = 30 * time.Second
)

// Audit reasons.
const (
	ReasonNotSteered        = "not-steered"
	ReasonSNIMismatch       = "sni-mismatch"
	ReasonNoSNI             = "no-sni"
	ReasonBadHost           = "bad-host"
	ReasonOutOfScope        = "placeholder-out-of-scope"
	ReasonSecretUnavailable = "secret-unavailable"
	ReasonUpstream          = "upstream-error"
	ReasonEncoding          = "unscrubbable-encoding"
	ReasonBadRequest        = "bad-request"
	// ReasonPlaintext: a placeholder in a plain-HTTP request; secrets
	// are only ever sent over TLS.
	ReasonPlaintext = "plaintext-credential"
	// ReasonUpstreamAddr: the credential host resolved only to addresses
	// the proxy may not connect to (policy.Guard).
	ReasonUpstreamAddr = "upstream-address-refused"
)

// UpstreamPort is the port the proxy connects to upstream: always HTTPS
// on 443, whatever port the guest's Host header names.
const UpstreamPort = 443

// Upstream configures the proxy's own connections to the real servers.
// The proxy runs on the host, so every connection it makes is checked
// against Guard: the guest chooses the names (through its policy), never
// the addresses or ports.
type Upstream struct {
	// RootCAs verifies upstream servers; nil uses the host's system roots.
	RootCAs *x509.CertPool
	// Resolve returns a credential host's addresses; nil uses
	// net.DefaultResolver (the host's resolver).
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// Guard decides which resolved addresses may be connected to; nil is
	// a policy.Guard without allowances (no loopback, link-local,
	// private, metadata or host address). Each address is checked before
	// the dial, in the dialer's Control hook, and on the connection's
	// remote address.
	Guard *policy.Guard
	// Port is the upstream port (0: UpstreamPort). Tests point it at
	// loopback servers; the guest cannot change it.
	Port int
	// Dial opens a connection to one checked address ("203.0.113.7:443");
	// nil uses a net.Dialer whose Control is Guard.Control. Tests point
	// it at loopback servers.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Timeout bounds dialing, the TLS handshake and the wait for the
	// response's header (not the streaming of bodies); 0 takes
	// DefaultUpstreamTimeout.
	Timeout time.Duration
}

// Config is what a Proxy needs.
type Config struct {
	Policy   policy.Policy
	CA       *CA
	Store    Store
	Audit    audit.Recorder // nil: audit.Discard
	Sandbox  string
	Upstream Upstream
	// PolicyOptions are the operator's allowances the policy is checked
	// against (wildcard credential hosts).
	PolicyOptions policy.Options

	// Limits on what the guest may make the host hold (0: the defaults).
	MaxHeaderBytes    int
	ReadHeaderTimeout time.Duration
	IdleTimeout       time.Duration
	// MaxConns bounds the guest's open connections per listener.
	MaxConns int
	// ErrorLog takes the HTTP server's own messages (TLS handshake
	// failures and the like, which never hold secrets); nil discards them.
	ErrorLog *log.Logger
}

// Stats are the proxy's counters.
type Stats struct {
	Requests    uint64 // requests handled (allowed or denied)
	Substituted uint64 // requests that had at least one secret substituted
	Denied      uint64 // requests and TLS handshakes refused
}

// Proxy is the credential proxy of one sandbox. It is safe for concurrent
// use.
type Proxy struct {
	cfg       Config
	guard     *policy.Guard
	audit     audit.Recorder
	pol       atomic.Pointer[policy.Policy]
	transport *http.Transport

	mu      sync.Mutex
	servers map[*http.Server]struct{} // +checklocks:mu
	// listeners are those Serve was given: Close and Shutdown close them
	// before they return, whether their server has begun to accept on
	// them or not (an http.Server closed before its Serve call has
	// tracked the listener closes it later, on Serve's goroutine, and a
	// restart on the same address could find it still bound).
	listeners map[net.Listener]struct{} // +checklocks:mu
	closed    bool                      // +checklocks:mu

	requests, substituted, denied atomic.Uint64
}

// New checks cfg and returns a proxy serving its policy.
func New(cfg Config) (*Proxy, error) {
	if cfg.CA == nil {
		return nil, errors.New("credproxy: no CA")
	}
	if cfg.Store == nil {
		return nil, errors.New("credproxy: no secret store")
	}
	if err := cfg.Policy.ValidateWith(cfg.PolicyOptions); err != nil {
		return nil, fmt.Errorf("credproxy: %w", err)
	}
	if cfg.Upstream.Port <= 0 || cfg.Upstream.Port > 65535 {
		cfg.Upstream.Port = UpstreamPort
	}
	if cfg.MaxHeaderBytes <= 0 {
		cfg.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if cfg.ReadHeaderTimeout <= 0 {
		cfg.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.Upstream.Timeout <= 0 {
		cfg.Upstream.Timeout = DefaultUpstreamTimeout
	}
	if cfg.ErrorLog == nil {
		cfg.ErrorLog = log.New(io.Discard, "", 0)
	}
	p := &Proxy{cfg: cfg, guard: cfg.Upstream.Guard, audit: cfg.Audit, servers: map[*http.Server]struct{}{},
		listeners: map[net.Listener]struct{}{}}
	if p.guard == nil {
		p.guard = &policy.Guard{}
	}
	if p.audit == nil {
		p.audit = audit.Discard{}
	}
	pol := clonePolicy(cfg.Policy)
	p.pol.Store(&pol)
	p.transport = &http.Transport{
		Proxy:                  nil, // never the host's HTTP(S)_PROXY
		DialContext:            p.dialUpstream,
		TLSClientConfig:        &tls.Config{RootCAs: cfg.Upstream.RootCAs, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:      true,
		TLSHandshakeTimeout:    cfg.Upstream.Timeout,
		ResponseHeaderTimeout:  cfg.Upstream.Timeout,
		ExpectContinueTimeout:  time.Second,
		MaxIdleConns:           64,
		MaxIdleConnsPerHost:    8,
		IdleConnTimeout:        cfg.IdleTimeout,
		MaxResponseHeaderBytes: 1 << 20,
	}
	return p, nil
}

// dialUpstream is the transport's DialContext: addr is "host:443" for a
// credential host of the policy (the proxy builds every upstream URL
// itself). It resolves host, drops the addresses the guard refuses,
// and connects to the rest in turn on the configured port, with the
// guard in the dialer's Control hook and on the connection's remote
// address: a name that resolves to loopback, metadata or the LAN gets no
// connection at all.
func (p *Proxy) dialUpstream(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if !p.pol.Load().CredentialHost(host) {
		return nil, fmt.Errorf("credproxy: %s is not a credential host", host)
	}
	var as []netip.Addr
	if p.cfg.Upstream.Resolve != nil {
		as, err = p.cfg.Upstream.Resolve(ctx, host)
	} else {
		as, err = net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	}
	if err != nil {
		return nil, fmt.Errorf("credproxy: resolve %s: %w", host, err)
	}
	if len(as) == 0 {
		return nil, fmt.Errorf("credproxy: resolve %s: no address", host)
	}
	port := strconv.Itoa(p.cfg.Upstream.Port)
	var first error
	for _, a := range as {
		if err := p.guard.Check(a); err != nil {
			if first == nil {
				first = err
			}
			continue
		}
		target := net.JoinHostPort(a.Unmap().String(), port)
		var c net.Conn
		if p.cfg.Upstream.Dial != nil {
			c, err = p.cfg.Upstream.Dial(ctx, network, target)
		} else {
			d := net.Dialer{Timeout: p.cfg.Upstream.Timeout, KeepAlive: 30 * time.Second, Control: p.guard.Control}
			c, err = d.DialContext(ctx, network, target)
		}
		if err == nil {
			err = p.checkRemote(c)
			if err != nil {
				c.Close()
			}
		}
		if err == nil {
			return c, nil
		}
		if first == nil || isRefused(first) && !isRefused(err) {
			first = err
		}
	}
	return nil, first
}

// checkRemote checks the address a connection actually reached (a
// custom Dial may have connected elsewhere than it was asked to).
func (p *Proxy) checkRemote(c net.Conn) error {
	ta, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return fmt.Errorf("credproxy: upstream connection to %v is not TCP", c.RemoteAddr())
	}
	return p.guard.Check(ta.AddrPort().Addr())
}

func isRefused(err error) bool {
	var re *policy.RefusedError
	return errors.As(err, &re)
}

func clonePolicy(pol policy.Policy) policy.Policy {
	out := pol
	out.Credentials = make([]policy.Credential, len(pol.Credentials))
	for i, c := range pol.Credentials {
		c.Hosts = append([]string(nil), c.Hosts...)
		c.Substitute = append([]string(nil), c.Substitute...)
		for j, h := range c.Hosts {
			c.Hosts[j] = strings.TrimSuffix(strings.ToLower(h), ".")
		}
		out.Credentials[i] = c
	}
	return out
}

// SetPolicy replaces the policy; requests that start afterwards (on new
// or existing connections) see the new one.
func (p *Proxy) SetPolicy(pol policy.Policy) error {
	if err := pol.ValidateWith(p.cfg.PolicyOptions); err != nil {
		return fmt.Errorf("credproxy: %w", err)
	}
	c := clonePolicy(pol)
	p.pol.Store(&c)
	return nil
}

// Policy returns the policy in force.
func (p *Proxy) Policy() policy.Policy { return *p.pol.Load() }

// Stats returns the proxy's counters.
func (p *Proxy) Stats() Stats {
	return Stats{Requests: p.requests.Load(), Substituted: p.substituted.Load(), Denied: p.denied.Load()}
}

// Serve serves the guest's requests on l until Close or Shutdown: with
// TLS (a leaf certificate minted for the client's SNI name; no SNI, or a
// name that is not a credential host, fails the handshake) when useTLS,
// else plain HTTP, where nothing is forwarded: a request carrying a
// placeholder is refused (403) and any other one to a credential host is
// redirected to https (308). Typically the caller listens on the guest
// gateway's ports 443 and 80. It returns http.ErrServerClosed after
// Close or Shutdown.
func (p *Proxy) Serve(l net.Listener, useTLS bool) error {
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { p.handle(w, r, useTLS) }),
		ReadHeaderTimeout: p.cfg.ReadHeaderTimeout,
		IdleTimeout:       p.cfg.IdleTimeout,
		MaxHeaderBytes:    p.cfg.MaxHeaderBytes,
		ErrorLog:          p.cfg.ErrorLog,
	}
	if useTLS {
		srv.TLSConfig = &tls.Config{
			MinVersion:     tls.VersionTLS12,
			GetCertificate: p.getCertificate,
		}
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.Close()
		return http.ErrServerClosed
	}
	p.servers[srv] = struct{}{}
	p.listeners[l] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.servers, srv)
		delete(p.listeners, l)
		p.mu.Unlock()
	}()
	l = newLimitListener(l, p.cfg.MaxConns)
	var err error
	if useTLS {
		err = srv.ServeTLS(l, "", "")
	} else {
		err = srv.Serve(l)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return http.ErrServerClosed // its listener closed under it
	}
	return err
}

// Close closes every listener and connection at once.
func (p *Proxy) Close() error {
	var err error
	for _, s := range p.stop() {
		if e := s.Close(); err == nil {
			err = e
		}
	}
	p.transport.CloseIdleConnections()
	return err
}

// Shutdown closes the listeners and waits, until ctx is done, for
// requests in progress to finish.
func (p *Proxy) Shutdown(ctx context.Context) error {
	var err error
	for _, s := range p.stop() {
		if e := s.Shutdown(ctx); err == nil {
			err = e
		}
	}
	p.transport.CloseIdleConnections()
	return err
}

func (p *Proxy) stop() []*http.Server {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for l := range p.listeners {
		l.Close()
	}
	var out []*http.Server
	for s := range p.servers {
		out = append(out, s)
	}
	return out
}

func (p *Proxy) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	name := strings.TrimSuffix(strings.ToLower(hello.ServerName), ".")
	if name == "" {
		p.deny(audit.Record{Reason: ReasonNoSNI, Detail: "TLS handshake without SNI"})
		return nil, errors.New("credproxy: no SNI")
	}
	if !p.pol.Load().CredentialHost(name) {
		p.deny(audit.Record{Name: name, Reason: ReasonNotSteered, Detail: "TLS handshake refused"})
		return nil, fmt.Errorf("credproxy: %s is not a credential host", name)
	}
	return p.cfg.CA.Leaf(name)
}

func (p *Proxy) record(r audit.Record) {
	r.Source = audit.SourceProxy
	if r.Sandbox == "" {
		r.Sandbox = p.cfg.Sandbox
	}
	p.audit.Record(r)
}

func (p *Proxy) deny(r audit.Record) {
	p.denied.Add(1)
	r.Verdict = audit.Deny
	p.record(r)
}

// hopHeaders are removed in both directions (RFC 9110 7.6.1), with the
// headers the Connection header names.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func removeHopHeaders(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				h.Del(f)
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// requestHost returns the request's host name (lower case, no port, no
// trailing dot) and its port ("" when the Host header has none). The
// port is only checked for syntax: upstream is always the host on
// Upstream.Port.
func requestHost(r *http.Request) (host, port string, ok bool) {
	h := r.Host
	if h == "" {
		return "", "", false
	}
	if hh, pp, err := net.SplitHostPort(h); err == nil {
		h, port = hh, pp
		if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
			return "", "", false
		}
	} else if strings.Contains(h, ":") {
		return "", "", false
	}
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	if h == "" {
		return "", "", false
	}
	return h, port, true
}

// secretUse is one credential of a request.
type secretUse struct {
	name        string // the secret's name
	placeholder string
	value       string
	used        bool // the placeholder appeared where c substitutes it
	body        bool // substituted in the request body too
}

func (p *Proxy) handle(w http.ResponseWriter, r *http.Request, useTLS bool) {
	p.requests.Add(1)
	rec := audit.Record{Method: r.Method, Path: r.URL.Path} // never the query
	host, _, ok := requestHost(r)
	if !ok {
		rec.Reason, rec.Status = ReasonBadHost, http.StatusBadRequest
		p.deny(rec)
		http.Error(w, "credproxy: bad Host header", rec.Status)
		return
	}
	rec.Name = host
	if useTLS {
		sni := ""
		if r.TLS != nil {
			sni = strings.TrimSuffix(strings.ToLower(r.TLS.ServerName), ".")
		}
		if sni != host {
			rec.Reason, rec.Status = ReasonSNIMismatch, http.StatusMisdirectedRequest
			rec.Detail = "TLS server name " + sni
			p.deny(rec)
			http.Error(w, "credproxy: Host does not match the TLS server name", rec.Status)
			return
		}
	}
	if r.Method == http.MethodConnect {
		rec.Reason, rec.Status = ReasonBadRequest, http.StatusMethodNotAllowed
		rec.Detail = "CONNECT is not proxied"
		p.deny(rec)
		http.Error(w, "credproxy: CONNECT is not supported", rec.Status)
		return
	}
	pol := p.pol.Load()
	if !pol.CredentialHost(host) {
		rec.Reason, rec.Status = ReasonNotSteered, http.StatusForbidden
		p.deny(rec)
		http.Error(w, "credproxy: host is not served by the credential proxy", rec.Status)
		return
	}

	// The request's parts that may carry placeholders.
	header := r.Header.Clone()
	removeHopHeaders(header)
	// Let the transport negotiate (and undo) gzip itself, so the response
	// body reaches the scrubber uncompressed.
	header.Del("Accept-Encoding")
	path := r.URL.EscapedPath()
	query := r.URL.RawQuery
	inHeader := func(ph string) bool {
		for k, vs := range header {
			if strings.Contains(k, ph) {
				return true
			}
			for _, v := range vs {
				if strings.Contains(v, ph) {
					return true
				}
			}
		}
		return false
	}
	// contains reports whether ph is in a part of the request that c
	// substitutes (any, for a credential scoped elsewhere).
	contains := func(c policy.Credential, ph string, scoped bool) bool {
		return (!scoped || c.SubstitutesIn(policy.PartPath)) && strings.Contains(path, ph) ||
			(!scoped || c.SubstitutesIn(policy.PartQuery)) && strings.Contains(query, ph) ||
			(!scoped || c.SubstitutesIn(policy.PartHeaders)) && inHeader(ph)
	}

	if !useTLS {
		// Plain HTTP: never a secret in cleartext, and nothing forwarded.
		// A request that carries any placeholder (in any part) is refused;
		// any other is sent to https, where the secret may be added.
		for _, c := range pol.Credentials {
			if ph := c.PlaceholderFor(); contains(c, ph, false) || strings.Contains(r.RequestURI, ph) {
				rec.Reason, rec.Status, rec.Credential = ReasonPlaintext, http.StatusForbidden, c.Secret
				rec.Detail = "a placeholder in a plain-HTTP request: credentials are only added over https"
				p.deny(rec)
				http.Error(w, "credproxy: credentials are only added over https; use https://"+host, rec.Status)
				return
			}
		}
		loc := &url.URL{Scheme: "https", Host: host, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
		w.Header().Set("Location", loc.String())
		w.WriteHeader(http.StatusPermanentRedirect)
		rec.Verdict, rec.Status, rec.Detail = audit.Allow, http.StatusPermanentRedirect, "redirected to https"
		p.record(rec)
		return
	}

	var uses []secretUse
	for _, c := range pol.Credentials {
		ph := c.PlaceholderFor()
		inScope := false
		for _, h := range c.Hosts {
			if policy.MatchName(h, host) {
				inScope = true
				break
			}
		}
		body := inScope && c.SubstitutesIn(policy.PartBody) && r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody
		used := contains(c, ph, inScope)
		if !inScope {
			if used {
				p.record(audit.Record{Verdict: audit.Allow, Name: host, Method: r.Method, Path: r.URL.Path,
					Credential: c.Secret, Reason: ReasonOutOfScope,
					Detail: "placeholder forwarded unchanged: the credential is not scoped to this host"})
			}
			continue
		}
		v, err := p.cfg.Store.Secret(c.Secret)
		if err == nil && v == "" {
			err = errors.New("credproxy: secret " + strconv.Quote(c.Secret) + " is empty")
		}
		if err != nil {
			if !used && !body {
				continue // not needed for this request; nothing to scrub
			}
			rec.Reason, rec.Status, rec.Credential = ReasonSecretUnavailable, http.StatusBadGateway, c.Secret
			rec.Detail = err.Error() // store errors never hold values
			p.deny(rec)
			http.Error(w, "credproxy: credential unavailable", rec.Status)
			return
		}
		uses = append(uses, secretUse{name: c.Secret, placeholder: ph, value: v, used: used, body: body})
		// (Credentials are matched to parts below through c again.)
	}

	// Substitute, placeholder to secret, in the parts each credential
	// names (header values by default; path, query and body only where
	// the policy says).
	var hdrSub, pathSub, querySub, bodySub []pair
	var names []string
	for _, u := range uses {
		c := credentialFor(pol, u.name)
		if u.body {
			bodySub = append(bodySub, pair{u.placeholder, u.value})
		}
		if !u.used && !u.body {
			continue
		}
		names = append(names, u.name)
		if c.SubstitutesIn(policy.PartHeaders) {
			hdrSub = append(hdrSub, pair{u.placeholder, u.value})
		}
		if c.SubstitutesIn(policy.PartPath) {
			pathSub = append(pathSub, pair{u.placeholder, url.PathEscape(u.value)})
		}
		if c.SubstitutesIn(policy.PartQuery) {
			querySub = append(querySub, pair{u.placeholder, url.QueryEscape(u.value)})
		}
	}
	hdrSub, pathSub, querySub, bodySub = normPairs(hdrSub), normPairs(pathSub), normPairs(querySub), normPairs(bodySub)
	for k, vs := range header {
		for i, v := range vs {
			vs[i] = replaceAll(v, hdrSub)
		}
		header[k] = vs
	}
	path = replaceAll(path, pathSub)
	query = replaceAll(query, querySub)
	rec.Credential = strings.Join(names, ",")

	// Scrub, secret to placeholder, in everything the guest gets back:
	// every secret of this host that resolved, in the forms it may have
	// been sent in.
	var scrub []pair
	for _, u := range uses {
		scrub = append(scrub, pair{u.value, u.placeholder})
		if e := url.PathEscape(u.value); e != u.value {
			scrub = append(scrub, pair{e, u.placeholder})
		}
		if e := url.QueryEscape(u.value); e != u.value {
			scrub = append(scrub, pair{e, u.placeholder})
		}
	}
	scrub = normPairs(scrub)

	// Always https to the host itself on the upstream port: the guest's
	// Host port is ignored (dialUpstream connects to Upstream.Port).
	scheme, uhost := "https", host
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	upath, err := url.PathUnescape(path)
	if err != nil {
		rec.Reason, rec.Status = ReasonBadRequest, http.StatusBadRequest
		rec.Detail = "bad request path"
		p.deny(rec)
		http.Error(w, "credproxy: bad request path", rec.Status)
		return
	}
	u := &url.URL{Scheme: scheme, Host: uhost, Path: upath, RawPath: path, RawQuery: query}

	out := r.Clone(r.Context())
	out.URL = u
	out.Host = uhost
	out.RequestURI = ""
	out.Header = header
	out.Close = false
	out.Trailer = nil // trailers would pass unsubstituted: drop them
	if r.ContentLength == 0 {
		out.Body = nil
	} else if len(bodySub) > 0 {
		// Streamed through a replacer: the length may change.
		out.Body = substituteBody(r.Body, bodySub)
		out.ContentLength = -1
		out.Header.Del("Content-Length")
	}
	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		rec.Reason, rec.Status = ReasonUpstream, http.StatusBadGateway
		if isRefused(err) {
			rec.Reason = ReasonUpstreamAddr
		}
		rec.Detail = scrubString(err.Error(), scrub, query)
		p.deny(rec)
		http.Error(w, "credproxy: upstream error", rec.Status)
		return
	}
	defer resp.Body.Close()
	if len(names) > 0 {
		p.substituted.Add(1)
	}

	if resp.StatusCode < 200 {
		rec.Reason, rec.Status = ReasonUpstream, http.StatusBadGateway
		rec.Detail = "upstream answered " + replaceAll(resp.Status, scrub)
		p.deny(rec)
		http.Error(w, "credproxy: upstream error", rec.Status)
		return
	}
	hasBody := r.Method != http.MethodHead && resp.StatusCode != http.StatusNoContent &&
		resp.StatusCode != http.StatusNotModified
	if ce := strings.TrimSpace(resp.Header.Get("Content-Encoding")); hasBody && len(scrub) > 0 && ce != "" && !strings.EqualFold(ce, "identity") {
		rec.Reason, rec.Status = ReasonEncoding, http.StatusBadGateway
		rec.Detail = "upstream response has Content-Encoding " + replaceAll(ce, scrub) + ", which cannot be scrubbed"
		p.deny(rec)
		http.Error(w, "credproxy: upstream response cannot be scrubbed", rec.Status)
		return
	}

	removeHopHeaders(resp.Header)
	dst := w.Header()
	for k, vs := range resp.Header {
		k2 := replaceAll(k, scrub)
		for _, v := range vs {
			dst.Add(k2, replaceAll(v, scrub))
		}
	}
	if hasBody && len(scrub) > 0 {
		// The body may change length: let the server chunk it.
		dst.Del("Content-Length")
	}
	w.WriteHeader(resp.StatusCode)
	rec.Verdict, rec.Status = audit.Allow, resp.StatusCode
	p.record(rec)
	if !hasBody {
		return
	}
	var sink io.Writer = flushWriter{w: w, rc: http.NewResponseController(w)}
	sc := newScrubber(sink, scrub)
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := sc.Write(buf[:n]); werr != nil {
				return // the guest went away
			}
		}
		if rerr != nil {
			break
		}
	}
	sc.Close()
	for k, vs := range resp.Trailer {
		for _, v := range vs {
			dst.Add(http.TrailerPrefix+replaceAll(k, scrub), replaceAll(v, scrub))
		}
	}
}

// credentialFor returns the credential of pol for secret name.
func credentialFor(pol *policy.Policy, name string) policy.Credential {
	for _, c := range pol.Credentials {
		if c.Secret == name {
			return c
		}
	}
	return policy.Credential{}
}

// substituteBody streams body through a replacer of pairs (placeholder to
// secret), never holding more than the longest placeholder back.
func substituteBody(body io.ReadCloser, pairs []pair) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		sc := newScrubber(pw, pairs)
		_, err := io.Copy(sc, body)
		if cerr := sc.Close(); err == nil {
			err = cerr
		}
		pw.CloseWithError(err)
	}()
	return &pipeBody{PipeReader: pr, src: body}
}

// pipeBody closes the guest's body too when the transport is done with
// the substituted one, so that the copying goroutine ends.
type pipeBody struct {
	*io.PipeReader
	src io.ReadCloser
}

func (b *pipeBody) Close() error {
	b.PipeReader.Close()
	return b.src.Close()
}

// scrubString removes secrets (and the substituted query, which may hold
// them in yet another form) from an error message.
func scrubString(s string, scrub []pair, query string) string {
	if query != "" {
		s = strings.ReplaceAll(s, query, "[query]")
	}
	return replaceAll(s, scrub)
}

// flushWriter writes to the guest and flushes at once, so that streamed
// responses (server-sent events and the like) stay streamed.
type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f flushWriter) Write(b []byte) (int, error) {
	n, err := f.w.Write(b)
	if err == nil {
		f.rc.Flush()
	}
	return n, err
}

// limitListener bounds the number of open accepted connections.
type limitListener struct {
	net.Listener
	sem chan struct{}
}

func newLimitListener(l net.Listener, n int) net.Listener {
	return &limitListener{Listener: l, sem: make(chan struct{}, n)}
}

func (l *limitListener) Accept() (net.Conn, error) {
	l.sem <- struct{}{}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
