package daemon

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/vmmctl"
)

// networkTemplate builds a template with "network": true.
func (c *client) networkTemplate(kernel string) store.Template {
	c.t.Helper()
	var tp store.Template
	c.ok(201, "POST", "/v1/templates", map[string]any{"kernel": kernel, "mem_mib": 128, "cpus": 1, "network": true}, &tp)
	if tp.Status != store.TemplateReady || !tp.Network {
		c.t.Fatalf("template %+v", tp)
	}
	return tp
}

func (c *client) setSecret(name, value string) {
	c.t.Helper()
	st, b := c.do("PUT", "/v1/secrets/"+name, []byte(value))
	if st != 201 && st != 200 {
		c.t.Fatalf("PUT secret %s: %d %s", name, st, b)
	}
}

func readJSONFile(t *testing.T, path string, v any) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v: %s", path, err, b)
	}
	return fi.Mode().Perm()
}

func TestNetworkTemplateArgs(t *testing.T) {
	state := t.TempDir()
	f := newFakeLauncher(t)
	hosts := filepath.Join(t.TempDir(), "hosts")
	td := startDaemon(t, state, f, func(c *Config) {
		c.EgressHosts, c.DNSUpstream, c.UpstreamCA = hosts, "10.0.0.53:53", "/etc/ca.pem"
	})
	c := td.client(t, "alice")

	plain := c.template(fakeKernel(t))
	if r := f.lastRun; plain.Network || r.PrivateNet || r.Tap != "" || r.Egress != "" {
		t.Fatalf("a template without network: %+v", r)
	}
	tp := c.networkTemplate(fakeKernel(t))
	dir := filepath.Join(state, "tenants", "alice", "templates", tp.ID)
	got := f.lastRun
	want := got
	want.PrivateNet, want.Tap, want.HostIP, want.GuestIP = true, "wt0", "10.200.0.1/24", "10.200.0.2"
	want.Egress, want.Audit = filepath.Join(dir, "egress-template.json"), filepath.Join(dir, "egress.jsonl")
	want.Hosts, want.DNSUpstream, want.UpstreamCA, want.UpstreamAllow, want.WildcardCredentials = hosts, "10.0.0.53:53", "/etc/ca.pem", "", false
	if !reflect.DeepEqual(got, want) {
		t.Errorf("network settings\n got %+v\nwant %+v", got, want)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "egress-template.json")); err != nil || strings.TrimSpace(string(b)) != "{}" {
		t.Errorf("the template's policy: %q %v", b, err)
	}
	var rec store.Template
	c.ok(200, "GET", "/v1/templates/"+tp.ID, nil, &rec)
	if !rec.Network {
		t.Errorf("the record lost network: %+v", rec)
	}
}

const testPolicy = `{"domains":[{"name":"api.example.com","proto":"tcp","ports":"443"}],` +
	`"credentials":[{"secret":"API_KEY","hosts":["api.example.com"]}]}`

