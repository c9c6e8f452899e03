package daemon

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"k8s.io/apimachinery/pkg/types"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/warrenvm/warren/fleet/api/v1alpha1"
	"github.com/warrenvm/warren/fleet/controller"
	"github.com/warrenvm/warren/fleet/fleettest"
	hc "github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/kube"
	"github.com/warrenvm/warren/internal/testtls"
)

// readmeHosts are the hosts TestE2EReadmeFleet starts from the README's
// one warren-hostd line ("on each host"), so that a resume may land on
// either.
var readmeHosts = []string{"h1", "h2"}

// TestE2EReadmeFleet runs README.md's fleet block as written
// (fleettest.ReadmeFleetRun: every kubectl line with kubectl, the admin's
// setup as the admin, the tenant's lines as alice) against a real
// kube-apiserver, SeaweedFS and warren-hostd hosts with real VMs. Only the
// daemon lines are the test's own: the controller runs in this process
// as the README's controller user (with the README's RBAC only), and the
// warren-hostd line starts two hosts with the README's flags, each value
// replaced by the test's (a flag the test does not know fails it; one
// warren-hostd lacks fails its start). After each line, besides
// ReadmeFleetRun's checks: the hosts appear in `kubectl get warrenhosts`
// (the "To add a host" paragraph); the Sandbox agent-1 runs on a host, its
// agentEndpoint answers over the host's --listen HTTPS with a --tokens
// token; get shows it Running there; Suspended uploads it to the object
// store and its host lets it go; Running restores it on a host with its
// memory intact (a file in its RAM-backed root).
func TestE2EReadmeFleet(t *testing.T) {
	warren, _, _ := e2ePaths(t)
	fleettest.Kubectl(t)
	_, step := e2eState(t, "readme-fleet-")
	users := []fleettest.User{{Name: "controller", Groups: []string{"warren:controllers"}}, {Name: "alice"}}
	for _, h := range readmeHosts {
		users = append(users, fleettest.User{Name: "host-" + h, Groups: []string{"warren:hosts"}})
	}
	k := fleettest.StartKube(t, users...)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c, err := ctrlclient.New(k.Config, ctrlclient.Options{Scheme: controller.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, ctx: ctx, kube: k, c: c, hosts: map[string]*fleetHost{}, step: step, warr: warren}
	f.s3 = fleettest.StartS3(t)
	f.s3creds = f.s3.CredentialsFile(t)
	step("apiserver and object store up")
	rh := newReadmeHosts(t, f)
	const marker = "written-before-suspend"
	var name, onHost string // the README's Sandbox, and its host before the suspend
	var r *fleettest.ReadmeFleetRun
	r = &fleettest.ReadmeFleetRun{Kube: k,
		Users: map[string]string{"controller.kubeconfig": "controller", "alice.kubeconfig": "alice"},
		Controller: func(c fleettest.Command, user string, cc controller.Config) {
			fleettest.StartController(t, k.ConfigFor(user), cc)
			step("line %d: the controller runs as %s (K=%d)", c.Line, user, cc.K)
		},
		Host: func(c fleettest.Command) {
			for _, name := range readmeHosts {
				rh.start(c, name)
			}
			out, err := k.RunKubectl(t, fleettest.AdminUser, t.TempDir(), "", "get", "warrenhosts")
			if err != nil {
				t.Fatal(err)
			}
			_, rows := fleettest.ParseTable(out)
			var listed []string
			for _, row := range rows {
				listed = append(listed, row["NAME"])
			}
			if !slices.Equal(listed, readmeHosts) {
				t.Fatalf("kubectl get warrenhosts after %v joined lists %q:\n%s", readmeHosts, listed, out)
			}
			step("line %d: hosts %v joined with the README's flags; kubectl get warrenhosts lists them", c.Line, readmeHosts)
		},
		Check: func(s fleettest.ReadmeStep, c fleettest.Command, out string) {
			ns, _ := c.Flag("-n")
			switch s {
			case fleettest.StepApply:
				if sbs := r.Sandboxes(); len(sbs) != 1 {
					t.Fatalf("line %d: the README makes Sandboxes %q; the test follows one", c.Line, sbs)
				} else {
					name = sbs[0]
				}
				f.waitReady(ns, 8*time.Minute, name)
				sb := f.sandbox(ns, name)
				rh.checkEndpoint(ns, sb)
				f.exec(ns, sb, "echo "+marker+" > /root/readme")
				onHost = sb.Status.HostName
				step("line %d: %s runs on %s; its agentEndpoint %s answers", c.Line, name, sb.Status.HostName, sb.Status.AgentEndpoint)
			case fleettest.StepGet:
				_, rows := fleettest.ParseTable(out)
				sb := f.sandbox(ns, name)
				if len(rows) != 1 || rows[0]["PHASE"] != string(v1.SandboxRunning) || rows[0]["HOST"] != sb.Status.HostName || sb.Status.HostName == "" {
					t.Fatalf("line %d: want %s Running on its host:\n%s", c.Line, name, out)
				}
			case fleettest.StepSuspend:
				from := onHost
				f.eventually(3*time.Minute, name+" suspended to the object store", func() (bool, string) {
					sb := f.sandbox(ns, name)
					return sb.Status.Phase == v1.SandboxSuspended && strings.HasPrefix(sb.Status.Snapshot, "s3://"+rh.bucket+"/"+ns+"/") &&
						sb.Labels[v1.LabelHost] == "" && sb.Status.HostName == "", fmt.Sprintf("%v %+v", sb.Labels, sb.Status)
				})
				ref := f.sandbox(ns, name).Status.Snapshot
				rh.checkUploaded(ns, ref)
				rh.checkGone(from, ns, name)
				step("line %d: %s suspended from %s to %s", c.Line, name, from, ref)
			case fleettest.StepResume:
				f.eventually(4*time.Minute, name+" resumed on a host", func() (bool, string) {
					sb := f.sandbox(ns, name)
					return isReady(sb) && sb.Status.HostName != "", fmt.Sprintf("%+v", sb.Status)
				})
				sb := f.sandbox(ns, name)
				if got := f.exec(ns, sb, "cat /root/readme"); got != marker+"\n" {
					t.Fatalf("line %d: %s resumed on %s: /root/readme holds %q, want %q", c.Line, name, sb.Status.HostName, got, marker)
				}
				rh.checkEndpoint(ns, sb)
				step("line %d: %s resumed on %s from the object store, its memory intact", c.Line, name, sb.Status.HostName)
			}
		}}
	r.Run(t)
}

// readmeHostEnv is what the README's warren-hostd flags become in
// TestE2EReadmeFleet: the TLS material and tokens of --listen, each host's
// port, and the bucket the README names.
type readmeHostEnv struct {
	f              *fleet
	cert, key, tok string // --tls-cert, --tls-key and --tokens files
	token          string // the token of tenant team-a in tok
	caPEM          []byte // signs cert, for "localhost"
	port           map[string]int
	bucket         string
}

func newReadmeHosts(t *testing.T, f *fleet) *readmeHostEnv {
	dir := t.TempDir()
	e := &readmeHostEnv{f: f, cert: filepath.Join(dir, "c.pem"), key: filepath.Join(dir, "k.pem"),
		tok: filepath.Join(dir, "tokens.json"), port: map[string]int{}}
	var cert tls.Certificate
	e.caPEM, cert = testtls.Upstream(t, "localhost")
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	var r [16]byte
	rand.Read(r[:])
	e.token = hex.EncodeToString(r[:])
	tokens, _ := json.Marshal(map[string]string{e.token: "team-a"})
	for p, b := range map[string][]byte{
		e.cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}),
		e.key:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		e.tok:  tokens,
	} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// start starts host name from the README's warren-hostd line c: each of
