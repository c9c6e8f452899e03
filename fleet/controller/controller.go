// Package controller is the fleet's controller (warren-controller): it
// places Sandboxes on WarrenHosts (best of K on committed memory and CPUs
// among the hosts of a CPU group that can restore them), keeps
// SandboxWarmPools full, hands pool sandboxes to SandboxClaims, expires
// sandboxes at their shutdownTime, and marks the sandboxes of a host
// whose Lease expired Lost, recreating elsewhere those that have a
// snapshot in the object store.
//
// It never talks to a host: a placement is a label (v1alpha1.LabelHost)
// and status.hostName on the Sandbox, which the host's agent (hostd/kube)
// watches and acts on, the way a kubelet acts on a pod's nodeName.
//
// Concurrency: controller-runtime runs each reconciler's requests one per
// object at a time; placement of different sandboxes may run at once
// (MaxConcurrentReconciles), and two of them could both count a host's
// room before either is recorded: the host's agent refuses what it has
// no room for (it re-checks against its own committed total), and the
// sandbox is placed again elsewhere.
package controller

import (
	"context"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/warrenvm/warren/fleet/api/v1alpha1"
)

// The controller's RBAC (fleet/config/rbac/controller, generated):
// +kubebuilder:rbac:groups=warren.dev,resources=sandboxes;sandboxwarmpools;sandboxclaims,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=warren.dev,resources=sandboxes/status;sandboxwarmpools/status;sandboxclaims/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=warren.dev,resources=sandboxtemplates;warrenhosts,verbs=get;list;watch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Config tunes the controller.
type Config struct {
	// K is how many feasible hosts placement compares (best of K;
	// default 2; negative: all of them).
	K int
	// Workers is how many sandboxes are reconciled at once (default 8).
	Workers int
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

func (c *Config) defaults() {
	if c.K == 0 {
		c.K = 2
	}
	if c.Workers == 0 {
		c.Workers = 8
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Scheme returns a scheme with the core kinds and warren.dev's.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	clientgoscheme.AddToScheme(s)
	v1.AddToScheme(s)
	return s
}

// Field index names.
const (
	// indexHost indexes Sandboxes by the host they are placed on, and
	// those on none under unplaced.
	indexHost = "warren.hostLabel"
	unplaced  = "-"
)

// ManagerOptions are the manager options the controller needs: its
// scheme, and a cache that holds Leases of LeaseNamespace only.
func ManagerOptions() ctrl.Options {
	return ctrl.Options{
		Scheme: Scheme(),
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&coordv1.Lease{}: {Namespaces: map[string]cache.Config{v1.LeaseNamespace: {}}},
		}},
	}
}

// Setup registers the controller's reconcilers and indexes with mgr.
func Setup(mgr ctrl.Manager, cfg Config) error {
	cfg.defaults()
	ctx := context.Background()
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1.Sandbox{}, indexHost, func(o client.Object) []string {
		if h := o.GetLabels()[v1.LabelHost]; h != "" {
			return []string{h}
		}
		return []string{unplaced}
	}); err != nil {
		return err
	}
	c := mgr.GetClient()
	rec := mgr.GetEventRecorder("warren-controller")
	sr := &sandboxReconciler{c: c, cfg: cfg, rec: rec}
	// A host registering or reporting retries the unplaced sandboxes
	// (room may have freed). A host's Lease expiring is no event: each
	// placed sandbox is requeued for when its host's Lease would expire.
	hostToUnplaced := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		return sr.unplaced(ctx)
	})
	if err := ctrl.NewControllerManagedBy(mgr).Named("sandbox").For(&v1.Sandbox{}).
		Watches(&v1.WarrenHost{}, hostToUnplaced).
		WithOptions(controller.Options{MaxConcurrentReconciles: cfg.Workers}).
		Complete(sr); err != nil {
		return err
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("warmpool").For(&v1.SandboxWarmPool{}).
		Owns(&v1.Sandbox{}).Complete(&poolReconciler{c: c, rec: rec}); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).Named("claim").For(&v1.SandboxClaim{}).
		Owns(&v1.Sandbox{}).Complete(&claimReconciler{c: c, rec: rec})
}

// CleanupFinalizer is on SandboxWarmPools and SandboxClaims: their
// sandboxes are deleted before they go. Owner references alone would
// leave that to kube-controller-manager's garbage collector, which a
// fleet running on a bare kube-apiserver does not have.
const CleanupFinalizer = "warren.dev/cleanup"

// finishDeletion deletes the sandboxes of l that owner controls, then
// lets owner go (its CleanupFinalizer removed).
func finishDeletion(ctx context.Context, c client.Client, owner client.Object, l *v1.SandboxList) error {
	for i := range l.Items {
		if metav1.IsControlledBy(&l.Items[i], owner) {
			if err := c.Delete(ctx, &l.Items[i]); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	return removeFinalizer(ctx, c, owner)
}

// addFinalizer adds CleanupFinalizer to o.
func addFinalizer(ctx context.Context, c client.Client, o client.Object) error {
	if controllerutil.ContainsFinalizer(o, CleanupFinalizer) {
		return nil
	}
	orig := o.DeepCopyObject().(client.Object)
	controllerutil.AddFinalizer(o, CleanupFinalizer)
	return client.IgnoreNotFound(c.Patch(ctx, o, client.MergeFrom(orig)))
}

// removeFinalizer removes CleanupFinalizer from o.
func removeFinalizer(ctx context.Context, c client.Client, o client.Object) error {
	if !controllerutil.ContainsFinalizer(o, CleanupFinalizer) {
		return nil
	}
	orig := o.DeepCopyObject().(client.Object)
	controllerutil.RemoveFinalizer(o, CleanupFinalizer)
	return client.IgnoreNotFound(c.Patch(ctx, o, client.MergeFrom(orig)))
}

// conflictRequeue turns a write conflict (another writer got there
// first) into a quiet retry: it is expected, not an error to log.
func conflictRequeue(res ctrl.Result, err error) (ctrl.Result, error) {
	if apierrors.IsConflict(err) {
		return ctrl.Result{Requeue: true}, nil
	}
	return res, err
}
