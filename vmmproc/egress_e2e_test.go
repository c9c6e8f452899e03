package vmmproc

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/warrenvm/warren/ebpf/audit"
	"github.com/warrenvm/warren/ebpf/policy"
	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/internal/testtls"
	"github.com/warrenvm/warren/vmmctl"
	"github.com/warrenvm/warren/vmmproc/egress"
)

// TestEgressEndToEnd boots a guest whose tap carries an egress policy and
// checks, from inside the guest, what the policy lets through: a CIDR rule,
// an allowed name (through the sandbox's resolver), a denied address and a
// denied name, a live policy change that flips two verdicts, and the
// credential proxy: the upstream sees the real secret, the guest only the
// placeholder, a placeholder sent to a host it is not scoped to goes out
// untouched, and the guest's memory holds no copy of either secret. Every
// decision is in the audit log.

// egressReply is `warren egress`'s output (vmmctl.EgressReply) decoded
// with its types.
type egressReply struct {
	Policy policy.Policy `json:"policy"`
	Stats  egress.Stats  `json:"stats"`
	Audit  string        `json:"audit"`
}

func TestEgressEndToEnd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root for the tap, the network namespace and eBPF")
	}
	kvmtest.Require(t)
	dir := t.TempDir()
	tok := make([]byte, 16)
	rand.Read(tok)
	secret := "sk-live-" + hex.EncodeToString(tok)
	rand.Read(tok)
	otherSecret := "sk-other-" + hex.EncodeToString(tok)
	secrets := filepath.Join(dir, "secrets.json")
	b, _ := json.Marshal(map[string]string{"API_KEY": secret, "OTHER_KEY": otherSecret})
	if err := os.WriteFile(secrets, b, 0o600); err != nil {
		t.Fatal(err)
	}

	// The upstream API, in the test's own namespace (where the proxy, a
	// part of this process, connects from) on 127.0.0.1:443.
	caPEM, cert := testtls.Upstream(t, "api.test", "other.test")
	upCA := filepath.Join(dir, "upstream-ca.pem")
	os.WriteFile(upCA, caPEM, 0o644)
	var seenMu sync.Mutex
	var seen []string // "host query authorization"
	upLn, err := tls.Listen("tcp", "127.0.0.1:443", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Skipf("skipped: cannot listen on 127.0.0.1:443 for the upstream: %v", err)
	}
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		line := fmt.Sprintf("%s %s %s", r.Host, r.URL.RawQuery, r.Header.Get("Authorization"))
		seenMu.Lock()
		seen = append(seen, line)
		seenMu.Unlock()
		w.Header().Set("X-Echo", r.URL.RawQuery)
		fmt.Fprintf(w, "upstream saw: %s\n", line)
	})}
	go up.Serve(upLn)
	defer up.Close()
	hosts := filepath.Join(dir, "hosts")
	os.WriteFile(hosts, []byte("127.0.0.1 api.test other.test\n198.51.100.10 www.allowed.test\n"), 0o644)

	pol := `{
		"rules": [{"id": 5, "cidr": "198.51.100.30/32", "proto": "tcp", "ports": "8080"}],
		"domains": [{"name": "www.allowed.test", "proto": "tcp", "ports": "8080"}],
		"credentials": [{"secret": "API_KEY", "hosts": ["api.test"], "substitute": ["headers", "query"]}, {"secret": "OTHER_KEY", "hosts": ["other.test"]}]
	}`
	p, err := policy.Parse([]byte(pol))
	if err != nil {
		t.Fatal(err)
	}
	auditPath := filepath.Join(dir, "audit.jsonl")
	sock, api := filepath.Join(dir, "vm.sock"), filepath.Join(dir, "api.sock")
	eg := &EgressOptions{HostAddr: netip.MustParsePrefix("10.204.0.1/24"), GuestAddr: netip.MustParseAddr("10.204.0.2"),
		Audit: auditPath, Secrets: secrets, Hosts: hosts, UpstreamCA: upCA, Sandbox: "e2e",
		// The upstream is on loopback: the operator's explicit allowance.
		UpstreamAllow: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}
	eg.State.Policy = p
	var g *guest
	var o vmOptions
	var srvs []*http.Server
	var testNS netns.NsHandle
	err = inNewNetns(func() error {
		var err error
		if testNS, err = netns.Get(); err != nil {
			return err
		}
		if srvs, err = pageServers(); err != nil {
			return err
		}
		o = vmOptions{memMiB: 256, cpus: 1, rng: true, tap: "wegr0", vsock: sock, cid: 3, trackDirty: true, egress: eg,
			mac:     net.HardwareAddr{0x52, 0x54, 0, 0x12, 0x34, 0x57},
			cmdline: "warren.hostname=egress warren.ip=10.204.0.2/24 warren.gw=10.204.0.1 warren.dns=10.204.0.1"}
		g, err = startGuest(t, o)
		return err
	})
	defer func() {
		for _, s := range srvs {
			s.Close()
		}
		testNS.Close()
	}()
	if err != nil {
		t.Fatal(err)
	}
	stopAPI, err := startAPI(api, &built{vm: g.vm, devs: g.dev}, o, NewLogger(os.Stderr, false), "", "")
	if err != nil {
		t.Fatal(err)
	}
	defer stopAPI()
	g.waitOr(readyLine, bootDeadline, bootStalled)
	mustRun(t, "health", "--wait", "3m", sock)

	// exec runs argv in the guest, killed after timeout, and returns its
	// exit code and output.
	exec := func(timeout time.Duration, argv ...string) (int, string) {
		t.Helper()
		args := append([]string{"exec", "--timeout", timeout.String(), sock, "--"}, argv...)
		code, out, errOut := cli(t, nil, args...)
		return code, out + errOut
	}
	fetch := func(url string) (int, string) {
		t.Helper()
		return exec(8*time.Second, "wget", "-O", "-", url)
	}
	mustFetch := func(url, want string) {
		t.Helper()
		if code, out := fetch(url); code != 0 || !strings.Contains(out, want) {
			t.Errorf("wget %s: exit %d, output %q; want %q", url, code, out, want)
		}
	}
	mustFail := func(url string) {
		t.Helper()
		if code, out := fetch(url); code == 0 {
			t.Errorf("wget %s got through: %q", url, out)
		}
	}

	t.Run("policy", func(t *testing.T) {
		mustFetch("http://198.51.100.30:8080/", "page of 198.51.100.30")
		mustFail("http://198.51.100.20:8080/")
		mustFetch("http://www.allowed.test:8080/", "page of 198.51.100.10")
		mustFail("http://denied.test:8080/")

		// A live change: .20 allowed, .30 no longer.
		p2 := strings.Replace(pol, `"198.51.100.30/32"`, `"198.51.100.20/32"`, 1)
		polFile := filepath.Join(dir, "policy2.json")
		os.WriteFile(polFile, []byte(p2), 0o644)
		var rep egressReply
		if err := json.Unmarshal([]byte(mustRun(t, "egress", "--policy", polFile, api)), &rep); err != nil {
			t.Fatal(err)
		}
		if rep.Policy.Rules[0].CIDR.String() != "198.51.100.20/32" {
			t.Fatalf("policy in force after the change: %+v", rep.Policy.Rules)
		}
		mustFetch("http://198.51.100.20:8080/", "page of 198.51.100.20")
		mustFail("http://198.51.100.30:8080/")
	})

	t.Run("credentials", func(t *testing.T) {
		code, out := exec(10*time.Second, "sh", "-c", "echo $API_KEY $OTHER_KEY")
		if code != 0 || strings.TrimSpace(out) != "warren-placeholder-API_KEY warren-placeholder-OTHER_KEY" {
			t.Fatalf("the guest's placeholders: exit %d %q", code, out)
		}
		code, out = exec(30*time.Second, "sh", "-c", `wget -O - "https://api.test/v1/echo?key=$API_KEY"`)
		if code != 0 || !strings.Contains(out, "key=warren-placeholder-API_KEY") {
			t.Errorf("https://api.test through the proxy: exit %d %q", code, out)
		}
		if strings.Contains(out, secret) {
			t.Errorf("the guest received the secret: %q", out)
		}
		// A placeholder sent to a host it is not scoped to goes out as it is.
		code, out = exec(30*time.Second, "sh", "-c", `wget -O - "https://api.test/v1/echo?key=$OTHER_KEY"`)
		if code != 0 || strings.Contains(out, otherSecret) {
			t.Errorf("out-of-scope placeholder: exit %d %q", code, out)
		}
		seenMu.Lock()
		got := strings.Join(seen, "\n")
		seenMu.Unlock()
		if !strings.Contains(got, "key="+secret) {
			t.Errorf("the upstream never saw the real credential; it saw:\n%s", got)
		}
		if strings.Contains(got, otherSecret) || !strings.Contains(got, "key=warren-placeholder-OTHER_KEY") {
			t.Errorf("the out-of-scope placeholder was replaced; the upstream saw:\n%s", got)
		}
		// The guest's RAM holds neither secret.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := g.vm.Pause(ctx); err != nil {
			t.Fatal(err)
		}
		mem := g.vm.Memory()
		ram, err := mem.Slice(0, mem.Size())
		if err == nil {
			for _, s := range []string{secret, otherSecret} {
				if i := bytes.Index(ram, []byte(s)); i >= 0 {
					t.Errorf("guest memory holds a secret at %#x", i)
				}
			}
			if !bytes.Contains(ram, []byte("warren-placeholder-API_KEY")) {
				t.Error("guest memory does not even hold the placeholder: the scan looks at the wrong bytes")
			}
		} else {
			t.Error(err)
		}
		if err := g.vm.Resume(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("audit", func(t *testing.T) {
		var rep egressReply
		if err := json.Unmarshal([]byte(mustRun(t, "egress", api)), &rep); err != nil {
			t.Fatal(err)
		}
		t.Logf("egress counters: %+v", rep.Stats)
		f, err := os.Open(auditPath)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var recs []audit.Record
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var r audit.Record
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatalf("audit line %q: %v", sc.Text(), err)
			}
			recs = append(recs, r)
		}
		has := func(what string, f func(audit.Record) bool) {
			t.Helper()
			for _, r := range recs {
				if f(r) {
					return
				}
			}
			t.Errorf("no audit record of %s", what)
		}
		has("the denied probe to .20", func(r audit.Record) bool {
			return r.Source == audit.SourceFilter && r.Verdict == audit.Deny && r.Dst == "198.51.100.20" && r.DstPort == 8080
		})
		has("the allowed flow to .30 (rule 5)", func(r audit.Record) bool {
			return r.Source == audit.SourceFilter && r.Verdict == audit.Allow && r.Dst == "198.51.100.30" && r.RuleID == 5
		})
		has("the denied probe to .30 after the change", func(r audit.Record) bool {
			return r.Source == audit.SourceFilter && r.Verdict == audit.Deny && r.Dst == "198.51.100.30"
		})
		has("the denied name", func(r audit.Record) bool {
			return r.Source == audit.SourceDNS && r.Verdict == audit.Deny && r.Name == "denied.test"
		})
		has("the allowed name", func(r audit.Record) bool {
			return r.Source == audit.SourceDNS && r.Verdict == audit.Allow && r.Name == "www.allowed.test"
		})
		has("the credential substituted", func(r audit.Record) bool {
			return r.Source == audit.SourceProxy && r.Verdict == audit.Allow && strings.Contains(r.Credential, "API_KEY")
		})
		has("the out-of-scope placeholder", func(r audit.Record) bool {
			return r.Source == audit.SourceProxy && r.Reason == "placeholder-out-of-scope"
		})
		has("the policy change", func(r audit.Record) bool { return r.Source == audit.SourcePolicy && r.Reason == "update" })
		b, _ := os.ReadFile(auditPath)
		for _, s := range []string{secret, otherSecret} {
			if bytes.Contains(b, []byte(s)) {
				t.Error("the audit log holds a secret")
			}
		}
		if rep.Stats.Filter.DeniedPackets == 0 || rep.Stats.Filter.AllowedPackets == 0 {
			t.Errorf("filter counters: %+v", rep.Stats.Filter)
		}
	})

	// The policy in force (the live change above) survives a snapshot and
	// a restore in a new VM: same verdicts, same CA (the guest's trust
	// store, restored with its memory, still accepts the proxy).
	var g2 *guest
	parent := t // the restored guest outlives its subtest
	sock2, api2 := filepath.Join(dir, "vm2.sock"), filepath.Join(dir, "api2.sock")
	t.Run("restore", func(t *testing.T) {
		snapPath := filepath.Join(dir, "snaps", "egress")
		os.MkdirAll(filepath.Dir(snapPath), 0o755)
		mustRun(t, "snapshot", api, snapPath)
		stopAPI()
		g.stop()
		o2 := restoreOptions(t, snapPath)
		snap := o2.restore
		defer snap.Close()
		if o2.egress == nil || len(o2.egress.State.Policy.Rules) != 1 || o2.egress.State.Policy.Rules[0].CIDR.String() != "198.51.100.20/32" {
			t.Fatalf("the snapshot recorded egress %+v, want the policy in force", o2.egress)
		}
		o2.vsock = sock2
		err = inNetns(testNS, func() error {
			var err error
			g2, err = startGuest(parent, o2)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		stop2, err := startAPI(api2, &built{vm: g2.vm, devs: g2.dev}, o2, NewLogger(os.Stderr, false), snap.Layer(), snap.Name())
		if err != nil {
			t.Fatal(err)
		}
		parent.Cleanup(stop2)
		mustRun(t, "health", "--wait", "2m", sock2)
		sock = sock2 // exec, fetch and friends now reach the restored guest
		mustFetch("http://198.51.100.20:8080/", "page of 198.51.100.20")
		mustFail("http://198.51.100.30:8080/")
		code, out := exec(30*time.Second, "sh", "-c", `wget -O - "https://api.test/v1/echo?key=$API_KEY"`)
		if code != 0 || !strings.Contains(out, "key=warren-placeholder-API_KEY") {
			t.Errorf("https://api.test after the restore: exit %d %q", code, out)
		}
	})

	// A fork's child inherits the policy or narrows it, never widens it,
	// and runs its own filter in its own network namespace.
	t.Run("fork", func(t *testing.T) {
		if g2 == nil {
			t.Skip("skipped: the restore failed")
		}
		wide := filepath.Join(dir, "wide.json")
		os.WriteFile(wide, []byte(`{"rules": [{"cidr": "198.51.100.0/24", "proto": "tcp", "ports": "8080"}]}`), 0o644)
		narrow := filepath.Join(dir, "narrow.json")
		os.WriteFile(narrow, []byte(`{"rules": [{"cidr": "198.51.100.20/32", "proto": "tcp", "ports": "8080"}]}`), 0o644)
		if code, _, errOut := cli(t, nil, "fork", "--netns", "--egress", wide, api2); code == 0 || !strings.Contains(errOut, "not within") {
			t.Errorf("a widening fork: exit %d %q", code, errOut)
		}
		if code, _, errOut := cli(t, nil, "fork", api2); code == 0 || !strings.Contains(errOut, "--netns") {
			t.Errorf("a fork without --netns: exit %d %q", code, errOut)
		}
		var r vmmctl.ForkReply
		if err := json.Unmarshal([]byte(mustRun(t, "fork", "--netns", "--egress", narrow, "--json", "--prefix", filepath.Join(dir, "kid"), api2)), &r); err != nil {
			t.Fatal(err)
		}
		c := r.Children[0]
		t.Cleanup(func() {
			if p, err := os.FindProcess(c.PID); err == nil {
				p.Kill()
			}
		})
		var rep egressReply
		if err := json.Unmarshal([]byte(mustRun(t, "egress", c.API)), &rep); err != nil {
			t.Fatal(err)
		}
		if len(rep.Policy.Rules) != 1 || len(rep.Policy.Domains) != 0 || len(rep.Policy.Credentials) != 0 {
			t.Errorf("the child's policy: %+v", rep.Policy)
		}
		// The child's namespace gets the same servers as ours.
		h, err := netns.GetFromPath(c.NetNS)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		var kidSrvs []*http.Server
		if err := inNetns(h, func() (err error) { kidSrvs, err = pageServers(); return err }); err != nil {
			t.Fatal(err)
		}
		defer func() {
			for _, s := range kidSrvs {
				s.Close()
			}
		}()
		mustRun(t, "health", "--wait", "2m", c.Vsock)
		sock = c.Vsock
		mustFetch("http://198.51.100.20:8080/", "page of 198.51.100.20")
		mustFail("http://www.allowed.test:8080/")
		sock = sock2
		// The parent's policy is untouched by the child's.
		if err := json.Unmarshal([]byte(mustRun(t, "egress", api2)), &rep); err != nil {
			t.Fatal(err)
		}
		if len(rep.Policy.Domains) != 1 || len(rep.Policy.Credentials) != 2 {
			t.Errorf("the parent's policy after the fork: %+v", rep.Policy)
		}
	})
}

// pageServers gives lo (brought up) the addresses 198.51.100.10, .20 and .30
// and serves "page of ADDRESS" on port 8080 of each, in the calling
// thread's network namespace.
func pageServers() ([]*http.Server, error) {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return nil, err
	}
	netlink.LinkSetUp(lo)
	var srvs []*http.Server
	for _, a := range []string{"198.51.100.10", "198.51.100.20", "198.51.100.30"} {
		addr, _ := netlink.ParseAddr(a + "/32")
		if err := netlink.AddrAdd(lo, addr); err != nil {
			return srvs, err
		}
		ln, err := net.Listen("tcp", a+":8080")
		if err != nil {
			return srvs, err
		}
		page := "page of " + a
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, page) })}
		go srv.Serve(ln)
		srvs = append(srvs, srv)
	}
	return srvs, nil
}
