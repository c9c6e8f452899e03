package fleettest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/warrenvm/warren/internal/product"
)

// ToolsEnv names the environment variable that, when set, is the
// directory holding the binaries (instead of build/kubetools).
const ToolsEnv = "WARREN_KUBETOOLS"

// toolNames are the binaries Tools' directory must hold.
var toolNames = []string{"kube-apiserver", "etcd", "weed"}

// errNoTools is findTools' answer when neither $WARREN_KUBETOOLS nor
// build/kubetools is there: the test skips (product.Missing).
var errNoTools = errors.New("no tools")

// Tools returns the directory holding kube-apiserver, etcd and weed:
// $WARREN_KUBETOOLS, else build/kubetools of the module the working
// directory is in (found by walking up to go.mod). When neither is set
// up, product.Missing ends the test (a skip saying to run `make
// kubetools`, a failure under make test); when
// $WARREN_KUBETOOLS is set but lacks a binary, the test fails.
func Tools(t testing.TB) string {
	t.Helper()
	dir, err := findTools()
	if errors.Is(err, errNoTools) {
		// One message for every test, so make test's summary groups them.
		product.Missing(t, "kube-apiserver, etcd and weed (no $"+ToolsEnv+", no build/kubetools)",
			"make kubetools: .ci/kubetools/build.sh, about 15 minutes once per machine")
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// findTools is Tools without the testing.TB.
func findTools() (string, error) {
	if dir := os.Getenv(ToolsEnv); dir != "" {
		if err := checkTools(dir); err != nil {
			return "", fmt.Errorf("$%s=%s: %w", ToolsEnv, dir, err)
		}
		return dir, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", errNoTools
	}
	dir := filepath.Join(root, "build", "kubetools")
	if checkTools(dir) != nil {
		return "", errNoTools
	}
	return dir, nil
}

// moduleRoot is the directory of the go.mod above the working directory
// (the module the test runs in).
func moduleRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no go.mod above %s", wd)
		}
	}
}

// checkTools says which binary dir lacks, if any.
func checkTools(dir string) error {
	for _, n := range toolNames {
		if err := checkExecutable(filepath.Join(dir, n)); err != nil {
			return fmt.Errorf("no %s: %w (make kubetools builds it)", n, err)
		}
	}
	return nil
}
