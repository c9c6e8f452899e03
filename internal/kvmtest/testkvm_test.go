package kvmtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeRun stands in for .ci/kvmhost/run.sh in TestKVMRunVerdicts: each
// call is one L1 boot, doing what the next line of $FAKE/boots says: "run"
// runs the command (test-kvm.sh's inner half) with run.sh's --env
// variables, and when the package's test binary hangs, stops it as run.sh
// does a silent command (its message, exit 124); "die" is an L1 that died
// before running anything (exit 125).
const fakeRun = `set -u
envs=()
while [ $# -gt 0 ]; do
	case $1 in
	--env) envs+=("$2"); shift 2 ;;
	--) shift; break ;;
	--*) shift 2 ;;
	*) root=$1; shift ;;
	esac
done
n=$(($(cat "$FAKE/boot" 2>/dev/null || echo 0) + 1))
echo $n >"$FAKE/boot"
case $(sed -n "${n}p" "$FAKE/boots") in
die) echo "kvmhost: error: L1 stopped without reporting an exit status"; exit 125 ;;
esac
cd "$root"
for e in "${envs[@]}"; do export "$e"; done
export WARREN_L2TRACE=off
rm -f "$FAKE/hung"
setsid sh -c "$1" &
pid=$!
while kill -0 $pid 2>/dev/null && [ ! -s "$FAKE/hung" ]; do sleep 0.05; done
if [ -s "$FAKE/hung" ]; then
	kill -KILL -- -$pid
	echo "kvmhost: error: the command printed nothing for 300s: taking L1 for frozen and stopping it"
	exit 124
fi
wait $pid
`

// fakeTest is the package's test binary: its Nth run passes, fails or
// hangs as line N of $FAKE/tests says.
const fakeTest = `#!/bin/sh
n=$(($(cat "$FAKE/test" 2>/dev/null || echo 0) + 1))
echo $n >"$FAKE/test"
echo "=== RUN   TestThing"
case $(sed -n "${n}p" "$FAKE/tests") in
pass) echo "--- PASS: TestThing (0.00s)"; exit 0 ;;
fail) echo "--- FAIL: TestThing (0.00s)"; exit 1 ;;
hang) echo $$ >"$FAKE/hung"; exec sleep 600 ;;
esac
`

// TestKVMRunVerdicts runs .ci/test-kvm.sh, CI's driver of the KVM tests in
// the nested host, with a stand-in for L1: a test that goes silent while
// L1 lives is a failure of its package (twice fails the build), while an
// L1 that dies is the nested host's and only costs a boot.
func TestKVMRunVerdicts(t *testing.T) {
	script, err := filepath.Abs("../../.ci/test-kvm.sh")
	if err != nil {
		t.Fatal(err)
	}
	const pkg = "internal/kvmtest"
	for _, c := range []struct {
		name, boots, tests string
		rc                 int
		say, notSay        string
	}{
		{"hung then passes", "run run", "hang pass", 0, "a test printed nothing while L1 lived (last started: TestThing): a hung test, a test failure", ""},
		{"hung twice", "run run", "hang hang", 1, "package internal/kvmtest failed twice", ""},
		{"hung then fails", "run run", "hang fail", 1, "package internal/kvmtest failed twice", ""},
		{"L1 dies, then passes", "die run", "pass", 0, "booting a fresh L1 and resuming", "a hung test"},
		{"fails then passes", "run", "fail pass", 0, "running its failed and remaining tests once more", "a hung test"},
	} {
		t.Run(c.name, func(t *testing.T) {
			fake, tests := t.TempDir(), t.TempDir()
			write := func(path, s string, mode os.FileMode) {
				if err := os.WriteFile(path, []byte(s), mode); err != nil {
					t.Fatal(err)
				}
			}
			write(filepath.Join(fake, "run.sh"), fakeRun, 0o755)
			write(filepath.Join(fake, "boots"), strings.ReplaceAll(c.boots, " ", "\n")+"\n", 0o644)
			write(filepath.Join(fake, "tests"), strings.ReplaceAll(c.tests, " ", "\n")+"\n", 0o644)
			write(filepath.Join(tests, strings.ReplaceAll(pkg, "/", "_")+".test"), fakeTest, 0o755)
			cmd := exec.Command("bash", script, filepath.Join(t.TempDir(), "state"), tests, pkg)
			cmd.Env = append(os.Environ(), "FAKE="+fake, "WARREN_KVMHOST_RUN="+filepath.Join(fake, "run.sh"),
				"MAX_BOOTS=4", "BUDGET=600", "WARREN_CI_DEADLINE=")
			out, err := cmd.CombinedOutput()
			rc := 0
			if ee, ok := err.(*exec.ExitError); ok {
				rc = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if rc != c.rc || !strings.Contains(string(out), c.say) || (c.notSay != "" && strings.Contains(string(out), c.notSay)) {
				t.Errorf("exit %d, want %d; want it to say %q and not %q; it said:\n%s", rc, c.rc, c.say, c.notSay, out)
			}
		})
	}
}