func TestNetworkCreate(t *testing.T) {
	td, f, c := aliceDaemon(t)
	state := td.state
	c.setSecret("API_KEY", "value-of-api-key")
	c.setSecret("OTHER", "value-of-other")
	c.setSecret("UNUSED", "value-of-unused")

	// Without network: the restore's arguments are exactly as before.
	plain := c.template(fakeKernel(t))
	sb := c.create(plain.ID)
	want := vmmctl.Restore{Snapshot: plain.Snapshot, Lazy: true, API: sb.API, Vsock: sb.Vsock, Console: sb.Console}
	if got := f.lastRestoreSpec; !reflect.DeepEqual(got, want) {
		t.Errorf("restore without network\n got %+v\nwant %+v", got, want)
	}
	if _, err := os.Stat(filepath.Join(state, "tenants", "alice", "sandboxes", sb.ID, "secrets.json")); err == nil {
		t.Error("a sandbox without network has a secrets.json")
	}

	tp := c.networkTemplate(fakeKernel(t))
	var nsb store.Sandbox
	c.ok(201, "POST", "/v1/sandboxes", map[string]any{"template": tp.ID, "egress": json.RawMessage(testPolicy),
		"secrets": []string{"API_KEY", "OTHER"}}, &nsb)
	if !nsb.Network || nsb.Status != store.Running {
		t.Fatalf("sandbox %+v", nsb)
	}
	dir := filepath.Join(state, "tenants", "alice", "sandboxes", nsb.ID)
	checkArgs := func(policy string) {
		t.Helper()
		r := f.lastRestoreSpec
		if r.Snapshot != tp.Snapshot {
			t.Errorf("restored %q, want the template's snapshot", r.Snapshot)
		}
		for what, p := range map[string][2]string{"secrets": {r.Secrets, "secrets.json"}, "audit": {r.Audit, "egress.jsonl"}, "egress": {r.Egress, "egress.json"}} {
			if p[0] != filepath.Join(dir, p[1]) {
				t.Errorf("%s %q, want %s in %+v", what, p[0], p[1], r)
			}
		}
		var sec map[string]string
		if mode := readJSONFile(t, filepath.Join(dir, "secrets.json"), &sec); mode != 0o600 {
			t.Errorf("secrets.json mode %v", mode)
		}
		if want := map[string]string{"API_KEY": "value-of-api-key", "OTHER": "value-of-other"}; !reflect.DeepEqual(sec, want) {
			t.Errorf("secrets.json %v, want %v", sec, want)
		}
		var got, wantPol any
		if mode := readJSONFile(t, filepath.Join(dir, "egress.json"), &got); mode != 0o600 {
			t.Errorf("egress.json mode %v", mode)
		}
		json.Unmarshal([]byte(policy), &wantPol)
		if !reflect.DeepEqual(got, wantPol) {
			t.Errorf("egress.json %v, want %v", got, wantPol)
		}
	}
	checkArgs(testPolicy)

	// Every start writes them again: a resume from disk, after the files
	// went.
	os.Remove(filepath.Join(dir, "secrets.json"))
	os.Remove(filepath.Join(dir, "egress.json"))
	c.suspendResume(nsb.ID)
	if f.lastRestoreSpec.Snapshot == tp.Snapshot {
		t.Fatal("resume restored the template")
	}
	if got := f.lastRestoreSpec.Secrets; got != filepath.Join(dir, "secrets.json") {
		t.Errorf("resume: secrets %q", got)
	}
	var sec map[string]string
	readJSONFile(t, filepath.Join(dir, "secrets.json"), &sec)
	if len(sec) != 2 {
		t.Errorf("resume: secrets.json %v", sec)
	}

	// A changed secret reaches the running sandbox's file.
	c.setSecret("API_KEY", "rotated")
	readJSONFile(t, filepath.Join(dir, "secrets.json"), &sec)
	if sec["API_KEY"] != "rotated" {
		t.Errorf("after rotation: %v", sec)
	}

	// Network without a policy: the template's (none passed).
	c.ok(201, "POST", "/v1/sandboxes", map[string]any{"template": tp.ID}, &nsb)
	if r := f.lastRestoreSpec; r.Egress != "" || r.Secrets == "" || r.Audit == "" {
		t.Errorf("network without a policy: %+v", r)
	}
}

