package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/warrenvm/warren/fleet/api/v1alpha1"
	fleetctl "github.com/warrenvm/warren/fleet/controller"
	hc "github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
)

// Daemon labels the agent puts on the VMs it makes.
const (
	// LabelUID is the Sandbox's UID.
	LabelUID = "warren.dev/uid"
	// LabelName is the Sandbox's namespace/name.
	LabelName = "warren.dev/name"
	// AnnotationForking marks a Sandbox made for a SandboxFork's child
	// before the fork: its VM comes from the fork, not from its template.
	AnnotationForking = "warren.dev/forking"
)

// sandboxReconciler makes the VMs of the Sandboxes placed on this host
// match them.
type sandboxReconciler struct {
	a *Agent
	// admit serializes the room check with the journal entry it leads
	// to, so that two sandboxes placed at once cannot both take the last
	// room.
	admit sync.Mutex
}

// Reconcile is one pass over one Sandbox of this host.
func (r *sandboxReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	res, err := r.reconcile(ctx, req)
	if apierrors.IsConflict(err) {
		return ctrl.Result{Requeue: true}, nil // another writer was first: retry quietly
	}
	return res, err
}

func (r *sandboxReconciler) reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	a := r.a
	var sb v1.Sandbox
	if err := a.kc.Get(ctx, req.NamespacedName, &sb); err != nil {
		if client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, err
		}
		// Gone, or moved to another host (the cache holds only this
		// host's): no VM of it may stay here.
		return ctrl.Result{}, a.release(ctx, req.Namespace, req.Name, "")
	}
	if sb.Labels[v1.LabelHost] != a.cfg.Host {
		return ctrl.Result{}, a.release(ctx, sb.Namespace, sb.Name, "")
	}
	// Entries of the same name under another UID are of a deleted
	// Sandbox made again: their VMs go.
	if err := a.release(ctx, sb.Namespace, sb.Name, string(sb.UID)); err != nil {
		return ctrl.Result{}, err
	}
	if !sb.DeletionTimestamp.IsZero() {
		if err := a.stop(ctx, &sb); err != nil {
			return ctrl.Result{}, err
		}
		if controllerutil.ContainsFinalizer(&sb, v1.HostFinalizer) {
			orig := sb.DeepCopy()
			controllerutil.RemoveFinalizer(&sb, v1.HostFinalizer)
			return ctrl.Result{}, client.IgnoreNotFound(a.kc.Patch(ctx, &sb, client.MergeFrom(orig)))
		}
		return ctrl.Result{}, nil
	}
	if t := sb.Spec.ShutdownTime; t != nil && !time.Now().Before(t.Time) {
		if err := a.stop(ctx, &sb); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, a.setStatus(ctx, &sb, func(st *v1.SandboxStatus) {
			st.Phase, st.SandboxID, st.AgentEndpoint = v1.SandboxExpired, "", ""
			setCond(st, sb.Generation, v1.ConditionReady, false, "Expired", "shutdownTime passed: the VM was stopped")
		})
	}
	var requeue time.Duration
	if t := sb.Spec.ShutdownTime; t != nil {
		requeue = time.Until(t.Time)
	}
	if sb.Status.Phase == v1.SandboxExpired || sb.Annotations[AnnotationForking] != "" {
		return ctrl.Result{}, nil
	}
	hcli, err := a.tenant(sb.Namespace)
	if err != nil {
		return ctrl.Result{}, err
	}
	e, ok := a.journal.get(string(sb.UID))
	if ok && e.ID == "" {
		if e, ok, err = a.resolvePending(ctx, hcli, e); err != nil {
			return ctrl.Result{}, err
		}
	}
	if !ok {
		res, err := r.start(ctx, hcli, &sb)
		if res.RequeueAfter == 0 && requeue > 0 {
			res.RequeueAfter = requeue
		}
		return res, err
	}
	local, err := hcli.Sandbox(ctx, e.ID)
	if hc.IsNotFound(err) {
		// The VM's record went (the daemon's state was lost): forget it
		// and start again.
		a.cfg.Log.Warn("kube: sandbox vanished from the daemon", "sandbox", req.String(), "id", e.ID)
		return ctrl.Result{Requeue: true}, a.journal.drop(e.UID)
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: requeue}, r.converge(ctx, hcli, &sb, local)
}

