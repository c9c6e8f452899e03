package vmmproc

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/warrenvm/warren/vmmctl"
)

// TestForkRepeated forks one running parent again and again, one child at
// a time, while the parent keeps changing its memory, so that its memory
// base grows a layer per fork: every child must come up, see exactly the
// parent's file of its fork, and answer; each is stopped before the next
// fork. (The benchmark forks the same way, twenty times per guest size.)
func TestForkRepeated(t *testing.T) {
	_, dir, sock, api := templateWithAPI(t)
	const forks = 10
	for i := range forks {
		mustRun(t, "exec", "--timeout", "1m", sock, "--", "sh", "-c",
			fmt.Sprintf("echo gen-%d > /tmp/gen; dd if=/dev/urandom of=/tmp/junk-%d bs=4096 count=64", i, i))
		var r vmmctl.ForkReply
		out := mustRun(t, "fork", "-n", "1", "--json", "--prefix", filepath.Join(dir, fmt.Sprintf("r%d", i)), api)
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatal(err)
		}
		c := r.Children[0]
		stop := func() {
			if p, err := os.FindProcess(c.PID); err == nil {
				p.Signal(syscall.SIGKILL)
			}
		}
		code, got, errOut := cli(t, nil, "exec", "--timeout", "2m", c.Vsock, "--", "cat", "/tmp/gen")
		if code != 0 || got != fmt.Sprintf("gen-%d\n", i) {
			logb, _ := os.ReadFile(c.Log)
			con, _ := os.ReadFile(c.Console)
			stop()
			t.Fatalf("fork %d (%d memory layers): child read %q, exit %d: %s\nchild log:\n%s\nchild console:\n%s", i, r.Layers, got, code, errOut, logb, tail(con))
		}
		t.Logf("fork %d: %d memory layers, parent paused %.1f ms, child running after %.1f ms", i, r.Layers, r.PauseMS, c.ReadyMS)
		stop()
	}
}
