package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRollbackEndToEnd restores the Linux template with the control API,
// takes a snapshot, then changes a file in /tmp and the kernel's hostname
// (guest memory both), and rolls back in place with `warren rollback`: the
// same process and sockets serve the guest, the file and the hostname are
// as they were, and the agent answers. A corrupt snapshot is refused and
// the VM keeps running untouched.
func TestRollbackEndToEnd(t *testing.T) {
	_, dir, sock, api := templateWithAPI(t)
	run := func(args ...string) string { t.Helper(); return mustRun(t, args...) }
	run("health", "--wait", "3m", sock)
	run("exec", sock, "--", "sh", "-c", "echo before > /tmp/state; echo good-step > /proc/sys/kernel/hostname")
	snap := filepath.Join(dir, "good")
	t.Logf("%s", run("snapshot", api, snap))

	check := func(state, host string, after bool) {
		t.Helper()
		if got := run("exec", sock, "--", "cat", "/tmp/state"); got != state+"\n" {
			t.Errorf("/tmp/state = %q, want %q", got, state)
		}
		if got := run("exec", sock, "--", "cat", "/proc/sys/kernel/hostname"); got != host+"\n" {
			t.Errorf("hostname = %q, want %q", got, host)
		}
		code, _, _ := cli(t, nil, "exec", sock, "--", "cat", "/tmp/after")
		if (code == 0) != after {
			t.Errorf("/tmp/after present = %v, want %v", code == 0, after)
		}
	}
	bad := func() {
		t.Helper()
		run("exec", sock, "--", "sh", "-c", "echo bad > /tmp/state; echo x > /tmp/after; echo bad-step > /proc/sys/kernel/hostname; dd if=/dev/urandom of=/tmp/junk bs=65536 count=16")
		check("bad", "bad-step", true)
	}
	bad()
	out := run("rollback", api, snap)
	t.Logf("%s", out)
	if !strings.Contains(out, "rolled back to") {
		t.Errorf("warren rollback printed %q", out)
	}
	run("health", "--wait", "1m", sock)
	check("before", "good-step", false)

	// Again, after another bad step: rollback is repeatable.
	bad()
	t.Logf("%s", run("rollback", api, snap))
	run("health", "--wait", "1m", sock)
	check("before", "good-step", false)

	// A corrupt snapshot is refused before the VM is touched.
	bad()
	corrupt := filepath.Join(dir, "corrupt")
	for _, ext := range []string{".wstate"} {
		b, err := os.ReadFile(snap + ext)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/2] ^= 0xff
		if err := os.WriteFile(corrupt+ext, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if code, out, errOut := cli(t, nil, "rollback", api, corrupt); code == 0 {
		t.Errorf("rollback to a corrupt snapshot succeeded: %s", out)
	} else {
		t.Logf("refused: %s", strings.TrimSpace(errOut))
	}
	check("bad", "bad-step", true)
	if code, _, errOut := cli(t, nil, "rollback", api, filepath.Join(dir, "missing")); code == 0 || !strings.Contains(errOut, "missing") {
		t.Errorf("rollback to a missing snapshot: exit %d, %q", code, errOut)
	}
}
