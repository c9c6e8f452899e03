package cli

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/warrenvm/warren/ebpf/filter"
	"github.com/warrenvm/warren/ebpf/policy"
	"github.com/warrenvm/warren/vmmctl"
	"github.com/warrenvm/warren/vmmproc/credproxy"
	"github.com/warrenvm/warren/vmmproc/egress"
)

// egressOptions are a VM's egress settings (runOptions.Egress): recorded
// in its snapshots (with the policy in force, the proxy CA and the
// resolver's allowed addresses at snapshot time) and given to its fork
// children. Paths are absolute.
type egressOptions struct {
	HostAddr    netip.Prefix `json:"host_addr"`
	GuestAddr   netip.Addr   `json:"guest_addr"`
	Audit       string       `json:"audit"`
	Secrets     string       `json:"secrets,omitempty"` // empty: the environment (WARREN_SECRET_<NAME>)
	Hosts       string       `json:"hosts,omitempty"`
	DNSUpstream string       `json:"dns_upstream,omitempty"`
	UpstreamCA  string       `json:"upstream_ca,omitempty"`
	Attach      string       `json:"attach,omitempty"` // auto (default), tcx or clsact
	// UpstreamAllow: the operator's prefixes the credential proxy may
	// reach although private or local (--upstream-allow).
	UpstreamAllow []netip.Prefix `json:"upstream_allow,omitempty"`
	// WildcardCredentials: credential hosts "*.example.com" allowed
	// (--allow-wildcard-credentials).
	WildcardCredentials bool         `json:"wildcard_credentials,omitempty"`
	Sandbox             string       `json:"sandbox"`
	State               egress.State `json:"state"`
}

// netFlags are `warren run`'s network and egress flags.
type netFlags struct {
	hostIP, guestIP                                  *string
	policy, audit, secrets, hosts, dns, upCA, attach *string
	upAllow                                          *string
	wildcard                                         *bool
}

func addNetFlags(fs *flag.FlagSet) *netFlags {
	return &netFlags{
		hostIP:   fs.String("host-ip", "", "with --tap: the tap's host address and prefix (10.200.0.1/24), the guest's gateway, resolver and credential proxy"),
		guestIP:  fs.String("guest-ip", "", "with --host-ip: the guest's address; eth0, its route and resolver are set on the kernel command line"),
		policy:   fs.String("egress", "", "filter the guest's traffic with this egress policy (JSON, see ebpf/README.md); needs --host-ip"),
		audit:    fs.String("audit", "", "with --egress: the JSON-lines audit log (default: warren-egress-<tap>.jsonl in the current directory)"),
		secrets:  fs.String("secrets", "", "with --egress: a JSON file of secret name to value, mode 0600 (default: environment variables WARREN_SECRET_<NAME>)"),
		hosts:    fs.String("hosts", "", "with --egress: an /etc/hosts-style file of fixed addresses for the resolver and the credential proxy"),
		dns:      fs.String("dns-upstream", "", "with --egress: the DNS server allowed names are asked of, ip:port (default: the host's /etc/resolv.conf)"),
		upCA:     fs.String("upstream-ca", "", "with --egress: PEM roots the credential proxy trusts upstream instead of the system's"),
		attach:   fs.String("egress-attach", "auto", "with --egress: how to attach the filter: auto (tcx, else clsact), tcx or clsact"),
		upAllow:  fs.String("upstream-allow", "", "with --egress: comma-separated addresses or CIDRs the credential proxy may connect to although loopback, private, link-local or the host's own (the operator's allowance; by default none)"),
		wildcard: fs.Bool("allow-wildcard-credentials", false, "with --egress: allow credential hosts such as *.example.com (the secret then goes to any name below)"),
	}
}

