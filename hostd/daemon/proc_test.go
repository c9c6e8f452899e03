package daemon

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestExecLauncher: the VMM runs in a session of its own (a kill of the
// daemon's process group or session leaves it), with its output in the
// log, the Prepare hook applied, and stopProc ends it.
func TestExecLauncher(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip(err)
	}
	log := filepath.Join(t.TempDir(), "vmm.log")
	prepared := false
	l := &ExecLauncher{Warren: sleep, Prepare: func(cmd *exec.Cmd, spec LaunchSpec) error {
		prepared = spec.ID == "sb-000000000001"
		return nil
	}}
	p, err := l.Start(LaunchSpec{ID: "sb-000000000001", Args: []string{"60"}, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer stopProc(p.PID, p.StartTime, time.Second)
	if !prepared {
		t.Error("Prepare hook not called")
	}
	sid, err := unix.Getsid(p.PID)
	if err != nil || sid != p.PID {
		t.Fatalf("session %d (%v), want its own (%d)", sid, err, p.PID)
	}
	if !alive(p.PID, p.StartTime) || alive(p.PID, p.StartTime+1) {
		t.Fatal("alive: start time not checked")
	}
	stopProc(p.PID, p.StartTime, 2*time.Second)
	if alive(p.PID, p.StartTime) {
		t.Fatal("still alive after stopProc")
	}
	// A failing VMM's message ends up in the log.
	l.Warren = sleep
	p, err = l.Start(LaunchSpec{Args: []string{"--bogus"}, Log: log})
	if err == nil {
		waitDead(p.PID, p.StartTime, 5*time.Second)
	}
	time.Sleep(100 * time.Millisecond)
	if b, _ := os.ReadFile(log); !strings.Contains(string(b), "bogus") {
		t.Errorf("log: %q", b)
	}
}

// TestJailPrepareNetNS: a jailed VMM without a network gets a new network
// namespace; a network VMM (which makes its own for its tap and needs the
// host's for its upstream) does not; neither gets a pid namespace.
func TestJailPrepareNetNS(t *testing.T) {
	prep, err := JailPrepare("vmm")
	if err != nil {
		t.Fatal(err)
	}
	for _, network := range []bool{false, true} {
		cmd := newCmd("/bin/warren", "restore", "snap")
		if err := prep(cmd, LaunchSpec{Kind: "sandbox", Args: []string{"restore", "snap"}, Network: network}); err != nil {
			t.Fatal(err)
		}
		fl := cmd.SysProcAttr.Cloneflags
		if got := fl&unix.CLONE_NEWNET != 0; got == network {
			t.Errorf("network %v: CLONE_NEWNET %v", network, got)
		}
		if fl&unix.CLONE_NEWNS == 0 || fl&unix.CLONE_NEWPID != 0 {
			t.Errorf("network %v: clone flags %#x", network, fl)
		}
		if want := []string{"/bin/warren", "restore", "--jail", "vmm", "snap"}; strings.Join(cmd.Args, " ") != strings.Join(want, " ") {
			t.Errorf("args %q", cmd.Args)
		}
	}
}
