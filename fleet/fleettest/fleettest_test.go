package fleettest

import (
	"bytes"
	"context"
	"io"
	"os"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/minio/minio-go/v7"
)

// TestKube starts etcd and kube-apiserver and checks what the fleet needs
// of them: a user is refused until RBAC grants it leases, then may create
// and renew one (also through its kubeconfig file); another user's token
// does not carry the grant; a CRD installs (twice: create, then update)
// and serves objects, its schema enforced by the apiserver.
func TestKube(t *testing.T) {
	t0 := time.Now()
	k := StartKube(t, User{Name: "host-a", Groups: []string{"warren:hosts"}}, User{Name: "tenant-b"})
	t.Logf("StartKube: %v", time.Since(t0).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(k.Config)
	hostA := kubernetes.NewForConfigOrDie(k.ConfigFor("host-a"))
	tenantB := kubernetes.NewForConfigOrDie(k.ConfigFor("tenant-b"))

	if v, err := admin.Discovery().ServerVersion(); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("apiserver %s", v.GitVersion)
	}
	const ns = "warren-system"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "host-a"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("host-a"), LeaseDurationSeconds: ptr.To[int32](15),
			RenewTime: &metav1.MicroTime{Time: time.Now()}},
	}
	_, err := hostA.CoordinationV1().Leases(ns).Create(ctx, lease, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("lease create before the grant: got %v, want Forbidden", err)
	}

	// Grant the group of host-a leases in the namespace.
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "leases", Namespace: ns},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"},
			Verbs: []string{"get", "list", "watch", "create", "update"}}},
	}
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "hosts-leases", Namespace: ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "leases"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "warren:hosts"}},
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// RBAC reads its objects from an informer: the grant takes effect
	// within moments, not at once.
	var got *coordinationv1.Lease
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err = hostA.CoordinationV1().Leases(ns).Create(ctx, lease, metav1.CreateOptions{})
		if err == nil || !apierrors.IsForbidden(err) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("lease create after the grant: %v", err)
	}
	if *got.Spec.HolderIdentity != "host-a" {
		t.Errorf("lease holder %q, want host-a", *got.Spec.HolderIdentity)
	}
	got.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	if _, err := hostA.CoordinationV1().Leases(ns).Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Errorf("lease renew: %v", err)
	}
	// So does a client of host-a's kubeconfig file.
	kc, err := clientcmd.BuildConfigFromFlags("", k.Kubeconfig(t, "host-a"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubernetes.NewForConfigOrDie(kc).CoordinationV1().Leases(ns).Get(ctx, "host-a", metav1.GetOptions{}); err != nil {
		t.Errorf("lease get with host-a's kubeconfig: %v", err)
	}
	// The grant is host-a's group's, not tenant-b's.
	if _, err := tenantB.CoordinationV1().Leases(ns).Get(ctx, "host-a", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("tenant-b reading host-a's lease: got %v, want Forbidden", err)
	}

	// A CRD, installed twice (the second is an update), serves objects.
	for range 2 {
		if err := InstallCRDs(ctx, k.Config, "testdata/widgets.yaml"); err != nil {
			t.Fatal(err)
		}
	}
	widgets := dynamic.NewForConfigOrDie(k.Config).Resource(schema.GroupVersionResource{
		Group: "fleettest.warren.dev", Version: "v1", Resource: "widgets"}).Namespace(ns)
	w := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "fleettest.warren.dev/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "w1"},
		"spec":     map[string]any{"size": int64(3)},
	}}
	if _, err := widgets.Create(ctx, w, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create widget: %v", err)
	}
	back, err := widgets.Get(ctx, "w1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if size, _, _ := unstructured.NestedInt64(back.Object, "spec", "size"); size != 3 {
		t.Errorf("widget size %d, want 3", size)
	}
	bad := w.DeepCopy()
	bad.SetName("w2")
	_ = unstructured.SetNestedField(bad.Object, int64(0), "spec", "size")
	if _, err := widgets.Create(ctx, bad, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Errorf("widget with size 0 (schema minimum 1): got %v, want Invalid", err)
	}
}