// options turns the flags into egress options (nil without --egress) and
// the kernel command-line arguments that configure the guest's network.
func (f *netFlags) options(tap string) (*egressOptions, string, error) {
	var cmdline string
	var host netip.Prefix
	var guest netip.Addr
	var err error
	if *f.hostIP != "" {
		if tap == "" {
			return nil, "", errors.New("--host-ip needs --tap")
		}
		if host, err = netip.ParsePrefix(*f.hostIP); err != nil || !host.Addr().Is4() {
			return nil, "", fmt.Errorf("--host-ip %q: want an IPv4 address with a prefix length", *f.hostIP)
		}
	}
	if *f.guestIP != "" {
		if !host.IsValid() {
			return nil, "", errors.New("--guest-ip needs --host-ip")
		}
		if guest, err = netip.ParseAddr(*f.guestIP); err != nil || !host.Contains(guest) || guest == host.Addr() {
			return nil, "", fmt.Errorf("--guest-ip %q: want another address in %v", *f.guestIP, host.Masked())
		}
		cmdline = fmt.Sprintf("warren.ip=%v/%d warren.gw=%v warren.dns=%v", guest, host.Bits(), host.Addr(), host.Addr())
	}
	if *f.policy == "" {
		for _, s := range []*string{f.audit, f.secrets, f.hosts, f.dns, f.upCA} {
			if *s != "" {
				return nil, "", errors.New("--audit, --secrets, --hosts, --dns-upstream and --upstream-ca need --egress")
			}
		}
		return nil, cmdline, nil
	}
	if !host.IsValid() {
		return nil, "", errors.New("--egress needs --tap and --host-ip")
	}
	allow, err := policy.ParsePrefixes(*f.upAllow)
	if err != nil {
		return nil, "", fmt.Errorf("--upstream-allow: %w", err)
	}
	p, err := policy.LoadWith(*f.policy, policy.Options{WildcardCredentials: *f.wildcard})
	if err != nil {
		return nil, "", err
	}
	e := &egressOptions{HostAddr: host, GuestAddr: guest, Audit: *f.audit, DNSUpstream: *f.dns,
		Attach: *f.attach, Sandbox: tap, State: egress.State{Policy: p}, UpstreamAllow: allow, WildcardCredentials: *f.wildcard}
	if e.Audit == "" {
		e.Audit = "warren-egress-" + tap + ".jsonl"
	}
	for _, p := range []struct{ in, out *string }{{&e.Audit, &e.Audit}, {f.secrets, &e.Secrets}, {f.hosts, &e.Hosts}, {f.upCA, &e.UpstreamCA}} {
		if *p.in != "" {
			if *p.out, err = filepath.Abs(*p.in); err != nil {
				return nil, "", err
			}
		}
	}
	if _, err := parseAttach(e.Attach); err != nil {
		return nil, "", err
	}
	// Read what can be checked now, so that a mistake fails before the VM.
	if e.Secrets != "" {
		if err := (credproxy.FileStore{Path: e.Secrets}).Check(); err != nil {
			return nil, "", err
		}
	}
	if e.Hosts != "" {
		if _, err := egress.ReadHosts(e.Hosts); err != nil {
			return nil, "", err
		}
	}
	return e, cmdline, nil
}

// policyOptions are the operator's allowances e's policies are checked with.
func (e *egressOptions) policyOptions() policy.Options {
	if e == nil {
		return policy.Options{}
	}
	return policy.Options{WildcardCredentials: e.WildcardCredentials}
}

func parseAttach(s string) (filter.AttachMode, error) {
	switch s {
	case "", "auto":
		return filter.AttachAuto, nil
	case "tcx":
		return filter.AttachTCX, nil
	case "clsact":
		return filter.AttachClsact, nil
	}
	return 0, fmt.Errorf("--egress-attach %q: want auto, tcx or clsact", s)
}

// startEgress starts the egress services of a VM whose tap exists, on
// prep when the VM's helper made their privileged part (which they then
// own; nil: they make it).
func startEgress(e *egressOptions, tap string, o vmOptions, prep *egress.Prepared) (_ *egress.Sandbox, err error) {
	defer func() {
		if err != nil && prep != nil {
			prep.Close()
		}
	}()
	cfg := egress.Config{Prepared: prep, Sandbox: e.Sandbox, Tap: tap, HostAddr: e.HostAddr, GuestAddr: e.GuestAddr,
		Policy: e.State.Policy, AuditPath: e.Audit, CAPEM: e.State.CAPEM, CAKeyPEM: e.State.CAKeyPEM,
		DNSUpstream: e.DNSUpstream, DNSState: e.State.DNS, Log: o.log,
		UpstreamAllow: e.UpstreamAllow, PolicyOptions: e.policyOptions()}
	if cfg.Attach, err = parseAttach(e.Attach); err != nil {
		return nil, err
	}
	if e.Secrets != "" {
		cfg.Secrets = credproxy.FileStore{Path: e.Secrets}
	}
	if e.Hosts != "" {
		if cfg.Hosts, err = egress.ReadHosts(e.Hosts); err != nil {
			return nil, err
		}
	}
	if e.UpstreamCA != "" {
		if cfg.UpstreamCAs, err = os.ReadFile(e.UpstreamCA); err != nil {
			return nil, fmt.Errorf("--upstream-ca: %w", err)
		}
	}
	s, err := egress.Start(cfg)
	prep = nil // Start's now, whatever the outcome
	return s, err
}

// liveOptions returns the run options a snapshot of the VM records now:
// the static ones with the egress state in force.
func (a *apiServer) liveOptions() (json.RawMessage, error) {
	o := a.opts
	if a.egress != nil && o.Egress != nil {
		st, err := a.egress.State()
		if err != nil {
			return nil, err
		}
		e := *o.Egress
		e.State = st
		o.Egress = &e
	}
	return json.Marshal(o)
}

