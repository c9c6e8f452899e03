// Package tartest writes the tar layers that the tests of image and
// image/flatten craft.
package tartest

import (
	"archive/tar"
	"bytes"
	"io"
	"testing"
)

// Ent is one entry of a crafted layer: its header and, for a regular
// file, its data.
type Ent struct {
	H    tar.Header
	Data string
}

// Tar writes ents as a tar stream, failing t if it cannot.
func Tar(t testing.TB, ents ...Ent) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range ents {
		h := e.H
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("crafting a layer: %s: %v", h.Name, err)
		}
		if _, err := io.WriteString(tw, e.Data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
