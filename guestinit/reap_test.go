//go:build linux

package guestinit

import (
	"bufio"
	"os"
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
	if os.IsNotExist(err) {
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

func TestReaperCollectsOrphans(t *testing.T) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Skipf("PR_SET_CHILD_SUBREAPER: %v", err)
	}
	r := NewReaper()

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
