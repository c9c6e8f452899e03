package fleettest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Apply creates the objects of multi-document YAML files (any kind the
// server knows; what exists already is updated), as kubectl apply -f
// would for new objects.
func Apply(ctx context.Context, cfg *rest.Config, paths ...string) error {
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return err
	}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for {
			var u unstructured.Unstructured
			if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			err := c.Create(ctx, &u)
			if apierrors.IsAlreadyExists(err) {
				var cur unstructured.Unstructured
				cur.SetGroupVersionKind(u.GroupVersionKind())
				if err = c.Get(ctx, client.ObjectKeyFromObject(&u), &cur); err == nil {
					u.SetResourceVersion(cur.GetResourceVersion())
					err = c.Update(ctx, &u)
				}
			}
			if err != nil {
				return fmt.Errorf("%s: %s %s: %w", p, u.GetKind(), u.GetName(), err)
			}
		}
	}
	return nil
}
