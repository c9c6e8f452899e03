package vmmproc

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmm/testguest"
	"github.com/warrenvm/warren/vmmctl"
)

// TestUffdRestoreEndToEnd snapshots the counter guest (which prints a dot
// now and then and an X should its memory or registers go wrong) and
// restores it with `warren restore --lazy=uffd`, in processes of their
// own: the guest counts on; the fault server's counters (GET
// /v1/working-set) show faults served; the recorded working set is saved
// (POST /v1/working-set/save); a full snapshot of the restored VM (which
// completes its memory first) holds the snapshot's memory but for the
// pages the counter writes. A second restore prefetches the working set
// (prefetched pages > 0), under the jail a forking VMM has (so the fault server's
// ioctls pass the seccomp filter), counts on, and forks (its memory
// completed before the fork shares it): the child counts on from the
// parent's state, and so does the parent.
func TestUffdRestoreEndToEnd(t *testing.T) {
	kvmtest.Require(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir := t.TempDir()
	counter := filepath.Join(dir, "counter.elf")
	if err := os.WriteFile(counter, testguest.Build(t, "counter"), 0o644); err != nil {
		t.Fatal(err)
	}
	snaps := filepath.Join(dir, "snaps")
	os.Mkdir(snaps, 0o755)

	srcAPI, srcConsole := filepath.Join(dir, "src.api"), filepath.Join(dir, "src.console")
	src := startVMMProcess(t, ctx, "run", "--kernel", counter, "--mem", "32", "--api", srcAPI, "--console", srcConsole)
	waitConsoleDots(t, srcConsole, 3, src)
	snap := filepath.Join(snaps, "base")
	t.Logf("%s", mustRun(t, "snapshot", srcAPI, snap))
	src.stop()

	// One: recording the working set.
	ws := filepath.Join(dir, "base.wset")
	api1, con1 := filepath.Join(dir, "one.api"), filepath.Join(dir, "one.console")
	one := startVMMProcess(t, ctx, "restore", "-v", "--lazy=uffd", "--record-working-set", ws, "--api", api1, "--console", con1, snap)
	waitConsoleDots(t, con1, 3, one)
	c1 := vmmctl.Client{Socket: api1}
	r, err := c1.WorkingSet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r.Mode == string(vmsnap.Mmap) {
		t.Skipf("this host cannot serve memory by userfaultfd (the VMM fell back to mmap): %s", one.log())
	}
	if r.Mode != string(vmsnap.Uffd) || r.Stats == nil || r.Stats.Faults == 0 || r.Stats.PagesCopied == 0 || r.Stats.Errors != 0 || !r.Stats.Recording {
		t.Fatalf("working set answer %+v (stats %+v): want the uffd mode, faults served, recording", r, r.Stats)
	}
	saved, err := c1.SaveWorkingSet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("working set: %d pages in %d runs; stats %+v", saved.Pages, saved.Runs, *saved.Stats)
	if saved.Pages == 0 || saved.Path != ws || saved.Stats.Recording {
		t.Fatalf("save answered %+v", saved)
	}
	if _, err := os.Stat(ws); err != nil {
		t.Fatal(err)
	}
	full := filepath.Join(snaps, "full")
	t.Logf("%s", mustRun(t, "snapshot", api1, full))
	if r, err := c1.WorkingSet(ctx); err != nil || !r.Stats.Completed {
		t.Fatalf("after a full snapshot: %+v, %v: want the memory completed", r, err)
	}
	if differ := differingPages(t, snap, full); differ > 8 {
		t.Errorf("the full snapshot of the restored VM differs from the snapshot in %d pages, want the counter's few", differ)
	}
	waitConsoleDots(t, con1, strings.Count(readFile(con1), ".")+2, one)
	one.stop()

	// Two: prefetching it, jailed, then forked.
	api2, con2 := filepath.Join(dir, "two.api"), filepath.Join(dir, "two.console")
	two := startVMMProcess(t, ctx, "restore", "-v", "--jail", "vmm", "--lazy=uffd", "--prefetch", ws, "--api", api2, "--console", con2, snap)
	waitConsoleDots(t, con2, 3, two)
	c2 := vmmctl.Client{Socket: api2}
	var st vmmctl.WorkingSetReply
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		r, err := c2.WorkingSet(ctx)
		if err != nil {
			t.Fatal(err)
		}
		st = *r
		if st.Stats != nil && st.Stats.PrefetchedPages > 0 || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("prefetching restore: %+v", *st.Stats)
	if st.Stats == nil || st.Stats.PrefetchedPages == 0 || st.Stats.Errors != 0 {
		t.Fatalf("stats %+v: want prefetched pages, no errors", st.Stats)
	}
	kid := forkOne(t, api2, filepath.Join(dir, "kid"))
	if r, err := c2.WorkingSet(ctx); err != nil || !r.Stats.Completed {
		t.Fatalf("after a fork: %+v, %v: want the memory completed", r, err)
	}
	waitConsoleDots(t, kid.Console, 2, nil)
	waitConsoleDots(t, con2, strings.Count(readFile(con2), ".")+2, two)
	for _, f := range []string{con2, kid.Console} {
		if strings.Contains(readFile(f), "X") {
			t.Errorf("%s: the counter's memory or registers went wrong: %q", f, tail([]byte(readFile(f))))
		}
	}
}

// vmmProcess is a `warren run` or `warren restore` in a process of its
// own (cliProcess), killed when the test ends.
type vmmProcess struct {
	t        *testing.T
	cmd      *exec.Cmd
	out      testguest.SyncBuffer
	done     chan error
	stopOnce sync.Once
}

func startVMMProcess(t *testing.T, ctx context.Context, args ...string) *vmmProcess {
	t.Helper()
	p := &vmmProcess{t: t, cmd: cliProcess(ctx, args...), done: make(chan error, 1)}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("warren %s:\n%s", strings.Join(args, " "), p.log())
		}
	})
	return p
}