// start makes the VM of a Sandbox that has none here: restored from its
// snapshot in the object store when it has one (a resume elsewhere, or a
// recovery), else from its template. A host without room refuses it.
func (r *sandboxReconciler) start(ctx context.Context, hcli *hc.Client, sb *v1.Sandbox) (ctrl.Result, error) {
	a := r.a
	if sb.Status.Snapshot != "" && a.cfg.Snapshots == nil {
		return ctrl.Result{}, a.refuse(ctx, sb, "NoObjectStore", "this host has no object store to restore snapshot "+sb.Status.Snapshot+" from")
	}
	r.admit.Lock()
	if ok, why, err := a.room(ctx, sb); err != nil || !ok {
		r.admit.Unlock()
		if err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, a.refuse(ctx, sb, "HostFull", why)
	}
	e := Entry{UID: string(sb.UID), Namespace: sb.Namespace, Name: sb.Name}
	err := a.journal.put(e)
	r.admit.Unlock()
	if err != nil {
		return ctrl.Result{}, err
	}
	labels := map[string]string{LabelUID: e.UID, LabelName: sb.Namespace + "/" + sb.Name, "name": sb.Name}
	var id, how string
	if sb.Status.Snapshot != "" {
		how = "restored from snapshot " + sb.Status.Snapshot
		id, err = a.cfg.Snapshots.Restore(ctx, hcli, sb.Status.Snapshot, labels)
	} else {
		var tplID string
		if tplID, err = a.template(ctx, hcli, sb.Namespace, sb.Spec.SandboxTemplateRef.Name); err == nil {
			how = "created from template " + sb.Spec.SandboxTemplateRef.Name
			var egress json.RawMessage
			if sb.Spec.EgressPolicy != nil {
				egress = sb.Spec.EgressPolicy.Raw
			}
			var local *hc.Sandbox
			local, err = hcli.Create(ctx, wire.SandboxRequest{Template: tplID, MemMiB: sb.Spec.Resources.MemoryMiB,
				CPUs: sb.Spec.Resources.CPUs, Egress: egress, Env: sb.Spec.Env, Secrets: sb.Spec.SecretNames, Labels: labels}, nil)
			if local != nil {
				id = local.ID
			}
		}
	}
	if err != nil {
		// Nothing was made (a failed create leaves a failed record, which
		// resolvePending would find: delete what the label finds).
		a.event(sb, true, "FailedStart", "Start", "%v", err)
		a.journal.drop(e.UID)
		a.deleteLabelled(ctx, hcli, e.UID)
		serr := a.setStatus(ctx, sb, func(st *v1.SandboxStatus) {
			setCond(st, sb.Generation, v1.ConditionReady, false, "FailedStart", err.Error())
		})
		return ctrl.Result{RequeueAfter: 15 * time.Second}, serr
	}
	e.ID = id
	if err := a.journal.put(e); err != nil {
		return ctrl.Result{}, err
	}
	a.event(sb, false, "Started", "Start", "%s on %s as %s", how, a.cfg.Host, id)
	if sb.Spec.OperatingMode == v1.OperatingModeSuspended {
		return ctrl.Result{Requeue: true}, nil // converge suspends it
	}
	return ctrl.Result{}, a.setStatus(ctx, sb, func(st *v1.SandboxStatus) {
		a.running(st, sb, id)
	})
}

// running fills the status of a running sandbox.
func (a *Agent) running(st *v1.SandboxStatus, sb *v1.Sandbox, id string) {
	st.HostName, st.SandboxID, st.Phase = a.cfg.Host, id, v1.SandboxRunning
	st.AgentEndpoint = ""
	if a.cfg.Endpoint != "" {
		st.AgentEndpoint = a.cfg.Endpoint + "/v1/sandboxes/" + id
	}
	st.ObservedGeneration = sb.Generation
	setCond(st, sb.Generation, v1.ConditionReady, true, "Running", "running on "+a.cfg.Host)
	setCond(st, sb.Generation, v1.ConditionSuspended, false, "Running", "")
	if meta.IsStatusConditionTrue(st.Conditions, v1.ConditionLost) {
		setCond(st, sb.Generation, v1.ConditionLost, false, "Running", "running on "+a.cfg.Host)
	}
}

