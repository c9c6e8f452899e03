package fleettest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/internal/product"
)

// kubectlTimeout bounds one kubectl command (a few hundred milliseconds
// against a local apiserver; the nested KVM host's emulated CPU makes
// that seconds).
const kubectlTimeout = 2 * time.Minute

// Kubectl returns the path of kubectl (Kubernetes v1.34.4, built by
// `make kubetools`: .ci/kubetools/build-kubectl.sh): $WARREN_KUBETOOLS/kubectl
// when that is set (the test fails if it lacks one), else
// build/kubetools/kubectl of the module the working directory is in.
// Without it product.Missing ends the test (a skip saying how to build
// it, a failure under make test).
func Kubectl(t testing.TB) string {
	t.Helper()
	p, err := findKubectl()
	if errors.Is(err, errNoTools) {
		// One message for every test, so make test's summary groups them.
		product.Missing(t, "kubectl (no $"+ToolsEnv+"/kubectl, no build/kubetools/kubectl)", "make kubetools: .ci/kubetools/build-kubectl.sh")
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// findKubectl is Kubectl without the testing.TB.
func findKubectl() (string, error) {
	if dir := os.Getenv(ToolsEnv); dir != "" {
		p := filepath.Join(dir, "kubectl")
		if err := checkExecutable(p); err != nil {
			return "", fmt.Errorf("$%s=%s: %w (make kubetools builds it)", ToolsEnv, dir, err)
		}
		return p, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", errNoTools
	}
	p := filepath.Join(root, "build", "kubetools", "kubectl")
	if checkExecutable(p) != nil {
		return "", errNoTools
	}
	return p, nil
}

// checkExecutable says why p is not an executable regular file, if so.
func checkExecutable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", p)
	}
	return nil
}

// RunKubectl runs kubectl args as user (one given to StartKube, or
// AdminUser) in directory dir, with stdin as its standard input, and
// returns what it printed on its standard output; an error holds its
// exit status and standard error. Its kubeconfig is user's (Kubeconfig),
// given by --kubeconfig ahead of args (a --kubeconfig in args would
// override it: a caller maps those itself). Its environment is minimal:
// HOME is a directory of the Kube's own (kubectl's discovery cache), and
// no $KUBECONFIG reaches it.
func (k *Kube) RunKubectl(t testing.TB, user, dir, stdin string, args ...string) (string, error) {
	t.Helper()
	bin := Kubectl(t)
	kc := k.Kubeconfig(t, user)
	home := filepath.Join(k.Dir, "kubectl-home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), kubectlTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", kc}, args...)...)
	cmd.Dir = dir
	cmd.Env = []string{"HOME=" + home, "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C"}
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("kubectl %s (as %s): %w: %s", strings.Join(args, " "), user, err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}
