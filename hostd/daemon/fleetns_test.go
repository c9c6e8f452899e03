package daemon

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/warrenvm/warren/fleet/api/v1alpha1"
	"github.com/warrenvm/warren/fleet/controller"
	"github.com/warrenvm/warren/fleet/fleettest"
	hc "github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/kube"
)

// fleetNet is the fleet tests' network: a bridge in the test's network
// namespace holding the servers' address (gw, where the apiserver and
// the object store listen) and, per host, a network namespace of its
// own joined to the bridge by a veth pair (hostNS). Everything it makes
// is removed when the test ends, whether it passed or not.
//
// The kernel needs veth and bridge: the nested KVM host's L1 loads
// bridge.ko; veth.ko must be among its modules too (.ci/kvmhost/run.sh).
type fleetNet struct {
	t *testing.T
	// tag names the links (wfl<tag>, wfl<tag>h<i>): random, so that tests
	// running at once on one machine do not collide.
	tag    string
	bridge netlink.Link
	prefix netip.Prefix
	// gw is the bridge's address: the servers listen there and each
	// host reaches them there across its link.
	gw    netip.Addr
	hosts []*hostNS
	// cert serves every host's --listen (ServingCert for their
	// addresses, made on the first tlsFiles call); tokens is their
	// --tokens file and token its one token (tenant team-a).
	cert   *fleettest.CertFiles
	tokens string
	token  string
}

// hostNS is one host's network namespace: loopback up, and eth0 (the
// inside end of its veth pair) at addr on fleetNet's prefix.
type hostNS struct {
	name string
	ns   netns.NsHandle
	// ino is the namespace's inode: /proc/PID/ns/net of a process in it.
	ino   uint64
	addr  netip.Addr
	outer string
}

// maxFleetNetHosts bounds the hosts of one fleetNet (addresses .10 on).
const maxFleetNetHosts = 200

// newFleetNet makes the bridge on a free 10.231.X.0/24 (a /24 no
// address or route of the test's namespace overlaps). It skips the
// test unless it runs as root.
func newFleetNet(t *testing.T) *fleetNet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipped: network namespaces and veth pairs need root")
	}
	var b [2]byte
	rand.Read(b[:])
	n := &fleetNet{t: t, tag: hex.EncodeToString(b[:])}
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatalf("fleetnet: routes: %v", err)
	}
	for k := range 256 {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 231, b[0] + byte(k), 0}), 24)
		taken := false
		for _, r := range routes {
			if r.Dst == nil {
				continue
			}
			rp, ok := netip.AddrFromSlice(r.Dst.IP)
			ones, _ := r.Dst.Mask.Size()
			// (A default route, 0.0.0.0/0, overlaps everything.)
			if ok && ones > 0 && netip.PrefixFrom(rp.Unmap(), ones).Overlaps(p) {
				taken = true
				break
			}
		}
		if !taken {
			n.prefix = p
			break
		}
	}
	if !n.prefix.IsValid() {
		t.Fatal("fleetnet: every 10.231.X.0/24 is in use")
	}
	n.gw = n.prefix.Addr().Next()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "wfl" + n.tag}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatalf("fleetnet: add bridge %s: %v", br.Name, err)
	}
	t.Cleanup(func() { netlink.LinkDel(br) })
	n.bridge = br
	if err := netlink.AddrAdd(br, &netlink.Addr{IPNet: ipNet(n.gw, 24)}); err != nil {
		t.Fatalf("fleetnet: address %s: %v", n.gw, err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		t.Fatalf("fleetnet: bridge up: %v", err)
	}
	t.Logf("fleetnet: bridge %s at %s", br.Name, netip.PrefixFrom(n.gw, 24))
	return n
}

func ipNet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}
}

