package fleettest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/warrenvm/warren/fleet/api/v1alpha1"
	"github.com/warrenvm/warren/fleet/controller"
)

// ReadmeStep is what a kubectl line of README.md's fleet block does, as
// ReadmeFleetRun knows it.
type ReadmeStep string

// The steps of the README's fleet block.
const (
	// StepInstall: kubectl apply -f fleet/config/... (the CRDs and RBAC).
	StepInstall ReadmeStep = "install"
	// StepNamespace: kubectl create namespace NAME.
	StepNamespace ReadmeStep = "namespace"
	// StepRoleBinding: kubectl -n NS create rolebinding NAME
	// --clusterrole=warren-tenant --user=USER (a tenant's grant).
	StepRoleBinding ReadmeStep = "rolebinding"
	// StepApply: kubectl -n NS apply -f - with a here-document of
	// Warren's kinds (the tenant's template and sandbox).
	StepApply ReadmeStep = "apply"
	// StepGet: kubectl -n NS get sandboxes.
	StepGet ReadmeStep = "get"
	// StepSuspend, StepResume: kubectl -n NS patch sandbox NAME --type
	// merge -p '{"spec":{"operatingMode":"Suspended"}}' (or "Running").
	StepSuspend ReadmeStep = "suspend"
	StepResume  ReadmeStep = "resume"
)

// kubectlValueFlags are the flags of the block's kubectl lines that take
// a value as the next word.
var kubectlValueFlags = []string{"-n", "--namespace", "-f", "--filename", "-p", "--patch", "--type",
	"--clusterrole", "--user", "-o", "--output", "--kubeconfig", "--for", "--timeout"}

// ReadmeStepOf says which step a kubectl line is; "" for one this
// package does not know (a test fails on it: each line needs a check).
func ReadmeStepOf(c Command) ReadmeStep {
	w := c.Words(kubectlValueFlags...)
	f, _ := c.Flag("-f")
	switch {
	case len(w) >= 1 && w[0] == "apply" && strings.HasPrefix(f, "fleet/config/"):
		return StepInstall
	case len(w) == 3 && w[0] == "create" && w[1] == "namespace":
		return StepNamespace
	case len(w) == 3 && w[0] == "create" && w[1] == "rolebinding":
		return StepRoleBinding
	case len(w) == 1 && w[0] == "apply" && f == "-" && c.Stdin != "":
		return StepApply
	case len(w) == 2 && w[0] == "get" && w[1] == "sandboxes":
		return StepGet
	case len(w) == 3 && w[0] == "patch" && w[1] == "sandbox":
		switch patchMode(c) {
		case v1.OperatingModeSuspended:
			return StepSuspend
		case v1.OperatingModeRunning:
			return StepResume
		}
	}
	return ""
}

// patchMode is the operatingMode a patch line's -p sets, if any.
func patchMode(c Command) v1.OperatingMode {
	p, _ := c.Flag("-p")
	var m struct {
		Spec struct {
			OperatingMode v1.OperatingMode `json:"operatingMode"`
		} `json:"spec"`
	}
	if json.Unmarshal([]byte(p), &m) != nil {
		return ""
	}
	return m.Spec.OperatingMode
}

// ReadmeFleetRun runs README.md's fleet block (ReadmeFleet) as a Script
// against Kube and checks, after each kubectl line, what holds with or
// without hosts: the install made every CRD Established and the roles;
// a namespace exists; the rolebinding lets its user create and patch
// Sandboxes in its namespace (and not in warren-system); the tenant's
// lines ran as that user; the applied objects exist; get prints the
// columns its comment names, one row per sandbox, with the values the
// objects hold; a patch set the sandbox's operatingMode. It fails the
// test on a line it does not know, and when a step is missing from the
// block. Test-specific outcomes (a sandbox placed, suspended to the
// object store) are Check's.
type ReadmeFleetRun struct {
	Kube *Kube
	// Users maps the kubeconfig files the block names to users (Script);
	// the controller's must be there.
	Users map[string]string
	// Controller starts the test's controller for the block's
	// bin/warren-controller line, as user (its --kubeconfig's) with the
	// Config its flags give.
	Controller func(c Command, user string, cc controller.Config)
	// Host starts the test's hosts for the block's warren-hostd line.
	Host func(c Command)
	// Check, if set, is called after the common checks of each kubectl
	// line with its step and output.
	Check func(step ReadmeStep, c Command, out string)

	// ns is the tenant's namespace and tenant its user (the rolebinding's);
	// objects what the apply step created.
	ns, tenant string
	objects    []*unstructured.Unstructured
	c          client.Client
}

