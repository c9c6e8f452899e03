package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/ebpf/policy"
	"github.com/warrenvm/warren/vmmproc/credproxy"
)

const (
	apiHost     = "api.test"
	secretName  = "API_KEY"
	secretValue = "sk-bench-4f2a9c1e7b3d5a608e1f2c3b4a5d6e7f"
	// responseSize is about the size of the upstream's JSON answer.
	responseSize = 1024
)

// proxyVariant is one client setup and what was measured with it.
type proxyVariant struct {
	name    string
	proxied bool
	fresh   bool // a new TLS connection per request
	client  *http.Client
	tr      *http.Transport

	lat []time.Duration
	cpu time.Duration
	n   int
}

// proxyReport is part 2's result.
type proxyReport struct {
	Requests       int                  `json:"requests_per_variant"`
	FreshConns     int                  `json:"fresh_conn_requests_per_variant"`
	Rounds         int                  `json:"rounds"`
	Variants       []proxyVariantReport `json:"variants"`
	UpstreamSecret uint64               `json:"upstream_requests_with_secret"`
	UpstreamBad    uint64               `json:"upstream_requests_without_secret"`
	ProxyStats     credproxy.Stats      `json:"proxy_stats"`
	// BodyBytes is the size of a direct and of a proxied response body.
	BodyBytes [2]int `json:"body_bytes_direct_proxied"`
}

type proxyVariantReport struct {
	Name          string          `json:"name"`
	Latency       []time.Duration `json:"latency_ns"`
	CPUPerRequest time.Duration   `json:"cpu_ns_per_request"`
}

// upstream is the real server: HTTPS for api.test, answering ~1 KiB of
// JSON that echoes the Authorization header it got (so that the proxy's
// scrubbing has work to do), counting requests with and without the secret.
type upstream struct {
	withSecret, without atomic.Uint64
	pad                 string
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	auth := r.Header.Get("Authorization")
	if auth == "Bearer "+secretValue {
		u.withSecret.Add(1)
	} else {
		u.without.Add(1)
	}
	var b bytes.Buffer
	b.WriteString(`{"k":`)
	b.WriteString(strconv.Quote(r.URL.Query().Get("k")))
	b.WriteString(`,"authorization":`)
	b.WriteString(strconv.Quote(auth))
	b.WriteString(`,"items":[`)
	b.WriteString(u.pad)
	b.WriteString("]}\n")
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	w.Write(b.Bytes())
}

func newUpstream() *upstream {
	var items []string
	for i := 0; len(strings.Join(items, ",")) < responseSize-115; i++ {
		items = append(items, fmt.Sprintf(`{"id":%d,"name":"item-%04d","ok":true}`, i, i))
	}
	return &upstream{pad: strings.Join(items, ",")}
}

