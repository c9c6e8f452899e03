package daemon

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/internal/testtls"
)

// TestE2ENetwork drives network sandboxes through the daemon with real
// VMs: a tenant secret, a network template (its VMM's tap and egress
// services in a namespace of their own), and two sandboxes of it running
// at once on the same tap name and addresses. The one whose policy scopes
// the secret to api.test reaches the upstream (on L1's loopback, through
// the credential proxy) with the real secret while its guest holds only
// the placeholder; a denied name fails; the other, with the template's
// deny-all policy, reaches nothing. A live policy change through the API
// takes effect, one naming a secret outside the sandbox's scope is
// refused, and the secret appears in no audit log and no API reply.
func TestE2ENetwork(t *testing.T) {
	warren, kernel, initrd := e2ePaths(t)
	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root (network namespaces, taps, eBPF)")
	}
	state, step := e2eState(t, "hostd-net-")
	u := startUpstream(t, state)
	secret, hosts, upCA := u.secret, u.hosts, u.ca
	td := startE2EDaemon(t, state, warren, func(c *Config) {
		// The upstream is on loopback: the operator's explicit allowance.
		c.EgressHosts, c.UpstreamCA, c.EgressUpstreamAllow = hosts, upCA, "127.0.0.1"
	})
	a := td.client(t, "tenant-n")
	var sbs []store.Sandbox
	defer func() {
		for _, sb := range sbs {
			stopProc(sb.PID, sb.StartTime, time.Second)
		}
	}()
	replies := &bytes.Buffer{} // every API reply, searched for the secret at the end
	do := func(want int, method, path string, body any) []byte {
		t.Helper()
		st, b := a.do(method, path, body)
		replies.Write(b)
		if st != want {
			t.Fatalf("%s %s: %d %s", method, path, st, b)
		}
		return b
	}
	if st, b := a.do("PUT", "/v1/secrets/API_KEY", []byte(secret)); st/100 != 2 {
		t.Fatalf("PUT secret: %d %s", st, b)
	}
	if b := do(200, "GET", "/v1/secrets", nil); !strings.Contains(string(b), "API_KEY") {
		t.Fatalf("GET /v1/secrets: %s", b)
	}
	if st, b := td.client(t, "tenant-o").do("GET", "/v1/secrets", nil); st != 200 || strings.Contains(string(b), "API_KEY") {
		t.Fatalf("another tenant's GET /v1/secrets: %d %s", st, b)
	}
	var tp store.Template
	a.ok(201, "POST", "/v1/templates", map[string]any{"kernel": kernel, "initramfs": initrd, "mem_mib": 256, "cpus": 1, "network": true}, &tp)
	step("network template %s ready in %.0f ms", tp.ID, tp.BuildMS)

	pol := map[string]any{"credentials": []map[string]any{{"secret": "API_KEY", "hosts": []string{"api.test"}, "substitute": []string{"headers", "query"}}}}
	var s1, s2 store.Sandbox
	a.ok(201, "POST", "/v1/sandboxes", map[string]any{"template": tp.ID, "egress": pol, "secrets": []string{"API_KEY"}}, &s1)
	sbs = append(sbs, s1)
	a.ok(201, "POST", "/v1/sandboxes", map[string]any{"template": tp.ID}, &s2)
	sbs = append(sbs, s2)
	step("sandboxes %s (API_KEY scoped to api.test) and %s (deny all) running at once", s1.ID, s2.ID)
	step("the network VMM is confined: %s", checkNetConfined(t, td.cfg.VMMUIDs, s1.PID, td.store.SandboxDir(s1.Tenant, s1.ID), td.store.SecretsPath(s1.Tenant)))

	sh := func(id, cmd string) (string, int) {
		t.Helper()
		out, errOut, code, err := a.tryExec(id, "sh", "-c", cmd)
		if err != nil {
			t.Fatal(err)
		}
		return out + errOut, code
	}
	ph, _ := sh(s1.ID, `echo -n "$API_KEY"`)
	if ph == "" || strings.Contains(ph, secret) {
		t.Fatalf("the guest's $API_KEY is %q", ph)
	}
	const fetch = `wget -O - "https://api.test/v1/echo?key=$API_KEY"`
	out, code := sh(s1.ID, fetch)
	if code != 0 || !strings.Contains(out, "upstream saw key="+ph) || strings.Contains(out, secret) {
		t.Fatalf("%s in %s: exit %d %q", fetch, s1.ID, code, out)
	}
	if got := u.seen(); !strings.Contains(got, "key="+secret) {
		t.Fatalf("the upstream saw %q, not the secret", got)
	}
	step("%s: the guest holds %q; the upstream saw the real secret", s1.ID, ph)
	if out, code := sh(s1.ID, `wget -O - http://denied.test/`); code == 0 {
		t.Fatalf("denied.test got through: %q", out)
	}
	if out, code := sh(s2.ID, fetch); code == 0 {
		t.Fatalf("the deny-all sandbox got through: %q", out)
	}
	step("denied.test refused; the deny-all sandbox reaches nothing")

	// A fork child makes its own namespace and inherits the policy.
	var fr struct{ Children []store.Sandbox }
	a.ok(201, "POST", "/v1/sandboxes/"+s1.ID+"/fork", map[string]any{"n": 1}, &fr)
	if len(fr.Children) != 1 || fr.Children[0].Status != store.Running {
		t.Fatalf("fork: %+v", fr)
	}
	kid := fr.Children[0]
	sbs = append(sbs, kid)
	if out, code := sh(kid.ID, fetch); code != 0 || !strings.Contains(out, "upstream saw key="+ph) {
		t.Fatalf("%s in the fork child %s: exit %d %q", fetch, kid.ID, code, out)
	}
	step("fork child %s reaches api.test through its own proxy, with its own secrets file: %s", kid.ID, checkSpawned(t, s1, kid))

	// Live policy changes through the API.
	if st, b := a.do("PUT", "/v1/sandboxes/"+s2.ID+"/egress", pol); st != 400 {
		t.Fatalf("a policy naming a secret outside %s's scope: %d %s", s2.ID, st, b)
	}
	do(200, "PUT", "/v1/sandboxes/"+s1.ID+"/egress", map[string]any{})
	if out, code := sh(s1.ID, fetch); code == 0 {
		t.Fatalf("after the deny-all update %s got through: %q", s1.ID, out)
	}
	if b := do(200, "GET", "/v1/sandboxes/"+s1.ID+"/egress", nil); strings.Contains(string(b), "api.test") {
		t.Fatalf("GET egress after the update: %s", b)
	}
	step("live update to deny-all in force; an out-of-scope policy refused")
	// The sandbox's own audit log (flushed by the GET) has the decisions.
	auditLog, err := os.ReadFile(filepath.Join(td.store.SandboxDir("tenant-n", s1.ID), "egress.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"denied.test`, `"api.test`, `"policy"`} {
		if !bytes.Contains(auditLog, []byte(want)) {
			t.Fatalf("%s's egress audit log lacks %s:\n%s", s1.ID, want, auditLog)
		}
	}

	for _, sb := range sbs {
		do(200, "DELETE", "/v1/sandboxes/"+sb.ID, nil)
	}
	do(200, "DELETE", "/v1/templates/"+tp.ID, nil)
	// The secret is in the tenant's secrets file and the sandboxes'
	// secrets.json only: no audit log, record or reply has it.
	var leaks []string
	filepath.Walk(state, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() || fi.Name() == "secrets.json" || fi.Size() > 64<<20 {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(secret)) {
			leaks = append(leaks, p)
		}
		return nil
	})
	if len(leaks) > 0 || bytes.Contains(replies.Bytes(), []byte(secret)) || strings.Contains(td.audit.String(), secret) {
		t.Fatalf("the secret leaked: files %v, replies %v, API audit %v", leaks,
			bytes.Contains(replies.Bytes(), []byte(secret)), strings.Contains(td.audit.String(), secret))
	}
	step("deleted; the secret is in no file but secrets.json, no reply, no audit log")
}