// its flags with the test's value (the README's own where it names no
// local resource: the bucket), plus --kube-s3-insecure (the test's
// SeaweedFS speaks plain HTTP on loopback).
func (e *readmeHostEnv) start(c fleettest.Command, name string) {
	f, t := e.f, e.f.t
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	e.port[name] = port
	test := map[string]string{
		"--guest-dir":           filepath.Join(repoRoot(t), "build"),
		"--kube":                f.kube.Kubeconfig(t, "host-"+name),
		"--kube-host":           name,
		"--kube-endpoint":       fmt.Sprintf("https://localhost:%d", port),
		"--listen":              fmt.Sprintf("127.0.0.1:%d", port),
		"--tokens":              e.tok,
		"--tls-cert":            e.cert,
		"--tls-key":             e.key,
		"--kube-s3":             f.s3.Endpoint,
		"--kube-s3-bucket":      "", // the README's
		"--kube-s3-credentials": f.s3creds,
	}
	var args []string
	for i := 1; i < len(c.Args); i++ {
		flag, val, eq := strings.Cut(c.Args[i], "=")
		if !eq && i+1 < len(c.Args) {
			i++
			val = c.Args[i]
		}
		v, ok := test[flag]
		if !ok {
			t.Fatalf("line %d: warren-hostd flag %s: the test has no value for it (readme_fleet_e2e_test.go)", c.Line, flag)
		}
		if v == "" {
			v = val
		}
		if flag == "--kube-s3-bucket" {
			e.bucket = v
		}
		args = append(args, flag, v)
	}
	if e.bucket == "" {
		e.bucket = "warren-snapshots" // warren-hostd's default
	}
	args = append(args, "--kube-s3-insecure")
	state, err := os.MkdirTemp("", "readme-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	h := &fleetHost{name: name, state: state, args: args}
	f.hosts[name] = h
	f.start(h)
	t.Cleanup(func() {
		f.kill(h)
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(state, "hostd-1.log")); err == nil {
				t.Logf("%s hostd-1.log:\n%s", name, lastLines(string(b), 60))
			}
		}
	})
	f.eventually(time.Minute, name+" registered", func() (bool, string) {
		var wh v1.WarrenHost
		err := f.c.Get(f.ctx, types.NamespacedName{Name: name}, &wh)
		return err == nil, fmt.Sprint(err)
	})
}

