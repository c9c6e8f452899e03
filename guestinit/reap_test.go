//go:build linux

package guestinit

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// procState returns the state letter of pid from /proc/<pid>/stat, or 0 if
// the process is gone (reaped).
func procState(t *testing.T, pid int) byte {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if os.IsNotExist(err) || errors.Is(err, unix.ESRCH) {
		// ESRCH: reaped between open and read.
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		t.Fatalf("bad stat %q", s)
	}
	return s[i+2]
}

func waitState(t *testing.T, pid int, want byte) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := procState(t, pid)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d: state %q, want %q", pid, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startOrphaner starts `sh` that backgrounds a short sleep and exits, so
// the sleep is reparented to us (a child subreaper, like PID 1). It returns
// the pids of the shell and of the orphan; neither is waited for.
func startOrphaner(t *testing.T) (shell, orphan int) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p, err := os.StartProcess("/bin/sh", []string{"sh", "-c", "sleep 0.2 & echo $!"},
		&os.ProcAttr{Files: []*os.File{nil, w, os.Stderr}})
	w.Close()
	if err != nil {
		t.Skipf("no /bin/sh: %v", err)
	}
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	orphan, err = strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	shell = p.Pid
	p.Release()
	return shell, orphan
}

// isolateEnv names the test an isolated child process runs.
const isolateEnv = "WARREN_GUESTINIT_ISOLATED_TEST"

// isolated runs the calling (top-level) test in a process of its own: the
// test binary again, with -test.run matching only that test. A Reaper
// waits for any child of its process (and a child subreaper also gets
// its descendants' orphans), so in the shared test process it would steal
// the children of other tests (net_test's exec.Command, say). isolated
// returns true in the child, where the body runs, and false in the
// parent, which fails or skips as the child did.
func isolated(t *testing.T) bool {
	t.Helper()
	if os.Getenv(isolateEnv) == t.Name() {
		return true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.v", "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), isolateEnv+"="+t.Name())
	out, err := cmd.CombinedOutput()
	switch {
	case err != nil:
		t.Fatalf("isolated %s: %v\n%s", t.Name(), err, out)
	case bytes.Contains(out, []byte("--- SKIP: "+t.Name())):
		t.Skipf("isolated:\n%s", out)
	case !bytes.Contains(out, []byte("--- PASS: "+t.Name())):
		t.Fatalf("isolated %s did not run:\n%s", t.Name(), out)
	}
	if testing.Verbose() {
		t.Logf("isolated:\n%s", out)
	}
	return false
}

// subreaper makes the (isolated) test process a child subreaper, as PID 1
// is for every process, and returns a new Reaper for it.
func subreaper(t *testing.T) *Reaper {
	t.Helper()
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Skipf("PR_SET_CHILD_SUBREAPER: %v", err)
	}
	return NewReaper()
}

func TestReaperCollectsOrphans(t *testing.T) {
	if !isolated(t) {
		return
	}
	r := subreaper(t)

	// Both the shell and its orphan turn into zombies of ours; ReapAll
	// collects both.
	shell, orphan := startOrphaner(t)
	waitState(t, shell, 'Z')
	waitState(t, orphan, 'Z')
	if n := r.ReapAll(); n != 2 {
		t.Errorf("ReapAll collected %d, want 2", n)
	}
	if s := procState(t, shell); s != 0 {
		t.Errorf("shell still there, state %q", s)
	}
	if s := procState(t, orphan); s != 0 {
		t.Errorf("orphan still there, state %q", s)
	}
	if n := r.ReapAll(); n != 0 {
		t.Errorf("second ReapAll collected %d, want 0", n)
	}

	// Run reaps on SIGCHLD without being asked.
	go r.Run()
	shell, orphan = startOrphaner(t)
	waitState(t, shell, 0)
	waitState(t, orphan, 0)
}
