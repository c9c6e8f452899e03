package daemon

// Sandbox networks, egress policies and tenant secrets.
//
// A network template's build VMM (`warren run --private-net ...`) has a
// tap and its egress services (filter, resolver, credential proxy) in a
// network namespace of its own, with a deny-all policy; its snapshot
// records them, so every sandbox restored from it gets the same network
// (the same tap name and addresses, each in its own namespace). On every
// start of a network sandbox's VMM the daemon writes the sandbox's files
// and passes them to `warren restore`:
//
//	<sandboxdir>/secrets.json   the secrets the sandbox names, current values (0600);
//	                            for a tenant with a key <decryptdir>/<id>.secrets.json
//	                            instead (see secrets.go)
//	<sandboxdir>/egress.json    its policy, when it has one (0600)
//	<sandboxdir>/egress.jsonl   the VMM's egress audit log
//
// A tenant's secrets live in <state>/tenants/<tenant>/secrets.json,
// sealed under its key when it has one (see secrets.go and hostd/store);
// no answer of the API ever carries a value.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"unicode/utf8"

	"github.com/warrenvm/warren/ebpf/policy"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/vmmctl"
)

// The private network every network VMM has (in its own namespace, so
// every sandbox has the same).
const (
	netTap    = "wt0"
	netHostIP = "10.200.0.1/24"
	netGuest  = "10.200.0.2"
)

// MaxSecretBytes bounds one secret's value.
const MaxSecretBytes = 64 << 10

// maxSandboxSecrets bounds the secrets file of one sandbox: the credential
// proxy (vmmproc/credproxy.FileStore) reads at most 1 MiB.
const maxSandboxSecrets = 1 << 20

var secretNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Files of a network sandbox, in its directory.
const (
	sbSecretsFile = "secrets.json"
	sbEgressFile  = "egress.json"
	sbAuditFile   = "egress.jsonl"
)

// templateNetwork gives the build of a network template in dir its
// network and egress (in run), after writing its deny-all policy there.
func (d *Daemon) templateNetwork(dir string, run *vmmctl.Run) error {
	pol := filepath.Join(dir, "egress-template.json")
	if err := store.WriteFileAtomic(pol, []byte("{}\n"), 0o600); err != nil {
		return err
	}
	run.PrivateNet, run.Tap, run.HostIP, run.GuestIP = true, netTap, netHostIP, netGuest
	run.Egress, run.Audit = pol, filepath.Join(dir, sbAuditFile)
	run.Hosts, run.DNSUpstream, run.UpstreamCA = d.cfg.EgressHosts, d.cfg.DNSUpstream, d.cfg.UpstreamCA
	run.UpstreamAllow, run.WildcardCredentials = d.cfg.EgressUpstreamAllow, d.cfg.WildcardCredentials
	return nil
}

// restoreNetwork writes a network sandbox's files (see the top of this
// file) and names them in its restore (rs's Secrets, Audit and Egress);
// nothing for a sandbox without network (caller holds s.mu or owns s).
func (d *Daemon) restoreNetwork(sb *store.Sandbox, rs *vmmctl.Restore) error {
	if !sb.Network {
		return nil
	}
	dir := d.store.SandboxDir(sb.Tenant, sb.ID)
	sec, err := d.sandboxSecretsPath(sb.Tenant, sb.ID)
	if err != nil {
		return err
	}
	d.secretsMu.Lock()
	err = d.writeSandboxSecrets(sb, sec)
	d.secretsMu.Unlock()
	if err != nil {
		return err
	}
	rs.Secrets, rs.Audit = sec, filepath.Join(dir, sbAuditFile)
	if len(sb.Egress) > 0 {
		pol := filepath.Join(dir, sbEgressFile)
		if err := store.WriteFileAtomic(pol, append(bytes.Clone(sb.Egress), '\n'), 0o600); err != nil {
			return err
		}
		rs.Egress = pol
	}
	return nil
}

