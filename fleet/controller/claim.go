package controller

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/warrenvm/warren/fleet/api/v1alpha1"
)

// Warm pool policies of a SandboxClaim besides a pool's name.
const (
	WarmPoolDefault = "default" // any pool of the template
	WarmPoolNone    = "none"    // always a new sandbox
)

// claimReconciler gives each SandboxClaim one sandbox: a ready one taken
// from a warm pool of its template when there is one, else a new one.
type claimReconciler struct {
	c   client.Client
	rec events.EventRecorder
}

// Reconcile is one pass over one SandboxClaim.
func (r *claimReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var cl v1.SandboxClaim
	if err := r.c.Get(ctx, req.NamespacedName, &cl); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !cl.DeletionTimestamp.IsZero() {
		// The claim's sandbox goes with it (no garbage collector needed).
		var l v1.SandboxList
		if err := r.c.List(ctx, &l, client.InNamespace(cl.Namespace)); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{}, finishDeletion(ctx, r.c, &cl, &l)
	}
	if err := addFinalizer(ctx, r.c, &cl); err != nil {
		return ctrl.Result{}, err
	}
	name := cl.Status.Sandbox.Name
	if name == "" {
		// One taken or made before, whose name did not reach the status.
		var l v1.SandboxList
		if err := r.c.List(ctx, &l, client.InNamespace(cl.Namespace)); err != nil {
			return ctrl.Result{}, err
		}
		for i := range l.Items {
			if metav1.IsControlledBy(&l.Items[i], &cl) {
				name = l.Items[i].Name
			}
		}
	}
	if name == "" {
		var err error
		if name, err = r.take(ctx, &cl); err != nil {
			return ctrl.Result{}, err
		}
		if name == "" {
			if name, err = r.create(ctx, &cl); err != nil {
				return ctrl.Result{}, err
			}
		}
	}
	var sb v1.Sandbox
	readyCond := metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: "SandboxNotReady"}
	switch err := r.c.Get(ctx, types.NamespacedName{Namespace: cl.Namespace, Name: name}, &sb); {
	case apierrors.IsNotFound(err):
		readyCond.Message = "sandbox " + name + " not found (yet)"
	case err != nil:
		return ctrl.Result{}, err
	default:
		if c := meta.FindStatusCondition(sb.Status.Conditions, v1.ConditionReady); c != nil {
			readyCond.Status, readyCond.Reason, readyCond.Message = c.Status, c.Reason, c.Message
		}
	}
	orig := cl.DeepCopy()
	cl.Status.Sandbox.Name = name
	readyCond.ObservedGeneration = cl.Generation
	meta.SetStatusCondition(&cl.Status.Conditions, readyCond)
	return ctrl.Result{}, client.IgnoreNotFound(r.c.Status().Patch(ctx, &cl, client.MergeFrom(orig)))
}

// take adopts a pool sandbox of the claim's template (ready ones first,
// oldest first): the pool label goes and the claim becomes its
// controller, under optimistic locking so that two claims never take the
// same one. It returns "" when none could be taken.
func (r *claimReconciler) take(ctx context.Context, cl *v1.SandboxClaim) (string, error) {
	policy := cl.Spec.WarmPool
	if policy == WarmPoolNone {
		return "", nil
	}
	sel := labels.NewSelector()
	req, err := labels.NewRequirement(v1.LabelPool, selection.Exists, nil)
	if err != nil {
		return "", err
	}
	sel = sel.Add(*req)
	if policy != "" && policy != WarmPoolDefault {
		req, err = labels.NewRequirement(v1.LabelPool, selection.Equals, []string{policy})
		if err != nil {
			return "", err
		}
		sel = sel.Add(*req)
	}
	var l v1.SandboxList
	if err := r.c.List(ctx, &l, client.InNamespace(cl.Namespace), client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return "", err
	}
	var cands []*v1.Sandbox
	for i := range l.Items {
		sb := &l.Items[i]
		if sb.Spec.SandboxTemplateRef.Name == cl.Spec.SandboxTemplateRef.Name && sb.DeletionTimestamp.IsZero() {
			cands = append(cands, sb)
		}
	}
	slices.SortFunc(cands, func(a, b *v1.Sandbox) int {
		ra, rb := ready(a), ready(b)
		if ra != rb {
			if ra {
				return -1
			}
			return 1
		}
		return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	})
	for _, sb := range cands {
		orig := sb.DeepCopy()
		pool := sb.Labels[v1.LabelPool]
		delete(sb.Labels, v1.LabelPool)
		sb.OwnerReferences = nil
		if err := controllerutil.SetControllerReference(cl, sb, r.c.Scheme()); err != nil {
			return "", err
		}
		err := r.c.Patch(ctx, sb, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			continue // another claim took it, or it went
		}
		if err != nil {
			return "", err
		}
		r.rec.Eventf(cl, sb, corev1.EventTypeNormal, "Claimed", "Claim", "took sandbox %s from warm pool %s", sb.Name, pool)
		return sb.Name, nil
	}
	return "", nil
}

// create makes a new sandbox for the claim, named after it.
func (r *claimReconciler) create(ctx context.Context, cl *v1.SandboxClaim) (string, error) {
	sb := &v1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Namespace: cl.Namespace, Name: cl.Name,
			Labels: map[string]string{v1.LabelTemplate: cl.Spec.SandboxTemplateRef.Name}},
		Spec: v1.SandboxSpec{SandboxTemplateRef: cl.Spec.SandboxTemplateRef},
	}
	if err := controllerutil.SetControllerReference(cl, sb, r.c.Scheme()); err != nil {
		return "", err
	}
	if err := r.c.Create(ctx, sb); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	r.rec.Eventf(cl, sb, corev1.EventTypeNormal, "Created", "Claim", "no pool sandbox to take: created sandbox %s", sb.Name)
	return sb.Name, nil
}
