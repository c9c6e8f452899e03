package vmmproc

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenvm/warren/cow/disk"
)

// TestRollbackEndToEnd restores the Linux template with the control API,
// takes a snapshot, then changes a file in /tmp, a file on the ext4 data
// disk (/mnt/data) and the kernel's hostname, and rolls back in place with
// `warren rollback`: the same process and sockets serve the guest, the
// files (the disk's read back from the disk itself, caches dropped) and
// the hostname are as they were, the kernel logged no file system error,
// and the agent answers. A corrupt snapshot is refused and the VM keeps
// running untouched. At the end the disk, as the VM left it, checks clean
// (e2fsck).
func TestRollbackEndToEnd(t *testing.T) {
	g, dir, sock, api := templateWithAPI(t)
	run := func(args ...string) string { t.Helper(); return mustRun(t, args...) }
	run("exec", sock, "--", "sh", "-c", "echo before > /tmp/state; echo good-step > /proc/sys/kernel/hostname; echo before > /mnt/data/state; sync")
	snap := filepath.Join(dir, "good")
	t.Logf("%s", run("snapshot", api, snap))

	// check reads, in one guest command (each costs seconds of emulated
	// kernel time here), the files in /tmp, the hostname, and the files on
	// the data disk after dropping the page cache (so they come from the
	// disk itself), and the kernel log.
	check := func(state, host string, after bool) {
		t.Helper()
		out := run("exec", sock, "--", "sh", "-c", "echo tmp=$(cat /tmp/state); echo host=$(cat /proc/sys/kernel/hostname); "+
			"test -e /tmp/after && echo tmp-after; sync; echo 3 > /proc/sys/vm/drop_caches; echo disk=$(cat /mnt/data/state); "+
			"test -e /mnt/data/after && echo disk-after; dmesg")
		lines := strings.Split(out, "\n")
		want := []string{"tmp=" + state, "host=" + host}
		if after {
			want = append(want, "tmp-after")
		}
		want = append(want, "disk="+state)
		if after {
			want = append(want, "disk-after")
		}
		if len(lines) < len(want) || strings.Join(lines[:len(want)], "\n") != strings.Join(want, "\n") {
			t.Errorf("the guest reads\n%s\nwant\n%s", strings.Join(lines[:min(len(lines), len(want)+1)], "\n"), strings.Join(want, "\n"))
		}
		if log := strings.Join(lines[len(want):], "\n"); strings.Contains(log, "EXT4-fs error") || strings.Contains(log, "I/O error") {
			t.Errorf("the guest kernel logged disk errors:\n%s", log)
		}
	}
	bad := func() {
		t.Helper()
		run("exec", sock, "--", "sh", "-c", "echo bad > /tmp/state; echo x > /tmp/after; echo bad-step > /proc/sys/kernel/hostname; dd if=/dev/urandom of=/tmp/junk bs=65536 count=16; "+
			"echo bad > /mnt/data/state; echo x > /mnt/data/after; dd if=/dev/zero of=/mnt/data/junk bs=4096 count=16; sync")
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

	// The disk as the VM leaves it is a clean ext4 (its journal replayed,
	// as a mount would).
	run("exec", sock, "--", "sync")
	g.vm.Stop(nil)
	fsckClean(t, g.dev.disks[0].Dev.Backend())
}

// fsckClean flattens a disk's view (an overlay chain) into a raw image,
// replays its journal (a disk cut off while mounted has one to replay) and
// checks it with e2fsck: no error.
func fsckClean(t *testing.T, be interface {
	ReadAt([]byte, int64) (int, error)
	Size() int64
}) {
	t.Helper()
	e2fsck, err := exec.LookPath("e2fsck")
	if err != nil {
		t.Logf("no e2fsck here (%v): the disk is not checked", err)
		return
	}
	raw := filepath.Join(t.TempDir(), "disk.img")
	if err := disk.Flatten(be, raw); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(e2fsck, "-E", "journal_only", "-y", raw).CombinedOutput(); err != nil {
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() > 1 {
			t.Fatalf("e2fsck -E journal_only: %v\n%s", err, out)
		}
	}
	if out, err := exec.Command(e2fsck, "-f", "-n", raw).CombinedOutput(); err != nil {
		t.Errorf("the disk does not check clean: %v\n%s", err, out)
	} else {
		t.Logf("e2fsck: %s", strings.TrimSpace(string(out)))
	}
}