// writeSandboxSecrets writes to path the current values of the secrets
// sb names; one the tenant no longer has is left out (caller holds
// d.secretsMu).
func (d *Daemon) writeSandboxSecrets(sb *store.Sandbox, path string) error {
	all, err := d.loadSecrets(sb.Tenant)
	if err != nil {
		return err
	}
	m := map[string]string{}
	for _, n := range sb.Secrets {
		if v, ok := all[n]; ok {
			m[n] = v
		} else {
			d.log.Warn("a secret the sandbox names is gone", "tenant", sb.Tenant, "sandbox", sb.ID, "secret", n)
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if len(b) > maxSandboxSecrets {
		return errf(400, "the sandbox's secrets add up to more than %d bytes", maxSandboxSecrets)
	}
	// A confined VMM reads it as its own uid (the sandbox directory's
	// owner) at every credential request: it is the uid's from the start.
	uid := -1
	if owner := dirOwner(d.store.SandboxDir(sb.Tenant, sb.ID)); d.cfg.VMMUIDs != nil && d.cfg.VMMUIDs.has(owner) {
		uid = owner
	}
	return store.WriteFileAtomicOwned(path, b, 0o600, uid)
}

// refreshSecrets rewrites the secrets file of every network sandbox of
// tenant that names secret and has one (in the decrypt directory or in its
// own: a VMM reads it), so that a changed or deleted secret takes effect
// at its proxy's next request; a fork child reads its parent's (caller
// holds d.secretsMu).
func (d *Daemon) refreshSecrets(tenant, secret string) {
	for _, s := range d.tenantSandboxes(tenant) {
		rec := d.snapshotRec(s)
		if !rec.Network || !slices.Contains(rec.Secrets, secret) {
			continue
		}
		for _, path := range []string{d.workSecretsPath(rec.ID), d.diskSecretsPath(tenant, rec.ID)} {
			if path == "" {
				continue
			}
			if _, err := os.Stat(path); err != nil {
				continue // not started, or stopped: its start writes it
			}
			if err := d.writeSandboxSecrets(&rec, path); err != nil {
				d.log.Error("refresh the sandbox's secrets", "tenant", tenant, "sandbox", rec.ID, "err", err)
			}
		}
	}
}

// checkEgress validates a sandbox's egress policy raw (nil: none) and
// secrets names against tenant's secrets: every name must exist, and
// every credential of the policy must name one of names. It returns the
// policy, compacted.
func (d *Daemon) checkEgress(tenant string, raw json.RawMessage, names []string) (json.RawMessage, error) {
	d.secretsMu.Lock()
	all, err := d.loadSecrets(tenant)
	d.secretsMu.Unlock()
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if _, ok := all[n]; !ok {
			return nil, errf(400, "secret %q not found (PUT /v1/secrets/%s first)", n, n)
		}
	}
	if len(raw) == 0 {
		return nil, nil
	}
	p, err := policy.ParseWith(raw, policy.Options{WildcardCredentials: d.cfg.WildcardCredentials})
	if err != nil {
		return nil, errf(400, "egress: %v", err)
	}
	for _, c := range p.Credentials {
		if !slices.Contains(names, c.Secret) {
			return nil, errf(400, "egress: credential secret %q is not among the sandbox's secrets", c.Secret)
		}
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, errf(400, "egress: %v", err)
	}
	return buf.Bytes(), nil
}

// isNull reports whether raw is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// putSecret is PUT /v1/secrets/{name}: the raw body is the value. The
// tenant's file is rewritten whole, sealed when the tenant has a key (403
// once it is revoked).
func (d *Daemon) putSecret(w http.ResponseWriter, r *http.Request, tenant string) {
	name := r.PathValue("name")
	if !secretNameRE.MatchString(name) {
		writeErr(w, errf(400, "bad secret name %q: want [A-Za-z_][A-Za-z0-9_]*", name))
		return
	}
	v, err := io.ReadAll(io.LimitReader(r.Body, MaxSecretBytes+1))
	if err != nil {
		writeErr(w, errf(400, "read the value: %v", err))
		return
	}
	switch {
	case len(v) > MaxSecretBytes:
		writeErr(w, errf(http.StatusRequestEntityTooLarge, "secret %s: the value is larger than %d bytes", name, MaxSecretBytes))
		return
	case len(v) == 0:
		writeErr(w, errf(400, "secret %s: the value is empty", name))
		return
	case !utf8.Valid(v):
		writeErr(w, errf(400, "secret %s: the value is not UTF-8 text", name))
		return
	}
	st := http.StatusCreated
	err = d.editSecret(tenant, name, "secret set", func(m map[string]string) error {
		if _, existed := m[name]; existed {
			st = http.StatusOK
		}
		m[name] = string(v)
		return nil
	})
	reply(w, st, wire.Secret{Name: name}, err)
}

// editSecret changes the tenant's secrets file with edit under secretsMu,
// writes it back, hands the running sandboxes that name name the change,
// and logs msg.
func (d *Daemon) editSecret(tenant, name, msg string, edit func(m map[string]string) error) error {
	d.secretsMu.Lock()
	defer d.secretsMu.Unlock()
	m, err := d.loadSecrets(tenant)
	if err == nil {
		err = edit(m)
	}
	if err == nil {
		err = d.saveSecrets(tenant, m)
	}
	if err != nil {
		return err
	}
	d.refreshSecrets(tenant, name)
	d.log.Info(msg, "tenant", tenant, "secret", name)
	return nil
}

// listSecrets is GET /v1/secrets: names only (403 once the tenant's key
// is revoked).
func (d *Daemon) listSecrets(w http.ResponseWriter, r *http.Request, tenant string) {
	d.secretsMu.Lock()
	m, err := d.loadSecrets(tenant)
	d.secretsMu.Unlock()
	if err != nil {
		writeErr(w, err)
		return
	}
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	writeJSON(w, 200, wire.SecretList{Names: names})
}

// deleteSecret is DELETE /v1/secrets/{name}. The running sandboxes that
// named it lose it at once (their proxy's next request fails for its
// credential); a create or policy change naming it is refused from then on.
func (d *Daemon) deleteSecret(w http.ResponseWriter, r *http.Request, tenant string) {
	name := r.PathValue("name")
	err := d.editSecret(tenant, name, "secret deleted", func(m map[string]string) error {
		if _, ok := m[name]; !ok {
			return errf(404, "secret %q not found", name)
		}
		delete(m, name)
		return nil
	})
	reply(w, 200, wire.Secret{Name: name}, err)
}

// withNetwork is withSandbox for a sandbox with network (404 otherwise).
func (d *Daemon) withNetwork(h func(w http.ResponseWriter, r *http.Request, s *sbState)) handlerFunc {
	return d.withSandbox(func(w http.ResponseWriter, r *http.Request, s *sbState) {
		if rec := d.snapshotRec(s); !rec.Network {
			writeErr(w, errf(404, "sandbox %s has no network: its template %s was not built with \"network\": true", rec.ID, rec.Template))
			return
		}
		h(w, r, s)
	})
}

// getEgress is GET /v1/sandboxes/{id}/egress: its VMM's policy in force
// and counters.
func (d *Daemon) getEgress(w http.ResponseWriter, r *http.Request, s *sbState) {
	rec := d.snapshotRec(s)
	if rec.Status != store.Running && rec.Status != store.Paused {
		writeErr(w, errf(409, "sandbox %s is %s", rec.ID, rec.Status))
		return
	}
	var rep wire.EgressReply
	if err := vmmCall(r.Context(), rec.API, http.MethodGet, "egress", nil, &rep); err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, 200, rep)
}