// add makes host name's namespace and its veth pair. Its cleanup (run
// before the bridge's) kills every process still in the namespace (a
// killed daemon's VMMs, say), deletes the pair and lets the namespace go.
func (n *fleetNet) add(name string) *hostNS {
	t := n.t
	t.Helper()
	i := len(n.hosts)
	if i >= maxFleetNetHosts {
		t.Fatalf("fleetnet: more than %d hosts", maxFleetNetHosts)
	}
	h := &hostNS{name: name, outer: fmt.Sprintf("wfl%sh%d", n.tag, i)}
	h.addr = n.prefix.Addr()
	for range 10 + i {
		h.addr = h.addr.Next()
	}
	// netns.New moves the calling thread into the new namespace: do it on
	// a locked thread and move back (a thread that cannot move back is
	// left locked, so the runtime ends it with the goroutine).
	ns, err := func() (netns.NsHandle, error) {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			return netns.None(), err
		}
		defer orig.Close()
		ns, err := netns.New()
		if serr := netns.Set(orig); serr != nil {
			if err == nil {
				ns.Close()
			}
			return netns.None(), fmt.Errorf("back to the test's namespace: %w", serr)
		}
		runtime.UnlockOSThread()
		return ns, err
	}()
	if err != nil {
		t.Fatalf("fleetnet: namespace for %s: %v", name, err)
	}
	h.ns = ns
	var st syscall.Stat_t
	if err := syscall.Fstat(int(ns), &st); err != nil {
		t.Fatal(err)
	}
	h.ino = st.Ino
	t.Cleanup(func() {
		killNetns(h.ino)
		if l, err := netlink.LinkByName(h.outer); err == nil {
			netlink.LinkDel(l)
		}
		ns.Close()
	})
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: h.outer, MasterIndex: n.bridge.Attrs().Index},
		PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("fleetnet: veth pair for %s: %v (the kernel needs veth: CONFIG_VETH, or veth.ko loaded)", name, err)
	}
	if err := netlink.LinkSetUp(veth); err != nil {
		t.Fatalf("fleetnet: %s up: %v", h.outer, err)
	}
	// Inside: through a netlink socket of the namespace, no thread moves.
	nh, err := netlink.NewHandleAt(ns, syscall.NETLINK_ROUTE) // route only: L1 has no xfrm_user
	if err != nil {
		t.Fatalf("fleetnet: netlink in %s's namespace: %v", name, err)
	}
	defer nh.Close()
	for _, dev := range []string{"lo", "eth0"} {
		l, err := nh.LinkByName(dev)
		if err == nil && dev == "eth0" {
			err = nh.AddrAdd(l, &netlink.Addr{IPNet: ipNet(h.addr, n.prefix.Bits())})
		}
		if err == nil {
			err = nh.LinkSetUp(l)
		}
		if err != nil {
			t.Fatalf("fleetnet: %s in %s's namespace: %v", dev, name, err)
		}
	}
	n.hosts = append(n.hosts, h)
	return h
}

