package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/warrenvm/warren/fleet/api/v1alpha1"
	"github.com/warrenvm/warren/fleet/placement"
)

// retryPlacement is how long an unplaceable sandbox waits before the
// next try when no host event comes first.
const retryPlacement = 10 * time.Second

// sandboxReconciler places, expires and loses Sandboxes.
type sandboxReconciler struct {
	c   client.Client
	cfg Config
	rec events.EventRecorder

	// placing serializes placements: a decision and its write happen
	// under it, and assumed holds the placements written that the cache
	// may not show yet (sandbox UID to host and when), counted as
	// committed until it does, so that concurrent workers never see a
	// host's room twice (kube-scheduler's "assume").
	placing sync.Mutex
	assumed map[types.UID]assumption
}

// assumption is a placement not yet seen in the cache.
type assumption struct {
	host string
	at   time.Time
}

// assumeFor is how long a placement counts before the cache shows it.
const assumeFor = 30 * time.Second

// hostView is a host as placement sees it now.
type hostView struct {
	host    *v1.WarrenHost
	expires time.Time // when its Lease runs out; zero without one
	alive   bool      // its Lease is current
}

// hostViews reads every WarrenHost and its Lease from the cache.
func (r *sandboxReconciler) hostViews(ctx context.Context, now time.Time) (map[string]*hostView, error) {
	var hl v1.WarrenHostList
	if err := r.c.List(ctx, &hl); err != nil {
		return nil, err
	}
	var ll coordv1.LeaseList
	if err := r.c.List(ctx, &ll, client.InNamespace(v1.LeaseNamespace)); err != nil {
		return nil, err
	}
	leases := map[string]*coordv1.Lease{}
	for i := range ll.Items {
		leases[ll.Items[i].Name] = &ll.Items[i]
	}
	out := map[string]*hostView{}
	for i := range hl.Items {
		h := &hl.Items[i]
		hv := &hostView{host: h}
		if exp, ok := LeaseExpiry(leases[h.Name]); ok {
			hv.expires = exp
			hv.alive = now.Before(exp)
		}
		out[h.Name] = hv
	}
	return out, nil
}

// LeaseExpiry is when l runs out: its renew (or acquire) time plus its
// duration; false when l is nil or lacks either.
func LeaseExpiry(l *coordv1.Lease) (time.Time, bool) {
	if l == nil || l.Spec.LeaseDurationSeconds == nil {
		return time.Time{}, false
	}
	t := l.Spec.RenewTime
	if t == nil {
		t = l.Spec.AcquireTime
	}
	if t == nil {
		return time.Time{}, false
	}
	return t.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second), true
}

// unplaced returns requests for every sandbox on no host.
func (r *sandboxReconciler) unplaced(ctx context.Context) []reconcile.Request {
	var l v1.SandboxList
	if err := r.c.List(ctx, &l, client.MatchingFields{indexHost: unplaced}); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(l.Items))
	for _, sb := range l.Items {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: sb.Namespace, Name: sb.Name}})
	}
	return out
}

// Reconcile is one pass over one Sandbox.
func (r *sandboxReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return conflictRequeue(r.reconcile(ctx, req))
}

