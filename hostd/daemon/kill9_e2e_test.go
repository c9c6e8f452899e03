package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/internal/product"

	"github.com/warrenvm/warren/hostd/cgroup"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/vmmproc/jail"
)

// roleEnv makes the test binary play another program (see TestMain):
// "hostd" runs warren-hostd's Main on the remaining arguments (so a test
// can kill -9 a real daemon process), "sleep" sleeps (a stand-in VMM for
// the stray-process tests: its argv is whatever the test gives it), "get"
// makes one GET on a daemon's socket (TestPeerUIDTenants runs it as other
// uids).
const roleEnv = "WARREN_DAEMON_TEST_ROLE"

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "hostd":
		os.Exit(Main(os.Args[1:], os.Stderr))
	case "sleep":
		time.Sleep(2 * time.Minute)
		os.Exit(0)
	case "get": // get SOCKET PATH [TENANT]: a GET on a daemon's socket, as another uid
		os.Exit(peerGet(os.Args[1:]))
	case "warren": // a stand-in warren: jail-init, and a VMM that sleeps
		if len(os.Args) > 2 && os.Args[1] == jail.InitVerb { // jail-init [--report-fd N] [--pass-fds N] [--cgroup DIR]... -- ...
			fd, pass, i := -1, 0, 2
			var cgroups []string
			for ; i+1 < len(os.Args) && os.Args[i] != "--"; i += 2 {
				n, _ := strconv.Atoi(os.Args[i+1])
				switch os.Args[i] {
				case "--report-fd":
					fd = n
				case "--pass-fds":
					pass = n
				case "--cgroup":
					cgroups = append(cgroups, os.Args[i+1])
				}
			}
			if err := cgroup.JoinSelf(cgroups); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			var fds []int
			for k := range pass {
				fds = append(fds, FirstExtraFD+k)
			}
			os.Exit(jail.RunInit(os.Args[i+1:], fd, fds...))
		}
		// The descriptors it inherited above stderr, as "fd N: TARGET".
		for fd := 3; fd < FirstExtraFD+4; fd++ {
			if p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd)); err == nil {
				fmt.Printf("fd %d: %s\n", fd, p)
			}
		}
		time.Sleep(2 * time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// e2ePaths returns the binary the end-to-end tests' VMMs run and the
// names of the kernel and initramfs their templates boot (files of
// build/, the guest directory startDaemon gives a daemon with a real
// launcher); without /dev/kvm the test skips, without one of the files
// product.Missing ends it. The VMMs' binary is warren-vmm beside warren
// ($WARREN_BIN, else bin/warren), as warren-hostd finds it beside itself,
// else warren.
func e2ePaths(t *testing.T) (warren, kernel, initrd string) {
	t.Helper()
	kvmtest.Require(t)
	root := repoRoot(t)
	warren = os.Getenv("WARREN_BIN")
	if warren == "" {
		warren = filepath.Join(root, "bin", "warren")
	}
	if vmm := filepath.Join(filepath.Dir(warren), "warren-vmm"); func() bool { fi, err := os.Stat(vmm); return err == nil && fi.Mode().IsRegular() }() {
		warren = vmm
	}
	kernel, initrd = filepath.Join(root, "build", "vmlinux"), filepath.Join(root, "build", "initramfs.cpio")
	for _, p := range []string{warren, kernel, initrd} {
		if _, err := os.Stat(p); err != nil {
			product.Missing(t, err.Error(), "make warren kernel initramfs")
		}
	}
	return warren, filepath.Base(kernel), filepath.Base(initrd)
}

// e2eState makes an end-to-end test's state directory (removed when the
// test ends) and its step logger, which stamps each line with the time
// since the start.
func e2eState(t *testing.T, prefix string) (string, func(format string, a ...any)) {
	t.Helper()
	state, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	start := time.Now()
	return state, func(format string, a ...any) {
		t.Logf("[%5.1fs] %s", time.Since(start).Seconds(), fmt.Sprintf(format, a...))
	}
}

// startE2EDaemon starts an in-process daemon on state whose VMMs are the
// real warren, jailed with the vmm profile and confined to uids of the
// default --vmm-uid-range, with the timeouts of the nested KVM host; mod
// adjusts its Config further.
func startE2EDaemon(t *testing.T, state, warren string, mod func(*Config)) *testDaemon {
	t.Helper()
	launcher := &ExecLauncher{Warren: warren}
	var err error
	if launcher.Prepare, err = JailPrepare("vmm"); err != nil {
		t.Fatal(err)
	}
	uids, err := ParseUIDRange(DefaultUIDRange)
	if err != nil {
		t.Fatal(err)
	}
	return startDaemon(t, state, launcher, func(c *Config) {
		c.VMMUIDs = uids // confined as warren-hostd's default
		c.CgroupRoot = ""
		c.MonitorInterval = 500 * time.Millisecond
		c.BootTimeout, c.RestoreTimeout = 4*time.Minute, 2*time.Minute
		if mod != nil {
			mod(c)
		}
	})
}

// hostdProc is a warren-hostd process (this test binary in the "hostd"
// role) serving state on state/hostd.sock.
type hostdProc struct {
	cmd  *exec.Cmd
	sock string
	log  string
}

func startHostd(t *testing.T, state, warren string, n int, extra ...string) *hostdProc {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	h := &hostdProc{sock: filepath.Join(state, "hostd.sock"), log: filepath.Join(state, fmt.Sprintf("hostd-%d.log", n))}
	logf, err := os.Create(h.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	args := append([]string{"--state", state, "--socket", h.sock, "--warren", warren, "--guest-dir", filepath.Join(repoRoot(t), "build")}, extra...)
	h.cmd = exec.Command(self, args...)
	h.cmd.Env = append(os.Environ(), roleEnv+"=hostd")
	h.cmd.Stdout, h.cmd.Stderr = logf, logf
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, h.sock, "probe")
	deadline := time.Now().Add(time.Minute)
	for {
		if st, _, err := c.try("GET", "/v1/sandboxes", nil); err == nil && st == 200 {
			return h
		}
		if time.Now().After(deadline) || h.cmd.ProcessState != nil {
			b, _ := os.ReadFile(h.log)
			t.Fatalf("warren-hostd did not come up: %s", b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestE2EKill9 runs warren-hostd as its own process and drives real VMs:
// 32 concurrent creates from one template (none may fail), then kill -9 of
// the daemon while a 33rd create is under way. The VMMs must run on; a new
// daemon on the same state directory re-adopts every sandbox (same PIDs,
// exec works), settles the interrupted create (failed, its VMM stopped, or
// running) and leaves no VMM that no record owns. Deleting everything
// leaves no VMM process. WARREN_E2E_CREATES overrides the 32.
func TestE2EKill9(t *testing.T) {
	warren, kernel, initrd := e2ePaths(t)
	n := 32
	if v, err := strconv.Atoi(os.Getenv("WARREN_E2E_CREATES")); err == nil && v > 0 {
		n = v
	}
	state, step := e2eState(t, "hostd-kill9-")
	hd := startHostd(t, state, warren, 1)
	defer func() {
		// Leave no process behind, whatever happened.
		if hd.cmd.ProcessState == nil {
			hd.cmd.Process.Kill()
			hd.cmd.Wait()
		}
		for _, p := range strayVMMs(state, nil) {
			stopProc(p.PID, p.StartTime, time.Second)
		}
		if t.Failed() {
			for i := 1; i <= 2; i++ {
				if b, err := os.ReadFile(filepath.Join(state, fmt.Sprintf("hostd-%d.log", i))); err == nil {
					t.Logf("hostd-%d.log:\n%s", i, lastLines(string(b), 40))
				}
			}
		}
	}()
	c := newClient(t, hd.sock, "tenant-k")
	var tp store.Template
	c.ok(201, "POST", "/v1/templates", map[string]any{"kernel": kernel, "initramfs": initrd, "mem_mib": 256, "cpus": 1}, &tp)
	step("template %s ready in %.0f ms", tp.ID, tp.BuildMS)

	// n creates at once.
	sbs := make([]store.Sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, b, err := c.try("POST", "/v1/sandboxes", map[string]any{"template": tp.ID, "labels": map[string]string{"i": strconv.Itoa(i)}})
			switch {
			case err != nil:
				errs[i] = err
			case st != 201:
				errs[i] = fmt.Errorf("status %d: %s", st, b)
			default:
				errs[i] = json.Unmarshal(b, &sbs[i])
			}
		}()
	}
	wg.Wait()
	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			t.Errorf("create %d of %d: %v", i+1, n, err)
		} else if sbs[i].Status != store.Running || !alive(sbs[i].PID, sbs[i].StartTime) {
			failed++
			t.Errorf("create %d of %d: %+v", i+1, n, sbs[i])
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d concurrent creates failed", failed, n)
	}
	step("%d concurrent creates: all running", n)
	execAll(t, c, sbs, "before the kill")
	step("exec answered in all %d", n)

	// kill -9 while another create is under way: once its record exists,
	// and again a moment later, so the kill lands between the VMM's start
	// and its record's PID, or while the agent is awaited.
	go c.try("POST", "/v1/sandboxes", map[string]any{"template": tp.ID})
	st, _ := store.Open(state)
	kvmtest.WaitFor(t, time.Minute, "the 33rd create's record", func() bool {
		_, recs, _ := st.Load()
		return slices.ContainsFunc(recs, func(s *store.Sandbox) bool { return s.Status == store.Creating })
	})
	time.Sleep(time.Duration(200+time.Now().UnixNano()%800) * time.Millisecond)
	if err := hd.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	hd.cmd.Wait()
	step("warren-hostd (pid %d) killed with SIGKILL during a create", hd.cmd.Process.Pid)
	for _, sb := range sbs {
		if !alive(sb.PID, sb.StartTime) {
			t.Fatalf("sandbox %s: VMM (pid %d) died with the daemon", sb.ID, sb.PID)
		}
	}
	step("all %d VMMs run on without their daemon", n)

	hd = startHostd(t, state, warren, 2)
	c = newClient(t, hd.sock, "tenant-k")
	var list []store.Sandbox
	c.ok(200, "GET", "/v1/sandboxes", nil, &list)
	if len(list) != n+1 {
		t.Fatalf("after the restart the daemon lists %d sandboxes, want %d", len(list), n+1)
	}
	owned := map[int]bool{}
	for _, got := range list {
		i := slices.IndexFunc(sbs, func(s store.Sandbox) bool { return s.ID == got.ID })
		if i < 0 { // the interrupted create
			step("the interrupted create %s: %s %s", got.ID, got.Status, got.Reason)
			switch got.Status {
			case store.Failed:
				if got.PID != 0 {
					t.Fatalf("interrupted create keeps a PID: %+v", got)
				}
			case store.Running:
				owned[got.PID] = true
				sbs = append(sbs, got)
			default:
				t.Fatalf("interrupted create: %+v", got)
			}
			continue
		}
		if got.Status != store.Running || got.PID != sbs[i].PID {
			t.Fatalf("after the restart: %+v, was %+v", got, sbs[i])
		}
		owned[got.PID] = true
	}
	if stray := strayVMMs(state, owned); len(stray) > 0 {
		t.Fatalf("VMMs that no record owns after the restart: %+v", stray)
	}
	step("new daemon: %d sandboxes re-adopted with their PIDs, no stray VMM", len(owned))
	execAll(t, c, sbs, "after the restart")
	step("exec answered in all %d", len(sbs))

	for _, sb := range list {
		c.ok(200, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
	}
	c.ok(200, "DELETE", "/v1/templates/"+tp.ID, nil, nil)
	if stray := strayVMMs(state, nil); len(stray) > 0 {
		t.Fatalf("VMMs left after deleting everything: %+v", stray)
	}
	hd.cmd.Process.Signal(syscall.SIGTERM)
	hd.cmd.Wait()
	step("all deleted; no VMM left")
}

// execAll runs `echo ID` in every sandbox at once; each must answer.
func execAll(t *testing.T, c *client, sbs []store.Sandbox, when string) {
	t.Helper()
	errs := make([]error, len(sbs))
	var wg sync.WaitGroup
	for i, sb := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, _, code, err := c.tryExec(sb.ID, "sh", "-c", "echo "+sb.ID)
			if err == nil && (out != sb.ID+"\n" || code != 0) {
				err = fmt.Errorf("exec in %s: %q, exit %d", sb.ID, out, code)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Errorf("%s: %v", when, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// TestStrayVMMs: a process shaped like one of the daemon's VMMs (argv[1]
// run or restore with an argument under the state directory, a fork-child
// holding its log under it, a jail-init of its own pid namespace with no
// recorded VMM in it) that no record owns is found, and a new daemon stops
// it and removes the sandbox directories that hold no record; others are
// left alone.
func TestStrayVMMs(t *testing.T) {
	state := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	spawnWith := func(prep func(*exec.Cmd), argv ...string) *exec.Cmd {
		cmd := exec.Command(self)
		cmd.Args = append([]string{"warren"}, argv...)
		cmd.Env = append(os.Environ(), roleEnv+"=sleep")
		if prep != nil {
			prep(cmd)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	spawn := func(argv ...string) *exec.Cmd { return spawnWith(nil, argv...) }
	logTo := func(path string) func(*exec.Cmd) {
		return func(cmd *exec.Cmd) {
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			cmd.Stdout = f
		}
	}
	// A fork child of a VMM that no record owns: its command line names
	// nothing, its log is under the state directory.
	strayKid := spawnWith(logTo(filepath.Join(state, "run", "fk-x", "child-0.log")), "fork-child")
	otherKid := spawnWith(logTo(filepath.Join(t.TempDir(), "child-0.log")), "fork-child")
	stray := spawn("restore", "--lazy", "--api", filepath.Join(state, "run", "sb-x.api"), "snap")
	strayRun := spawn("run", "--kernel", "/k", "--console", filepath.Join(state, "tenants", "a", "templates", "tp-x", "console.log"))
	owned := spawn("restore", "--api", filepath.Join(state, "run", "sb-y.api"))
	other := spawn("restore", "--api", "/elsewhere/run/sb-z.api")
	notVMM := spawn("ls", filepath.Join(state, "run"))
	pids := func(ps []Proc) []int {
		var out []int
		for _, p := range ps {
			out = append(out, p.PID)
		}
		slices.Sort(out)
		return out
	}
	want := []int{stray.Process.Pid, strayRun.Process.Pid, strayKid.Process.Pid}
	strays := []*exec.Cmd{stray, strayRun, strayKid, owned}
	if os.Geteuid() == 0 {
		// A jailed family's init (pid 1 of its own namespace) whose VMM
		// is not recorded, or not started yet.
		strayInit := spawnWith(func(cmd *exec.Cmd) {
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
		}, jail.InitVerb, "--report-fd", "3", "--", "/bin/warren", "restore", "--api", filepath.Join(state, "run", "sb-w.api"))
		want = append(want, strayInit.Process.Pid)
		strays = append(strays, strayInit)
	} else {
		t.Log("not root: no jail-init in a pid namespace of its own")
	}
	slices.Sort(want)
	// Sandbox directories: one without a record (a fork child its daemon
	// never recorded) goes; one whose record is unreadable stays.
	recordless := filepath.Join(state, "tenants", "acme", "sandboxes", "sb-norecord")
	unreadable := filepath.Join(state, "tenants", "acme", "sandboxes", "sb-garbled")
	for _, dir := range []string{recordless, unreadable} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "disk0.overlay"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(unreadable, "sandbox.json"), []byte("{garbled"), 0o600); err != nil {
		t.Fatal(err)
	}
	kvmtest.WaitFor(t, 10*time.Second, "the processes' command lines", func() bool {
		return slices.Equal(pids(strayVMMs(state, map[int]bool{owned.Process.Pid: true})), want)
	})
	// A daemon starting on the state directory, whose records own none of
	// them, stops the three under it (SIGTERM ends the "sleep" role).
	startDaemon(t, state, newFakeLauncher(t))
	for _, c := range strays {
		if err := c.Wait(); err == nil {
			t.Fatalf("stray %v exited 0", c.Args)
		}
	}
	for _, c := range []*exec.Cmd{other, notVMM, otherKid} {
		if err := c.Process.Signal(syscall.Signal(0)); err != nil {
			t.Fatalf("%v was stopped: %v", c.Args, err)
		}
	}
	if _, err := os.Stat(recordless); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the sandbox directory without a record is still there (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(unreadable, "disk0.overlay")); err != nil {
		t.Errorf("the sandbox directory with an unreadable record lost its disk: %v", err)
	}
}