// egressReply is the answer of GET and PUT /v1/egress.
func (a *apiServer) egressReply() (*vmmctl.EgressReply, error) {
	st, err := a.egress.Stats()
	if err != nil {
		return nil, err
	}
	a.egress.FlushAudit()
	pol, err := json.Marshal(a.egress.Policy())
	if err != nil {
		return nil, err
	}
	stats, err := json.Marshal(st)
	if err != nil {
		return nil, err
	}
	return &vmmctl.EgressReply{Policy: pol, Stats: stats, Audit: a.opts.Egress.Audit}, nil
}

// getEgress is GET /v1/egress: the policy in force and the counters.
func (a *apiServer) getEgress(w http.ResponseWriter, r *http.Request) {
	if a.egress == nil {
		replyErr(w, http.StatusNotFound, errors.New("egress: this VM has no egress policy (warren run --egress)"))
		return
	}
	rep, err := a.egressReply()
	if err != nil {
		replyErr(w, http.StatusInternalServerError, err)
		return
	}
	reply(w, http.StatusOK, rep)
}

// putEgress is PUT /v1/egress: a new policy, in force when it answers.
// The guest learns new credential placeholders at its next re-sync.
func (a *apiServer) putEgress(w http.ResponseWriter, r *http.Request) {
	if a.egress == nil {
		replyErr(w, http.StatusNotFound, errors.New("egress: this VM has no egress policy (warren run --egress)"))
		return
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		replyErr(w, http.StatusBadRequest, err)
		return
	}
	p, err := policy.ParseWith(b, a.opts.Egress.policyOptions())
	if err != nil {
		replyErr(w, http.StatusBadRequest, err)
		return
	}
	if err := a.egress.SetPolicy(p); err != nil {
		replyErr(w, http.StatusBadRequest, err)
		return
	}
	if a.sync != nil {
		a.sync.SetEgress(a.egress.Guest())
	}
	rep, err := a.egressReply()
	if err != nil {
		replyErr(w, http.StatusInternalServerError, err)
		return
	}
	reply(w, http.StatusOK, rep)
}

// egressCmd is `warren egress API [--policy FILE]`.
func egressCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren egress", flag.ContinueOnError)
	fs.SetOutput(stderr)
	pol := fs.String("policy", "", "replace the running VM's egress policy with this one (JSON)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprint(stderr, "usage: warren egress [--policy FILE] API\n\nprints the egress policy in force and the filter, proxy and audit counters of the VM\nwhose control socket is API; with --policy, replaces the policy first (live).\n")
		return 2
	}
	ctx, stop := interruptContext()
	defer stop()
	c := vmmctl.Client{Socket: fs.Arg(0)}
	var rep *vmmctl.EgressReply
	var err error
	if *pol != "" {
		var b []byte
		if b, err = os.ReadFile(*pol); err == nil {
			// (The VM checks it with its operator's allowances.)
			if _, err = policy.ParseWith(b, policy.Options{WildcardCredentials: true}); err == nil {
				rep, err = c.SetEgress(ctx, b)
			}
		}
	} else {
		rep, err = c.Egress(ctx)
	}
	if err != nil {
		fmt.Fprintf(stderr, "warren egress: %v\n", err)
		return 1
	}
	out, _ := json.MarshalIndent(rep, "", "  ")
	fmt.Fprintln(stdout, string(out))
	return 0
}

// egressOverrides are `warren restore`'s --egress, --secrets and --audit:
// changes to a snapshot's egress options for the VM restored from it (the
// daemon gives each sandbox of a template its own policy, secrets and
// audit log).
type egressOverrides struct {
	policy, secrets, audit *string
}

// apply changes e (the snapshot's egress options, nil when it has none)
// as the flags say; a flag on a snapshot without egress is an error.
func (f egressOverrides) apply(e *egressOptions) error {
	if *f.policy == "" && *f.secrets == "" && *f.audit == "" {
		return nil
	}
	if e == nil {
		return errors.New("--egress, --secrets and --audit need a snapshot of a VM with egress (warren run --egress)")
	}
	if *f.policy != "" {
		p, err := policy.LoadWith(*f.policy, e.policyOptions())
		if err != nil {
			return err
		}
		// The resolver's allowed addresses were the old policy's.
		e.State.Policy, e.State.DNS = p, nil
	}
	if *f.secrets != "" {
		abs, err := filepath.Abs(*f.secrets)
		if err != nil {
			return err
		}
		if err := (credproxy.FileStore{Path: abs}).Check(); err != nil {
			return err
		}
		e.Secrets = abs
	}
	if *f.audit != "" {
		abs, err := filepath.Abs(*f.audit)
		if err != nil {
			return err
		}
		e.Audit = abs
	}
	return nil
}