// upstream is an HTTPS API for network sandboxes' credential proxies to
// reach: api.test on 127.0.0.1:443 of this (L1's) namespace, where the
// VMMs' proxies connect from, with its CA and an /etc/hosts-style file
// for the daemon (Config.UpstreamCA, Config.EgressHosts), and a fresh
// secret for the tenant to store.
type upstream struct {
	secret, hosts, ca string
	mu                sync.Mutex
	queries           []string
}

// seen is every query string the upstream was sent, space-separated.
func (u *upstream) seen() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return strings.Join(u.queries, " ")
}

// startUpstream starts the upstream for the rest of the test, or skips it
// where 127.0.0.1:443 cannot be had.
func startUpstream(t *testing.T, state string) *upstream {
	t.Helper()
	tok := make([]byte, 16)
	rand.Read(tok)
	u := &upstream{secret: "sk-live-" + hex.EncodeToString(tok), ca: filepath.Join(state, "upstream-ca.pem"), hosts: filepath.Join(state, "hosts")}
	caPEM, cert := testtls.Upstream(t, "api.test")
	os.WriteFile(u.ca, caPEM, 0o644)
	os.WriteFile(u.hosts, []byte("127.0.0.1 api.test\n"), 0o644)
	ln, err := tls.Listen("tcp", "127.0.0.1:443", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Skipf("skipped: cannot listen on 127.0.0.1:443 for the upstream: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.queries = append(u.queries, r.URL.RawQuery)
		u.mu.Unlock()
		fmt.Fprintf(w, "upstream saw %s\n", r.URL.RawQuery)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return u
}
