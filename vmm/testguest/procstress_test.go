package testguest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// TestProcstressOnHost runs procstress on this machine (x86-64 Linux):
// its processes pass, and its self-test (one spoiled register and word)
// is caught, so a guest run that passes means something.
func TestProcstressOnHost(t *testing.T) {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skip("procstress is an x86-64 Linux program")
	}
	if _, err := exec.LookPath("gcc"); err != nil && os.Getenv("WARREN_TESTGUESTS") == "" {
		t.Skip("no gcc to build procstress")
	}
	bin := BuildProgram(t, "procstress")
	out, err := exec.Command(bin, "4", "300").CombinedOutput()
	if err != nil || string(out) != "processes 4, iterations 300, failed 0\n" {
		t.Fatalf("procstress 4 300: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "4", "300", "corrupt").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("procstress corrupt: %v, want exit 1\n%s", err, out)
	}
	for _, want := range []string{
		"process 1 iteration 10: registers changed across a system call, mask 0x0000000000000008\n",
		"process 1 iteration 10: word 7 is ",
		"processes 4, iterations 300, failed 1\n",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("procstress corrupt: no %q in\n%s", want, out)
		}
	}
}

// TestProgramFlagsMatchMakefile: `make testguests` builds the programs
// with ProgramFlags.
func TestProgramFlagsMatchMakefile(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join(Dir(), "..", "..", "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^PROGRAM_FLAGS := (.*)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("no PROGRAM_FLAGS in the Makefile")
	}
	if got, want := string(m[1]), strings.Join(ProgramFlags, " "); got != want {
		t.Errorf("Makefile PROGRAM_FLAGS %q, ProgramFlags %q", got, want)
	}
}