// tlsFiles returns the hosts' serving certificate (for the addresses
// of maxFleetNetHosts hosts, so hosts added later are covered), their
// --tokens file and its token.
func (n *fleetNet) tlsFiles() (*fleettest.CertFiles, string, string) {
	t := n.t
	if n.cert == nil {
		dir := t.TempDir()
		var addrs []netip.Addr
		a := n.prefix.Addr()
		for i := range 10 + maxFleetNetHosts {
			a = a.Next()
			if i >= 9 {
				addrs = append(addrs, a)
			}
		}
		c := fleettest.ServingCert(t, dir, addrs...)
		n.cert = &c
		var b [16]byte
		rand.Read(b[:])
		n.token = hex.EncodeToString(b[:])
		n.tokens = filepath.Join(dir, "tokens.json")
		js, _ := json.Marshal(map[string]string{n.token: "team-a"})
		if err := os.WriteFile(n.tokens, js, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return n.cert, n.tokens, n.token
}

// do runs fn on this goroutine's thread moved into the namespace: a
// process fn starts (os/exec forks from the calling thread, and the
// child inherits that thread's network namespace) runs in it. Go's
// os/exec.Cmd.Start does the clone on the calling goroutine, which is
// locked to this thread meanwhile; nothing else runs on the thread. The
// thread moves back after fn (also when fn ends by t.Fatal, which runs
// deferred calls); one that cannot is left locked, so the runtime ends
// it instead of reusing it.
func (h *hostNS) do(t testing.TB, fn func()) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	if err := netns.Set(h.ns); err != nil {
		orig.Close()
		runtime.UnlockOSThread()
		t.Fatalf("enter %s's namespace: %v", h.name, err)
	}
	defer func() {
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		orig.Close()
	}()
	fn()
}

// netnsOf returns the inode of process pid's network namespace.
func netnsOf(pid int) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// killNetns SIGKILLs every process in the network namespace of inode
// ino (one the test made: all in it are the test's descendants) and
// waits up to 5 s for them to go.
func killNetns(ino uint64) {
	for range 50 {
		ents, _ := os.ReadDir("/proc")
		left := 0
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if in, err := netnsOf(pid); err == nil && in == ino {
				syscall.Kill(pid, syscall.SIGKILL)
				left++
			}
		}
		if left == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// fakeHostEnv makes the test binary a warren-hostd whose VMMs are the
// fake launcher's (runFakeHost), for hosts that must be processes of
// their own (in their own network namespaces) without KVM. It is read
// in init, before TestMain: startHostd's children inherit the test's
// environment, so a test that sets it (t.Setenv) gets fake hosts from
// the same startHostd the real ones come from.
const fakeHostEnv = "WARREN_DAEMON_TEST_FAKE_HOSTD"

func init() {
	if os.Getenv(fakeHostEnv) == "1" && os.Getenv(roleEnv) == "hostd" {
		os.Exit(runFakeHost(os.Args[1:]))
	}
}

// runFakeHost is warren-hostd's Main for the flags the fleet tests give
// it (the daemon's unix socket with PeerAuth, --listen with TLS and
// --tokens, the --kube agent with its object store), with the fake
// launcher's VMMs (sleep processes served by this process). It serves
// until SIGTERM or SIGINT.
func runFakeHost(args []string) int {
	fs := flag.NewFlagSet("fake-hostd", flag.ContinueOnError)
	state := fs.String("state", "", "")
	sock := fs.String("socket", "", "")
	fs.String("warren", "", "ignored: the VMMs are fakes")
	guest := fs.String("guest-dir", "", "")
	listen := fs.String("listen", "", "")
	tokens := fs.String("tokens", "", "")
	cert := fs.String("tls-cert", "", "")
	key := fs.String("tls-key", "", "")
	var kc kubeFlags
	kc.register(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	fail := func(err error) int {
		log.Error("fake-hostd", "err", err)
		return 1
	}
	tb := &procTB{}
	defer tb.cleanup()
	d, err := New(Config{State: *state, Launcher: newFakeLauncher(tb), CgroupRoot: "none", GuestDir: *guest,
		MonitorInterval: 100 * time.Millisecond, BootTimeout: 20 * time.Second, RestoreTimeout: 20 * time.Second,
		Log: log, Audit: os.Stderr})
	if err != nil {
		return fail(err)
	}
	defer d.Close()
	os.Remove(*sock)
	ul, err := net.Listen("unix", *sock)
	if err != nil {
		return fail(err)
	}
	errc := make(chan error, 3)
	go func() { errc <- d.Serve(ul, PeerAuth(TenantUIDs{})) }()
	if *listen != "" {
		toks, err := LoadTokens(*tokens)
		if err != nil {
			return fail(err)
		}
		tc, err := ServerTLS(*cert, *key, "")
		if err != nil {
			return fail(err)
		}
		tl, err := net.Listen("tcp", *listen)
		if err != nil {
			return fail(err)
		}
		go func() { errc <- d.Serve(tls.NewListener(tl, tc), TokenAuth(toks)) }()
	}
	if kc.kubeconfig != "" {
		kcfg, err := kc.config(*sock, *state, log)
		if err != nil {
			return fail(fmt.Errorf("--kube: %w", err))
		}
		go func() { errc <- fmt.Errorf("kube: %w", kube.Run(context.Background(), kcfg)) }()
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-sig:
		return 0
	case err := <-errc:
		return fail(err)
	}
}

// TestFleetNamespaces: two hosts, each a warren-hostd process in a
// network namespace of its own (the fake launcher's VMMs: no KVM), join
// a real kube-apiserver and object store that they reach only across
// their veth pairs; a Sandbox gets Ready on each, and each host's HTTPS
// API, reached across its link at its own address (its agentEndpoint),
// lists the sandbox. Each daemon's network namespace is not the test's.
// A host killed with kill -9 is Lost; its namespace stays until the end.
func TestFleetNamespaces(t *testing.T) {
	t.Setenv(fakeHostEnv, "1")
	fn := newFleetNet(t)
	_, step := e2eState(t, "fleetns-")
	f := startFleetOn(t, "", step, controller.Config{K: -1}, fleetOptions{net: fn, s3: true})
	f.guestDir = guestDir(t, nil)
	self, err := netnsOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"h1", "h2"} {
		h := f.join(name, 1)
		if ino, err := netnsOf(h.proc.cmd.Process.Pid); err != nil || ino == self || ino != h.ns.ino {
			t.Fatalf("%s's daemon in network namespace %d (%v): want its own %d, not the test's %d", name, ino, err, h.ns.ino, self)
		}
	}
	f.eventually(time.Minute, "two hosts registered", func() (bool, string) {
		var l v1.WarrenHostList
		f.c.List(f.ctx, &l)
		return len(l.Items) == 2, fmt.Sprint(len(l.Items))
	})
	step("h1 and h2 joined from their own network namespaces (%s, %s)", f.hosts["h1"].ns.addr, f.hosts["h2"].ns.addr)
	f.create(&v1.SandboxTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "fake"},
		Spec: v1.SandboxTemplateSpec{Kernel: fakeKernel(t), MemoryMiB: 256, CPUs: 1}})
	// One CPU each: the second sandbox must go to the other host.
	for _, n := range []string{"sb-1", "sb-2"} {
		f.create(&v1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: n},
			Spec: v1.SandboxSpec{SandboxTemplateRef: v1.TemplateRef{Name: "fake"}}})
	}
	f.waitReady("team-a", 3*time.Minute, "sb-1", "sb-2")
	seen := map[string]bool{}
	for _, n := range []string{"sb-1", "sb-2"} {
		sb := f.sandbox("team-a", n)
		h := f.hosts[sb.Status.HostName]
		if h == nil || seen[h.name] {
			t.Fatalf("%s on %q: want one sandbox on each host", n, sb.Status.HostName)
		}
		seen[h.name] = true
		if want := h.endpoint + "/v1/sandboxes/" + sb.Status.SandboxID; !strings.HasPrefix(sb.Status.AgentEndpoint, want) {
			t.Fatalf("%s: agentEndpoint %q, want %s", n, sb.Status.AgentEndpoint, want)
		}
		// Across the link: the host's HTTPS API at its own address.
		ids := f.listOver(h)
		if len(ids) != 1 || ids[0] != sb.Status.SandboxID {
			t.Fatalf("%s's API at %s lists %v, want %s", h.name, h.endpoint, ids, sb.Status.SandboxID)
		}
		if out := f.exec("team-a", sb, "echo hi"); out != "hi\n" {
			t.Fatalf("exec in %s: %q", n, out)
		}
	}
	step("a sandbox Ready on each host; each host's API answers at its address across its link")

	// kill -9 of h2's daemon and VMMs: Lost once its Lease runs out; its
	// namespace stays (the cleanup removes it).
	h2 := f.hosts["h2"]
	var onH2 string
	for _, n := range []string{"sb-1", "sb-2"} {
		if f.sandbox("team-a", n).Status.HostName == "h2" {
			onH2 = n
		}
	}
	f.kill(h2)
	f.eventually(time.Minute, onH2+" lost", func() (bool, string) {
		sb := f.sandbox("team-a", onH2)
		return meta.IsStatusConditionTrue(sb.Status.Conditions, v1.ConditionLost), fmt.Sprintf("%+v", sb.Status)
	})
	if _, err := netlink.LinkByName(h2.ns.outer); err != nil {
		t.Fatalf("h2's link gone after its daemon was killed: %v", err)
	}
	step("h2 killed: %s Lost; h2's namespace and link remain until cleanup", onH2)
	// h2 comes back in the same namespace.
	f.start(h2)
	if ino, err := netnsOf(h2.proc.cmd.Process.Pid); err != nil || ino != h2.ns.ino {
		t.Fatalf("h2's second daemon in namespace %d (%v), want %d", ino, err, h2.ns.ino)
	}
	f.eventually(time.Minute, "h2's API back across its link", func() (bool, string) {
		_, err := f.listOverErr(h2)
		return err == nil, fmt.Sprint(err)
	})
	step("h2 restarted in its namespace; its API answers across its link")
}

