package v1alpha1_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	v1 "github.com/warrenvm/warren/fleet/api/v1alpha1"
)

// TestCRDsMatchTypes: every kind has a generated CRD, and each CRD's
// schema has every field of the Go type's spec and status (down to nested
// structs): a field added without `make crds` fails here.
func TestCRDsMatchTypes(t *testing.T) {
	s := runtime.NewScheme()
	if err := v1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	crds := map[string]*apiextensionsv1.CustomResourceDefinition{}
	files, _ := filepath.Glob("../../config/crd/*.yaml")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(b, &crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		crds[crd.Spec.Names.Kind] = &crd
	}
	for kind, typ := range s.KnownTypes(v1.GroupVersion) {
		if strings.HasSuffix(kind, "List") || typ.PkgPath() != reflect.TypeOf(v1.Sandbox{}).PkgPath() {
			continue // lists, and meta/v1's options and events
		}
		crd := crds[kind]
		if crd == nil {
			t.Errorf("kind %s has no CRD in fleet/config/crd (make crds)", kind)
			continue
		}
		if crd.Spec.Group != v1.GroupVersion.Group || len(crd.Spec.Versions) != 1 || crd.Spec.Versions[0].Name != v1.GroupVersion.Version {
			t.Errorf("%s: group %s versions %d", kind, crd.Spec.Group, len(crd.Spec.Versions))
			continue
		}
		schema := crd.Spec.Versions[0].Schema.OpenAPIV3Schema
		for _, part := range []string{"spec", "status"} {
			f, ok := typ.FieldByName(strings.ToUpper(part[:1]) + part[1:])
			if !ok {
				continue
			}
			prop, ok := schema.Properties[part]
			if !ok {
				t.Errorf("%s: CRD has no %s", kind, part)
				continue
			}
			checkFields(t, kind+"."+part, f.Type, &prop)
		}
	}
}

// checkFields checks that every JSON field of struct type typ is in p.
func checkFields(t *testing.T, at string, typ reflect.Type, p *apiextensionsv1.JSONSchemaProps) {
	for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice {
		typ = typ.Elem()
		if p.Items != nil && p.Items.Schema != nil {
			p = p.Items.Schema
		}
	}
	if typ.Kind() != reflect.Struct || typ.PkgPath() != reflect.TypeOf(v1.Sandbox{}).PkgPath() {
		return
	}
	for i := range typ.NumField() {
		f := typ.Field(i)
		tag := strings.Split(f.Tag.Get("json"), ",")
		if tag[0] == "" && len(tag) > 1 && tag[1] == "inline" {
			checkFields(t, at, f.Type, p)
			continue
		}
		if tag[0] == "" || tag[0] == "-" {
			continue
		}
		sub, ok := p.Properties[tag[0]]
		if !ok {
			t.Errorf("%s.%s: not in the CRD (make crds)", at, tag[0])
			continue
		}
		checkFields(t, at+"."+tag[0], f.Type, &sub)
	}
}