// converge brings an existing VM to the Sandbox's operating mode.
func (r *sandboxReconciler) converge(ctx context.Context, hcli *hc.Client, sb *v1.Sandbox, local *hc.Sandbox) error {
	a := r.a
	want := sb.Spec.OperatingMode
	if want == "" {
		want = v1.OperatingModeRunning
	}
	switch {
	case want == v1.OperatingModeSuspended && (local.Status == store.Running || local.Status == store.Paused):
		if _, err := hcli.Pause(ctx, local.ID, true, nil); err != nil {
			a.event(sb, true, "FailedSuspend", "Suspend", "%v", err)
			return err
		}
		ref := ""
		if a.cfg.Snapshots != nil {
			var err error
			if ref, err = a.cfg.Snapshots.Upload(ctx, hcli, local.ID); err != nil {
				a.event(sb, true, "FailedUpload", "Suspend", "suspended here, but the upload failed: %v", err)
				return err
			}
		}
		a.event(sb, false, "Suspended", "Suspend", "suspended on %s (snapshot %q)", a.cfg.Host, ref)
		if err := a.setStatus(ctx, sb, func(st *v1.SandboxStatus) {
			st.Phase = v1.SandboxSuspended
			if ref != "" {
				now := metav1.Now()
				st.Snapshot, st.SnapshotTime, st.SnapshotCPUGroup = ref, &now, a.cfg.CPUGroup
			}
			st.ObservedGeneration = sb.Generation
			setCond(st, sb.Generation, v1.ConditionReady, false, "Suspended", "suspended on "+a.cfg.Host)
			setCond(st, sb.Generation, v1.ConditionSuspended, true, "Suspended", "snapshot "+ref)
		}); err != nil || ref == "" {
			return err
		}
		// In the object store, it needs this host no more: release it, so
		// that its resume is placed on any host of its CPU group.
		return a.releaseSuspended(ctx, sb)
	case want == v1.OperatingModeSuspended && local.Status == store.Suspended:
		if sb.Status.Phase == v1.SandboxSuspended {
			return nil
		}
		return a.setStatus(ctx, sb, func(st *v1.SandboxStatus) {
			st.Phase = v1.SandboxSuspended
			setCond(st, sb.Generation, v1.ConditionSuspended, true, "Suspended", "")
		})
	case want == v1.OperatingModeSuspended && local.Status == store.Suspended && sb.Status.Snapshot != "" && a.cfg.Snapshots != nil:
		return a.releaseSuspended(ctx, sb)
	case want == v1.OperatingModeRunning && local.Status == store.Stopped && len(local.Snapshots) == 0:
		// Its VMM died (the host restarted, or it crashed) and there is no
		// snapshot to resume from: say so; starting it again from its
		// template would silently lose what ran in it.
		if sb.Status.Phase == v1.SandboxFailed {
			return nil
		}
		a.event(sb, true, "VMStopped", "Resume", "its VM stopped (%s) and it has no snapshot to resume from", local.Reason)
		return a.setStatus(ctx, sb, func(st *v1.SandboxStatus) {
			st.Phase = v1.SandboxFailed
			setCond(st, sb.Generation, v1.ConditionReady, false, "VMStopped", "the VM stopped ("+local.Reason+") and has no snapshot to resume from")
		})
	case want == v1.OperatingModeRunning && local.Status != store.Running:
		if local.Status == store.Failed || local.Status == store.Creating {
			return a.setStatus(ctx, sb, func(st *v1.SandboxStatus) {
				st.Phase = v1.SandboxFailed
				setCond(st, sb.Generation, v1.ConditionReady, false, "VMFailed", local.Reason)
			})
		}
		if _, err := hcli.Resume(ctx, local.ID, nil); err != nil {
			a.event(sb, true, "FailedResume", "Resume", "%v", err)
			return err
		}
		a.event(sb, false, "Resumed", "Resume", "resumed on %s", a.cfg.Host)
	}
	if want == v1.OperatingModeRunning && (sb.Status.Phase != v1.SandboxRunning || sb.Status.SandboxID != local.ID ||
		!meta.IsStatusConditionTrue(sb.Status.Conditions, v1.ConditionReady)) {
		return a.setStatus(ctx, sb, func(st *v1.SandboxStatus) { a.running(st, sb, local.ID) })
	}
	return nil
}

