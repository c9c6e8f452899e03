package vmmproc

import (
	"encoding/json"
	"errors"
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

// EgressOptions are a VM's egress settings (runOptions.Egress): recorded
// in its snapshots (with the policy in force, the proxy CA and the
// resolver's allowed addresses at snapshot time) and given to its fork
// children. Paths are absolute.
type EgressOptions struct {
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

// policyOptions are the operator's allowances e's policies are checked with.
func (e *EgressOptions) policyOptions() policy.Options {
	if e == nil {
		return policy.Options{}
	}
	return policy.Options{WildcardCredentials: e.WildcardCredentials}
}

func ParseAttach(s string) (filter.AttachMode, error) {
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
func startEgress(e *EgressOptions, tap string, o vmOptions, prep *egress.Prepared) (_ *egress.Sandbox, err error) {
	defer func() {
		if err != nil && prep != nil {
			prep.Close()
		}
	}()
	cfg := egress.Config{Prepared: prep, Sandbox: e.Sandbox, Tap: tap, HostAddr: e.HostAddr, GuestAddr: e.GuestAddr,
		Policy: e.State.Policy, AuditPath: e.Audit, CAPEM: e.State.CAPEM, CAKeyPEM: e.State.CAKeyPEM,
		DNSUpstream: e.DNSUpstream, DNSState: e.State.DNS, Log: o.log,
		UpstreamAllow: e.UpstreamAllow, PolicyOptions: e.policyOptions()}
	if cfg.Attach, err = ParseAttach(e.Attach); err != nil {
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

// EgressOverrides are `warren restore`'s --egress, --secrets and --audit:
// changes to a snapshot's egress options for the VM restored from it (the
// daemon gives each sandbox of a template its own policy, secrets and
// audit log).
type EgressOverrides struct {
	// Policy is the policy file in force from the start instead of the
	// snapshot's; Secrets the credential proxy's secrets file; Audit the
	// audit log. Empty: the snapshot's.
	Policy, Secrets, Audit string
}

// apply changes e (the snapshot's egress options, nil when it has none)
// as the flags say; a flag on a snapshot without egress is an error.
func (f EgressOverrides) apply(e *EgressOptions) error {
	if f.Policy == "" && f.Secrets == "" && f.Audit == "" {
		return nil
	}
	if e == nil {
		return errors.New("--egress, --secrets and --audit need a snapshot of a VM with egress (warren run --egress)")
	}
	if f.Policy != "" {
		p, err := policy.LoadWith(f.Policy, e.policyOptions())
		if err != nil {
			return err
		}
		// The resolver's allowed addresses were the old policy's.
		e.State.Policy, e.State.DNS = p, nil
	}
	if f.Secrets != "" {
		abs, err := filepath.Abs(f.Secrets)
		if err != nil {
			return err
		}
		if err := (credproxy.FileStore{Path: abs}).Check(); err != nil {
			return err
		}
		e.Secrets = abs
	}
	if f.Audit != "" {
		abs, err := filepath.Abs(f.Audit)
		if err != nil {
			return err
		}
		e.Audit = abs
	}
	return nil
}