func proxyBench(c config) (*proxyReport, []*proxyVariant, error) {
	upCA, err := credproxy.NewCA("bench-upstream")
	if err != nil {
		return nil, nil, err
	}
	up := newUpstream()
	upSrv := &http.Server{
		Handler: up,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			return upCA.Leaf(h.ServerName)
		}},
		Protocols: new(http.Protocols),
	}
	// HTTP/1.1 only, so that the direct client and the proxy speak the
	// same protocol to it.
	upSrv.Protocols.SetHTTP1(true)
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	go upSrv.ServeTLS(upLn, "", "")
	defer upSrv.Close()
	upAddr := upLn.Addr().String()

	sbCA, err := credproxy.NewCA("bench-sandbox")
	if err != nil {
		return nil, nil, err
	}
	cred := policy.Credential{Secret: secretName, Hosts: []string{apiHost}}
	placeholder := cred.PlaceholderFor()
	px, err := credproxy.New(credproxy.Config{
		Policy:  policy.Policy{Credentials: []policy.Credential{cred}},
		CA:      sbCA,
		Store:   credproxy.MapStore{secretName: secretValue},
		Sandbox: "bench",
		Upstream: credproxy.Upstream{
			RootCAs: upCA.Pool(),
			Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
				if addr != apiHost+":443" {
					return nil, fmt.Errorf("bench upstream dialer: no upstream for %s", addr)
				}
				var d net.Dialer
				return d.DialContext(ctx, network, upAddr)
			},
		},
	})
	if err != nil {
		return nil, nil, err
	}
	pxLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	pxDone := make(chan error, 1)
	go func() { pxDone <- px.Serve(pxLn, true) }()
	defer func() {
		px.Close()
		<-pxDone
	}()
	pxAddr := pxLn.Addr().String()

	client := func(target string, roots *x509.CertPool, fresh bool) (*http.Client, *http.Transport) {
		tr := &http.Transport{
			Proxy: nil,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, target)
			},
			TLSClientConfig:     &tls.Config{RootCAs: roots}, // no session cache: a full handshake per connection
			DisableKeepAlives:   fresh,
			DisableCompression:  true,
			MaxIdleConnsPerHost: 4,
		}
		return &http.Client{Transport: tr, Timeout: 30 * time.Second}, tr
	}
	variants := []*proxyVariant{
		{name: "direct", proxied: false},
		{name: "proxy", proxied: true},
		{name: "direct fresh", proxied: false, fresh: true},
		{name: "proxy fresh", proxied: true, fresh: true},
	}
	for _, v := range variants {
		if v.proxied {
			v.client, v.tr = client(pxAddr, sbCA.Pool(), v.fresh)
		} else {
			v.client, v.tr = client(upAddr, upCA.Pool(), v.fresh)
		}
		defer v.tr.CloseIdleConnections()
	}

	var seq atomic.Uint64
	var bodyBytes [2]int
	do := func(v *proxyVariant) (time.Duration, error) {
		k := seq.Add(1)
		req, err := http.NewRequest("GET", "https://"+apiHost+"/v1/x?k="+strconv.FormatUint(k, 10), nil)
		if err != nil {
			return 0, err
		}
		token := secretValue
		if v.proxied {
			token = placeholder
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Accept", "application/json")
		t0 := time.Now()
		resp, err := v.client.Do(req)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", v.name, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		d := time.Since(t0)
		if err != nil {
			return 0, fmt.Errorf("%s: body: %w", v.name, err)
		}
		if resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("%s: status %s: %.200s", v.name, resp.Status, body)
		}
		want := `"k":"` + strconv.FormatUint(k, 10) + `","authorization":"Bearer ` + token + `"`
		if !bytes.Contains(body, []byte(want)) {
			return 0, fmt.Errorf("%s: the response lacks %s: %.300s", v.name, want, body)
		}
		if v.proxied && bytes.Contains(body, []byte(secretValue)) {
			return 0, fmt.Errorf("%s: the secret reached the client", v.name)
		}
		if v.proxied {
			bodyBytes[1] = len(body)
		} else {
			bodyBytes[0] = len(body)
		}
		return d, nil
	}
	run := func(v *proxyVariant, n int, record bool) error {
		c0 := processCPU()
		for range n {
			d, err := do(v)
			if err != nil {
				return err
			}
			if record {
				v.lat = append(v.lat, d)
			}
		}
		if record {
			v.cpu += processCPU() - c0
			v.n += n
		}
		return nil
	}
	count := func(v *proxyVariant) int {
		if v.fresh {
			return c.freshConns
		}
		return c.requests
	}
	for _, v := range variants { // warm-up: connections, leaf certificates, code paths
		if err := run(v, max(20, count(v)/20), false); err != nil {
			return nil, nil, err
		}
	}
	u0, b0 := up.withSecret.Load(), up.without.Load()
	for r := range c.rounds {
		for i := range variants {
			v := variants[(i+r)%len(variants)]
			n := count(v) / c.rounds
			if r < count(v)%c.rounds {
				n++
			}
			if err := run(v, n, true); err != nil {
				return nil, nil, err
			}
		}
	}
	rep := &proxyReport{Requests: c.requests, FreshConns: c.freshConns, Rounds: c.rounds,
		UpstreamSecret: up.withSecret.Load() - u0, UpstreamBad: up.without.Load() - b0, ProxyStats: px.Stats(), BodyBytes: bodyBytes}
	total := 0
	for _, v := range variants {
		total += v.n
		vr := proxyVariantReport{Name: v.name, Latency: v.lat}
		if v.n > 0 {
			vr.CPUPerRequest = v.cpu / time.Duration(v.n)
		}
		rep.Variants = append(rep.Variants, vr)
	}
	if rep.UpstreamBad != 0 || rep.UpstreamSecret != uint64(total) {
		return nil, nil, fmt.Errorf("the upstream got %d requests with the secret and %d without, want %d and 0", rep.UpstreamSecret, rep.UpstreamBad, total)
	}
	return rep, variants, nil
}

// processCPU is the process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
