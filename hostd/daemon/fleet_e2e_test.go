package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "github.com/warrenvm/warren/fleet/api/v1alpha1"
	"github.com/warrenvm/warren/fleet/controller"
	"github.com/warrenvm/warren/fleet/fleettest"
	hc "github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/kube"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/internal/kvmtest"
)

// fleet is a real kube-apiserver and etcd with Warren's CRDs and RBAC,
// the controller running in this process, and warren-hostd processes
// joined with --kube, each with its own state directory and socket.
type fleet struct {
	t     *testing.T
	ctx   context.Context
	kube  *fleettest.Kube
	c     ctrlclient.Client
	hosts map[string]*fleetHost
	step  func(string, ...any)
	warr  string
	// s3 is the fleet's object store; s3creds the hosts' credentials file.
	s3      *fleettest.S3
	s3creds string
	// net, when set, gives each host a network namespace of its own
	// (fleetOptions.net); guestDir, when set, is the hosts' --guest-dir.
	net      *fleetNet
	guestDir string
}

type fleetHost struct {
	name, state string
	proc        *hostdProc
	n           int // starts so far
	args        []string
	// ns is the host's network namespace (nil: the test's); endpoint the
	// URL of its API (--kube-endpoint), served across its link (--listen
	// at ns.addr) when ns is set.
	ns       *hostNS
	endpoint string
}

// fleetOptions are startFleetOn's choices; the zero value is startFleet's.
type fleetOptions struct {
	// net makes the fleet's network: the apiserver and the object store
	// listen on its bridge's address, and each host joins from a network
	// namespace of its own, reaching them across its veth pair.
	net *fleetNet
	// s3 starts the object store although warren is "" (fake hosts).
	s3 bool
}

func startFleet(t *testing.T, warren string, step func(string, ...any), cc controller.Config) *fleet {
	return startFleetOn(t, warren, step, cc, fleetOptions{})
}

// startFleetOn is startFleet with fo.
func startFleetOn(t *testing.T, warren string, step func(string, ...any), cc controller.Config, fo fleetOptions) *fleet {
	ctrl.SetLogger(logr.Discard())
	var ko fleettest.KubeOptions
	s3o := fleettest.S3Options{}
	if fo.net != nil {
		ko.Addr, s3o.Addr, s3o.TLS = fo.net.gw, fo.net.gw, true
	}
	k := fleettest.StartKubeWith(t, ko,
		fleettest.User{Name: "host-h1", Groups: []string{"warren:hosts"}},
		fleettest.User{Name: "host-h2", Groups: []string{"warren:hosts"}},
		fleettest.User{Name: "host-h3", Groups: []string{"warren:hosts"}},
		fleettest.User{Name: "controller", Groups: []string{"warren:controllers"}},
		fleettest.User{Name: "alice"}, fleettest.User{Name: "bob"})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	root := repoRoot(t)
	crds, _ := filepath.Glob(filepath.Join(root, "fleet/config/crd/*.yaml"))
	if err := fleettest.InstallCRDs(ctx, k.Config, crds...); err != nil {
		t.Fatal(err)
	}
	rbac := []string{"fleet/config/rbac/host/role.yaml", "fleet/config/rbac/controller/role.yaml",
		"fleet/config/rbac/bindings.yaml", "fleet/config/rbac/tenant.yaml"}
	for i := range rbac {
		rbac[i] = filepath.Join(root, rbac[i])
	}
	if err := fleettest.Apply(ctx, k.Config, rbac...); err != nil {
		t.Fatal(err)
	}
	c, err := ctrlclient.New(k.Config, ctrlclient.Options{Scheme: controller.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, ctx: ctx, kube: k, c: c, hosts: map[string]*fleetHost{}, step: step, warr: warren, net: fo.net}
	if warren != "" || fo.s3 {
		// The fleet's object store (a real SeaweedFS S3 server) and the
		// hosts' credentials for it.
		f.s3 = fleettest.StartS3With(t, s3o)
		f.s3creds = filepath.Join(t.TempDir(), "s3.json")
		b, _ := json.Marshal(map[string]string{"access_key": f.s3.AccessKey, "secret_key": f.s3.SecretKey, "region": f.s3.Region})
		if err := os.WriteFile(f.s3creds, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if s3o.TLS {
			// The hosts (Go programs: crypto/x509 reads SSL_CERT_FILE)
			// trust the store's CA; they start after this, and inherit it.
			t.Setenv("SSL_CERT_FILE", f.s3.CAFile)
		}
	}
	for _, ns := range []string{v1.LeaseNamespace, "team-a", "team-b"} {
		f.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	for ns, user := range map[string]string{"team-a": "alice", "team-b": "bob"} {
		f.create(&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: user + "-warren"},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "warren-tenant"},
			Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}}})
	}
	// The controller, as a user of group warren:controllers (its RBAC is
	// the generated role's, nothing more).
	opts := controller.ManagerOptions()
	opts.Metrics = metricsserver.Options{BindAddress: "0"}
	opts.Controller.SkipNameValidation = ptr.To(true)
	mgr, err := ctrl.NewManager(k.ConfigFor("controller"), opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := controller.Setup(mgr, cc); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return f
}

