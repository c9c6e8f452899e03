package fleettest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"
)

// establishTimeout bounds how long a CRD may take to be Established after
// it was written (well under a second on an idle apiserver).
const establishTimeout = time.Minute

// InstallCRDs reads CustomResourceDefinitions (apiextensions.k8s.io/v1)
// from multi-document YAML files, creates them, or updates those that
// exist, and returns once the apiserver serves each (its Established
// condition). A document that is not such a CRD, or has a field the type
// lacks, is an error; empty documents are skipped.
func InstallCRDs(ctx context.Context, cfg *rest.Config, paths ...string) error {
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, p := range paths {
		got, err := readCRDs(p)
		if err != nil {
			return err
		}
		crds = append(crds, got...)
	}
	cs, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	api := cs.ApiextensionsV1().CustomResourceDefinitions()
	for _, crd := range crds {
		_, err := api.Create(ctx, crd, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
				cur, err := api.Get(ctx, crd.Name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				up := crd.DeepCopy()
				up.ResourceVersion = cur.ResourceVersion
				_, err = api.Update(ctx, up, metav1.UpdateOptions{})
				return err
			})
		}
		if err != nil {
			return fmt.Errorf("install CRD %s: %w", crd.Name, err)
		}
	}
	for _, crd := range crds {
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, establishTimeout, true, func(ctx context.Context) (bool, error) {
			cur, err := api.Get(ctx, crd.Name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, c := range cur.Status.Conditions {
				switch {
				case c.Type == apiextensionsv1.NamesAccepted && c.Status == apiextensionsv1.ConditionFalse:
					return false, fmt.Errorf("names not accepted: %s", c.Message)
				case c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue:
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w", crd.Name, err)
		}
	}
	return nil
}

// readCRDs decodes every CRD of one YAML file.
func readCRDs(path string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	var crds []*apiextensionsv1.CustomResourceDefinition
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return crds, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, i, err)
		}
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, i, err)
		}
		if t := bytes.TrimSpace(j); len(t) == 0 || bytes.Equal(t, []byte("null")) {
			continue // empty, or comments only
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(doc, crd); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, i, err)
		}
		if crd.APIVersion != apiextensionsv1.SchemeGroupVersion.String() || crd.Kind != "CustomResourceDefinition" {
			return nil, fmt.Errorf("%s: document %d is a %s %s, not an %s CustomResourceDefinition",
				path, i, crd.APIVersion, crd.Kind, apiextensionsv1.SchemeGroupVersion)
		}
		crds = append(crds, crd)
	}
}