func (r *sandboxReconciler) reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var sb v1.Sandbox
	if err := r.c.Get(ctx, req.NamespacedName, &sb); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	now := r.cfg.Now()
	hosts, err := r.hostViews(ctx, now)
	if err != nil {
		return ctrl.Result{}, err
	}
	host := sb.Labels[v1.LabelHost]
	hv := hosts[host]
	if !sb.DeletionTimestamp.IsZero() {
		// A live host's agent stops the VM and removes the finalizer; with
		// no host, or a lost one, there is nothing to stop.
		if (host == "" || hv == nil || !hv.alive) && controllerutil.ContainsFinalizer(&sb, v1.HostFinalizer) {
			orig := sb.DeepCopy()
			controllerutil.RemoveFinalizer(&sb, v1.HostFinalizer)
			return ctrl.Result{}, client.IgnoreNotFound(r.c.Patch(ctx, &sb, client.MergeFrom(orig)))
		}
		return ctrl.Result{}, nil
	}
	var next time.Duration
	if t := sb.Spec.ShutdownTime; t != nil {
		if !now.Before(t.Time) {
			return r.expire(ctx, &sb, host)
		}
		next = t.Sub(now)
	}
	if host != "" {
		if hv == nil || !hv.alive {
			return r.lost(ctx, &sb, host)
		}
		return ctrl.Result{RequeueAfter: soonest(next, hv.expires.Sub(now)+time.Second)}, nil
	}
	switch {
	case sb.Status.Phase == v1.SandboxExpired, sb.Status.Phase == v1.SandboxLost:
		return ctrl.Result{RequeueAfter: next}, nil
	case sb.Spec.OperatingMode == v1.OperatingModeSuspended && sb.Status.Snapshot != "":
		// Suspended to the object store and released by its host: it
		// is placed again when it is to run.
		return ctrl.Result{RequeueAfter: next}, nil
	}
	res, err := r.place(ctx, &sb, hosts)
	if next > 0 {
		res.RequeueAfter = soonest(res.RequeueAfter, next)
	}
	return res, err
}

// soonest is the smaller positive duration of a and b (0 when neither).
func soonest(a, b time.Duration) time.Duration {
	switch {
	case a <= 0:
		return max(b, 0)
	case b <= 0:
		return a
	}
	return min(a, b)
}

// expire handles a sandbox past its shutdownTime: Delete deletes the
// object (its host's agent stops the VM first, by the finalizer); Retain
// leaves the VM to the agent, which stops it and sets phase Expired; a
// sandbox on no host is marked Expired here.
func (r *sandboxReconciler) expire(ctx context.Context, sb *v1.Sandbox, host string) (ctrl.Result, error) {
	if sb.Spec.ShutdownPolicy == v1.ShutdownPolicyDelete {
		r.rec.Eventf(sb, nil, corev1.EventTypeNormal, "Expired", "Delete", "shutdownTime %s passed: deleting", sb.Spec.ShutdownTime.UTC().Format(time.RFC3339))
		return ctrl.Result{}, client.IgnoreNotFound(r.c.Delete(ctx, sb))
	}
	if host != "" || sb.Status.Phase == v1.SandboxExpired {
		return ctrl.Result{}, nil
	}
	orig := sb.DeepCopy()
	sb.Status.Phase = v1.SandboxExpired
	meta.SetStatusCondition(&sb.Status.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse,
		Reason: "Expired", Message: "shutdownTime passed", ObservedGeneration: sb.Generation})
	return ctrl.Result{}, client.IgnoreNotFound(r.c.Status().Patch(ctx, sb, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})))
}

// lost marks a sandbox whose host's Lease expired Lost; one with a
// snapshot in the object store is taken off the host to be placed
// elsewhere (restored from it by the new host), with a Recovered
// condition naming the snapshot.
func (r *sandboxReconciler) lost(ctx context.Context, sb *v1.Sandbox, host string) (ctrl.Result, error) {
	orig := sb.DeepCopy()
	if !meta.IsStatusConditionTrue(sb.Status.Conditions, v1.ConditionLost) {
		r.rec.Eventf(sb, nil, corev1.EventTypeWarning, "HostLost", "Lose", "host %s stopped renewing its Lease", host)
	}
	meta.SetStatusCondition(&sb.Status.Conditions, metav1.Condition{Type: v1.ConditionLost, Status: metav1.ConditionTrue,
		Reason: "LeaseExpired", Message: fmt.Sprintf("host %s stopped renewing its Lease", host), ObservedGeneration: sb.Generation})
	meta.SetStatusCondition(&sb.Status.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse,
		Reason: "HostLost", Message: fmt.Sprintf("host %s is lost", host), ObservedGeneration: sb.Generation})
	if sb.Status.Snapshot == "" {
		sb.Status.Phase = v1.SandboxLost
		return ctrl.Result{}, client.IgnoreNotFound(r.c.Status().Patch(ctx, sb, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})))
	}
	// Recover: the status first (so the next host sees where to restore
	// from and that the old one is excluded), then the label.
	msg := fmt.Sprintf("recreated from snapshot %s", sb.Status.Snapshot)
	if t := sb.Status.SnapshotTime; t != nil {
		msg += fmt.Sprintf(" taken %s (work after it is lost)", t.UTC().Format(time.RFC3339))
	}
	msg += " after host " + host + " was lost"
	if !slices.Contains(sb.Status.ExcludedHosts, host) {
		sb.Status.ExcludedHosts = append(sb.Status.ExcludedHosts, host)
	}
	sb.Status.HostName, sb.Status.SandboxID, sb.Status.AgentEndpoint = "", "", ""
	sb.Status.Phase = v1.SandboxPending
	meta.SetStatusCondition(&sb.Status.Conditions, metav1.Condition{Type: v1.ConditionRecovered, Status: metav1.ConditionTrue,
		Reason: "FromSnapshot", Message: msg, ObservedGeneration: sb.Generation})
	if err := r.c.Status().Patch(ctx, sb, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	r.rec.Eventf(sb, nil, corev1.EventTypeNormal, "Recovering", "Recover", "%s", msg)
	orig = sb.DeepCopy()
	delete(sb.Labels, v1.LabelHost)
	return ctrl.Result{}, client.IgnoreNotFound(r.c.Patch(ctx, sb, client.MergeFrom(orig)))
}