func (f *fleet) create(o ctrlclient.Object) {
	f.t.Helper()
	if err := f.c.Create(f.ctx, o); err != nil {
		f.t.Fatalf("create %T %s: %v", o, o.GetName(), err)
	}
}

// join starts warren-hostd for host name with --kube. With the fleet's
// net, the host runs in a network namespace of its own and serves its
// API over HTTPS at its address there (--listen, its --kube-endpoint),
// reaching the apiserver and the object store (over HTTPS) at the
// bridge's address.
func (f *fleet) join(name string, cpus int) *fleetHost {
	t := f.t
	t.Helper()
	state, err := os.MkdirTemp("", "fleet-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	h := &fleetHost{name: name, state: state, endpoint: "http://" + name + ".test:7443"}
	s3 := []string{"--kube-s3", f.s3.Endpoint, "--kube-s3-insecure"}
	if f.net != nil {
		h.ns = f.net.add(name)
		cert, tokens, _ := f.net.tlsFiles()
		listen := net.JoinHostPort(h.ns.addr.String(), "7443")
		h.endpoint = "https://" + listen
		h.args = append(h.args, "--listen", listen, "--tokens", tokens, "--tls-cert", cert.Cert, "--tls-key", cert.Key)
		s3 = []string{"--kube-s3", f.s3.TLSEndpoint}
	}
	if f.guestDir != "" {
		h.args = append(h.args, "--guest-dir", f.guestDir)
	}
	h.args = append(h.args, "--kube", f.kube.Kubeconfig(t, "host-"+name), "--kube-host", name,
		"--kube-cpus", fmt.Sprint(cpus), "--kube-memory-mib", "8192", "--kube-cpu-group", "g1", "--kube-lease", "6s",
		"--kube-endpoint", h.endpoint, "--kube-s3-credentials", f.s3creds, "--kube-s3-bucket", "fleet")
	h.args = append(h.args, s3...)
	f.hosts[name] = h
	f.start(h)
	t.Cleanup(func() {
		f.kill(h)
		if t.Failed() {
			for i := 1; i <= h.n; i++ {
				if b, err := os.ReadFile(filepath.Join(state, fmt.Sprintf("hostd-%d.log", i))); err == nil {
					t.Logf("%s hostd-%d.log:\n%s", name, i, lastLines(string(b), 60))
				}
			}
		}
	})
	return h
}

// start starts h's daemon (again), in h's network namespace if it has
// one (hostNS.do: the child inherits the starting thread's namespace).
func (f *fleet) start(h *fleetHost) {
	h.n++
	if h.ns == nil {
		h.proc = startHostd(f.t, h.state, f.warr, h.n, h.args...)
		return
	}
	h.ns.do(f.t, func() { h.proc = startHostd(f.t, h.state, f.warr, h.n, h.args...) })
}

// kill kill -9s a host's daemon and every VMM of its state.
func (f *fleet) kill(h *fleetHost) {
	if h.proc != nil && h.proc.cmd.ProcessState == nil {
		h.proc.cmd.Process.Kill()
		h.proc.cmd.Wait()
	}
	for _, p := range strayVMMs(h.state, nil) {
		stopProc(p.PID, p.StartTime, 0)
	}
}

func (f *fleet) eventually(d time.Duration, what string, cond func() (bool, string)) {
	f.t.Helper()
	fleettest.Eventually(f.t, d, 250*time.Millisecond, what, cond)
}

// request creates a one-shot request o (a SandboxSnapshot, Fork or
// Rollback) and waits up to 3 minutes until done, which reads o as
// last fetched, holds.
func (f *fleet) request(o ctrlclient.Object, what string, done func() bool) {
	f.t.Helper()
	f.create(o)
	key := ctrlclient.ObjectKeyFromObject(o)
	f.eventually(3*time.Minute, what, func() (bool, string) {
		if err := f.c.Get(f.ctx, key, o); err != nil {
			return false, err.Error()
		}
		return done(), fmt.Sprintf("%+v", o)
	})
}

func (f *fleet) sandbox(ns, name string) *v1.Sandbox {
	f.t.Helper()
	var sb v1.Sandbox
	if err := f.c.Get(f.ctx, types.NamespacedName{Namespace: ns, Name: name}, &sb); err != nil {
		f.t.Fatalf("get sandbox %s/%s: %v", ns, name, err)
	}
	return &sb
}

func isReady(sb *v1.Sandbox) bool {
	return meta.IsStatusConditionTrue(sb.Status.Conditions, v1.ConditionReady)
}

// waitReady waits until every named sandbox of ns is Ready.
func (f *fleet) waitReady(ns string, d time.Duration, names ...string) {
	f.t.Helper()
	f.eventually(d, fmt.Sprintf("%d sandboxes ready", len(names)), func() (bool, string) {
		var not []string
		for _, n := range names {
			if sb := f.sandbox(ns, n); !isReady(sb) {
				c := meta.FindStatusCondition(sb.Status.Conditions, v1.ConditionReady)
				not = append(not, fmt.Sprintf("%s %s %v", n, sb.Status.Phase, c))
			}
		}
		return len(not) == 0, strings.Join(not, "; ")
	})
}

// exec runs sh -c script in a sandbox through its host's daemon.
func (f *fleet) exec(ns string, sb *v1.Sandbox, script string) string {
	f.t.Helper()
	h := f.hosts[sb.Status.HostName]
	if h == nil {
		f.t.Fatalf("sandbox %s on unknown host %q", sb.Name, sb.Status.HostName)
	}
	cl, err := hc.New(h.proc.sock, ns, "")
	if err != nil {
		f.t.Fatal(err)
	}
	var out bytes.Buffer
	st, err := cl.Exec(f.ctx, sb.Status.SandboxID, wire.ExecRequest{Argv: []string{"sh", "-c", script}}, &out, &out)
	if err != nil || st.Exit != 0 {
		f.t.Fatalf("exec in %s on %s: %v %+v: %s", sb.Name, sb.Status.HostName, err, st, out.String())
	}
	return out.String()
}

// TestE2EFleet: three warren-hostd hosts with real VMs join a real
// kube-apiserver: nine Sandboxes spread over them and answer exec; a warm
// pool of 2 refills after a claim takes one; a host whose record claims
// more room than it has refuses what it cannot take, which the controller
// places elsewhere; a tenant's user sees only its namespace; a host
// killed with its VMMs is Lost; deleting the Sandboxes deletes their VMs.
func TestE2EFleet(t *testing.T) {
	warren, kernel, initrd := e2ePaths(t)
	_, step := e2eState(t, "fleet-")
	// Each host in a network namespace of its own, reaching the apiserver
	// and the object store across its veth pair.
	fn := newFleetNet(t)
	// K<0: compare every host, so where a sandbox goes is predictable.
	f := startFleetOn(t, warren, step, controller.Config{K: -1}, fleetOptions{net: fn})
	for _, h := range []string{"h1", "h2", "h3"} {
		f.join(h, 5)
	}
	f.eventually(time.Minute, "three hosts registered", func() (bool, string) {
		var l v1.WarrenHostList
		f.c.List(f.ctx, &l)
		return len(l.Items) == 3, fmt.Sprint(len(l.Items))
	})
	step("three hosts joined")
	f.create(&v1.SandboxTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "tiny"},
		Spec: v1.SandboxTemplateSpec{Kernel: kernel, Initramfs: initrd, MemoryMiB: 256, CPUs: 1}})
	// One sandbox first: its host builds the template and uploads it;
	// the other hosts import it from the object store for the eight
	// that follow.
	var names []string
	for i := range 9 {
		names = append(names, fmt.Sprintf("sb-%d", i))
	}
	newSandbox := func(name string) {
		f.create(&v1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name},
			Spec: v1.SandboxSpec{SandboxTemplateRef: v1.TemplateRef{Name: "tiny"}}})
	}
	newSandbox(names[0])
	f.waitReady("team-a", 5*time.Minute, names[0])
	f.eventually(2*time.Minute, "the template's snapshot recorded", func() (bool, string) {
		tpl := f.template("team-a", "tiny")
		return len(tpl.Status.Snapshots) > 0, fmt.Sprintf("%+v", tpl.Status)
	})
	for _, n := range names[1:] {
		newSandbox(n)
	}
	f.waitReady("team-a", 8*time.Minute, names...)
	f.checkTemplateShared("team-a", "tiny", f.sandbox("team-a", names[0]).Status.HostName)
	per := map[string]int{}
	for _, n := range names {
		sb := f.sandbox("team-a", n)
		per[sb.Status.HostName]++
		h := f.hosts[sb.Status.HostName]
		if sb.Status.SandboxID == "" || h == nil || !strings.HasPrefix(sb.Status.AgentEndpoint, h.endpoint+"/v1/sandboxes/") {
			t.Fatalf("%s: status %+v", n, sb.Status)
		}
	}
	if per["h1"] != 3 || per["h2"] != 3 || per["h3"] != 3 {
		t.Fatalf("nine sandboxes over three equal hosts: %v, want 3 each", per)
	}
	step("nine sandboxes ready: %v", per)
	self, serr := netnsOf(os.Getpid())
	if serr != nil {
		t.Fatal(serr)
	}
	for _, name := range []string{"h1", "h2", "h3"} {
		h := f.hosts[name]
		if ino, err := netnsOf(h.proc.cmd.Process.Pid); err != nil || ino == self || ino != h.ns.ino {
			t.Fatalf("%s's daemon in network namespace %d (%v): want its own %d", name, ino, err, h.ns.ino)
		}
		// Its HTTPS API, across its link at its own address.
		if ids := f.listOver(h); len(ids) != per[name] {
			t.Fatalf("%s's API at %s lists %d sandboxes of team-a, want %d", name, h.endpoint, len(ids), per[name])
		}
	}
	step("each host in its own network namespace; each one's API answers at its address (%s, %s, %s)",
		f.hosts["h1"].endpoint, f.hosts["h2"].endpoint, f.hosts["h3"].endpoint)
	for _, n := range []string{"sb-0", "sb-4", "sb-8"} {
		sb := f.sandbox("team-a", n)
		if out := f.exec("team-a", sb, "echo hello from "+n); out != "hello from "+n+"\n" {
			t.Fatalf("exec in %s: %q", n, out)
		}
	}
	step("exec answered through each sandbox's host")

	// A warm pool of two; a claim takes a ready one; the pool refills.
	f.create(&v1.SandboxWarmPool{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "warm"},
		Spec: v1.SandboxWarmPoolSpec{Replicas: 2, SandboxTemplateRef: v1.TemplateRef{Name: "tiny"}}})
	poolReady := func() (ready []string, all int) {
		var l v1.SandboxList
		f.c.List(f.ctx, &l, ctrlclient.InNamespace("team-a"), ctrlclient.MatchingLabels{v1.LabelPool: "warm"})
		for _, sb := range l.Items {
			if isReady(&sb) {
				ready = append(ready, sb.Name)
			}
		}
		return ready, len(l.Items)
	}
	f.eventually(5*time.Minute, "pool of 2 ready", func() (bool, string) {
		r, n := poolReady()
		return len(r) == 2 && n == 2, fmt.Sprintf("%d ready of %d", len(r), n)
	})
	before, _ := poolReady()
	f.create(&v1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "job-1"},
		Spec: v1.SandboxClaimSpec{SandboxTemplateRef: v1.TemplateRef{Name: "tiny"}}})
	var claimed string
	f.eventually(time.Minute, "claim served", func() (bool, string) {
		var cl v1.SandboxClaim
		if err := f.c.Get(f.ctx, types.NamespacedName{Namespace: "team-a", Name: "job-1"}, &cl); err != nil {
			return false, err.Error()
		}
		claimed = cl.Status.Sandbox.Name
		return claimed != "" && meta.IsStatusConditionTrue(cl.Status.Conditions, v1.ConditionReady), fmt.Sprintf("%+v", cl.Status)
	})
	if !slices.Contains(before, claimed) {
		t.Fatalf("claim got %s, not one of the ready pool sandboxes %v", claimed, before)
	}
	f.exec("team-a", f.sandbox("team-a", claimed), "true")
	f.eventually(5*time.Minute, "pool refilled to 2 ready", func() (bool, string) {
		r, n := poolReady()
		return len(r) == 2 && n == 2 && !slices.Contains(r, claimed), fmt.Sprintf("%v of %d", r, n)
	})
	step("claim took %s from the pool; the pool refilled", claimed)

	// h1's record claims 50 CPUs: the controller prefers it, its agent
	// (5 CPUs) refuses what it has no room for, and the controller places
	// those elsewhere with h1 excluded.
	var h1 v1.WarrenHost
	if err := f.c.Get(f.ctx, types.NamespacedName{Name: "h1"}, &h1); err != nil {
		t.Fatal(err)
	}
	h1.Spec.Capacity.CPUs = 50
	if err := f.c.Update(f.ctx, &h1); err != nil {
		t.Fatal(err)
	}
	var extras []string
	for i := range 3 {
		extras = append(extras, fmt.Sprintf("extra-%d", i))
		f.create(&v1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: extras[i]},
			Spec: v1.SandboxSpec{SandboxTemplateRef: v1.TemplateRef{Name: "tiny"}}})
	}
	f.waitReady("team-a", 5*time.Minute, extras...)
	refused := 0
	for _, n := range extras {
		sb := f.sandbox("team-a", n)
		if slices.Contains(sb.Status.ExcludedHosts, "h1") {
			refused++
			if sb.Status.HostName == "h1" {
				t.Fatalf("%s refused by h1 but running there", n)
			}
		}
	}
	if refused == 0 {
		t.Fatalf("h1 had no room (5 CPUs, full) yet refused none of %v", extras)
	}
	step("h1 refused %d of 3 for lack of room; they run elsewhere", refused)
	// h1 tells the truth again.
	err := f.c.Get(f.ctx, types.NamespacedName{Name: "h1"}, &h1)
	if err == nil {
		h1.Spec.Capacity.CPUs = 5
		err = f.c.Update(f.ctx, &h1)
	}
	if err != nil {
		t.Fatal(err)
	}
	// Make room for the moves below: the fleet is full (15 of 15 CPUs).
	for _, n := range extras {
		if err := f.c.Delete(f.ctx, &v1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	f.eventually(2*time.Minute, "extras deleted", func() (bool, string) {
		var l v1.SandboxList
		f.c.List(f.ctx, &l, ctrlclient.InNamespace("team-a"))
		left := slices.DeleteFunc(l.Items, func(sb v1.Sandbox) bool { return !strings.HasPrefix(sb.Name, "extra-") })
		return len(left) == 0, fmt.Sprint(len(left))
	})

	// Tenants: alice (team-a) cannot see team-b's sandboxes, bob cannot
	// read team-a's.
	for user, ns := range map[string]string{"alice": "team-b", "bob": "team-a"} {
		uc, err := ctrlclient.New(f.kube.ConfigFor(user), ctrlclient.Options{Scheme: controller.Scheme()})
		if err != nil {
			t.Fatal(err)
		}
		var l v1.SandboxList
		if err := uc.List(f.ctx, &l, ctrlclient.InNamespace(ns)); !apierrors.IsForbidden(err) {
			t.Fatalf("%s listing %s's sandboxes: %v, want forbidden", user, ns, err)
		}
		own := map[string]string{"alice": "team-a", "bob": "team-b"}[user]
		if err := uc.List(f.ctx, &l, ctrlclient.InNamespace(own)); err != nil {
			t.Fatalf("%s listing its own namespace: %v", user, err)
		}
	}
	step("tenants see only their own namespaces")

	f.moveAcrossHosts(names)
	f.forkAndRollback(names)

	// A SandboxSnapshot of one of h3's sandboxes goes to the object
	// store; then kill -9 of h3's daemon and VMMs: once its Lease (6 s)
	// runs out its sandboxes are Lost, and the one with a snapshot is
	// recreated on another host from it, its file intact.
	var onH3 []string
	for _, n := range names {
		if f.sandbox("team-a", n).Status.HostName == "h3" {
			onH3 = append(onH3, n)
		}
	}
	saved := onH3[0]
	f.exec("team-a", f.sandbox("team-a", saved), "echo kept-by-snapshot > /root/saved")
	sn := &v1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "before-crash"},
		Spec: v1.SandboxSnapshotSpec{SandboxRef: v1.SandboxRef{Name: saved}}}
	f.request(sn, "snapshot uploaded", func() bool {
		return sn.Status.Phase == v1.PhaseDone && strings.HasPrefix(sn.Status.Location, "s3://fleet/team-a/") &&
			f.sandbox("team-a", saved).Status.Snapshot == sn.Status.Location
	})
	f.exec("team-a", f.sandbox("team-a", saved), "echo after-snapshot > /root/lost")
	step("SandboxSnapshot of %s (on h3) uploaded", saved)
	f.kill(f.hosts["h3"])
	f.eventually(time.Minute, "h3's sandboxes lost", func() (bool, string) {
		for _, n := range onH3 {
			sb := f.sandbox("team-a", n)
			if !meta.IsStatusConditionTrue(sb.Status.Conditions, v1.ConditionLost) {
				return false, fmt.Sprintf("%s: %+v", n, sb.Status)
			}
		}
		return true, ""
	})
	step("h3 killed: its %d sandboxes are Lost", len(onH3))
	f.eventually(4*time.Minute, saved+" recovered elsewhere", func() (bool, string) {
		sb := f.sandbox("team-a", saved)
		c := meta.FindStatusCondition(sb.Status.Conditions, v1.ConditionRecovered)
		return isReady(sb) && sb.Status.HostName != "h3" && sb.Status.HostName != "" && c != nil &&
			strings.Contains(c.Message, sb.Status.Snapshot), fmt.Sprintf("%+v", sb.Status)
	})
	rec := f.sandbox("team-a", saved)
	if out := f.exec("team-a", rec, "cat /root/saved; cat /root/lost 2>/dev/null || echo gone"); out != "kept-by-snapshot\ngone\n" {
		t.Fatalf("recovered %s: %q, want the snapshot's file and not the later one", saved, out)
	}
	step("%s recovered on %s from its snapshot (what came after it is gone, as the condition says)", saved, rec.Status.HostName)
	for _, n := range onH3[1:] {
		if sb := f.sandbox("team-a", n); sb.Status.Phase != v1.SandboxLost || sb.Labels[v1.LabelHost] != "h3" {
			t.Fatalf("%s (no snapshot) after its host was lost: %+v", n, sb.Status)
		}
	}

	// h3's daemon comes back: it must not run a second copy of the
	// sandbox that moved (its VM record there is deleted), and the ones
	// without a snapshot, whose VMs died, say so (Failed).
	h3 := f.hosts["h3"]
	f.start(h3)
	h3c, err := hc.New(h3.proc.sock, "team-a", "")
	if err != nil {
		t.Fatal(err)
	}
	f.eventually(2*time.Minute, "h3 back: the moved sandbox's VM gone from it, the others Failed", func() (bool, string) {
		l, err := h3c.Sandboxes(f.ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, s := range l {
			if s.Labels[kube.LabelName] == "team-a/"+saved {
				return false, "h3 still holds " + s.ID + " of " + saved
			}
		}
		for _, n := range onH3[1:] {
			if sb := f.sandbox("team-a", n); sb.Status.Phase != v1.SandboxFailed {
				return false, fmt.Sprintf("%s: %+v", n, sb.Status)
			}
		}
		return true, ""
	})
	step("h3 came back: no second copy of %s; its other sandboxes are Failed (no snapshot)", saved)

	// Deleting the pool and the claim deletes their sandboxes (the
	// controller's finalizer: there is no garbage collector here);
	// deleting the Sandboxes of live hosts deletes their VMs.
	if err := f.c.Delete(f.ctx, &v1.SandboxWarmPool{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "warm"}}); err != nil {
		t.Fatal(err)
	}
	if err := f.c.Delete(f.ctx, &v1.SandboxClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "job-1"}}); err != nil {
		t.Fatal(err)
	}
	f.eventually(2*time.Minute, "pool and claim sandboxes gone", func() (bool, string) {
		var l v1.SandboxList
		f.c.List(f.ctx, &l, ctrlclient.InNamespace("team-a"))
		left := 0
		for _, sb := range l.Items {
			if _, ok := sb.Labels[v1.LabelPool]; ok || sb.Name == claimed {
				left++
			}
		}
		return left == 0, fmt.Sprint(left)
	})
	var all v1.SandboxList
	f.c.List(f.ctx, &all, ctrlclient.InNamespace("team-a"))
	for _, sb := range all.Items {
		if err := f.c.Delete(f.ctx, &sb); ctrlclient.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
	}
	f.eventually(2*time.Minute, "every Sandbox gone", func() (bool, string) {
		var l v1.SandboxList
		f.c.List(f.ctx, &l, ctrlclient.InNamespace("team-a"))
		return len(l.Items) == 0, fmt.Sprint(len(l.Items))
	})
	for _, name := range []string{"h1", "h2", "h3"} {
		cl, err := hc.New(f.hosts[name].proc.sock, "team-a", "")
		if err != nil {
			t.Fatal(err)
		}
		kvmtest.WaitFor(t, time.Minute, name+"'s VMs deleted", func() bool {
			l, err := cl.Sandboxes(f.ctx)
			return err == nil && len(l) == 0
		})
	}
	step("deleted: no VM left on any host")
}

