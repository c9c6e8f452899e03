// Package kube is the host side of the fleet (warren-hostd --kube): it
// registers the host as a WarrenHost (capacity, CPU fingerprint group,
// free memory), renews the host's coordination.k8s.io Lease, and
// reconciles the Sandboxes placed on it (label v1alpha1.LabelHost) the
// way a kubelet reconciles its pods, through the daemon's own API on its
// unix socket (hostd/client), one client per tenant (a namespace).
//
// What it created is journaled in a file beside the daemon's state
// (journal.go), so that after a restart it finds its VMs again, and
// deletes those whose Sandbox moved to another host or went: a daemon
// that comes back never runs a second copy of a sandbox.
//
// Goroutines: controller-runtime's workers run the reconcilers (several
// sandboxes at once, one sandbox at a time); the heartbeat goroutine
// renews the Lease and the WarrenHost's status. The journal and the
// template cache have their own locks.
package kube

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "github.com/warrenvm/warren/fleet/api/v1alpha1"
	fleetctl "github.com/warrenvm/warren/fleet/controller"
	hc "github.com/warrenvm/warren/hostd/client"
)

// A host's RBAC (fleet/config/rbac/host, generated), bound to the group
// of the hosts' users:
// +kubebuilder:rbac:groups=warren.dev,resources=warrenhosts,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=warren.dev,resources=warrenhosts/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=warren.dev,resources=sandboxes,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=warren.dev,resources=sandboxes/status;sandboxtemplates/status;sandboxsnapshots/status;sandboxforks/status;sandboxrollbacks/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=warren.dev,resources=sandboxtemplates;sandboxsnapshots;sandboxforks;sandboxrollbacks,verbs=get;list;watch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Config is how a host joins the fleet.
type Config struct {
	// Kube is the API server's client configuration.
	Kube *rest.Config
	// Host is the WarrenHost's name (default the machine's host name).
	Host string
	// Endpoint is the URL of this daemon's API that clients reach
	// sandboxes on (recorded in WarrenHost.spec and each Sandbox's
	// status.agentEndpoint).
	Endpoint string
	// Socket is the daemon's unix socket.
	Socket string
	// StateDir holds the journal (the daemon's state directory).
	StateDir string
	// Capacity is what the host offers (default: MemTotal less 1 GiB,
	// and every CPU).
	Capacity v1.HostResources
	// CPUGroup is the host's CPU fingerprint group (hex digest of the
	// fingerprint snapshots carry).
	CPUGroup string
	// LeaseDuration is how long the host's Lease lasts unrenewed
	// (default 40 s); it is renewed every quarter of it.
	LeaseDuration time.Duration
	// Snapshots moves suspended sandboxes through the fleet's object
	// store, and templates too when it is a TemplateStore; nil: suspend
	// keeps snapshots on this host only, and each host builds its
	// templates.
	Snapshots SnapshotStore
	// Log gets the agent's log lines.
	Log *slog.Logger
}

// SnapshotStore moves a sandbox's latest snapshot to and from the
// fleet's shared object store.
type SnapshotStore interface {
	// Upload stores the latest snapshot of the tenant's sandbox id and
	// returns its reference.
	Upload(ctx context.Context, c *hc.Client, id string) (ref string, err error)
	// Restore makes a sandbox on this host from the stored snapshot ref
	// and returns its id.
	Restore(ctx context.Context, c *hc.Client, ref string, labels map[string]string) (id string, err error)
}

// TemplateStore moves templates through the fleet's shared object
// store. A Config.Snapshots that implements it (ObjectSnapshots does) is
// also used for templates (template.go).
type TemplateStore interface {
	// UploadTemplate stores the tenant's ready template id and returns
	// its reference.
	UploadTemplate(ctx context.Context, c *hc.Client, id string) (ref string, err error)
	// ImportTemplate records a ready template on this host from the
	// stored template ref and returns it.
	ImportTemplate(ctx context.Context, c *hc.Client, ref string) (*hc.Template, error)
}

