package kube

import (
	"context"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	v1 "github.com/warrenvm/warren/fleet/api/v1alpha1"
	hc "github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
)

// Templates on a host. A Sandbox of a SandboxTemplate needs the template
// on its host's daemon, of the template's current generation. The agent
// remembers the daemon's id of each (Agent.templates, and the template's
// status.hosts); a host that has none gets one:
//
//   - from the object store, when the agent has a TemplateStore: the
//     snapshot that status.snapshots records for this host's CPU group
//     and the template's generation is fetched and imported (the daemon
//     verifies it as it does any bundle); the imported template stays
//     on the daemon, its local cache;
//   - else, or when there is none or its import fails (a warning event
//     on the template says why), by building it, as before; the build is
//     then exported and uploaded, and recorded in status.snapshots (an
//     upload that fails is a warning event: the next host builds too).
//
// Two hosts may build one template at once and both upload: the store is
// content-addressed and the later record replaces the earlier, both
// usable; no lock is needed. A template stays in its namespace, its
// tenant: the daemon client is the tenant's, and a reference of another
// tenant is refused. Network templates are neither uploaded nor imported
// (the daemon's bundles do not carry them): each host builds them.

// template returns the daemon's id of the namespace's SandboxTemplate
// name on this host, importing or building it first when this host has
// none of its current generation.
func (a *Agent) template(ctx context.Context, hcli *hc.Client, ns, name string) (string, error) {
	var tpl v1.SandboxTemplate
	if err := a.kc.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &tpl); err != nil {
		return "", fmt.Errorf("SandboxTemplate %s/%s: %w", ns, name, err)
	}
	key := fmt.Sprintf("%s/%s@%d", ns, name, tpl.Generation)
	defer a.lockBuild(key)()
	var id string
	a.mu.Lock()
	if h, ok := a.templates[ns+"/"+name]; ok && h.generation == tpl.Generation {
		id = h.id
	}
	a.mu.Unlock()
	if id == "" {
		for _, h := range tpl.Status.Hosts {
			if h.Host == a.cfg.Host && h.Generation == tpl.Generation {
				id = h.TemplateID
			}
		}
	}
	if id != "" {
		t, err := hcli.Template(ctx, id)
		if err == nil && t.Status == store.TemplateReady {
			a.remember(&tpl, id)
			return id, nil
		}
		if err != nil && !hc.IsNotFound(err) {
			return "", err
		}
	}
	ts, _ := a.cfg.Snapshots.(TemplateStore)
	if tpl.Spec.Network {
		ts = nil
	}
	if ts != nil {
		if id, ok := a.importTemplate(ctx, hcli, ts, &tpl); ok {
			return id, nil
		}
	}
	s := tpl.Spec
	t, err := hcli.CreateTemplate(ctx, wire.TemplateRequest{Kernel: s.Kernel, Initramfs: s.Initramfs, Disks: s.Disks,
		MemMiB: s.MemoryMiB, CPUs: s.CPUs, Cmdline: s.Cmdline, Network: s.Network, Balloon: s.Balloon, Image: s.Image,
		StartCmd: s.StartCommand, ReadyCmd: s.ReadyCommand, ReadyTimeoutS: s.ReadyTimeoutSeconds}, nil)
	if err != nil {
		a.event(&tpl, true, "FailedBuild", "Build", "on %s: %v", a.cfg.Host, err)
		return "", fmt.Errorf("building template %s/%s: %w", ns, name, err)
	}
	a.event(&tpl, false, "Built", "Build", "built on %s as %s", a.cfg.Host, t.ID)
	a.haveTemplate(ctx, &tpl, t.ID, "")
	if ts != nil {
		ref, err := ts.UploadTemplate(ctx, hcli, t.ID)
		if err != nil {
			a.cfg.Log.Warn("kube: uploading a template", "template", ns+"/"+name, "err", err)
			a.event(&tpl, true, "FailedUpload", "Upload", "built on %s, but the upload failed: %v", a.cfg.Host, err)
			return t.ID, nil
		}
		snap := v1.TemplateSnapshot{CPUGroup: a.cfg.CPUGroup, Generation: tpl.Generation, Ref: ref, BuiltBy: a.cfg.Host}
		if err := a.templateStatus(ctx, &tpl, func(st *v1.SandboxTemplateStatus) {
			st.Snapshots = slices.DeleteFunc(st.Snapshots, func(o v1.TemplateSnapshot) bool {
				return o.CPUGroup == snap.CPUGroup && o.Generation <= snap.Generation
			})
			st.Snapshots = append(st.Snapshots, snap)
		}); err != nil {
			a.cfg.Log.Warn("kube: recording a template's snapshot", "template", ns+"/"+name, "err", err)
		} else {
			a.event(&tpl, false, "Uploaded", "Upload", "built on %s, uploaded as %s", a.cfg.Host, ref)
		}
	}
	return t.ID, nil
}