func TestNetworkValidation(t *testing.T) {
	f := newFakeLauncher(t)
	td := startDaemon(t, t.TempDir(), f)
	c := td.client(t, "alice")
	c.setSecret("API_KEY", "v1")
	c.setSecret("OTHER", "v2")
	plain := c.template(fakeKernel(t))
	tp := c.networkTemplate(fakeKernel(t))
	for _, tc := range []struct {
		name    string
		tpl     string
		egress  string
		secrets []string
		status  int
		msg     string
	}{
		{"egress without network", plain.ID, `{}`, nil, 400, `egress needs a template built with "network": true`},
		{"unparsable policy", tp.ID, `{"rules":[{"cidr":"not-a-cidr"}]}`, nil, 400, "egress: "},
		{"unknown policy field", tp.ID, `{"allow":[]}`, nil, 400, "egress: "},
		{"credential not in secrets", tp.ID, testPolicy, []string{"OTHER"}, 400, `credential secret "API_KEY" is not among the sandbox's secrets`},
		{"credential secret missing", tp.ID, strings.ReplaceAll(testPolicy, "API_KEY", "GONE"), []string{"GONE"}, 400, `secret "GONE" not found`},
		{"unknown secret", tp.ID, "", []string{"API_KEY", "nope"}, 400, `secret "nope" not found`},
		{"unknown secret without network", plain.ID, "", []string{"nope"}, 400, `secret "nope" not found`},
	} {
		req := map[string]any{"template": tc.tpl, "secrets": tc.secrets}
		if tc.egress != "" {
			req["egress"] = json.RawMessage(tc.egress)
		}
		st, b := c.do("POST", "/v1/sandboxes", req)
		var e wire.Error
		json.Unmarshal(b, &e)
		if st != tc.status || !strings.Contains(e.Error, tc.msg) {
			t.Errorf("%s: %d %q, want %d %q", tc.name, st, e.Error, tc.status, tc.msg)
		}
	}
	// The secrets API's own checks.
	for _, tc := range []struct {
		name, path string
		body       []byte
		status     int
	}{
		{"bad name", "/v1/secrets/1abc", []byte("v"), 400},
		{"bad name dash", "/v1/secrets/a-b", []byte("v"), 400},
		{"empty", "/v1/secrets/EMPTY", []byte{}, 400},
		{"not UTF-8", "/v1/secrets/BIN", []byte{0xff, 0xfe}, 400},
		{"too large", "/v1/secrets/BIG", make([]byte, MaxSecretBytes+1), 413},
		{"largest", "/v1/secrets/MAX", []byte(strings.Repeat("x", MaxSecretBytes)), 201},
	} {
		if st, b := c.do("PUT", tc.path, tc.body); st != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.name, st, b, tc.status)
		}
	}
}

func TestSecretsTenantIsolation(t *testing.T) {
	state := t.TempDir()
	f := newFakeLauncher(t)
	td := startDaemon(t, state, f)
	a, b := td.client(t, "alice"), td.client(t, "bob")
	a.setSecret("TOKEN", "alice-token-value")
	var l wire.SecretList
	a.ok(200, "GET", "/v1/secrets", nil, &l)
	if !reflect.DeepEqual(l.Names, []string{"TOKEN"}) {
		t.Errorf("alice's secrets: %v", l.Names)
	}
	b.ok(200, "GET", "/v1/secrets", nil, &l)
	if l.Names == nil || len(l.Names) != 0 {
		t.Errorf("bob sees %v", l.Names)
	}
	if st, body := b.do("GET", "/v1/secrets/TOKEN", nil); st < 400 || strings.Contains(string(body), "alice-token-value") {
		t.Errorf("bob reads alice's secret: %d %s", st, body)
	}
	if st, _ := b.do("DELETE", "/v1/secrets/TOKEN", nil); st != 404 {
		t.Errorf("bob deletes alice's secret: %d", st)
	}
	tp := b.networkTemplate(fakeKernel(t))
	pol := `{"credentials":[{"secret":"TOKEN","hosts":["x.example.com"]}]}`
	if st, body := b.do("POST", "/v1/sandboxes", map[string]any{"template": tp.ID, "egress": json.RawMessage(pol),
		"secrets": []string{"TOKEN"}}); st != 400 || !strings.Contains(string(body), `secret \"TOKEN\" not found`) {
		t.Errorf("bob's create naming alice's secret: %d %s", st, body)
	}
	// Bob's own secret of the same name is his, and alice's is unchanged.
	b.setSecret("TOKEN", "bob-token-value")
	var sec map[string]string
	if mode := readJSONFile(t, filepath.Join(state, "tenants", "alice", "secrets.json"), &sec); mode != 0o600 || sec["TOKEN"] != "alice-token-value" {
		t.Errorf("alice's file: %v %v", mode, sec)
	}
	readJSONFile(t, filepath.Join(state, "tenants", "bob", "secrets.json"), &sec)
	if sec["TOKEN"] != "bob-token-value" {
		t.Errorf("bob's file: %v", sec)
	}
	var del wire.Secret
	a.ok(200, "DELETE", "/v1/secrets/TOKEN", nil, &del)
	b.ok(200, "GET", "/v1/secrets", nil, &l)
	if !reflect.DeepEqual(l.Names, []string{"TOKEN"}) {
		t.Errorf("alice's delete took bob's: %v", l.Names)
	}
}