// TestInstallCRDsRejects checks that a document that is not a CRD, or
// has a field a CRD lacks, is refused before anything is written.
func TestInstallCRDsRejects(t *testing.T) {
	for _, tc := range []struct{ name, yaml string }{
		{"not a CRD", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n"},
		{"unknown field", "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: a.b\nspec:\n  grup: b\n"},
		{"old version", "apiVersion: apiextensions.k8s.io/v1beta1\nkind: CustomResourceDefinition\nmetadata:\n  name: a.b\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := t.TempDir() + "/crd.yaml"
			if err := os.WriteFile(p, []byte(tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := readCRDs(p); err == nil {
				t.Errorf("readCRDs accepted %q", tc.yaml)
			}
		})
	}
	crds, err := readCRDs("testdata/widgets.yaml")
	if err != nil || len(crds) != 1 || crds[0].Name != "widgets.fleettest.warren.dev" {
		t.Fatalf("readCRDs(testdata/widgets.yaml) = %d CRDs, %v; want widgets.fleettest.warren.dev", len(crds), err)
	}
}

// TestS3 starts SeaweedFS and puts, lists, gets and deletes an object
// with minio-go; a wrong secret is refused.
func TestS3(t *testing.T) {
	t0 := time.Now()
	s := StartS3(t)
	t.Logf("StartS3: %v", time.Since(t0).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s.MakeBucket(t, "snapshots")
	t.Logf("MakeBucket: %v", time.Since(t0).Round(time.Millisecond))
	c := s.Client(t)
	// More than the filer's 4 MiB chunk, so the object spans chunks.
	body := bytes.Repeat([]byte("warren snapshot layer\n"), 300_000)
	if _, err := c.PutObject(ctx, "snapshots", "tenant-a/snap-1/memory", bytes.NewReader(body), int64(len(body)),
		minio.PutObjectOptions{ContentType: "application/octet-stream"}); err != nil {
		t.Fatalf("put: %v", err)
	}
	t.Logf("put: %v", time.Since(t0).Round(time.Millisecond))
	var keys []string
	for o := range c.ListObjects(ctx, "snapshots", minio.ListObjectsOptions{Prefix: "tenant-a/", Recursive: true}) {
		if o.Err != nil {
			t.Fatalf("list: %v", o.Err)
		}
		keys = append(keys, o.Key)
		if o.Size != int64(len(body)) {
			t.Errorf("listed size %d, want %d", o.Size, len(body))
		}
	}
	if len(keys) != 1 || keys[0] != "tenant-a/snap-1/memory" {
		t.Errorf("listed %q, want [tenant-a/snap-1/memory]", keys)
	}
	obj, err := c.GetObject(ctx, "snapshots", "tenant-a/snap-1/memory", minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	back, err := io.ReadAll(obj)
	obj.Close()
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if !bytes.Equal(back, body) {
		t.Errorf("got %d bytes back, not the %d put", len(back), len(body))
	}
	if err := c.RemoveObject(ctx, "snapshots", "tenant-a/snap-1/memory", minio.RemoveObjectOptions{}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := c.StatObject(ctx, "snapshots", "tenant-a/snap-1/memory", minio.StatObjectOptions{}); minio.ToErrorResponse(err).Code != "NoSuchKey" {
		t.Errorf("stat after delete: got %v, want NoSuchKey", err)
	}

	t.Logf("deleted: %v", time.Since(t0).Round(time.Millisecond))
	wrong := *s
	wrong.SecretKey = "not-" + s.SecretKey
	if _, err := wrong.Client(t).ListBuckets(ctx); err == nil {
		t.Error("a wrong secret listed the buckets")
	}
}
