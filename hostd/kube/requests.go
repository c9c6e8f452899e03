package kube

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/warrenvm/warren/fleet/api/v1alpha1"
	hc "github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/wire"
)

// setupRequests registers the reconcilers of the one-shot requests
// (SandboxSnapshot, SandboxRollback, SandboxFork): each acts only when
// the sandbox it names is on this host (the cache holds no other).
func (a *Agent) setupRequests(mgr ctrl.Manager) error {
	if err := ctrl.NewControllerManagedBy(mgr).Named("host-snapshot").For(&v1.SandboxSnapshot{}).
		Complete(reconcileFunc(a.snapshot)); err != nil {
		return err
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("host-rollback").For(&v1.SandboxRollback{}).
		Complete(reconcileFunc(a.rollback)); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).Named("host-fork").For(&v1.SandboxFork{}).
		Complete(reconcileFunc(a.fork))
}

type reconcileFunc func(ctx context.Context, req ctrl.Request) (ctrl.Result, error)

func (f reconcileFunc) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	return f(ctx, req)
}

// target returns the sandbox a request names, with its daemon client and
// VM id, or errNotMine when it is not running here.
func (a *Agent) target(ctx context.Context, ns, name string) (*v1.Sandbox, *hc.Client, string, error) {
	var sb v1.Sandbox
	if err := a.kc.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &sb); err != nil {
		if client.IgnoreNotFound(err) == nil {
			return nil, nil, "", errNotMine
		}
		return nil, nil, "", err
	}
	e, ok := a.journal.get(string(sb.UID))
	if !ok || e.ID == "" {
		return nil, nil, "", errNotMine
	}
	hcli, err := a.tenant(ns)
	return &sb, hcli, e.ID, err
}

// finish records a request's outcome.
func finish(st *v1.RequestStatus, host string, err error) {
	st.HostName = host
	now := metav1.Now()
	st.CompletionTime = &now
	if err != nil {
		st.Phase, st.Message = v1.PhaseFailed, err.Error()
		return
	}
	st.Phase = v1.PhaseDone
}

func done(phase string) bool { return phase == v1.PhaseDone || phase == v1.PhaseFailed }

