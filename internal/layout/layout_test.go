package layout

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// root is the repository's root, from this package's folder.
const root = "../.."

// packages maps each package of the tree (its path below the module) to
// the module packages its non-test files import.
func packages(t *testing.T) map[string][]string {
	t.Helper()
	pkgs := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "build" || name == "bin" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(p))
		pkg := filepath.ToSlash(rel)
		if _, ok := pkgs[pkg]; !ok {
			pkgs[pkg] = nil
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if rest, ok := strings.CutPrefix(path, Module+"/"); ok && !slices.Contains(pkgs[pkg], rest) {
				pkgs[pkg] = append(pkgs[pkg], rest)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 20 {
		t.Fatalf("found only %d packages under %s", len(pkgs), root)
	}
	return pkgs
}

// TestImportDirection fails for every import against the direction.
func TestImportDirection(t *testing.T) {
	for pkg, imports := range packages(t) {
		for _, imp := range imports {
			if ok, why := Allowed(pkg, imp); !ok {
				t.Errorf("%s imports %s: %s", pkg, imp, why)
			}
		}
	}
}

// TestAllowed pins the rules on cases that must pass and fail.
func TestAllowed(t *testing.T) {
	for _, c := range []struct {
		from, to string
		ok       bool
	}{
		{"hostd/daemon", "memsnap/vmsnap", true},
		{"cmd/warren/cli", "vmmproc/jail", true},
		{"vmm", "vmm/kvm", true},
		{"vmm/boot", "vmm/guestmem", true},
		{"cow", "memsnap", true},
		{"memsnap/vmsnap", "cow/disk", true},
		{"ebpf/filter", "internal/logcap", true},
		{"hostd/daemon", "guestinit/imageconfig", true},
		{"hostd/daemon", "agentwire", true},
		{"hostd/daemon", "agentclient", true},
		{"cmd/warren/cli", "agentclient", true},
		{"bench/agent", "agentclient", true},
		{"vmmctl", "agentclient", true},
		{"agentclient", "agentwire", true},
		{"agentclient", "devices/virtio/vsock", true},
		{"guestinit/agent", "agentwire", true},
		{"guestinit", "agentwire", true},
		{"agentwire", "internal/atomicfile", true},
		{"hostd/daemon", "vmmctl", true},
		{"cmd/warren/cli", "vmmctl", true},
		{"vmmctl", "memsnap/vmsnap", true},
		{"vmmproc", "vmmctl", true},
		{"vmmproc/egress", "agentclient", true},
		{"hostd/daemon", "vmmproc/jail", true},
		{"vmmproc/egress", "ebpf/filter", true},
		{"vmmproc/jail", "hostd/store", false},
		{"vmmproc/egress", "hostd/wire", false},
		{"vmmproc", "cmd/warren/cli", false},
		{"vmm/kvm", "vmm", false},
		{"devices/virtio", "memsnap", false},
		{"memsnap", "hostd/crypt", false},
		{"hostd/daemon", "cmd/warren/cli", false},
		{"cmd/warren/cli", "bench/stats", false},
		{"guestinit/agent", "hostd/wire", false},
		{"guestinit/agent", "agentclient", false},
		{"hostd/daemon", "guestinit/agent", false},
		{"cmd/warren/cli", "guestinit/agent", false},
		{"agentclient", "guestinit/agent", false},
		{"agentclient", "hostd/wire", false},
		{"devices/virtio/vsock", "agentclient", false},
		{"agentwire", "guestinit/agent", false},
		{"agentwire", "agentclient", false},
		{"agentwire", "devices/virtio/vsock", false},
		{"internal/testsum", "agentwire", false},
		{"guestinit", "vmm/kvm", false},
		{"hostd/daemon", "guestinit/etc", false},
		{"internal/testsum", "vmm", false},
		{"newgroup/x", "vmm", false},
	} {
		if ok, why := Allowed(c.from, c.to); ok != c.ok {
			t.Errorf("Allowed(%s, %s) = %v (%s), want %v", c.from, c.to, ok, why, c.ok)
		}
	}
}

// TestExceptionsUsed: every exception is still taken by some host
// package, so that one whose reason has gone (its package moved) is
// removed rather than left to admit imports it was never meant for.
func TestExceptionsUsed(t *testing.T) {
	used := map[string]bool{}
	for pkg, imports := range packages(t) {
		for _, imp := range imports {
			if Group(pkg) != "guestinit" && Group(imp) == "guestinit" {
				used[imp] = true
			}
		}
	}
	for pkg := range Exceptions {
		if !used[pkg] {
			t.Errorf("Exceptions[%q]: no host package imports it; remove the exception", pkg)
		}
	}
}

// TestReadmeListsEveryPackage: README.md's layout table names every
// package, each in backquotes.
func TestReadmeListsEveryPackage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Layout\n")
	if !ok {
		t.Fatal("README.md has no \"## Layout\" section")
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	listed := map[string]bool{}
	for _, l := range strings.Split(section, "\n") {
		if m := regexp.MustCompile("^\\| `([^`]+)`").FindStringSubmatch(l); m != nil {
			listed[m[1]] = true
		}
	}
	var missing []string
	for pkg := range packages(t) {
		if !listed[pkg] {
			missing = append(missing, pkg)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("README.md's layout table lacks a row for: %s", strings.Join(missing, ", "))
	}
}

// TestGroupDocs: each top-level folder of Go code has a doc.go that says
// what it owns and what it may import ("May import").
func TestGroupDocs(t *testing.T) {
	groups := map[string]bool{}
	for pkg := range packages(t) {
		if pkg != "." {
			g, _, _ := strings.Cut(pkg, "/")
			groups[g] = true
		}
	}
	for g := range groups {
		b, err := os.ReadFile(filepath.Join(root, g, "doc.go"))
		if err != nil {
			t.Errorf("%s: %v", g, err)
			continue
		}
		if !strings.Contains(string(b), "May import") {
			t.Errorf("%s/doc.go does not say what the group may import (\"May import ...\")", g)
		}
	}
}

// TestReadmeQuickstarts checks that each quickstart README.md copies from
// an SDK's own README (after a marker `<!-- the quickstart of PATH, which
// its end-to-end test runs -->`) is that README's: the SDKs' end-to-end
// tests (sdk/test.sh) run the quickstart of their own README as written,
// so the copy a reader runs is the one tested.
func TestReadmeQuickstarts(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	re := regexp.MustCompile("<!-- the quickstart of (\\S+), which its end-to-end test runs -->\n(```[a-z]*\n[\\s\\S]*?```)")
	ms := re.FindAllStringSubmatch(readme, -1)
	if len(ms) < 2 {
		t.Fatalf("README.md has %d SDK quickstarts, want the Python and TypeScript ones", len(ms))
	}
	for _, m := range ms {
		src, err := os.ReadFile(filepath.Join(root, m[1]))
		if err != nil {
			t.Fatal(err)
		}
		_, q, ok := strings.Cut(string(src), "## Quickstart")
		fence := m[2][:strings.Index(m[2], "\n")+1]
		start := strings.Index(q, fence)
		if !ok || start < 0 {
			t.Errorf("%s: no %q block under its Quickstart heading", m[1], strings.TrimSpace(fence))
			continue
		}
		end := strings.Index(q[start+len(fence):], "```")
		if want := q[start : start+len(fence)+end+3]; want != m[2] {
			t.Errorf("README.md's copy of %s's quickstart differs from it:\n%s\nwant:\n%s", m[1], m[2], want)
		}
	}
}
