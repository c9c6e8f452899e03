package vmmproc

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestExecutableSurvivesReplacement: the program fork children are
// started from is the running binary itself, even after the file at the
// path it was started by is replaced (an upgrade, or go build rewriting
// bin/warren while VMMs run): a child must run the code that wrote its
// spec. A copy of this test binary, started from a path over which it
// then renames a script that cannot run, starts executable() and reads
// its answer.
func TestExecutableSurvivesReplacement(t *testing.T) {
	if path := os.Getenv("SELF_TEST_PATH"); path != "" {
		if os.Getenv("SELF_TEST_CHILD") == "1" {
			os.Stdout.WriteString("child ran\n")
			os.Exit(0)
		}
		// Replaced as an upgrade replaces it: a new file renamed over the
		// path (a running binary cannot be written in place here).
		if err := os.WriteFile(path+".new", []byte("#!/no/such/interpreter\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
		exe, err := (&process{}).executable()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(exe, "-test.run=^TestExecutableSurvivesReplacement$")
		cmd.Env = append(os.Environ(), "SELF_TEST_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "child ran") {
			t.Fatalf("a child started from %s after its path was replaced: %v: %s", exe, err, out)
		}
		return
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(t.TempDir(), "vmmproc.test")
	if err := os.WriteFile(copyPath, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(copyPath, "-test.run=^TestExecutableSurvivesReplacement$", "-test.v")
	cmd.Env = append(os.Environ(), "SELF_TEST_PATH="+copyPath)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
}
