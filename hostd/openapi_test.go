package hostd

import (
	"context"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// TestOpenAPIValid loads hostd/openapi.yaml with kin-openapi, a
// standard OpenAPI 3 loader and validator, and fails on any error it finds
// (what a client generator would choke on).
func TestOpenAPIValid(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromFile("openapi.yaml")
	if err != nil {
		t.Fatalf("openapi.yaml does not load: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("openapi.yaml is not valid OpenAPI 3: %v", err)
	}
}