// releaseSuspended deletes the local copy of a sandbox suspended to the
// object store and takes it off this host (status first, then the
// label), so that it holds no room here and resumes wherever it is
// placed next.
func (a *Agent) releaseSuspended(ctx context.Context, sb *v1.Sandbox) error {
	if err := a.stop(ctx, sb); err != nil {
		return err
	}
	if err := a.setStatus(ctx, sb, func(st *v1.SandboxStatus) {
		st.HostName, st.SandboxID, st.AgentEndpoint = "", "", ""
	}); err != nil {
		return err
	}
	orig := sb.DeepCopy()
	delete(sb.Labels, v1.LabelHost)
	return client.IgnoreNotFound(a.kc.Patch(ctx, sb, client.MergeFrom(orig)))
}

// room says whether this host can take sb besides the VMs it already
// runs (journaled) for other Sandboxes, and why not.
func (a *Agent) room(ctx context.Context, sb *v1.Sandbox) (bool, string, error) {
	var l v1.SandboxList
	if err := a.kc.List(ctx, &l); err != nil {
		return false, "", err
	}
	var tl v1.SandboxTemplateList
	if err := a.kc.List(ctx, &tl); err != nil {
		return false, "", err
	}
	tpl := func(o *v1.Sandbox) *v1.SandboxTemplate {
		for i := range tl.Items {
			if tl.Items[i].Namespace == o.Namespace && tl.Items[i].Name == o.Spec.SandboxTemplateRef.Name {
				return &tl.Items[i]
			}
		}
		return nil
	}
	mem, cpus := 0, 0
	for i := range l.Items {
		o := &l.Items[i]
		if o.UID == sb.UID {
			continue
		}
		if _, ok := a.journal.get(string(o.UID)); !ok {
			continue
		}
		m, c := fleetctl.Committed(o, tpl(o))
		mem, cpus = mem+m, cpus+c
	}
	m, c := fleetctl.Committed(sb, tpl(sb))
	capy := a.cfg.Capacity
	if mem+m > capy.MemoryMiB || cpus+c > capy.CPUs {
		return false, fmt.Sprintf("host %s has %d/%d MiB and %d/%d CPUs committed; the sandbox needs %d MiB and %d CPUs",
			a.cfg.Host, mem, capy.MemoryMiB, cpus, capy.CPUs, m, c), nil
	}
	return true, "", nil
}

// refuse hands sb back to the controller: this host is added to its
// excluded hosts and its host label goes, so it is placed elsewhere.
func (a *Agent) refuse(ctx context.Context, sb *v1.Sandbox, reason, msg string) error {
	a.event(sb, true, "Refused", "Start", "%s", msg)
	if err := a.setStatus(ctx, sb, func(st *v1.SandboxStatus) {
		if !slices.Contains(st.ExcludedHosts, a.cfg.Host) {
			st.ExcludedHosts = append(st.ExcludedHosts, a.cfg.Host)
		}
		st.HostName, st.Phase = "", v1.SandboxPending
		setCond(st, sb.Generation, v1.ConditionReady, false, reason, msg)
	}); err != nil {
		return err
	}
	orig := sb.DeepCopy()
	delete(sb.Labels, v1.LabelHost)
	return client.IgnoreNotFound(a.kc.Patch(ctx, sb, client.MergeFrom(orig)))
}

// stop deletes sb's VM here, if any.
func (a *Agent) stop(ctx context.Context, sb *v1.Sandbox) error {
	e, ok := a.journal.get(string(sb.UID))
	if !ok {
		return nil
	}
	return a.deleteEntry(ctx, e)
}