// checkEndpoint GETs sb's agentEndpoint over HTTPS (trusting the test's
// CA) with the tenant's --tokens token, as a client off the host would,
// and wants the sandbox.
func (e *readmeHostEnv) checkEndpoint(ns string, sb *v1.Sandbox) {
	t := e.f.t
	t.Helper()
	want := fmt.Sprintf("https://localhost:%d/v1/sandboxes/%s", e.port[sb.Status.HostName], sb.Status.SandboxID)
	if sb.Status.AgentEndpoint != want {
		t.Fatalf("%s/%s: agentEndpoint %q, want %q", ns, sb.Name, sb.Status.AgentEndpoint, want)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(e.caPEM)
	cl := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	req, _ := http.NewRequestWithContext(e.f.ctx, http.MethodGet, sb.Status.AgentEndpoint, nil)
	req.Header.Set("Authorization", "Bearer "+e.token)
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var got struct {
		ID string `json:"id"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &got) != nil || got.ID != sb.Status.SandboxID {
		t.Fatalf("GET %s: %s: %s", sb.Status.AgentEndpoint, resp.Status, body)
	}
}

// checkUploaded wants the bundle ref (s3://BUCKET/TENANT/MANIFEST) of
// tenant ns in the README's bucket: its manifest object, and blobs
// (fleet/objstore's layout).
func (e *readmeHostEnv) checkUploaded(ns, ref string) {
	t := e.f.t
	t.Helper()
	manifest, ok := strings.CutPrefix(ref, "s3://"+e.bucket+"/"+ns+"/")
	if !ok || manifest == "" || strings.Contains(manifest, "/") {
		t.Fatalf("snapshot %q: not a bundle of tenant %s in bucket %s", ref, ns, e.bucket)
	}
	cl := e.f.s3.Client(t)
	if _, err := cl.StatObject(e.f.ctx, e.bucket, ns+"/manifests/"+manifest, minio.StatObjectOptions{}); err != nil {
		t.Fatalf("snapshot %s: its manifest: %v", ref, err)
	}
	n := 0
	for o := range cl.ListObjects(e.f.ctx, e.bucket, minio.ListObjectsOptions{Prefix: ns + "/blobs/", Recursive: true}) {
		if o.Err != nil {
			t.Fatalf("list s3://%s/%s/blobs/: %v", e.bucket, ns, o.Err)
		}
		n++
	}
	if n == 0 {
		t.Fatalf("snapshot %s: s3://%s/%s/blobs/ holds no object", ref, e.bucket, ns)
	}
}

// checkGone wants host to hold no VM of Sandbox ns/name any more.
func (e *readmeHostEnv) checkGone(host, ns, name string) {
	t := e.f.t
	t.Helper()
	cl, err := hc.New(e.f.hosts[host].proc.sock, ns, "")
	if err != nil {
		t.Fatal(err)
	}
	e.f.eventually(time.Minute, host+" let "+name+" go", func() (bool, string) {
		l, err := cl.Sandboxes(e.f.ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, s := range l {
			if s.Labels[kube.LabelName] == ns+"/"+name {
				return false, host + " still holds " + s.ID
			}
		}
		return true, ""
	})
}