// Run runs the block and its checks.
func (r *ReadmeFleetRun) Run(t testing.TB) {
	t.Helper()
	root, cmds := ReadmeFleet(t)
	var err error
	if r.c, err = client.New(r.Kube.Config, client.Options{Scheme: controller.Scheme()}); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	s := &Script{Kube: r.Kube, Dir: root, Users: r.Users,
		Daemon: func(c Command) {
			switch filepath.Base(c.Args[0]) {
			case "warren-controller":
				user, cc := r.controllerArgs(t, c)
				seen["warren-controller"] = true
				r.Controller(c, user, cc)
			case "warren-hostd":
				seen["warren-hostd"] = true
				r.Host(c)
			default:
				t.Fatalf("line %d: %s: neither kubectl nor a daemon the test knows", c.Line, c)
			}
		},
		After: func(c Command, user, out string) {
			step := ReadmeStepOf(c)
			if step == "" {
				t.Fatalf("line %d: %s: a kubectl line the test has no check for (fleettest.ReadmeStepOf)", c.Line, c)
			}
			seen[string(step)] = true
			r.check(t, step, c, user, out, root)
			if r.Check != nil {
				r.Check(step, c, out)
			}
		}}
	s.Run(t, cmds)
	for _, want := range []string{string(StepInstall), string(StepNamespace), "warren-controller", "warren-hostd",
		string(StepRoleBinding), string(StepApply), string(StepGet), string(StepSuspend), string(StepResume)} {
		if !seen[want] {
			t.Errorf("README.md's fleet block has no %s line", want)
		}
	}
}

// controllerArgs reads the controller line's flags: --kubeconfig FILE
// (one of Users) and --k N; any other fails the test, which would not
// know what it means.
func (r *ReadmeFleetRun) controllerArgs(t testing.TB, c Command) (string, controller.Config) {
	t.Helper()
	var user string
	cc := controller.Config{K: 2} // warren-controller's default
	for i := 1; i < len(c.Args); i++ {
		name, val, eq := strings.Cut(c.Args[i], "=")
		if !eq && i+1 < len(c.Args) {
			i++
			val = c.Args[i]
		}
		switch name {
		case "--kubeconfig":
			u, ok := r.Users[val]
			if !ok {
				t.Fatalf("line %d: %s: kubeconfig %q is none of the test's users %v", c.Line, c, val, r.Users)
			}
			user = u
		case "--k":
			k, err := strconv.Atoi(val)
			if err != nil {
				t.Fatalf("line %d: %s: --k %q", c.Line, c, val)
			}
			cc.K = k
		default:
			t.Fatalf("line %d: %s: flag %s is not one the test knows (--kubeconfig, --k)", c.Line, c, name)
		}
	}
	if user == "" {
		t.Fatalf("line %d: %s: no --kubeconfig", c.Line, c)
	}
	return user, cc
}

// readmeTimeout bounds each wait of the common checks (RBAC and CRDs
// take effect within a second on an idle apiserver).
const readmeTimeout = time.Minute

