package daemon

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"

	"github.com/warrenvm/warren/hostd/crypt"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
)

// encrypts reports whether tenant's snapshots are sealed (it has a key).
func (d *Daemon) encrypts(tenant string) bool {
	if d.atRest == nil {
		return false
	}
	_, ok, _ := d.atRest.key(tenant)
	return ok
}

// keyUsable fails (403, the provider's message) when tenant's key was
// revoked: nothing of the tenant may be restored or built any more.
func (d *Daemon) keyUsable(tenant string) error {
	if d.atRest == nil {
		return nil
	}
	if _, _, err := d.atRest.key(tenant); err != nil {
		return cryptStatus(err)
	}
	return nil
}

// tenantDir is where everything of tenant lives on disk.
func (d *Daemon) tenantDir(tenant string) string {
	return filepath.Join(d.cfg.State, "tenants", tenant)
}

// sealAll seals what is left in plaintext of every tenant with a key (a
// crash between a snapshot and its sealing, secrets written before the key
// existed).
func (d *Daemon) sealAll() {
	if d.atRest == nil {
		return
	}
	ents, _ := os.ReadDir(filepath.Join(d.cfg.State, "tenants"))
	for _, e := range ents {
		if !e.IsDir() || !store.ValidTenant(e.Name()) {
			continue
		}
		if err := d.atRest.sealTenant(e.Name(), d.tenantDir(e.Name())); err != nil {
			d.log.Error("sealing snapshots", "tenant", e.Name(), "err", err)
		}
		d.sealIdleDisks(e.Name())
		d.secretsMu.Lock()
		err := d.sealSecrets(e.Name())
		d.secretsMu.Unlock()
		if err != nil {
			d.log.Error("sealing secrets", "tenant", e.Name(), "err", err)
		}
	}
}

// tenantSandboxes returns tenant's sandboxes.
func (d *Daemon) tenantSandboxes(tenant string) []*sbState {
	var out []*sbState
	for _, s := range d.allSandboxes() {
		if s.rec.Tenant == tenant {
			out = append(out, s)
		}
	}
	return out
}

// KeyInfo is the answer of the /v1/keys calls.
type KeyInfo = wire.KeyInfo

func (d *Daemon) keysConfigured(w http.ResponseWriter) bool {
	if d.atRest == nil {
		writeErr(w, errf(http.StatusNotImplemented, "at-rest encryption is not configured on this daemon (warren-hostd --keys DIR)"))
		return false
	}
	return true
}

// postKey creates the tenant's key and seals its existing snapshots and
// secrets file.
func (d *Daemon) postKey(w http.ResponseWriter, r *http.Request, tenant string) {
	if !d.keysConfigured(w) {
		return
	}
	k, err := d.atRest.keys.Create(tenant)
	if err != nil {
		if errors.Is(err, crypt.ErrKeyExists) || errors.Is(err, crypt.ErrRevoked) {
			writeErr(w, errf(409, "%v", err))
			return
		}
		writeErr(w, err)
		return
	}
	// The tenant's snapshots so far are sealed now; while that runs no
	// operation of its sandboxes may snapshot or restore, and none may
	// take an incremental snapshot on a layer sealed under it.
	sbs := d.tenantSandboxes(tenant)
	for _, s := range sbs {
		s.mu.Lock()
	}
	// Nor may a template's cache be dropped while its reference file is
	// dealt with (templatepages.go).
	var tpls []*tplState
	for _, ts := range d.templateStates() {
		if t := ts.view.Load(); t != nil && t.Tenant == tenant {
			ts.warm.Lock()
			tpls = append(tpls, ts)
		}
	}
	err = d.atRest.sealTenant(tenant, d.tenantDir(tenant))
	for _, ts := range tpls {
		ts.warm.Unlock()
	}
	d.sealIdleDisks(tenant)
	d.secretsMu.Lock()
	err = errors.Join(err, d.sealSecrets(tenant))
	d.secretsMu.Unlock()
	for _, s := range sbs {
		s.chainOK = false
		s.mu.Unlock()
	}
	d.forgetWorkingSets(tenant)
	if err != nil {
		d.log.Error("sealing snapshots", "tenant", tenant, "err", err)
		writeErr(w, errf(500, "key created, but sealing the existing snapshots or secrets failed: %v", err))
		return
	}
	d.log.Info("encryption key created", "tenant", tenant, "key_id", k.ID())
	d.events.publish(tenant, wire.Event{Type: "key_created", Detail: k.ID()})
	writeJSON(w, http.StatusCreated, KeyInfo{Tenant: tenant, KeyID: k.ID()})
}

// getKey says whether the tenant has a key.
func (d *Daemon) getKey(w http.ResponseWriter, r *http.Request, tenant string) {
	if !d.keysConfigured(w) {
		return
	}
	k, err := d.atRest.keys.Key(context.Background(), tenant)
	switch {
	case errors.Is(err, crypt.ErrNoKey):
		writeErr(w, errf(404, "tenant %s has no encryption key", tenant))
	case errors.Is(err, crypt.ErrRevoked):
		writeJSON(w, 200, KeyInfo{Tenant: tenant, Revoked: true})
	case err != nil:
		writeErr(w, err)
	default:
		writeJSON(w, 200, KeyInfo{Tenant: tenant, KeyID: k.ID()})
	}
}

// deleteKey revokes the tenant's key (crypto-shredding) and stops its
// running sandboxes: their memory is plaintext, a snapshot they took could
// not be sealed any more, and their secrets files in the decrypt
// directory go with them (markStopped).
func (d *Daemon) deleteKey(w http.ResponseWriter, r *http.Request, tenant string) {
	if !d.keysConfigured(w) {
		return
	}
	// The key as it was: the disks of the VMMs stopped below are sealed
	// with it once they are idle (diskseal.go), then it is dropped.
	key, _, _ := d.atRest.key(tenant)
	if err := d.atRest.keys.Revoke(tenant); err != nil {
		if errors.Is(err, crypt.ErrNoKey) {
			writeErr(w, errf(404, "tenant %s has no encryption key", tenant))
			return
		}
		writeErr(w, err)
		return
	}
	stopped := []string{}
	for _, s := range d.tenantSandboxes(tenant) {
		s.mu.Lock()
		if s.rec.Status == store.Running || s.rec.Status == store.Paused {
			if s.stopRolling != nil {
				s.stopRolling()
				s.stopRolling = nil
			}
			stopProc(s.rec.PID, s.rec.StartTime, StopGrace)
			d.markStopped(s, "the tenant's encryption key was revoked")
			stopped = append(stopped, s.rec.ID)
		}
		s.mu.Unlock()
	}
	d.sealIdleDisksWith(tenant, key)
	d.atRest.dropTemplateCopies(tenant, "")
	d.log.Warn("encryption key revoked", "tenant", tenant, "stopped", len(stopped))
	d.events.publish(tenant, wire.Event{Type: "key_revoked", Detail: "key revoked"})
	writeJSON(w, 200, KeyInfo{Tenant: tenant, Revoked: true, Stopped: stopped})
}
