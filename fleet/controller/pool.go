package controller

import (
	"context"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/warrenvm/warren/fleet/api/v1alpha1"
)

// expectWindow is how long a created sandbox not yet in the cache still
// counts as the pool's.
const expectWindow = 30 * time.Second

// poolReconciler keeps each SandboxWarmPool at its replicas.
type poolReconciler struct {
	c   client.Client
	rec events.EventRecorder

	// mu guards created: per pool, the sandboxes it created that the
	// cache may not show yet, with when they were made, so that a
	// reconcile right after a create does not create again.
	mu      sync.Mutex
	created map[types.UID]map[string]time.Time
}

// PoolSelector selects a pool's unclaimed sandboxes.
func PoolSelector(pool string) labels.Selector {
	return labels.SelectorFromSet(labels.Set{v1.LabelPool: pool})
}

// Reconcile is one pass over one SandboxWarmPool.
func (r *poolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var pool v1.SandboxWarmPool
	if err := r.c.Get(ctx, req.NamespacedName, &pool); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var l v1.SandboxList
	if err := r.c.List(ctx, &l, client.InNamespace(pool.Namespace), client.MatchingLabelsSelector{Selector: PoolSelector(pool.Name)}); err != nil {
		return ctrl.Result{}, err
	}
	if !pool.DeletionTimestamp.IsZero() {
		// Delete the unclaimed sandboxes here rather than leave them to a
		// garbage collector, which a fleet of bare kube-apiserver lacks.
		return ctrl.Result{}, finishDeletion(ctx, r.c, &pool, &l)
	}
	if err := addFinalizer(ctx, r.c, &pool); err != nil {
		return ctrl.Result{}, err
	}
	var mine []*v1.Sandbox
	seen := map[string]bool{}
	for i := range l.Items {
		sb := &l.Items[i]
		if metav1.IsControlledBy(sb, &pool) && sb.DeletionTimestamp.IsZero() {
			mine = append(mine, sb)
		}
		seen[sb.Name] = true
	}
	pending := r.pending(pool.UID, seen)
	have := len(mine) + pending
	want := int(pool.Spec.Replicas)
	made := 0
	for i := have; i < want; i++ {
		sb := &v1.Sandbox{
			ObjectMeta: metav1.ObjectMeta{Namespace: pool.Namespace, GenerateName: pool.Name + "-",
				Labels: map[string]string{v1.LabelPool: pool.Name, v1.LabelTemplate: pool.Spec.SandboxTemplateRef.Name}},
			Spec: v1.SandboxSpec{SandboxTemplateRef: pool.Spec.SandboxTemplateRef},
		}
		if err := controllerutil.SetControllerReference(&pool, sb, r.c.Scheme()); err != nil {
			return ctrl.Result{}, err
		}
		if err := r.c.Create(ctx, sb); err != nil {
			return ctrl.Result{}, err
		}
		r.expect(pool.UID, sb.Name)
		made++
		r.rec.Eventf(&pool, sb, corev1.EventTypeNormal, "Created", "Refill", "created sandbox %s", sb.Name)
	}
	if extra := len(mine) - want; extra > 0 {
		// Delete the ones not ready first, then the newest.
		slices.SortFunc(mine, func(a, b *v1.Sandbox) int {
			ra, rb := ready(a), ready(b)
			if ra != rb {
				if ra {
					return 1
				}
				return -1
			}
			return b.CreationTimestamp.Compare(a.CreationTimestamp.Time)
		})
		for _, sb := range mine[:extra] {
			if err := r.c.Delete(ctx, sb); client.IgnoreNotFound(err) != nil {
				return ctrl.Result{}, err
			}
		}
		mine = mine[extra:]
	}
	orig := pool.DeepCopy()
	pool.Status.Replicas = int32(len(mine) + pending + made)
	pool.Status.ReadyReplicas = 0
	for _, sb := range mine {
		if ready(sb) {
			pool.Status.ReadyReplicas++
		}
	}
	pool.Status.Selector = PoolSelector(pool.Name).String()
	if err := r.c.Status().Patch(ctx, &pool, client.MergeFrom(orig)); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if pending+made > 0 {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	return ctrl.Result{}, nil
}

// ready says whether sb's Ready condition is true.
func ready(sb *v1.Sandbox) bool {
	return meta.IsStatusConditionTrue(sb.Status.Conditions, v1.ConditionReady)
}

// expect records that pool created name.
func (r *poolReconciler) expect(pool types.UID, name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.created == nil {
		r.created = map[types.UID]map[string]time.Time{}
	}
	if r.created[pool] == nil {
		r.created[pool] = map[string]time.Time{}
	}
	r.created[pool][name] = time.Now()
}

// pending counts pool's recent creations the cache does not show yet,
// forgetting those it shows (or that are too old to wait for).
func (r *poolReconciler) pending(pool types.UID, seen map[string]bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for name, t := range r.created[pool] {
		if seen[name] || time.Since(t) > expectWindow {
			delete(r.created[pool], name)
			continue
		}
		n++
	}
	return n
}