func (r *ReadmeFleetRun) check(t testing.TB, step ReadmeStep, c Command, user, out, root string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*readmeTimeout)
	defer cancel()
	ns, _ := c.Flag("-n")
	w := c.Words(kubectlValueFlags...)
	switch step {
	case StepInstall:
		if user != AdminUser {
			t.Fatalf("line %d: %s ran as %s, not the cluster's admin", c.Line, c, user)
		}
		var crds []string
		for i, a := range c.Args {
			if a == "-f" && i+1 < len(c.Args) && strings.HasSuffix(c.Args[i+1], "/crd/") {
				crds, _ = filepath.Glob(filepath.Join(root, c.Args[i+1], "*.yaml"))
			}
		}
		if len(crds) == 0 {
			t.Fatalf("line %d: %s installs no CRD directory", c.Line, c)
		}
		api := apiextensionsclient.NewForConfigOrDie(r.Kube.Config).ApiextensionsV1().CustomResourceDefinitions()
		for _, p := range crds {
			got, err := readCRDs(p)
			if err != nil {
				t.Fatal(err)
			}
			for _, crd := range got {
				Eventually(t, readmeTimeout, 100*time.Millisecond, "CRD "+crd.Name+" established", func() (bool, string) {
					cur, err := api.Get(ctx, crd.Name, metav1.GetOptions{})
					if err != nil {
						return false, err.Error()
					}
					for _, cond := range cur.Status.Conditions {
						if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
							return true, ""
						}
					}
					return false, fmt.Sprint(cur.Status.Conditions)
				})
			}
		}
		cs := kubernetes.NewForConfigOrDie(r.Kube.Config)
		for _, role := range []string{"warren-host", "warren-controller", "warren-tenant"} {
			if _, err := cs.RbacV1().ClusterRoles().Get(ctx, role, metav1.GetOptions{}); err != nil {
				t.Fatalf("after line %d: ClusterRole %s: %v", c.Line, role, err)
			}
		}
		for _, b := range []string{"warren-host", "warren-controller"} {
			if _, err := cs.RbacV1().ClusterRoleBindings().Get(ctx, b, metav1.GetOptions{}); err != nil {
				t.Fatalf("after line %d: ClusterRoleBinding %s: %v", c.Line, b, err)
			}
		}
	case StepNamespace:
		if _, err := kubernetes.NewForConfigOrDie(r.Kube.Config).CoreV1().Namespaces().Get(ctx, w[2], metav1.GetOptions{}); err != nil {
			t.Fatalf("after line %d: namespace %s: %v", c.Line, w[2], err)
		}
	case StepRoleBinding:
		r.ns, _ = c.Flag("-n")
		r.tenant, _ = c.Flag("--user")
		if r.ns == "" || r.tenant == "" {
			t.Fatalf("line %d: %s: want -n NAMESPACE and --user USER", c.Line, c)
		}
		// RBAC reads its objects from an informer: the grant takes
		// effect within moments.
		for _, verb := range []string{"create", "patch", "list"} {
			Eventually(t, readmeTimeout, 100*time.Millisecond, r.tenant+" may "+verb+" sandboxes in "+r.ns, func() (bool, string) {
				ok, why := r.allowed(ctx, t, verb, r.ns)
				return ok, why
			})
		}
		if ok, _ := r.allowed(ctx, t, "create", v1.LeaseNamespace); ok {
			t.Fatalf("after line %d: %s may create sandboxes in %s too", c.Line, r.tenant, v1.LeaseNamespace)
		}
	case StepApply, StepGet, StepSuspend, StepResume:
		if r.tenant == "" || user != r.tenant || ns != r.ns {
			t.Fatalf("line %d: %s ran as %s in namespace %q: the tenant's lines should run as the tenant the rolebinding names (%q, namespace %q)",
				c.Line, c, user, ns, r.tenant, r.ns)
		}
	}
	switch step {
	case StepApply:
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader([]byte(c.Stdin)), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("line %d: the here-document: %v", c.Line, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			got := &unstructured.Unstructured{}
			got.SetGroupVersionKind(u.GroupVersionKind())
			if err := r.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: u.GetName()}, got); err != nil {
				t.Fatalf("after line %d: %s %s: %v", c.Line, u.GetKind(), u.GetName(), err)
			}
			r.objects = append(r.objects, got)
		}
	case StepGet:
		r.checkTable(t, ctx, c, out)
	case StepSuspend, StepResume:
		var sb v1.Sandbox
		if err := r.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: w[2]}, &sb); err != nil {
			t.Fatalf("after line %d: %v", c.Line, err)
		}
		if sb.Spec.OperatingMode != patchMode(c) {
			t.Fatalf("after line %d: %s's operatingMode is %q", c.Line, sb.Name, sb.Spec.OperatingMode)
		}
	}
}