// putEgress is PUT /v1/sandboxes/{id}/egress: a new policy, checked as a
// create's, put in force by the VMM, then recorded so that later
// restores start with it.
func (d *Daemon) putEgress(w http.ResponseWriter, r *http.Request, s *sbState) {
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20+1))
	if err != nil || len(b) > 1<<20 {
		writeErr(w, errf(400, "bad request body: want a policy of at most 1 MiB"))
		return
	}
	if isNull(b) {
		writeErr(w, errf(400, "egress: the body must be a policy (JSON object)"))
		return
	}
	rec := d.snapshotRec(s)
	pol, err := d.checkEgress(rec.Tenant, b, rec.Secrets)
	if err != nil {
		writeErr(w, err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := running(s, true); err != nil {
		writeErr(w, err)
		return
	}
	var rep wire.EgressReply
	if err := vmmCall(r.Context(), s.rec.API, http.MethodPut, "egress", pol, &rep); err != nil {
		writeErr(w, err)
		return
	}
	s.rec.Egress = pol
	err = d.save(s)
	if err == nil {
		path := filepath.Join(d.store.SandboxDir(s.rec.Tenant, s.rec.ID), sbEgressFile)
		err = store.WriteFileAtomic(path, append(bytes.Clone(pol), '\n'), 0o600)
	}
	if err != nil {
		writeErr(w, fmt.Errorf("the policy is in force, but recording it failed (a restore would start with the previous one): %w", err))
		return
	}
	writeJSON(w, 200, rep)
}