func (c *Config) defaults() error {
	if c.Kube == nil || c.Socket == "" || c.StateDir == "" {
		return errors.New("kube: Kube, Socket and StateDir are required")
	}
	if c.Host == "" {
		h, err := os.Hostname()
		if err != nil {
			return err
		}
		c.Host = strings.ToLower(h)
	}
	if c.Capacity.CPUs == 0 {
		c.Capacity.CPUs = runtime.NumCPU()
	}
	if c.Capacity.MemoryMiB == 0 {
		total, _, err := meminfo()
		if err != nil {
			return err
		}
		c.Capacity.MemoryMiB = max(total-1024, 256)
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = 40 * time.Second
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}

// CPUGroupOf names the group of a CPU fingerprint: the first 12 hex
// digits of its SHA-256.
func CPUGroupOf(fingerprint []byte) string {
	s := sha256.Sum256(fingerprint)
	return fmt.Sprintf("%x", s[:6])
}

// meminfo returns MemTotal and MemAvailable in MiB.
func meminfo() (total, avail int, err error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 2 {
			continue
		}
		kb, err := strconv.Atoi(fs[1])
		if err != nil {
			continue
		}
		switch fs[0] {
		case "MemTotal:":
			total = kb / 1024
		case "MemAvailable:":
			avail = kb / 1024
		}
	}
	if total == 0 {
		return 0, 0, errors.New("/proc/meminfo: no MemTotal")
	}
	return total, avail, sc.Err()
}

// Agent is a running host agent.
type Agent struct {
	cfg     Config
	c       ctrl.Manager
	kc      client.Client // uncached reads and all writes
	rec     events.EventRecorder
	journal *journal

	// mu guards clients, templates and building (and buildLock.users).
	mu      sync.Mutex
	clients map[string]*hc.Client
	// templates maps namespace/name to the generation this host has and
	// the daemon's template id for it (one entry per template name: a
	// newer generation replaces the older). building holds a lock per
	// namespace/name@generation being looked up, imported or built, so one
	// template is built once at a time; an entry goes when its last user
	// is done, so neither map grows with a tenant's edits.
	templates map[string]hostTemplate
	building  map[string]*buildLock
}

// hostTemplate is a template's generation on this host and the daemon's
// id for it.
type hostTemplate struct {
	generation int64
	id         string
}

// buildLock serializes the work on one template generation; users counts
// the goroutines holding or waiting for it (guarded by Agent.mu).
type buildLock struct {
	sync.Mutex
	users int
}

// Run joins the fleet and reconciles until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.defaults(); err != nil {
		return err
	}
	j, err := openJournal(cfg.StateDir)
	if err != nil {
		return err
	}
	if cfg.Kube.QPS == 0 {
		cfg.Kube = rest.CopyConfig(cfg.Kube)
		cfg.Kube.QPS, cfg.Kube.Burst = 50, 100
	}
	sel := labels.SelectorFromSet(labels.Set{v1.LabelHost: cfg.Host})
	opts := fleetctl.ManagerOptions()
	opts.Metrics = metricsserver.Options{BindAddress: "0"}
	opts.Logger = logr.FromSlogHandler(cfg.Log.Handler())
	opts.Cache.ByObject[&v1.Sandbox{}] = cache.ByObject{Label: sel}
	// Controller names are checked unique per process, for their metrics;
	// tests and the scale benchmark run many hosts in one.
	opts.Controller.SkipNameValidation = ptr.To(true)
	mgr, err := ctrl.NewManager(cfg.Kube, opts)
	if err != nil {
		return err
	}
	a := &Agent{cfg: cfg, c: mgr, kc: mgr.GetClient(), rec: mgr.GetEventRecorder("warren-hostd"), journal: j,
		clients: map[string]*hc.Client{}, templates: map[string]hostTemplate{}, building: map[string]*buildLock{}}
	direct, err := client.New(cfg.Kube, client.Options{Scheme: mgr.GetScheme()})
	if err != nil {
		return err
	}
	if err := a.register(ctx, direct); err != nil {
		return err
	}
	if err := a.sweep(ctx, direct); err != nil {
		return fmt.Errorf("kube: sweeping the journal: %w", err)
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("host-sandbox").For(&v1.Sandbox{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(&sandboxReconciler{a: a}); err != nil {
		return err
	}
	if err := a.setupRequests(mgr); err != nil {
		return err
	}
	go a.heartbeat(ctx, direct)
	cfg.Log.Info("kube: joined the fleet", "host", cfg.Host, "cpu_group", cfg.CPUGroup,
		"memory_mib", cfg.Capacity.MemoryMiB, "cpus", cfg.Capacity.CPUs)
	return mgr.Start(ctx)
}

// register creates or updates the host's WarrenHost and Lease.
func (a *Agent) register(ctx context.Context, c client.Client) error {
	h := &v1.WarrenHost{ObjectMeta: metav1.ObjectMeta{Name: a.cfg.Host}}
	_, err := ctrlCreateOrUpdate(ctx, c, h, func() {
		h.Spec.Endpoint = a.cfg.Endpoint
		h.Spec.CPUGroup = a.cfg.CPUGroup
		h.Spec.Capacity = a.cfg.Capacity
	})
	if err != nil {
		return fmt.Errorf("kube: registering WarrenHost %s: %w", a.cfg.Host, err)
	}
	return a.renew(ctx, c)
}

// renew renews (or creates) the host's Lease.
func (a *Agent) renew(ctx context.Context, c client.Client) error {
	l := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: v1.LeaseNamespace, Name: a.cfg.Host}}
	now := metav1.NewMicroTime(time.Now())
	_, err := ctrlCreateOrUpdate(ctx, c, l, func() {
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != a.cfg.Host {
			l.Spec.HolderIdentity = ptr.To(a.cfg.Host)
			l.Spec.AcquireTime = &now
		}
		l.Spec.LeaseDurationSeconds = ptr.To(int32(a.cfg.LeaseDuration / time.Second))
		l.Spec.RenewTime = &now
	})
	return err
}

