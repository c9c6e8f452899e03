package vmmproc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSnapshotEndToEnd restores the Linux template with vsock and the
// control API, writes a file in /tmp and one on the ext4 data disk
// (/mnt/data) through the agent, takes a full snapshot, writes second
// files, takes an incremental one, and restores each in a new process
// (`warren restore`, eager and lazy, with its own vsock socket; the first
// one twice): the agent answers, and exactly the files written before the
// snapshot are there, in memory and on the disk (read back with the page
// cache dropped), each restore on its own overlay over the snapshot's
// disk layer.
func TestSnapshotEndToEnd(t *testing.T) {
	g, dir, sock, api := templateWithAPI(t)
	run := func(args ...string) string { t.Helper(); return mustRun(t, args...) }
	run("exec", sock, "--", "sh", "-c", "echo first > /tmp/first; echo first > /mnt/data/first; sync")
	snaps := filepath.Join(dir, "snaps")
	os.Mkdir(snaps, 0o755)
	t.Logf("%s", run("snapshot", api, filepath.Join(snaps, "one")))
	run("exec", sock, "--", "sh", "-c", "echo second > /tmp/second; echo second > /mnt/data/second; sync")
	t.Logf("%s", run("snapshot", "--incremental", api, filepath.Join(snaps, "two")))
	if out := run("pause", api); out != "paused=true\n" {
		t.Errorf("warren pause: %q", out)
	}
	if out := run("resume", api); out != "paused=false\n" {
		t.Errorf("warren resume: %q", out)
	}
	t.Logf("%s", run("compact", filepath.Join(snaps, "two"), filepath.Join(snaps, "two-flat")))
	// A running guest's snapshot: its vCPU and its vsock and disk queues.
	desc := run("describe", filepath.Join(snaps, "two"))
	for _, want := range []string{"vcpu 0: rip ", "lapic: ", "ioapic: ", "device vsock: status 0xf", "queue 0: device next avail "} {
		if !strings.Contains(desc, want) {
			t.Errorf("warren describe lacks %q:\n%s", want, desc)
		}
	}
	// Rolling snapshots: full, incremental, and full again at --max-chain 2.
	roll := run("snapshot", "--every", "200ms", "--max-chain", "2", "--count", "3", api, filepath.Join(snaps, "roll"))
	t.Logf("%s", roll)
	if lines := strings.Split(strings.TrimSpace(roll), "\n"); len(lines) != 3 || !strings.HasPrefix(lines[0], "full ") ||
		!strings.HasPrefix(lines[1], "incremental ") || !strings.HasPrefix(lines[2], "full ") || !strings.Contains(lines[1], "roll-0002") {
		t.Errorf("rolling snapshots: %q", roll)
	}
	g.vm.Stop(nil) // the restored copies run alone
	restores := 0

	for _, c := range []struct {
		name    string
		lazy    bool
		present []string // files in /tmp
		absent  []string
		// then runs against the restored VM's vsock and API sockets.
		then func(t *testing.T, sock, api string)
	}{
		{name: "one", present: []string{"first"}, absent: []string{"second"}, then: func(t *testing.T, sock, api string) {
			// Written on this restore's own overlay: the next restore of
			// the same snapshot does not see it.
			run("exec", sock, "--", "sh", "-c", "echo second > /mnt/data/second; sync")
		}},
		{name: "one", present: []string{"first"}, absent: []string{"second"}},
		{name: "two", lazy: true, present: []string{"first", "second"}, then: func(t *testing.T, sock, api string) {
			// An incremental snapshot of a restored VM is relative to the
			// snapshot it was restored from.
			run("exec", sock, "--", "sh", "-c", "echo third > /tmp/third; echo third > /mnt/data/third; sync")
			t.Logf("%s", run("snapshot", "--incremental", api, filepath.Join(snaps, "three")))
		}},
		{name: "two-flat", present: []string{"first", "second"}, absent: []string{"third"}},
		{name: "three", present: []string{"first", "second", "third"}},
		{name: "roll-0002", present: []string{"first", "second"}, absent: []string{"third"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			restores++
			sock2, api2 := filepath.Join(dir, fmt.Sprintf("%s-%d.sock", c.name, restores)), filepath.Join(dir, fmt.Sprintf("%s-%d.api", c.name, restores))
			console := filepath.Join(dir, fmt.Sprintf("%s-%d.console", c.name, restores))
			args := []string{"restore", "--vsock", sock2, "--api", api2, "--console", console}
			if c.lazy {
				args = append(args, "--lazy")
			}
			args = append(args, filepath.Join(snaps, c.name))
			cmd := exec.Command(os.Args[0], "-test.run=^TestRestoreProcess$", "-test.count=1", "-test.v")
			enc, _ := json.Marshal(args)
			cmd.Env = append(os.Environ(), "WARREN_RESTORE_ARGS="+string(enc))
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			start := time.Now()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				cmd.Process.Kill()
				cmd.Wait()
				if t.Failed() {
					con, _ := os.ReadFile(console)
					t.Logf("restore process:\n%s\nconsole:\n%s", out.String(), tail(con))
				}
			}()
			run("health", "--wait", "3m", sock2)
			t.Logf("restored %s (lazy %v): the agent answered %v after the process started", c.name, c.lazy, time.Since(start))
			// One guest command (each costs seconds of emulated kernel
			// time here): the files in /tmp, then on the disk with the page
			// cache dropped (so they come from the disk itself), then the
			// kernel log.
			var script, want strings.Builder
			script.WriteString("sync; echo 3 > /proc/sys/vm/drop_caches; ")
			for _, d := range []string{"/tmp/", "/mnt/data/"} {
				for _, f := range c.present {
					fmt.Fprintf(&script, "echo %s%s=$(cat %s%s); ", d, f, d, f)
					fmt.Fprintf(&want, "%s%s=%s\n", d, f, f)
				}
				for _, f := range c.absent {
					fmt.Fprintf(&script, "test -e %s%s && echo %s%s is there; ", d, f, d, f)
				}
			}
			script.WriteString("dmesg")
			got := run("exec", sock2, "--", "sh", "-c", script.String())
			if !strings.HasPrefix(got, want.String()) {
				t.Errorf("the restored guest reads\n%s\nwant\n%s(and none of %q)", got[:min(len(got), len(want.String())+200)], want.String(), c.absent)
			}
			for _, d := range []string{"/tmp/", "/mnt/data/"} {
				for _, f := range c.absent {
					if strings.Contains(got, d+f+" is there") {
						t.Errorf("%s%s is there in a snapshot taken before it was written", d, f)
					}
				}
			}
			if strings.Contains(got, "EXT4-fs error") {
				t.Errorf("the restored guest's kernel logged file system errors:\n%s", got)
			}
			if c.then != nil {
				c.then(t, sock2, api2)
			}
		})
	}
}

// TestRestoreProcess runs `warren restore` with the arguments in
// $WARREN_RESTORE_ARGS (a JSON array): the new process of
// TestSnapshotEndToEnd. It skips unless run by it.
func TestRestoreProcess(t *testing.T) {
	args := os.Getenv("WARREN_RESTORE_ARGS")
	if args == "" {
		t.Skip("run by TestSnapshotEndToEnd")
	}
	var argv []string
	if err := json.Unmarshal([]byte(args), &argv); err != nil {
		t.Fatal(err)
	}
	code := cliMain(argv, nil, os.Stdout, os.Stderr)
	t.Fatalf("warren restore exited %d", code)
}