// template returns a SandboxTemplate.
func (f *fleet) template(ns, name string) *v1.SandboxTemplate {
	f.t.Helper()
	var tpl v1.SandboxTemplate
	if err := f.c.Get(f.ctx, types.NamespacedName{Namespace: ns, Name: name}, &tpl); err != nil {
		f.t.Fatal(err)
	}
	return &tpl
}

// checkTemplateShared checks that template ns/name was built once, by
// host builder, and uploaded (one snapshot in its status, for the
// fleet's CPU group and its generation), and that every other host
// imported that snapshot (status.hosts, and a ready template of that id
// on each host's daemon, of the template's size).
func (f *fleet) checkTemplateShared(ns, name, builder string) {
	t := f.t
	t.Helper()
	tpl := f.template(ns, name)
	st := tpl.Status
	if len(st.Snapshots) != 1 || st.Snapshots[0].BuiltBy != builder || st.Snapshots[0].CPUGroup != "g1" ||
		st.Snapshots[0].Generation != tpl.Generation || !strings.HasPrefix(st.Snapshots[0].Ref, "s3://fleet/"+ns+"/") {
		t.Fatalf("template %s/%s: snapshots %+v, want one built by %s", ns, name, st.Snapshots, builder)
	}
	ref := st.Snapshots[0].Ref
	built, imported := 0, 0
	for _, h := range st.Hosts {
		switch {
		case h.Generation != tpl.Generation:
			t.Fatalf("template %s/%s on %s: generation %d, want %d", ns, name, h.Host, h.Generation, tpl.Generation)
		case h.ImportedFrom == "" && h.Host == builder:
			built++
		case h.ImportedFrom == ref && h.Host != builder:
			imported++
		default:
			t.Fatalf("template %s/%s: hosts %+v (built by %s, uploaded as %s)", ns, name, st.Hosts, builder, ref)
		}
		cl, err := hc.New(f.hosts[h.Host].proc.sock, ns, "")
		if err != nil {
			t.Fatal(err)
		}
		dt, err := cl.Template(f.ctx, h.TemplateID)
		if err != nil || dt.Status != "ready" || dt.MemMiB != tpl.Spec.MemoryMiB || dt.CPUs != tpl.Spec.CPUs || dt.Kernel != tpl.Spec.Kernel {
			t.Fatalf("template %s on %s: %+v (%v)", h.TemplateID, h.Host, dt, err)
		}
		if all, err := cl.Templates(f.ctx); err != nil || len(all) != 1 {
			t.Fatalf("%s has %d templates of %s (%v), want the one", h.Host, len(all), ns, err)
		}
	}
	if built != 1 || imported != len(f.hosts)-1 {
		t.Fatalf("template %s/%s: built on %d hosts, imported on %d: %+v", ns, name, built, imported, st.Hosts)
	}
	f.step("template %s built once (on %s), uploaded as %s, imported by the %d other hosts", name, builder, ref, imported)
}

