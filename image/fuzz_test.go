package image

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenvm/warren/guestinit/imageconfig"
	"github.com/warrenvm/warren/image/internal/tartest"
)

// Fuzz targets for every parser of image-supplied bytes in this package
// (package flatten has FuzzFlatten for the layers' tar streams).

func archiveSeeds(t testing.TB) [][]byte {
	man := `[{"Config":"c.json","RepoTags":["a/b:c"],"Layers":["l.tar"]}]`
	return [][]byte{
		tartest.Tar(t, reg("manifest.json", man, 0o644), reg("c.json", `{"architecture":"amd64","os":"linux"}`, 0o644), reg("l.tar", "", 0o644)),
		tartest.Tar(t, reg("manifest.json", man, 0o644), symlink("c.json", "x/../y.json"), reg("y.json", "{}", 0o644), hardlink("l.tar", "c.json")),
		tartest.Tar(t, reg("manifest.json", `[{},{}]`, 0o644)),
	}
}

func FuzzScanArchive(f *testing.F) {
	for _, s := range archiveSeeds(f) {
		f.Add(s, "")
		f.Add(s, "a/b:c")
	}
	f.Fuzz(func(t *testing.T, b []byte, ref string) {
		scanArchive(bytes.NewReader(b), ref)
	})
}

func FuzzParseArchiveManifest(f *testing.F) {
	f.Add([]byte(`[{"Config":"c.json","RepoTags":["a/b:c"],"Layers":["l.tar"]}]`), "a/b:c")
	f.Add([]byte(`[{"Config":"x"},{"Config":"y","RepoTags":["index.docker.io/library/x:latest"]}]`), "x")
	f.Add([]byte(`{}`), "")
	f.Fuzz(func(t *testing.T, b []byte, ref string) {
		d, err := parseArchiveManifest(b, ref)
		if err == nil && d == nil {
			t.Fatal("no error and no descriptor")
		}
	})
}

func configSeeds() []string {
	return []string{
		`{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin"],"WorkingDir":"app","User":"1000","Entrypoint":["/e"],"Cmd":["c"]},"rootfs":{"type":"layers","diff_ids":["sha256:` + strings.Repeat("a", 64) + `"]}}`,
		`{"architecture":"arm64","os":"linux","variant":"v8"}`,
		`{"config":{"Env":["NOEQUALS"]}}`,
		`{"config":{"WorkingDir":"/../../x/./y/"}}`,
	}
}

func FuzzParseConfig(f *testing.F) {
	for _, s := range configSeeds() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		cf, err := parseConfig(b)
		if err != nil {
			return
		}
		c, err := guestConfig(cf, "ref", "sha256:"+strings.Repeat("0", 64))
		if err != nil {
			return
		}
		out, err := c.Marshal()
		if err != nil {
			t.Fatalf("a checked config does not marshal: %v", err)
		}
		if _, err := imageconfig.Parse(out); err != nil {
			t.Fatalf("what the guest reads does not parse: %v", err)
		}
	})
}

// TestWriteFuzzSeeds rewrites testdata/fuzz from the seeds above when
// WARREN_WRITE_SEEDS=1.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("WARREN_WRITE_SEEDS") != "1" {
		t.Skip("set WARREN_WRITE_SEEDS=1 to rewrite the seed corpus")
	}
	write := func(target, body string) {
		dir := filepath.Join("testdata", "fuzz", target)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256([]byte(body))
		if err := os.WriteFile(filepath.Join(dir, hex.EncodeToString(sum[:8])), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range archiveSeeds(t) {
		write("FuzzScanArchive", fmt.Sprintf("go test fuzz v1\n[]byte(%q)\nstring(%q)\n", s, "a/b:c"))
	}
	for _, s := range configSeeds() {
		write("FuzzParseConfig", fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s))
	}
	write("FuzzParseArchiveManifest", fmt.Sprintf("go test fuzz v1\n[]byte(%q)\nstring(%q)\n", `[{"Config":"c","RepoTags":["r/a:b"]}]`, "r/a:b"))
}
