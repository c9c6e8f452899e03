package daemon

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	hostclient "github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/wire"
)

// TestPeerUIDTenants: another local user who can open the unix socket
// tries to act as a tenant by setting X-Warren-Tenant. With uid 65534
// mapped to tenant "nobody-t" only (--tenant-uid 65534=nobody-t), it gets
// 403 for tenant-a's sandbox and sandboxes list, and is served as
// nobody-t; uid 65533, mapped to nothing, gets 403 for everything; root
// acts for any tenant.
func TestPeerUIDTenants(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (runs a client as other uids)")
	}
	td := startDaemon(t, t.TempDir(), newFakeLauncher(t))
	a := td.client(t, "tenant-a")
	sb := a.create(a.template(fakeKernel(t)).ID)

	// A socket other users can reach: only the uid check stands between
	// them and the tenants.
	dir, err := os.MkdirTemp("", "peerauth")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	sock := filepath.Join(dir, "hostd.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(sock, 0o777)
	// The client: this test binary in its "get" role (TestMain), copied
	// where the other uids may run it.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	client := filepath.Join(dir, "get")
	if b, err := os.ReadFile(self); err != nil || os.WriteFile(client, b, 0o755) != nil {
		t.Fatalf("copy the test binary: %v", err)
	}
	uids := TenantUIDs{}
	for _, v := range []string{"65534=nobody-t", "65532=tenant-x,tenant-y"} {
		if err := uids.ParseTenantUID(v); err != nil {
			t.Fatal(err)
		}
	}
	go td.Serve(ln, PeerAuth(uids))

	// as runs the client as uid against path with the tenant header (none
	// for ""), and returns the status and body.
	as := func(uid int, tenant, path string) (int, string) {
		t.Helper()
		cmd := exec.Command(client, sock, path, tenant)
		cmd.Env = append(os.Environ(), roleEnv+"=get")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
		cmd.Dir = "/"
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("the client as %d: %v: %s", uid, err, errb.String())
		}
		body, code, _ := strings.Cut(strings.TrimSpace(out.String()), "\n")
		if i := strings.LastIndexByte(out.String(), '\n'); i >= 0 {
			body, code = strings.TrimSpace(out.String()[:i]), out.String()[i+1:]
		}
		var st int
		for _, ch := range code {
			st = st*10 + int(ch-'0')
		}
		return st, body
	}
	healthTenant := func(body string) string {
		var h wire.Health
		json.Unmarshal([]byte(body), &h)
		return h.Tenant
	}
	for _, tc := range []struct {
		uid          int
		tenant, path string
		want         int
		wantTenant   string
	}{
		// The attack: another user names tenant-a.
		{65534, "tenant-a", "/v1/sandboxes/" + sb.ID, 403, ""},
		{65534, "tenant-a", "/v1/sandboxes", 403, ""},
		{65534, "tenant-a", "/v1/health", 403, ""},
		// Its own tenant, named or implied (its only one).
		{65534, "nobody-t", "/v1/health", 200, "nobody-t"},
		{65534, "", "/v1/health", 200, "nobody-t"},
		{65534, "nobody-t", "/v1/sandboxes/" + sb.ID, 404, ""},
		// A uid of two tenants names one of them.
		{65532, "tenant-y", "/v1/health", 200, "tenant-y"},
		{65532, "", "/v1/health", 401, ""},
		{65532, "tenant-a", "/v1/health", 403, ""},
		// An unmapped uid: nothing.
		{65533, "tenant-a", "/v1/sandboxes", 403, ""},
		{65533, "", "/v1/health", 403, ""},
		// Root: any tenant.
		{0, "tenant-a", "/v1/sandboxes/" + sb.ID, 200, ""},
		{0, "nobody-t", "/v1/health", 200, "nobody-t"},
	} {
		st, body := as(tc.uid, tc.tenant, tc.path)
		if st != tc.want {
			t.Errorf("uid %d as %q: GET %s = %d %s, want %d", tc.uid, tc.tenant, tc.path, st, body, tc.want)
			continue
		}
		if tc.wantTenant != "" && healthTenant(body) != tc.wantTenant {
			t.Errorf("uid %d as %q: acts for %q, want %q", tc.uid, tc.tenant, healthTenant(body), tc.wantTenant)
		}
		if st == 403 && strings.Contains(body, sb.ID) {
			t.Errorf("uid %d: a 403 that leaks %s: %s", tc.uid, sb.ID, body)
		}
	}
}