// Sandboxes are the names of the Sandboxes the block's apply step made,
// once it ran.
func (r *ReadmeFleetRun) Sandboxes() []string {
	var names []string
	for _, o := range r.objects {
		if o.GetKind() == "Sandbox" {
			names = append(names, o.GetName())
		}
	}
	return names
}

// allowed asks the apiserver whether the tenant may verb sandboxes in ns.
func (r *ReadmeFleetRun) allowed(ctx context.Context, t testing.TB, verb, ns string) (bool, string) {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: r.tenant,
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: v1.GroupVersion.Group, Resource: "sandboxes"}}}
	got, err := kubernetes.NewForConfigOrDie(r.Kube.Config).AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got.Status.Allowed, fmt.Sprintf("%+v", got.Status)
}

// checkTable checks get's output: its header is the columns the line's
// comment names, and each Sandbox the apply step made has a row with
// the values its object holds.
func (r *ReadmeFleetRun) checkTable(t testing.TB, ctx context.Context, c Command, out string) {
	t.Helper()
	want := strings.Fields(c.Comment)
	head, rows := ParseTable(out)
	if !slices.Equal(head, want) {
		t.Fatalf("line %d: %s printed the columns %q; its comment says %q", c.Line, c, head, want)
	}
	var sandboxes int
	for _, o := range r.objects {
		if o.GetKind() != "Sandbox" {
			continue
		}
		sandboxes++
		var sb v1.Sandbox
		if err := r.c.Get(ctx, client.ObjectKeyFromObject(o), &sb); err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(rows, func(row map[string]string) bool { return row["NAME"] == sb.Name })
		if i < 0 {
			t.Fatalf("line %d: no row for sandbox %s in\n%s", c.Line, sb.Name, out)
		}
		exp := map[string]string{"TEMPLATE": sb.Spec.SandboxTemplateRef.Name, "MODE": string(sb.Spec.OperatingMode),
			"PHASE": string(sb.Status.Phase), "HOST": sb.Status.HostName}
		for col, v := range exp { // (an empty value prints as blanks)
			if _, shown := rows[i][col]; shown && rows[i][col] != v {
				t.Fatalf("line %d: sandbox %s: column %s is %q, its object says %q:\n%s", c.Line, sb.Name, col, rows[i][col], v, out)
			}
		}
	}
	if len(rows) != sandboxes {
		t.Fatalf("line %d: %d rows for %d sandboxes:\n%s", c.Line, len(rows), sandboxes, out)
	}
}

// ParseTable reads kubectl's table output (get): the header's column
// names, and each row as column name to value, cut at the columns'
// offsets in the header (kubectl aligns them; a value holds no blank).
func ParseTable(out string) (head []string, rows []map[string]string) {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) == 0 || lines[0] == "" {
		return nil, nil
	}
	var starts []int
	for i := 0; i < len(lines[0]); i++ {
		if lines[0][i] != ' ' && (i == 0 || lines[0][i-1] == ' ') {
			starts = append(starts, i)
		}
	}
	head = strings.Fields(lines[0])
	for _, l := range lines[1:] {
		row := map[string]string{}
		for j, s := range starts {
			e := len(l)
			if j+1 < len(starts) && starts[j+1] < e {
				e = starts[j+1]
			}
			if s < len(l) {
				row[head[j]] = strings.TrimSpace(l[s:e])
			} else {
				row[head[j]] = ""
			}
		}
		rows = append(rows, row)
	}
	return head, rows
}