func (p *vmmProcess) log() string { return tail([]byte(p.out.String())) }

// stop kills the process and waits for it.
func (p *vmmProcess) stop() {
	p.stopOnce.Do(func() {
		p.cmd.Process.Kill()
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			p.t.Errorf("warren process %d did not exit", p.cmd.Process.Pid)
		}
	})
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// waitConsoleDots waits until the console file holds at least want dots
// and no X; p, when set, is the process whose early exit fails the test.
func waitConsoleDots(t *testing.T, console string, want int, p *vmmProcess) {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		s := readFile(console)
		if strings.Contains(s, "X") {
			t.Fatalf("%s: the counter's memory or registers went wrong: %q", console, tail([]byte(s)))
		}
		if strings.Count(s, ".") >= want {
			return
		}
		if p != nil {
			select {
			case err := <-p.done:
				p.done <- err
				t.Fatalf("the VMM exited (%v) before %d dots in %s: %s", err, want, console, p.log())
			default:
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d dots, want %d", console, strings.Count(s, "."), want)
		}
	}
}

// differingPages returns how many pages of memory the snapshots a and b
// hold differently.
func differingPages(t *testing.T, a, b string) int {
	t.Helper()
	mem := func(p string) []byte {
		s, err := vmsnap.Load(p, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		m := make([]byte, s.Chain.MemSize())
		if err := s.Chain.Restore(m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	ma, mb := mem(a), mem(b)
	n := 0
	for off := 0; off < len(ma); off += 4096 {
		if string(ma[off:off+4096]) != string(mb[off:off+4096]) {
			n++
		}
	}
	return n
}

// TestUffdRestoreLinux restores the Linux template (256 MiB, with vsock,
// entropy and a data disk) with `warren restore --lazy=uffd` in a process
// of its own: the guest's agent answers and runs commands that read and
// write memory the guest had not touched since the snapshot (its virtio
// devices fault pages in too, from the VMM's own goroutines); then a fork
// (its memory completed first) gives a child whose agent answers with the
// parent's files.
func TestUffdRestoreLinux(t *testing.T) {
	path := linuxTemplate(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	dir := t.TempDir()
	sock, api, con := filepath.Join(dir, "vm.sock"), filepath.Join(dir, "vm.api"), filepath.Join(dir, "vm.console")
	start := time.Now()
	p := startVMMProcess(t, ctx, "restore", "-v", "--lazy=uffd", "--vsock", sock, "--api", api, "--console", con, path)
	mustRun(t, "health", "--wait", "3m", sock)
	c := vmmctl.Client{Socket: api}
	r, err := c.WorkingSet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if r.Mode != string(vmsnap.Uffd) {
		t.Skipf("memory mode %q: this host cannot serve memory by userfaultfd: %s", r.Mode, p.log())
	}
	t.Logf("the agent answered %v after the process started; %+v", time.Since(start), *r.Stats)
	out := mustRun(t, "exec", sock, "--", "sh", "-c", "echo parent > /tmp/uffd; dd if=/dev/zero of=/tmp/fill bs=1M count=8 2>/dev/null; sync; ls -l /tmp/fill; cat /tmp/uffd")
	if !strings.Contains(out, "8388608") || !strings.HasSuffix(out, "parent\n") {
		t.Fatalf("the guest answered %q", out)
	}
	r, err = c.WorkingSet(ctx)
	if err != nil || r.Stats.Faults == 0 || r.Stats.Errors != 0 || r.Stats.Completed {
		t.Fatalf("stats %+v (%v): want faults served, no errors", r.Stats, err)
	}
	t.Logf("after the commands: %+v", *r.Stats)
	kid := forkOne(t, api, filepath.Join(dir, "kid"))
	if r, err := c.WorkingSet(ctx); err != nil || !r.Stats.Completed {
		t.Fatalf("after the fork: %+v, %v: want the memory completed", r.Stats, err)
	}
	mustRun(t, "health", "--wait", "3m", kid.Vsock)
	if out := mustRun(t, "exec", kid.Vsock, "--", "sh", "-c", "cat /tmp/uffd; ls -l /tmp/fill"); !strings.HasPrefix(out, "parent\n") || !strings.Contains(out, "8388608") {
		t.Fatalf("the child reads %q", out)
	}
	if out := mustRun(t, "exec", sock, "--", "cat", "/tmp/uffd"); out != "parent\n" {
		t.Fatalf("the parent reads %q after the fork", out)
	}
}

// forkOne forks the VM of api into one child (warren fork -n 1 --json, as a
// user does) and kills the child when the test ends, logging its log and
// console if the test failed.
func forkOne(t *testing.T, api, prefix string) vmmctl.ForkChild {
	t.Helper()
	var fr vmmctl.ForkReply
	out := mustRun(t, "fork", "-n", "1", "--prefix", prefix, "--json", api)
	if err := json.Unmarshal([]byte(out), &fr); err != nil || len(fr.Children) != 1 {
		t.Fatalf("warren fork --json: %v: %q", err, out)
	}
	kid := fr.Children[0]
	t.Cleanup(func() {
		syscall.Kill(kid.PID, syscall.SIGKILL)
		if t.Failed() {
			logb, _ := os.ReadFile(kid.Log)
			t.Logf("child log:\n%s\nconsole:\n%s", logb, tail([]byte(readFile(kid.Console))))
		}
	})
	return kid
}