// importTemplate imports the snapshot of tpl that the template's status
// (read again) records for this host's CPU group and tpl's generation;
// false when there is none or the import failed (said in the log and in
// an event on the template).
func (a *Agent) importTemplate(ctx context.Context, hcli *hc.Client, ts TemplateStore, tpl *v1.SandboxTemplate) (string, bool) {
	var cur v1.SandboxTemplate
	if err := a.c.GetAPIReader().Get(ctx, types.NamespacedName{Namespace: tpl.Namespace, Name: tpl.Name}, &cur); err != nil {
		return "", false
	}
	ref := ""
	for _, s := range cur.Status.Snapshots {
		if s.CPUGroup == a.cfg.CPUGroup && s.Generation == tpl.Generation {
			ref = s.Ref
		}
	}
	if ref == "" {
		return "", false
	}
	t, err := ts.ImportTemplate(ctx, hcli, ref)
	if err == nil && t.Status != store.TemplateReady {
		err = fmt.Errorf("the imported template %s is %s", t.ID, t.Status)
	}
	if err != nil {
		a.cfg.Log.Warn("kube: importing a template failed; building it", "template", tpl.Namespace+"/"+tpl.Name, "ref", ref, "err", err)
		a.event(tpl, true, "FailedImport", "Import", "on %s, from %s: %v; building it here", a.cfg.Host, ref, err)
		return "", false
	}
	a.event(tpl, false, "Imported", "Import", "imported on %s as %s from %s", a.cfg.Host, t.ID, ref)
	a.haveTemplate(ctx, tpl, t.ID, ref)
	return t.ID, true
}

// haveTemplate remembers that this host has tpl as the daemon's template
// id (imported from ref, or built when ref is empty), here and in the
// template's status.hosts.
func (a *Agent) haveTemplate(ctx context.Context, tpl *v1.SandboxTemplate, id, ref string) {
	a.remember(tpl, id)
	if err := a.templateStatus(ctx, tpl, func(st *v1.SandboxTemplateStatus) {
		st.Hosts = slices.DeleteFunc(st.Hosts, func(h v1.TemplateOnHost) bool { return h.Host == a.cfg.Host })
		st.Hosts = append(st.Hosts, v1.TemplateOnHost{Host: a.cfg.Host, TemplateID: id, Generation: tpl.Generation, ImportedFrom: ref})
	}); err != nil {
		a.cfg.Log.Warn("kube: recording the template on this host", "template", tpl.Namespace+"/"+tpl.Name, "err", err)
	}
}

// remember records id as this host's template for tpl's generation,
// replacing any older generation's entry.
func (a *Agent) remember(tpl *v1.SandboxTemplate, id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.templates[tpl.Namespace+"/"+tpl.Name] = hostTemplate{generation: tpl.Generation, id: id}
}

// lockBuild takes key's build lock (made on first use) and returns its
// release, which drops the lock's entry once nobody holds or waits for it.
func (a *Agent) lockBuild(key string) (release func()) {
	a.mu.Lock()
	b := a.building[key]
	if b == nil {
		b = &buildLock{}
		a.building[key] = b
	}
	b.users++
	a.mu.Unlock()
	b.Lock()
	return func() {
		b.Unlock()
		a.mu.Lock()
		defer a.mu.Unlock()
		if b.users--; b.users == 0 {
			delete(a.building, key)
		}
	}
}

// templateStatus applies fn to the template's status as last stored and
// updates it (optimistically: on a conflict with another host's update,
// read again, from the API server, and retry).
func (a *Agent) templateStatus(ctx context.Context, tpl *v1.SandboxTemplate, fn func(*v1.SandboxTemplateStatus)) error {
	backoff := wait.Backoff{Steps: 8, Duration: 20 * time.Millisecond, Factor: 1.5, Jitter: 0.5}
	return retry.RetryOnConflict(backoff, func() error {
		var cur v1.SandboxTemplate
		if err := a.c.GetAPIReader().Get(ctx, types.NamespacedName{Namespace: tpl.Namespace, Name: tpl.Name}, &cur); err != nil {
			return err
		}
		fn(&cur.Status)
		return a.kc.Status().Update(ctx, &cur)
	})
}
