// Command warren-controller runs the fleet's controller (fleet/controller)
// against a Kubernetes API server: it places Sandboxes on warren-hostd
// hosts, keeps warm pools full, serves claims and recovers the sandboxes
// of lost hosts. Run one (or several, with --leader-elect).
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/warrenvm/warren/fleet/controller"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file (default: in-cluster, or $KUBECONFIG)")
	k := flag.Int("k", 2, "placement compares the best of K feasible hosts")
	workers := flag.Int("workers", 8, "sandboxes reconciled at once")
	leader := flag.Bool("leader-elect", false, "run as one of several replicas, only the Lease holder acting")
	metrics := flag.String("metrics", "0", "metrics address (0: off)")
	flag.Parse()
	ctrl.SetLogger(logr.FromSlogHandler(slog.NewJSONHandler(os.Stderr, nil)))
	cfg, err := loadConfig(*kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "warren-controller:", err)
		os.Exit(1)
	}
	if cfg.QPS == 0 {
		// client-go's default (5/s) would make a thousand placements
		// wait on the client, not on the API server.
		cfg.QPS, cfg.Burst = 200, 400
	}
	opts := controller.ManagerOptions()
	opts.LeaderElection = *leader
	opts.LeaderElectionID = "warren-controller"
	opts.LeaderElectionNamespace = "warren-system"
	opts.Metrics = metricsserver.Options{BindAddress: *metrics}
	mgr, err := ctrl.NewManager(cfg, opts)
	if err == nil {
		err = controller.Setup(mgr, controller.Config{K: *k, Workers: *workers})
	}
	if err == nil {
		err = mgr.Start(ctrl.SetupSignalHandler())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "warren-controller:", err)
		os.Exit(1)
	}
}

// loadConfig reads the kubeconfig: the flag's file, else the usual rules
// ($KUBECONFIG, in-cluster, ~/.kube/config).
func loadConfig(path string) (*rest.Config, error) {
	if path != "" {
		return clientcmd.BuildConfigFromFlags("", path)
	}
	return ctrl.GetConfig()
}
