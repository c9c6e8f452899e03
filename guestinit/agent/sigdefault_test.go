//go:build linux

package agent

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/warrenvm/warren/agentwire"
)

// TestChildSignalsDefault runs an agent in a process started with SIGHUP,
// SIGINT and SIGPIPE ignored (as nohup and a shell's background jobs are)
// and checks that a command it runs starts with none of them ignored:
// otherwise a SIGHUP sent through /kill would not end it.
func TestChildSignalsDefault(t *testing.T) {
	if os.Getenv("AGENT_SIGNALS_HELPER") == "1" {
		c := start(t)
		var out bytes.Buffer
		code, err := c.Exec(ctxT(t), agentwire.ExecRequest{Argv: []string{"cat", "/proc/self/status"}}, &out, nil)
		if err != nil || code != 0 {
			t.Fatalf("exec: code %d, %v", code, err)
		}
		for _, line := range strings.Split(out.String(), "\n") {
			if v, ok := strings.CutPrefix(line, "SigIgn:"); ok {
				mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
				if err != nil {
					t.Fatal(line, err)
				}
				for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGPIPE} {
					if mask&(1<<(sig-1)) != 0 {
						t.Errorf("the agent's child starts with %v ignored (SigIgn %s)", sig, strings.TrimSpace(v))
					}
				}
				return
			}
		}
		t.Fatalf("no SigIgn line in\n%s", out.String())
	}
	// The helper process: this test binary again, started with the three
	// signals ignored (an ignored disposition survives execve).
	cmd := exec.Command(os.Args[0], "-test.run=^TestChildSignalsDefault$", "-test.v")
	cmd.Env = append(os.Environ(), "AGENT_SIGNALS_HELPER=1")
	out, err := runIgnoring(cmd, syscall.SIGHUP, syscall.SIGINT, syscall.SIGPIPE)
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "--- PASS: TestChildSignalsDefault") {
		t.Fatalf("helper did not pass:\n%s", out)
	}
}

// runIgnoring runs cmd with sigs ignored, through a shell's trap with an empty action
// (which sets SIG_IGN before it execs cmd), and returns its output.
func runIgnoring(cmd *exec.Cmd, sigs ...syscall.Signal) ([]byte, error) {
	var names []string
	for _, s := range sigs {
		names = append(names, strconv.Itoa(int(s)))
	}
	args := append([]string{"-c", `trap '' ` + strings.Join(names, " ") + `; exec "$@"`, "sh", cmd.Path}, cmd.Args[1:]...)
	sh := exec.Command("sh", args...)
	sh.Env = cmd.Env
	return sh.CombinedOutput()
}