// release deletes the VMs journaled for namespace/name, except the one
// of UID keep.
func (a *Agent) release(ctx context.Context, ns, name, keep string) error {
	for _, e := range a.journal.byName(ns, name) {
		if e.UID == keep {
			continue
		}
		a.cfg.Log.Info("kube: deleting a VM whose Sandbox went or moved", "sandbox", ns+"/"+name, "id", e.ID)
		if err := a.deleteEntry(ctx, e); err != nil {
			return err
		}
	}
	return nil
}

// deleteEntry deletes e's VM (and any the daemon labelled with its UID)
// and forgets it.
func (a *Agent) deleteEntry(ctx context.Context, e Entry) error {
	hcli, err := a.tenant(e.Namespace)
	if err != nil {
		return err
	}
	if e.ID != "" {
		if err := hcli.Delete(ctx, e.ID); err != nil && !hc.IsNotFound(err) {
			return err
		}
	}
	if err := a.deleteLabelled(ctx, hcli, e.UID); err != nil {
		return err
	}
	return a.journal.drop(e.UID)
}

// deleteLabelled deletes the tenant's VMs labelled with uid.
func (a *Agent) deleteLabelled(ctx context.Context, hcli *hc.Client, uid string) error {
	l, err := hcli.Sandboxes(ctx)
	if err != nil {
		return err
	}
	for _, s := range l {
		if s.Labels[LabelUID] == uid {
			if err := hcli.Delete(ctx, s.ID); err != nil && !hc.IsNotFound(err) {
				return err
			}
		}
	}
	return nil
}

// resolvePending finds the VM of an entry journaled before its create
// returned: by its UID label (keeping the newest that is not failed), or
// none (the entry is dropped).
func (a *Agent) resolvePending(ctx context.Context, hcli *hc.Client, e Entry) (Entry, bool, error) {
	l, err := hcli.Sandboxes(ctx)
	if err != nil {
		return e, false, err
	}
	for _, s := range slices.Backward(l) {
		if s.Labels[LabelUID] == e.UID && s.Status != store.Failed {
			e.ID = s.ID
			return e, true, a.journal.put(e)
		}
	}
	return e, false, a.deleteEntry(ctx, e)
}

// sweep runs at start: every journaled VM whose Sandbox is gone, was made
// again (another UID) or is placed on another host is deleted; this is
// what keeps a daemon that comes back after its sandboxes moved from
// running second copies.
func (a *Agent) sweep(ctx context.Context, c client.Client) error {
	for _, e := range a.journal.all() {
		var sb v1.Sandbox
		err := c.Get(ctx, types.NamespacedName{Namespace: e.Namespace, Name: e.Name}, &sb)
		if client.IgnoreNotFound(err) != nil {
			return err
		}
		if err == nil && string(sb.UID) == e.UID && sb.Labels[v1.LabelHost] == a.cfg.Host && sb.Status.Phase != v1.SandboxExpired {
			continue
		}
		a.cfg.Log.Info("kube: sweeping a VM whose Sandbox went or moved", "sandbox", e.Namespace+"/"+e.Name, "id", e.ID)
		if err := a.deleteEntry(ctx, e); err != nil {
			return err
		}
	}
	return nil
}

// setStatus applies fn to sb's status and patches it.
func (a *Agent) setStatus(ctx context.Context, sb *v1.Sandbox, fn func(*v1.SandboxStatus)) error {
	orig := sb.DeepCopy()
	fn(&sb.Status)
	err := a.kc.Status().Patch(ctx, sb, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
	return client.IgnoreNotFound(err)
}

// setCond sets one condition.
func setCond(st *v1.SandboxStatus, gen int64, typ string, ok bool, reason, msg string) {
	s := metav1.ConditionFalse
	if ok {
		s = metav1.ConditionTrue
	}
	if reason == "" {
		reason = "Unknown"
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen})
}

// errNotMine: a request names a sandbox this host does not run.
var errNotMine = errors.New("not on this host")
