package fleettest

import (
	"context"
	"fmt"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/warrenvm/warren/fleet/api/v1alpha1"
	"github.com/warrenvm/warren/fleet/controller"
)

// TestReadmeFleetKubectl runs README.md's fleet block as written with
// kubectl against a real apiserver and the controller, without hosts
// (no KVM needed; hostd/daemon's TestE2EReadmeFleet runs it with real
// hosts): the admin's setup, the controller as the README's controller
// user (so with the README's RBAC only), and the tenant's lines as alice.
// Besides ReadmeFleetRun's checks after each line: with no host, the
// controller says so on the tenant's sandbox (Pending, Unschedulable,
// a FailedPlacement event).
func TestReadmeFleetKubectl(t *testing.T) {
	Kubectl(t)
	k := StartKube(t, User{Name: "controller", Groups: []string{"warren:controllers"}}, User{Name: "alice"})
	c, err := client.New(k.Config, client.Options{Scheme: controller.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var r *ReadmeFleetRun
	r = &ReadmeFleetRun{Kube: k,
		Users: map[string]string{"controller.kubeconfig": "controller", "alice.kubeconfig": "alice"},
		Controller: func(_ Command, user string, cc controller.Config) {
			StartController(t, k.ConfigFor(user), cc)
		},
		Host: func(c Command) { t.Logf("line %d: no host in this test (no KVM): %s", c.Line, c) },
		Check: func(step ReadmeStep, cmd Command, out string) {
			if step != StepApply {
				return
			}
			ns, _ := cmd.Flag("-n")
			names := r.Sandboxes()
			if len(names) != 1 {
				t.Fatalf("the README makes Sandboxes %q; the test follows one", names)
			}
			var sb v1.Sandbox
			Eventually(t, time.Minute, 100*time.Millisecond, "the controller finds no host", func() (bool, string) {
				if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: names[0]}, &sb); err != nil {
					return false, err.Error()
				}
				cond := meta.FindStatusCondition(sb.Status.Conditions, v1.ConditionReady)
				return sb.Status.Phase == v1.SandboxPending && cond != nil && cond.Reason == "Unschedulable", fmt.Sprintf("%+v", sb.Status)
			})
			var l eventsv1.EventList
			if err := c.List(ctx, &l, client.InNamespace(ns)); err != nil {
				t.Fatal(err)
			}
			for _, ev := range l.Items {
				if ev.Regarding.Name == names[0] && ev.Reason == "FailedPlacement" {
					return
				}
			}
			t.Fatalf("no FailedPlacement event for %s: %+v", names[0], l.Items)
		}}
	r.Run(t)
}