// listOver lists team-a's sandboxes through host h's HTTPS API at its
// namespace's address (its --listen), as the tokens file's tenant.
func (f *fleet) listOver(h *fleetHost) []string {
	f.t.Helper()
	ids, err := f.listOverErr(h)
	if err != nil {
		f.t.Fatalf("%s's API at %s: %v", h.name, h.endpoint, err)
	}
	return ids
}

func (f *fleet) listOverErr(h *fleetHost) ([]string, error) {
	cert, _, token := f.net.tlsFiles()
	cl, err := hc.NewTLS(h.endpoint, "", token, hc.TLS{CAFile: cert.CA})
	if err != nil {
		return nil, err
	}
	l, err := cl.Sandboxes(f.ctx)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, s := range l {
		ids = append(ids, s.ID)
	}
	return ids, nil
}

// procTB is the testing.TB the fake launcher is given in runFakeHost's
// process, which has no test: Cleanup collects, the rest logs or
// panics. Only what the fake launcher and the daemon call is defined;
// another method panics (its embedded TB is nil).
type procTB struct {
	testing.TB
	fns []func()
}

func (p *procTB) Helper()                        {}
func (p *procTB) Cleanup(fn func())              { p.fns = append(p.fns, fn) }
func (p *procTB) Log(a ...any)                   { fmt.Fprintln(os.Stderr, a...) }
func (p *procTB) Logf(format string, a ...any)   { fmt.Fprintf(os.Stderr, format+"\n", a...) }
func (p *procTB) Error(a ...any)                 { p.Log(a...) }
func (p *procTB) Errorf(format string, a ...any) { p.Logf(format, a...) }
func (p *procTB) Fatal(a ...any)                 { panic(fmt.Sprint(a...)) }
func (p *procTB) Fatalf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }
func (p *procTB) Failed() bool                   { return false }
func (p *procTB) Name() string                   { return "fake-hostd" }
func (p *procTB) Setenv(string, string)          { panic(errors.New("fake-hostd: Setenv")) }
func (p *procTB) TempDir() string                { d, _ := os.MkdirTemp("", "fake-hostd-"); return d }
func (p *procTB) Skip(a ...any)                  { panic(fmt.Sprint(a...)) }
func (p *procTB) cleanup() {
	for i := len(p.fns) - 1; i >= 0; i-- {
		p.fns[i]()
	}
}