// No answer of the API, and no line of its audit log, carries a value.
func TestSecretValuesNeverShown(t *testing.T) {
	td, _, c := aliceDaemon(t)
	state := td.state
	const value = "sUpEr-SeCrEt-VaLuE-42"
	var bodies []string
	call := func(method, path string, body any) []byte {
		t.Helper()
		st, b := c.do(method, path, body)
		if st >= 300 {
			t.Fatalf("%s %s: %d %s", method, path, st, b)
		}
		bodies = append(bodies, string(b))
		return b
	}
	call("PUT", "/v1/secrets/API_KEY", []byte(value))
	call("PUT", "/v1/secrets/API_KEY", []byte(value))
	call("GET", "/v1/secrets", nil)
	tp := c.networkTemplate(fakeKernel(t))
	var sb store.Sandbox
	json.Unmarshal(call("POST", "/v1/sandboxes", map[string]any{"template": tp.ID, "egress": json.RawMessage(testPolicy),
		"secrets": []string{"API_KEY"}}), &sb)
	call("GET", "/v1/sandboxes/"+sb.ID, nil)
	call("GET", "/v1/sandboxes", nil)
	call("GET", "/v1/sandboxes/"+sb.ID+"/egress", nil)
	call("PUT", "/v1/sandboxes/"+sb.ID+"/egress", []byte(testPolicy))
	call("POST", "/v1/sandboxes/"+sb.ID+"/pause?to_disk=true", nil)
	call("POST", "/v1/sandboxes/"+sb.ID+"/resume", nil)
	call("DELETE", "/v1/secrets/API_KEY", nil)
	for _, b := range bodies {
		if strings.Contains(b, value) {
			t.Errorf("an answer carries the value: %s", b)
		}
	}
	audit := td.audit.String()
	if strings.Contains(audit, value) {
		t.Errorf("the audit log carries the value: %s", audit)
	}
	if !strings.Contains(audit, `"path":"/v1/secrets/API_KEY"`) || !strings.Contains(audit, `"secret":"API_KEY"`) {
		t.Errorf("the secrets calls are not in the audit log: %s", audit)
	}
	// The deleted secret is gone from the running sandbox's file too.
	var sec map[string]string
	readJSONFile(t, filepath.Join(state, "tenants", "alice", "sandboxes", sb.ID, "secrets.json"), &sec)
	if len(sec) != 0 {
		t.Errorf("after the delete the sandbox still has %v", sec)
	}
}

