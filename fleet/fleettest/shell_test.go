package fleettest

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestShellBlock reads commands out of a Markdown block: continued lines,
// quotes, comments and here-documents; the block under another heading
// is not read.
func TestShellBlock(t *testing.T) {
	md := "# Doc\n\n## Other\n\n```sh\nnot me\n```\n\n## A fleet on Kubernetes: x\n\ntext\n\n```sh\n" +
		"kubectl apply -f a/ \\\n  -f 'b c.yaml'   # two files\n" +
		"# a comment line\n\n" +
		"export KUBECONFIG=alice.kubeconfig\n" +
		"kubectl -n team-a apply -f - <<'YAML'\nkind: X\nmetadata: {name: $y}\nYAML\n" +
		"kubectl patch sandbox s -p '{\"spec\":{\"m\":\"S\"}}' \"double quoted\"\n" +
		"```\n"
	p := filepath.Join(t.TempDir(), "README.md")
	if err := os.WriteFile(p, []byte(md), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := ShellBlock(p, "A fleet on Kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	want := []Command{
		{Line: 14, Args: []string{"kubectl", "apply", "-f", "a/", "-f", "b c.yaml"}, Comment: "two files"},
		{Line: 18, Args: []string{"export", "KUBECONFIG=alice.kubeconfig"}},
		{Line: 19, Args: []string{"kubectl", "-n", "team-a", "apply", "-f", "-"}, Stdin: "kind: X\nmetadata: {name: $y}\n"},
		{Line: 23, Args: []string{"kubectl", "patch", "sandbox", "s", "-p", `{"spec":{"m":"S"}}`, "double quoted"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got\n%#v\nwant\n%#v", got, want)
	}
	if w := got[2].Words(kubectlValueFlags...); !reflect.DeepEqual(w, []string{"apply"}) {
		t.Errorf("Words: %q", w)
	}
	if v, ok := got[2].Flag("-n"); v != "team-a" || !ok {
		t.Errorf("Flag(-n) = %q, %v", v, ok)
	}
}

// TestShellBlockRefuses: what would take a real shell to mean, and a
// block that is not there or does not end, are errors.
func TestShellBlockRefuses(t *testing.T) {
	for _, tc := range []struct{ name, block string }{
		{"pipe", "kubectl get sandboxes | grep x\n"},
		{"and", "kubectl get x && echo y\n"},
		{"semicolon", "kubectl get x; echo y\n"},
		{"redirect", "kubectl get x > out\n"},
		{"variable", "kubectl -n $NS get x\n"},
		{"variable in double quotes", "kubectl -n \"$NS\" get x\n"},
		{"substitution", "kubectl get `x`\n"},
		{"glob", "kubectl apply -f fleet/*.yaml\n"},
		{"tilde", "kubectl --kubeconfig ~/k get x\n"},
		{"unterminated quote", "kubectl -p '{\n"},
		{"expanding here-document", "kubectl apply -f - <<EOF\nname: $x\nEOF\n"},
		{"unended here-document", "kubectl apply -f - <<'EOF'\nname: x\n"},
		{"continued last line", "kubectl get x \\\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "README.md")
			if err := os.WriteFile(p, []byte("## H\n```sh\n"+tc.block+"```\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if got, err := ShellBlock(p, "H"); err == nil {
				t.Fatalf("read %q as %#v", tc.block, got)
			}
		})
	}
	p := filepath.Join(t.TempDir(), "README.md")
	for _, md := range []string{"## H\ntext\n## Next\n```sh\nx\n```\n", "## H\n```sh\nx\n", "## Other\n```sh\nx\n```\n"} {
		if err := os.WriteFile(p, []byte(md), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ShellBlock(p, "H"); err == nil {
			t.Errorf("read a block out of %q", md)
		}
	}
	os.WriteFile(p, []byte("## H\n```sh\nkubectl get x | y\n```\n"), 0o644)
	if _, err := ShellBlock(p, "H"); !errors.Is(err, errUnsupported) || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("a pipe: %v, want errUnsupported at line 3", err)
	}
}

// TestReadmeFleetSteps: every kubectl line of README.md's fleet block is
// a step ReadmeFleetRun checks, and it has every step (no apiserver
// needed: this runs everywhere).
func TestReadmeFleetSteps(t *testing.T) {
	_, cmds := ReadmeFleet(t)
	seen := map[ReadmeStep]bool{}
	for _, c := range cmds {
		if c.Args[0] != "kubectl" {
			continue
		}
		s := ReadmeStepOf(c)
		if s == "" {
			t.Errorf("line %d: %s: no step", c.Line, c)
		}
		seen[s] = true
	}
	for _, s := range []ReadmeStep{StepInstall, StepNamespace, StepRoleBinding, StepApply, StepGet, StepSuspend, StepResume} {
		if !seen[s] {
			t.Errorf("no %s line", s)
		}
	}
}
