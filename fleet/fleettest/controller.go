package fleettest

import (
	"context"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/warrenvm/warren/fleet/controller"
)

// StartController runs the fleet's controller in this process against
// cfg (a user's: its RBAC is what the controller may do), as
// warren-controller runs it but with cc, no metrics server and its
// logs discarded (controller-runtime's logger is global: this sets it),
// until the test ends. A failure to start fails the test; so does the
// manager's error at the end.
func StartController(t testing.TB, cfg *rest.Config, cc controller.Config) {
	t.Helper()
	ctrl.SetLogger(logr.Discard())
	opts := controller.ManagerOptions()
	opts.Metrics = metricsserver.Options{BindAddress: "0"}
	// Each test has a manager of its own, with the same controller names.
	opts.Controller.SkipNameValidation = ptr.To(true)
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		t.Fatalf("fleettest: controller: %v", err)
	}
	if err := controller.Setup(mgr, cc); err != nil {
		t.Fatalf("fleettest: controller: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("fleettest: controller: %v", err)
		}
	})
}