// moveAcrossHosts suspends a sandbox of h1 to the object store and
// resumes it with h1 cordoned, so on another host: a file and a running
// process (its memory holds a value only the test and it know) must be
// intact. It prints the cross-host resume time beside a same-host resume
// (suspend to disk and resume through one daemon's API, no object store)
// of a sandbox of the same template.
func (f *fleet) moveAcrossHosts(names []string) {
	t := f.t
	var name string
	for _, n := range names {
		if f.sandbox("team-a", n).Status.HostName == "h1" {
			name = n
			break
		}
	}
	secret := fmt.Sprintf("v%d", time.Now().UnixNano())
	sb := f.sandbox("team-a", name)
	f.exec("team-a", sb, "echo moved-file > /root/marker; rm -f /tmp/go /tmp/beat")
	// The process holds the secret in its memory only (argv and a shell
	// variable); it writes it out once /tmp/go appears.
	pc, err := hc.New(f.hosts["h1"].proc.sock, "team-a", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pc.StartProcess(f.ctx, sb.Status.SandboxID, wire.ProcessRequest{Argv: []string{"sh", "-c",
		"v=" + secret + "; while :; do [ -f /tmp/go ] && echo \"$v $$\" > /tmp/beat; sleep 1; done"}}); err != nil {
		t.Fatal(err)
	}
	set := func(mode v1.OperatingMode) {
		sb := f.sandbox("team-a", name)
		orig := sb.DeepCopy()
		sb.Spec.OperatingMode = mode
		if err := f.c.Patch(f.ctx, sb, ctrlclient.MergeFrom(orig)); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now()
	set(v1.OperatingModeSuspended)
	f.eventually(3*time.Minute, name+" suspended to the object store", func() (bool, string) {
		sb := f.sandbox("team-a", name)
		return sb.Status.Phase == v1.SandboxSuspended && strings.HasPrefix(sb.Status.Snapshot, "s3://fleet/team-a/") &&
			sb.Labels[v1.LabelHost] == "" && sb.Status.HostName == "", fmt.Sprintf("%v %+v", sb.Labels, sb.Status)
	})
	suspend := time.Since(t0)
	// A merge patch (setUnschedulable), not an update: h1's agent writes
	// its WarrenHost's status meanwhile, and an update of the object as
	// read then fails on the conflict (seen in CI).
	cordon := func(on bool) { f.setUnschedulable("h1", on) }
	cordon(true)
	t0 = time.Now()
	set(v1.OperatingModeRunning)
	f.eventually(4*time.Minute, name+" resumed on another host", func() (bool, string) {
		sb := f.sandbox("team-a", name)
		return isReady(sb) && sb.Status.HostName != "" && sb.Status.HostName != "h1", fmt.Sprintf("%+v", sb.Status)
	})
	cross := time.Since(t0)
	cordon(false)
	sb = f.sandbox("team-a", name)
	// (The guest's userland is u-root's: gosh, no touch, seq or cut.)
	out := f.exec("team-a", sb, "cat /root/marker; echo > /tmp/go; i=0; while [ $i -lt 60 ] && [ ! -s /tmp/beat ]; do sleep 1; i=$((i+1)); done; read v p < /tmp/beat; echo $v")
	if out != "moved-file\n"+secret+"\n" {
		t.Fatalf("%s after its move to %s: %q, want the file and the process's value %s", name, sb.Status.HostName, out, secret)
	}
	f.step("%s suspended on h1 to the object store (%.1f s) and resumed on %s (%.1f s): file and process memory intact",
		name, suspend.Seconds(), sb.Status.HostName, cross.Seconds())

	// The same-host baseline: one daemon's own suspend and resume.
	cl, err := hc.New(f.hosts["h2"].proc.sock, "team-b", "")
	if err != nil {
		t.Fatal(err)
	}
	tp, err := cl.CreateTemplate(f.ctx, wire.TemplateRequest{Kernel: "vmlinux", Initramfs: "initramfs.cpio", MemMiB: 256, CPUs: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	local, err := cl.Create(f.ctx, wire.SandboxRequest{Template: tp.ID}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	if _, err := cl.Pause(f.ctx, local.ID, true, nil); err != nil {
		t.Fatal(err)
	}
	localSuspend := time.Since(t0)
	t0 = time.Now()
	if _, err := cl.Resume(f.ctx, local.ID, nil); err != nil {
		t.Fatal(err)
	}
	same := time.Since(t0)
	if err := cl.Delete(f.ctx, local.ID); err != nil {
		t.Fatal(err)
	}
	cl.DeleteTemplate(f.ctx, tp.ID)
	f.step("resume latency (nested host: compare the ratio only): same host %.1f s (suspend %.1f s); across hosts through the object store %.1f s (suspend and upload %.1f s): %.1fx",
		same.Seconds(), localSuspend.Seconds(), cross.Seconds(), suspend.Seconds(), cross.Seconds()/same.Seconds())
}

// forkAndRollback: a SandboxFork of a sandbox on h2 makes two children,
// Sandboxes of their own on h2 holding the parent's file; a
// SandboxRollback takes the parent back to a SandboxSnapshot's state.
func (f *fleet) forkAndRollback(names []string) {
	t := f.t
	var name string
	for _, n := range names {
		if f.sandbox("team-a", n).Status.HostName == "h2" {
			name = n
			break
		}
	}
	sb := f.sandbox("team-a", name)
	f.exec("team-a", sb, "echo from-parent > /root/forked")
	fk := &v1.SandboxFork{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "kids"},
		Spec: v1.SandboxForkSpec{SandboxRef: v1.SandboxRef{Name: name}, Count: 2}}
	f.request(fk, "fork done", func() bool {
		return fk.Status.Phase == v1.PhaseDone && slices.Equal(fk.Status.Children, []string{"kids-1", "kids-2"})
	})
	f.waitReady("team-a", time.Minute, "kids-1", "kids-2")
	for _, c := range []string{"kids-1", "kids-2"} {
		child := f.sandbox("team-a", c)
		if child.Status.HostName != "h2" || child.Status.SandboxID == sb.Status.SandboxID {
			t.Fatalf("fork child %s: %+v", c, child.Status)
		}
		if out := f.exec("team-a", child, "cat /root/forked; echo child-"+c+" > /root/forked"); out != "from-parent\n" {
			t.Fatalf("fork child %s: %q", c, out)
		}
	}
	if out := f.exec("team-a", sb, "cat /root/forked"); out != "from-parent\n" {
		t.Fatalf("parent after its children wrote: %q", out)
	}
	f.step("SandboxFork of %s: kids-1 and kids-2 on h2 with the parent's file, each writing its own", name)

	sn := &v1.SandboxSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "good-state"},
		Spec: v1.SandboxSnapshotSpec{SandboxRef: v1.SandboxRef{Name: name}}}
	f.request(sn, "snapshot done", func() bool { return sn.Status.Phase == v1.PhaseDone })
	f.exec("team-a", sb, "echo bad-step > /root/forked")
	rb := &v1.SandboxRollback{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "undo"},
		Spec: v1.SandboxRollbackSpec{SandboxRef: v1.SandboxRef{Name: name}, SnapshotName: "good-state"}}
	f.request(rb, "rollback done", func() bool { return rb.Status.Phase == v1.PhaseDone })
	if out := f.exec("team-a", f.sandbox("team-a", name), "cat /root/forked"); out != "from-parent\n" {
		t.Fatalf("%s after SandboxRollback: %q, want the snapshot's file", name, out)
	}
	f.step("SandboxRollback of %s to SandboxSnapshot good-state: the bad step is undone", name)
	for _, c := range []string{"kids-1", "kids-2"} {
		if err := f.c.Delete(f.ctx, &v1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: c}}); err != nil {
			t.Fatal(err)
		}
	}
}
