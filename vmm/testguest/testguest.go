// Package testguest builds the freestanding test guests in
// vmm/testdata/guests (32-bit code in a PVH-bootable ELF) with the machine's
// gcc and ld, for tests that run real KVM VMs in seconds, and the
// freestanding Linux programs in vmm/testdata/programs that tests run inside
// a Linux guest.
//
// When WARREN_TESTGUESTS names a directory holding NAME.elf (a guest) or
// NAME (a program), that prebuilt file is used instead (how the tests run
// inside the nested KVM host, which has no compiler); `make testguests`
// fills build/testguests.
package testguest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// Dir is the directory of the guest sources.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "testdata", "guests")
}

// Build returns the ELF image of guest name (e.g. "hello").
func Build(t testing.TB, name string) []byte {
	t.Helper()
	return assemble(t, name, ".elf", "-T", filepath.Join(Dir(), "guest.ld"), "--no-warn-rwx-segments")
}

// assemble returns guest name, prebuilt as NAME+ext in WARREN_TESTGUESTS,
// or assembled with gcc and linked with ld and ldArgs.
func assemble(t testing.TB, name, ext string, ldArgs ...string) []byte {
	t.Helper()
	if dir := os.Getenv("WARREN_TESTGUESTS"); dir != "" {
		if b, err := os.ReadFile(filepath.Join(dir, name+ext)); err == nil {
			return b
		}
	}
	tmp := t.TempDir()
	obj, out := filepath.Join(tmp, name+".o"), filepath.Join(tmp, name+ext)
	for _, args := range [][]string{
		{"gcc", "-c", "-I", Dir(), "-o", obj, filepath.Join(Dir(), name+".S")},
		append(append([]string{"ld"}, ldArgs...), "-o", out, obj),
	} {
		if msg, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("build test guest %s: %v: %v\n%s", name, args, err, msg)
		}
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ProgramFlags are gcc's flags for the programs in vmm/testdata/programs:
// static x86-64 Linux executables with no C library (the Makefile uses the
// same).
var ProgramFlags = []string{"-O1", "-static", "-nostdlib", "-ffreestanding", "-mno-red-zone",
	"-fno-stack-protector", "-fno-pie", "-no-pie"}

// BuildProgram returns the path of the Linux program name (e.g.
// "procstress"), prebuilt or built into a temporary directory.
func BuildProgram(t testing.TB, name string) string {
	t.Helper()
	if dir := os.Getenv("WARREN_TESTGUESTS"); dir != "" {
		if p := filepath.Join(dir, name); fileExists(p) {
			return p
		}
	}
	src := filepath.Join(Dir(), "..", "programs", name+".c")
	out := filepath.Join(t.TempDir(), name)
	args := append(append([]string{}, ProgramFlags...), "-o", out, src)
	if b, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("build test program %s: %v\n%s", name, err, b)
	}
	return out
}

func fileExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// BuildFlat returns guest name assembled as a flat binary to be placed at
// guest physical address addr (for raw KVM tests that set up no paging or
// boot protocol).
func BuildFlat(t testing.TB, name string, addr uint64) []byte {
	t.Helper()
	return assemble(t, name, ".bin", "-Ttext", fmt.Sprintf("%#x", addr), "--oformat", "binary")
}