// Committed is what a sandbox counts against its host: its resources,
// or its template's size where it names none.
func Committed(sb *v1.Sandbox, tpl *v1.SandboxTemplate) (memMiB, cpus int) {
	memMiB, cpus = sb.Spec.Resources.MemoryMiB, sb.Spec.Resources.CPUs
	if tpl != nil {
		if memMiB == 0 {
			memMiB = tpl.Spec.MemoryMiB
		}
		if cpus == 0 {
			cpus = tpl.Spec.CPUs
		}
	}
	return max(memMiB, 1), max(cpus, 1)
}

// counts reports whether a placed sandbox still holds room on its host.
func counts(sb *v1.Sandbox) bool {
	switch sb.Status.Phase {
	case v1.SandboxExpired, v1.SandboxLost, v1.SandboxFailed:
		return false
	}
	return true
}

// place chooses a host for sb and records it.
func (r *sandboxReconciler) place(ctx context.Context, sb *v1.Sandbox, hosts map[string]*hostView) (ctrl.Result, error) {
	var tpl v1.SandboxTemplate
	if err := r.c.Get(ctx, types.NamespacedName{Namespace: sb.Namespace, Name: sb.Spec.SandboxTemplateRef.Name}, &tpl); err != nil {
		if !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
		return r.unplaceable(ctx, sb, "NoTemplate", fmt.Sprintf("SandboxTemplate %q not found", sb.Spec.SandboxTemplateRef.Name))
	}
	templates := map[types.NamespacedName]*v1.SandboxTemplate{}
	var tl v1.SandboxTemplateList
	if err := r.c.List(ctx, &tl); err != nil {
		return ctrl.Result{}, err
	}
	for i := range tl.Items {
		templates[types.NamespacedName{Namespace: tl.Items[i].Namespace, Name: tl.Items[i].Name}] = &tl.Items[i]
	}
	d, err := r.decide(ctx, sb, &tpl, templates, hosts)
	if errors.Is(err, placement.ErrNoHost) {
		return r.unplaceable(ctx, sb, "Unschedulable", err.Error())
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	orig := sb.DeepCopy()
	if sb.Labels == nil {
		sb.Labels = map[string]string{}
	}
	sb.Labels[v1.LabelHost] = d.Host
	sb.Labels[v1.LabelTemplate] = sb.Spec.SandboxTemplateRef.Name
	controllerutil.AddFinalizer(sb, v1.HostFinalizer)
	if err := r.c.Patch(ctx, sb, client.MergeFrom(orig)); err != nil {
		r.placing.Lock()
		delete(r.assumed, sb.UID)
		r.placing.Unlock()
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	orig = sb.DeepCopy()
	sb.Status.HostName = d.Host
	sb.Status.Phase = v1.SandboxPlaced
	meta.SetStatusCondition(&sb.Status.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse,
		Reason: "Placed", Message: d.String(), ObservedGeneration: sb.Generation})
	r.rec.Eventf(sb, nil, corev1.EventTypeNormal, "Placed", "Place", "%s", d.String())
	return ctrl.Result{}, client.IgnoreNotFound(r.c.Status().Patch(ctx, sb, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})))
}