// heartbeat renews the Lease every quarter of its duration and reports
// free memory and the sandbox count.
func (a *Agent) heartbeat(ctx context.Context, c client.Client) {
	t := time.NewTicker(a.cfg.LeaseDuration / 4)
	defer t.Stop()
	for {
		if err := a.renew(ctx, c); err != nil && ctx.Err() == nil {
			a.cfg.Log.Warn("kube: renewing the Lease", "err", err)
		}
		a.report(ctx, c)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// report updates the WarrenHost's status when it changed enough to
// matter (so that heartbeats do not wake the controller each time).
func (a *Agent) report(ctx context.Context, c client.Client) {
	var h v1.WarrenHost
	if err := c.Get(ctx, types.NamespacedName{Name: a.cfg.Host}, &h); err != nil {
		return
	}
	_, avail, _ := meminfo()
	n := a.journal.count()
	orig := h.DeepCopy()
	changed := h.Status.Sandboxes != n || abs(h.Status.FreeMemoryMiB-avail) >= 256
	h.Status.Sandboxes = n
	h.Status.FreeMemoryMiB = avail
	if meta.SetStatusCondition(&h.Status.Conditions, metav1.Condition{Type: "Ready", Status: metav1.ConditionTrue,
		Reason: "Heartbeat", Message: "the daemon renews its Lease", ObservedGeneration: h.Generation}) {
		changed = true
	}
	if changed {
		if err := c.Status().Patch(ctx, &h, client.MergeFrom(orig)); err != nil && ctx.Err() == nil {
			a.cfg.Log.Warn("kube: reporting host status", "err", err)
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// ctrlCreateOrUpdate gets o, applies mutate and creates or updates it.
func ctrlCreateOrUpdate(ctx context.Context, c client.Client, o client.Object, mutate func()) (bool, error) {
	err := c.Get(ctx, client.ObjectKeyFromObject(o), o)
	switch {
	case apierrors.IsNotFound(err):
		mutate()
		return true, c.Create(ctx, o)
	case err != nil:
		return false, err
	}
	mutate()
	return false, c.Update(ctx, o)
}

// tenant returns the daemon client acting for a namespace's tenant.
func (a *Agent) tenant(ns string) (*hc.Client, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c := a.clients[ns]; c != nil {
		return c, nil
	}
	c, err := hc.New(a.cfg.Socket, ns, "")
	if err != nil {
		return nil, err
	}
	a.clients[ns] = c
	return c, nil
}

// event records an event on o.
func (a *Agent) event(o client.Object, warning bool, reason, action, format string, args ...any) {
	t := corev1.EventTypeNormal
	if warning {
		t = corev1.EventTypeWarning
	}
	a.rec.Eventf(o, nil, t, reason, action, format, args...)
}