// snapshot takes a SandboxSnapshot: a snapshot of the VM, uploaded to the
// object store when the host has one, which then becomes the Sandbox's
// recovery point (status.snapshot).
func (a *Agent) snapshot(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var s v1.SandboxSnapshot
	if err := a.kc.Get(ctx, req.NamespacedName, &s); err != nil || done(s.Status.Phase) {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	sb, hcli, id, err := a.target(ctx, s.Namespace, s.Spec.SandboxRef.Name)
	if err == errNotMine {
		return ctrl.Result{}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	snap, err := hcli.Snapshot(ctx, id, wire.SnapshotRequest{Name: s.Name})
	ref := ""
	if err == nil && a.cfg.Snapshots != nil {
		ref, err = a.cfg.Snapshots.Upload(ctx, hcli, id)
	}
	orig := s.DeepCopy()
	finish(&s.Status.RequestStatus, a.cfg.Host, err)
	if snap != nil {
		s.Status.Snapshot = snap.Name
	}
	s.Status.Location = ref
	if err := a.kc.Status().Patch(ctx, &s, client.MergeFrom(orig)); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if ref != "" {
		return ctrl.Result{}, a.setStatus(ctx, sb, func(st *v1.SandboxStatus) {
			now := metav1.Now()
			st.Snapshot, st.SnapshotTime, st.SnapshotCPUGroup = ref, &now, a.cfg.CPUGroup
		})
	}
	return ctrl.Result{}, nil
}

// rollback rolls a sandbox back to one of its snapshots, in place.
func (a *Agent) rollback(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var r v1.SandboxRollback
	if err := a.kc.Get(ctx, req.NamespacedName, &r); err != nil || done(r.Status.Phase) {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	_, hcli, id, err := a.target(ctx, r.Namespace, r.Spec.SandboxRef.Name)
	if err == errNotMine {
		return ctrl.Result{}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	_, err = hcli.Rollback(ctx, id, r.Spec.SnapshotName)
	orig := r.DeepCopy()
	finish(&r.Status, a.cfg.Host, err)
	return ctrl.Result{}, client.IgnoreNotFound(a.kc.Status().Patch(ctx, &r, client.MergeFrom(orig)))
}

// fork makes a SandboxFork's children: their Sandboxes first (placed on
// this host, marked AnnotationForking, journaled with no VM), then the
// fork, then each child's VM id into its entry and status.
func (a *Agent) fork(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var f v1.SandboxFork
	if err := a.kc.Get(ctx, req.NamespacedName, &f); err != nil || done(f.Status.Phase) {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	parent, hcli, id, err := a.target(ctx, f.Namespace, f.Spec.SandboxRef.Name)
	if err == errNotMine {
		return ctrl.Result{}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	n := max(f.Spec.Count, 1)
	children := make([]*v1.Sandbox, n)
	for i := range n {
		c := &v1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: f.Namespace, Name: fmt.Sprintf("%s-%d", f.Name, i+1),
				Labels:      map[string]string{v1.LabelHost: a.cfg.Host, v1.LabelTemplate: parent.Spec.SandboxTemplateRef.Name},
				Annotations: map[string]string{AnnotationForking: string(f.UID)}},
			Spec: *parent.Spec.DeepCopy(),
		}
		controllerutil.AddFinalizer(c, v1.HostFinalizer)
		if err := a.kc.Create(ctx, c); err != nil {
			return ctrl.Result{}, a.failFork(ctx, &f, children[:i], fmt.Errorf("creating Sandbox %s: %w", c.Name, err))
		}
		if err := a.journal.put(Entry{UID: string(c.UID), Namespace: c.Namespace, Name: c.Name}); err != nil {
			return ctrl.Result{}, err
		}
		children[i] = c
	}
	res, err := hcli.Fork(ctx, id, n, nil)
	if err != nil {
		return ctrl.Result{}, a.failFork(ctx, &f, children, err)
	}
	var names []string
	for i, c := range children {
		if i >= len(res.Children) || res.Children[i].Status == "failed" {
			if err := a.kc.Delete(ctx, c); client.IgnoreNotFound(err) != nil {
				return ctrl.Result{}, err
			}
			continue
		}
		vm := res.Children[i]
		if err := a.journal.put(Entry{UID: string(c.UID), Namespace: c.Namespace, Name: c.Name, ID: vm.ID}); err != nil {
			return ctrl.Result{}, err
		}
		if err := a.setStatus(ctx, c, func(st *v1.SandboxStatus) { a.running(st, c, vm.ID) }); err != nil {
			return ctrl.Result{}, err
		}
		orig := c.DeepCopy()
		delete(c.Annotations, AnnotationForking)
		if err := a.kc.Patch(ctx, c, client.MergeFrom(orig)); err != nil {
			return ctrl.Result{}, err
		}
		names = append(names, c.Name)
	}
	orig := f.DeepCopy()
	var ferr error
	if len(names) < n {
		ferr = fmt.Errorf("%d of %d children failed: %v", n-len(names), n, res.Errors)
	}
	finish(&f.Status.RequestStatus, a.cfg.Host, ferr)
	f.Status.Children = names
	return ctrl.Result{}, client.IgnoreNotFound(a.kc.Status().Patch(ctx, &f, client.MergeFrom(orig)))
}

// failFork records a fork that failed and deletes the children's
// Sandboxes made for it.
func (a *Agent) failFork(ctx context.Context, f *v1.SandboxFork, children []*v1.Sandbox, err error) error {
	for _, c := range children {
		if derr := a.kc.Delete(ctx, c); client.IgnoreNotFound(derr) != nil {
			return derr
		}
	}
	orig := f.DeepCopy()
	finish(&f.Status.RequestStatus, a.cfg.Host, err)
	return client.IgnoreNotFound(a.kc.Status().Patch(ctx, f, client.MergeFrom(orig)))
}