// decide chooses sb's host and records the choice as assumed, under
// placing, so that concurrent placements each see the others' choices.
// The caller writes the choice, and drops the assumption if that fails.
func (r *sandboxReconciler) decide(ctx context.Context, sb *v1.Sandbox, tpl *v1.SandboxTemplate,
	templates map[types.NamespacedName]*v1.SandboxTemplate, hosts map[string]*hostView) (placement.Decision, error) {
	r.placing.Lock()
	defer r.placing.Unlock()
	if r.assumed == nil {
		r.assumed = map[types.UID]assumption{}
	}
	var all v1.SandboxList
	// Read-only: no copy of every sandbox per placement.
	if err := r.c.List(ctx, &all, client.UnsafeDisableDeepCopy); err != nil {
		return placement.Decision{}, err
	}
	committed := map[string][2]int{}
	for i := range all.Items {
		o := &all.Items[i]
		h := o.Labels[v1.LabelHost]
		if as, ok := r.assumed[o.UID]; ok {
			if h != "" || r.cfg.Now().Sub(as.at) > assumeFor {
				delete(r.assumed, o.UID)
			} else if o.UID != sb.UID {
				h = as.host
			}
		}
		if h == "" || !counts(o) {
			continue
		}
		m, c := Committed(o, templates[types.NamespacedName{Namespace: o.Namespace, Name: o.Spec.SandboxTemplateRef.Name}])
		cur := committed[h]
		committed[h] = [2]int{cur[0] + m, cur[1] + c}
	}
	var cands []placement.Host
	for name, hv := range hosts {
		h := hv.host
		cands = append(cands, placement.Host{Name: name, CPUGroup: h.Spec.CPUGroup, Ready: hv.alive && !h.Spec.Unschedulable,
			MemoryMiB: h.Spec.Capacity.MemoryMiB, CPUs: h.Spec.Capacity.CPUs,
			CommittedMemoryMiB: committed[name][0], CommittedCPUs: committed[name][1]})
	}
	slices.SortFunc(cands, func(a, b placement.Host) int { return cmp.Compare(a.Name, b.Name) })
	mem, cpus := Committed(sb, tpl)
	req := placement.Request{MemoryMiB: mem, CPUs: cpus, Exclude: sb.Status.ExcludedHosts}
	if sb.Status.Snapshot != "" {
		req.CPUGroup = sb.Status.SnapshotCPUGroup
	}
	d, err := placement.Choose(cands, req, r.cfg.K, nil)
	if err != nil {
		return d, err
	}
	r.assumed[sb.UID] = assumption{host: d.Host, at: r.cfg.Now()}
	return d, nil
}

// unplaceable records why sb has no host (an event only when the reason
// changes) and retries later.
func (r *sandboxReconciler) unplaceable(ctx context.Context, sb *v1.Sandbox, reason, msg string) (ctrl.Result, error) {
	c := meta.FindStatusCondition(sb.Status.Conditions, v1.ConditionReady)
	if c != nil && c.Reason == reason && c.Message == msg && sb.Status.Phase == v1.SandboxPending {
		return ctrl.Result{RequeueAfter: retryPlacement}, nil
	}
	r.rec.Eventf(sb, nil, corev1.EventTypeWarning, "FailedPlacement", "Place", "%s", msg)
	orig := sb.DeepCopy()
	sb.Status.Phase = v1.SandboxPending
	meta.SetStatusCondition(&sb.Status.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse,
		Reason: reason, Message: msg, ObservedGeneration: sb.Generation})
	return ctrl.Result{RequeueAfter: retryPlacement}, client.IgnoreNotFound(r.c.Status().Patch(ctx, sb, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})))
}