func TestParseTenantUID(t *testing.T) {
	m := TenantUIDs{}
	for _, ok := range []string{"1000=a", "1000=b,c", "1001=*"} {
		if err := m.ParseTenantUID(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	if strings.Join(m[1000], ",") != "a,b,c" || m[1001][0] != "*" {
		t.Errorf("got %v", m)
	}
	for _, bad := range []string{"", "1000", "1000=", "x=a", "-1=a", "1000=A", "1000=a,,b", "1000=../x"} {
		if err := m.ParseTenantUID(bad); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
}

// pki is a throwaway CA with a server certificate for 127.0.0.1 and a
// client certificate, as PEM files in a directory.
type pki struct {
	ca, serverCert, serverKey, clientCert, clientKey, otherCA string
}

func newPKI(t *testing.T) pki {
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	newCA := func(name string) (*x509.Certificate, *ecdsa.PrivateKey, string) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
			NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
		der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &k.PublicKey, k)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := x509.ParseCertificate(der)
		return c, k, write(name+".pem", "CERTIFICATE", der)
	}
	ca, caKey, caFile := newCA("ca")
	_, _, otherFile := newCA("other")
	leaf := func(name string, usage x509.ExtKeyUsage, ips ...net.IP) (string, string) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: ips,
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		der, err := x509.CreateCertificate(rand.Reader, tpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kd, _ := x509.MarshalECPrivateKey(k)
		return write(name+".pem", "CERTIFICATE", der), write(name+".key", "EC PRIVATE KEY", kd)
	}
	p := pki{ca: caFile, otherCA: otherFile}
	p.serverCert, p.serverKey = leaf("server", x509.ExtKeyUsageServerAuth, net.ParseIP("127.0.0.1"))
	p.clientCert, p.clientKey = leaf("client", x509.ExtKeyUsageClientAuth)
	return p
}

// tlsToken is tenant-a's bearer token on serveTLS's listener.
const tlsToken = "token-of-a-0123456789"

// serveTLS starts a daemon and serves its API with TokenAuth (tlsToken
// for tenant-a) on a TLS listener on loopback with p's server
// certificate, mutual TLS against clientCA unless it is "". It returns the
// listener's https:// address and a context for the test's calls.
func serveTLS(t *testing.T, p pki, clientCA string) (string, context.Context) {
	td := startDaemon(t, t.TempDir(), newFakeLauncher(t))
	cfg, err := ServerTLS(p.serverCert, p.serverKey, clientCA)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go td.Serve(tls.NewListener(l, cfg), TokenAuth(map[string]string{tlsToken: "tenant-a"}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return "https://" + l.Addr().String(), ctx
}

// tlsClient is a client of url with tlsToken and tl, failing t if there
// is none.
func tlsClient(t *testing.T, url string, tl hostclient.TLS) *hostclient.Client {
	c, err := hostclient.NewTLS(url, "", tlsToken, tl)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestTLSListener: the TCP API is served over TLS with the operator's
// certificate; the Go client reaches it with the CA file, refuses it
// without (an unknown authority), and a plain-HTTP request with a valid
// token gets no answer of the API's.
func TestTLSListener(t *testing.T) {
	p := newPKI(t)
	url, ctx := serveTLS(t, p, "")

	if tenant, err := tlsClient(t, url, hostclient.TLS{CAFile: p.ca}).Health(ctx); err != nil || tenant != "tenant-a" {
		t.Fatalf("Health over TLS = %q, %v", tenant, err)
	}
	// The system's roots, or another CA: the daemon is not trusted.
	for _, tl := range []hostclient.TLS{{}, {CAFile: p.otherCA}} {
		if _, err := tlsClient(t, url, tl).Health(ctx); err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Errorf("CA %q: Health = %v, want a certificate error", tl.CAFile, err)
		}
	}
	// Plain HTTP with a valid token: no API answer.
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+strings.TrimPrefix(url, "https://")+"/v1/health", nil)
	req.Header.Set("Authorization", "Bearer "+tlsToken)
	if res, err := http.DefaultClient.Do(req); err == nil {
		var h wire.Health
		json.NewDecoder(res.Body).Decode(&h)
		res.Body.Close()
		if res.StatusCode == 200 || h.Tenant != "" {
			t.Errorf("plain HTTP to the TLS listener: %d %+v", res.StatusCode, h)
		}
	}
	// CA options on a non-https address are a mistake, not ignored.
	if _, err := hostclient.NewTLS("http://127.0.0.1:1", "", tlsToken, hostclient.TLS{CAFile: p.ca}); err == nil {
		t.Error("a CA file with an http:// address was accepted")
	}
}

// TestMutualTLS: with --client-ca, a client without a certificate (or
// with one of another CA) is refused in the handshake, even with a valid
// token; one with the CA's client certificate is served.
func TestMutualTLS(t *testing.T) {
	p := newPKI(t)
	url, ctx := serveTLS(t, p, p.ca)

	if _, err := tlsClient(t, url, hostclient.TLS{CAFile: p.ca}).Health(ctx); err == nil {
		t.Fatal("a client without a certificate was served")
	} else {
		t.Logf("without a certificate: %v", err)
	}
	// A certificate the server's own CA did not sign: the server's
	// certificate and key, issued for serverAuth by the same CA, would
	// pass; one self-signed by an attacker must not.
	other := newPKI(t)
	forged := tlsClient(t, url, hostclient.TLS{CAFile: p.ca, CertFile: other.clientCert, KeyFile: other.clientKey})
	if _, err := forged.Health(ctx); err == nil {
		t.Fatal("a client certificate of another CA was accepted")
	}
	good := tlsClient(t, url, hostclient.TLS{CAFile: p.ca, CertFile: p.clientCert, KeyFile: p.clientKey})
	if tenant, err := good.Health(ctx); err != nil || tenant != "tenant-a" {
		t.Fatalf("Health with a client certificate = %q, %v", tenant, err)
	}
}

func TestCheckPlainTCP(t *testing.T) {
	for _, tc := range []struct {
		addr     string
		insecure bool
		ok       bool
	}{
		{"127.0.0.1:8080", false, true},
		{"[::1]:8080", false, true},
		{"localhost:8080", false, true},
		{"127.3.2.1:8080", false, true},
		{":8080", false, false},
		{"0.0.0.0:8080", false, false},
		{"[::]:8080", false, false},
		{"10.0.0.5:8080", false, false},
		{"[::ffff:127.0.0.1]:8080", false, true},
		{"0.0.0.0:8080", true, true},
	} {
		if err := CheckPlainTCP(tc.addr, tc.insecure); (err == nil) != tc.ok {
			t.Errorf("CheckPlainTCP(%q, %v) = %v, want ok %v", tc.addr, tc.insecure, err, tc.ok)
		}
	}
}

// TestMainRefusesPlainTCP: warren-hostd will not serve bearer tokens in
// cleartext on a non-loopback address unless told to.
func TestMainRefusesPlainTCP(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	os.WriteFile(tokens, []byte(`{"token-of-a-0123456789":"tenant-a"}`), 0o600)
	var stderr bytes.Buffer
	code := Main([]string{"--state", filepath.Join(dir, "state"), "--socket", filepath.Join(dir, "s.sock"), "--warren", "/bin/true",
		"--cgroup-root", "none", "--listen", "0.0.0.0:0", "--tokens", tokens}, &stderr)
	if code == 0 || !strings.Contains(stderr.String(), "not a loopback address") {
		t.Fatalf("Main = %d: %s", code, stderr.String())
	}
	stderr.Reset()
	code = Main([]string{"--state", filepath.Join(dir, "state"), "--socket", filepath.Join(dir, "s.sock"), "--warren", "/bin/true",
		"--cgroup-root", "none", "--client-ca", tokens}, &stderr)
	if code == 0 || !strings.Contains(stderr.String(), "--client-ca needs") {
		t.Fatalf("Main with --client-ca alone = %d: %s", code, stderr.String())
	}
}

// peerGet is the "get" role of the test binary: one GET of args[1] on the
// daemon socket args[0], with tenant args[2] when not empty; it prints the
// body, a newline and the status code (as TestPeerUIDTenants reads them).
func peerGet(args []string) int {
	if len(args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: get SOCKET PATH TENANT")
		return 2
	}
	hc := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", args[0])
		}}}
	req, err := http.NewRequest("GET", "http://hostd"+args[1], nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if args[2] != "" {
		req.Header.Set(TenantHeader, args[2])
	}
	resp, err := hc.Do(req)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("%s\n%d", b, resp.StatusCode)
	return 0
}