func TestEgressForwarding(t *testing.T) {
	td, f, c := aliceDaemon(t)
	state := td.state
	c.setSecret("API_KEY", "v")
	c.setSecret("OTHER", "w")
	tp := c.networkTemplate(fakeKernel(t))
	sb := c.createWith(map[string]any{"template": tp.ID, "egress": json.RawMessage(testPolicy), "secrets": []string{"API_KEY"}})

	samePolicy := func(got json.RawMessage, want string) bool {
		var g, w any
		json.Unmarshal(got, &g)
		json.Unmarshal([]byte(want), &w)
		return reflect.DeepEqual(g, w)
	}
	var rep wire.EgressReply
	c.ok(200, "GET", "/v1/sandboxes/"+sb.ID+"/egress", nil, &rep)
	if !samePolicy(rep.Policy, testPolicy) || !strings.Contains(string(rep.Stats), "passed") || rep.Audit == "" {
		t.Errorf("GET egress: %+v", rep)
	}

	newPol := `{"rules":[{"cidr":"192.0.2.0/24","proto":"tcp","ports":"80"}]}`
	c.ok(200, "PUT", "/v1/sandboxes/"+sb.ID+"/egress", []byte(newPol), &rep)
	if !samePolicy(rep.Policy, newPol) {
		t.Errorf("PUT egress answered %s", rep.Policy)
	}
	if vm := f.vm(c.get(sb.ID).PID); !samePolicy(vm.egress, newPol) {
		t.Errorf("the VMM has %s", vm.egress)
	}
	if rec := c.get(sb.ID); !samePolicy(rec.Egress, newPol) {
		t.Errorf("the record has %s", rec.Egress)
	}
	dir := filepath.Join(state, "tenants", "alice", "sandboxes", sb.ID)
	if b, _ := os.ReadFile(filepath.Join(dir, "egress.json")); !samePolicy(b, newPol) {
		t.Errorf("egress.json: %s", b)
	}
	// A later restore starts with it.
	c.suspendResume(sb.ID)
	if vm := f.vm(c.get(sb.ID).PID); !samePolicy(vm.egress, newPol) {
		t.Errorf("after a resume the VMM has %s", vm.egress)
	}

	// A PUT is checked like a create, against the sandbox's secrets.
	for _, tc := range []struct {
		body string
		msg  string
	}{
		{`{"bogus":true}`, "egress: "},
		{strings.ReplaceAll(testPolicy, "API_KEY", "OTHER"), `credential secret "OTHER" is not among the sandbox's secrets`},
		{`null`, "must be a policy"},
	} {
		st, b := c.do("PUT", "/v1/sandboxes/"+sb.ID+"/egress", []byte(tc.body))
		if st != 400 || !strings.Contains(string(b), strings.ReplaceAll(tc.msg, `"`, `\"`)) {
			t.Errorf("PUT %s: %d %s, want 400 %q", tc.body, st, b, tc.msg)
		}
	}
	if rec := c.get(sb.ID); !samePolicy(rec.Egress, newPol) {
		t.Errorf("a refused PUT changed the record: %s", rec.Egress)
	}

	// A sandbox without network has no egress endpoint; another tenant's
	// is not found.
	plain := c.create(c.template(fakeKernel(t)).ID)
	for _, m := range []string{"GET", "PUT"} {
		st, b := c.do(m, "/v1/sandboxes/"+plain.ID+"/egress", []byte(newPol))
		if st != 404 || !strings.Contains(string(b), "has no network") {
			t.Errorf("%s egress without network: %d %s", m, st, b)
		}
	}
	if st, _ := td.client(t, "bob").do("GET", "/v1/sandboxes/"+sb.ID+"/egress", nil); st != 404 {
		t.Errorf("bob's GET of alice's egress: %d", st)
	}
	// A stopped sandbox's VMM cannot answer.
	c.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/pause?to_disk=true", nil, nil)
	if st, _ := c.do("GET", "/v1/sandboxes/"+sb.ID+"/egress", nil); st != 409 {
		t.Errorf("GET egress of a suspended sandbox: %d", st)
	}
}

// TestEgressDeniedMetric: warren_egress_denied_packets_total sums the
// network VMMs' filter counts and stays monotonic when a sandbox gets a
// new VMM (whose filter counts from zero) and when it is deleted.
func TestEgressDeniedMetric(t *testing.T) {
	td, f, c := aliceDaemon(t)
	tp := c.networkTemplate(fakeKernel(t))
	a, b := c.create(tp.ID), c.create(tp.ID)
	c.create(c.template(fakeKernel(t)).ID) // no network: never asked
	f.vm(a.PID).denied.Store(5)
	f.vm(b.PID).denied.Store(7)
	if got := td.EgressDenied(); got != 12 {
		t.Fatalf("total %v, want 12", got)
	}
	// a's VMM is replaced (pause to disk, resume): its new filter starts
	// at 0 and counts 2 more; the total keeps the old 5.
	c.suspendResume(a.ID)
	f.vm(c.get(a.ID).PID).denied.Store(2)
	if got := td.EgressDenied(); got != 14 {
		t.Fatalf("after a new VMM: total %v, want 14", got)
	}
	c.ok(200, "DELETE", "/v1/sandboxes/"+b.ID, nil, nil)
	if got := td.EgressDenied(); got != 14 {
		t.Fatalf("after a delete: total %v, want 14", got)
	}
}
