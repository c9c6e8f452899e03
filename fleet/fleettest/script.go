package fleettest

import (
	"path/filepath"
	"strings"
	"testing"
)

// ReadmeFleetHeading is the heading of README.md's fleet section; its
// ```sh block is the fleet's setup, which ReadmeFleet reads.
const ReadmeFleetHeading = "A fleet on Kubernetes"

// ReadmeFleet returns the commands of the ```sh block of README.md's
// fleet section, from the module the test runs in, and that module's
// root directory (the block names files relative to it). A block it
// cannot read fails the test.
func ReadmeFleet(t testing.TB) (root string, cmds []Command) {
	t.Helper()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmds, err = ShellBlock(filepath.Join(root, "README.md"), ReadmeFleetHeading)
	if err != nil {
		t.Fatalf("README.md's fleet block: %v", err)
	}
	if len(cmds) == 0 {
		t.Fatal("README.md's fleet block has no command")
	}
	return root, cmds
}

// Script runs a shell block's commands in order, as a person would type
// them, against a Kube: each kubectl line with kubectl (RunKubectl), as
// the user of the kubeconfig in force; `export KUBECONFIG=FILE` sets it
// for the lines after; every other line (one that starts a daemon) goes
// to Daemon, which starts the test's own. Any kubectl line that fails
// fails the test, with the line.
type Script struct {
	Kube *Kube
	// Dir is the directory kubectl runs in (paths of the block are
	// relative to it).
	Dir string
	// Users maps each kubeconfig file the block names (--kubeconfig FILE,
	// KUBECONFIG=FILE) to the user whose credentials it holds; kubectl
	// without one runs as AdminUser (the cluster's admin). A file not in
	// Users fails the test.
	Users map[string]string
	// Daemon is called for each line that is neither kubectl nor export.
	Daemon func(c Command)
	// After is called after each kubectl line with the user it ran as and
	// what it printed, to check its outcome.
	After func(c Command, user, out string)
}

// Run runs cmds.
func (s *Script) Run(t testing.TB, cmds []Command) {
	t.Helper()
	user := AdminUser
	for _, c := range cmds {
		switch c.Args[0] {
		case "export":
			if len(c.Args) != 2 {
				t.Fatalf("line %d: %s: one NAME=VALUE expected", c.Line, c)
			}
			name, file, _ := strings.Cut(c.Args[1], "=")
			if name != "KUBECONFIG" {
				t.Fatalf("line %d: %s: only KUBECONFIG is known here", c.Line, c)
			}
			user = s.user(t, c, file)
		case "kubectl":
			u := user
			args := append([]string(nil), c.Args[1:]...)
			for i := 0; i < len(args); i++ {
				switch a := args[i]; {
				case a == "--kubeconfig" && i+1 < len(args):
					u = s.user(t, c, args[i+1])
					args = append(args[:i], args[i+2:]...)
					i--
				case strings.HasPrefix(a, "--kubeconfig="):
					u = s.user(t, c, strings.TrimPrefix(a, "--kubeconfig="))
					args = append(args[:i], args[i+1:]...)
					i--
				}
			}
			out, err := s.Kube.RunKubectl(t, u, s.Dir, c.Stdin, args...)
			if err != nil {
				t.Fatalf("line %d: %s: %v", c.Line, c, err)
			}
			t.Logf("line %d, as %s: %s\n%s", c.Line, u, c, out)
			if s.After != nil {
				s.After(c, u, out)
			}
		default:
			if s.Daemon == nil {
				t.Fatalf("line %d: %s: no daemon starter", c.Line, c)
			}
			s.Daemon(c)
		}
	}
}

// user is the user of kubeconfig file.
func (s *Script) user(t testing.TB, c Command, file string) string {
	t.Helper()
	u, ok := s.Users[file]
	if !ok {
		t.Fatalf("line %d: %s: kubeconfig %q is none of the test's users %v", c.Line, c, file, s.Users)
	}
	return u
}
