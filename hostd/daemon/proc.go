package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warrenvm/warren/vmmctl"
	"github.com/warrenvm/warren/vmmproc/jail"
)

// LaunchSpec is one VMM process to start: `warren ARGS...`, ARGS being
// Launch encoded (vmmctl.Launch.Args), under the launcher's jail when it
// has one (JailPrepare).
type LaunchSpec struct {
	// Tenant and ID name the sandbox (or template) it runs.
	Tenant, ID string
	// Kind is "template" (a build's `warren run`) or "sandbox" (`warren restore`).
	Kind string
	// Launch is what the VMM is asked to be: the template build's `run`
	// or the sandbox's `restore`, typed; the launcher encodes it.
	Launch vmmctl.Launch
	// Log receives the process's stdout and stderr.
	Log string
	// Network says the VMM has a network (a network template's build or
	// sandbox): it makes its own network namespace for its tap and needs
	// the host's for its upstream connections. Any other VMM is started
	// in a new, empty network namespace when jailed.
	Network bool
	// ExtraFiles are open files the VMM inherits: ExtraFiles[i] is its
	// descriptor FirstExtraFD+i, jailed or not (under jail-init too), and
	// Launch names them by number (vmmctl.Run.KernelFD): the daemon
	// opens a template's kernel and initramfs itself and the VMM never
	// opens them by path. The launcher does not close them.
	ExtraFiles []*os.File
	// Confine, when set, is the VMM's jail and uid after its setup
	// (JailPrepare passes it on; other launchers may ignore it).
	Confine *Confinement
	// Cgroup, when set, are the directories of the cgroup the VMM must be
	// born in (one per hierarchy): jailed, jail-init joins them before it
	// starts the VMM (`--cgroup`); otherwise on cgroup v2 the process is
	// cloned into it (clone3 with CLONE_INTO_CGROUP). On v1 without a jail
	// the daemon moves it there right after its start.
	Cgroup []string
}

// FirstExtraFD is the descriptor number of LaunchSpec.ExtraFiles[0] in the
// VMM. Descriptor 3 is jail-init's report socket under the jail (closed
// in the VMM) and left closed without it.
const FirstExtraFD = 4

// Proc is a started VMM process.
type Proc struct {
	PID int
	// StartTime is field 22 of /proc/PID/stat: with the PID it names the
	// process across PID reuse.
	StartTime uint64
	// Spawner says its jail-init starts its fork children (it was given
	// LaunchSpec.Confine.GrantKey: store.Sandbox.Spawner).
	Spawner bool
}

// Launcher starts VMM processes. The process must outlive the daemon (its
// own session, not killed with the daemon). Tests inject a fake.
type Launcher interface {
	Start(spec LaunchSpec) (Proc, error)
}

// ExecLauncher starts the warren binary.
type ExecLauncher struct {
	// Warren is the path of the warren binary.
	Warren string
	// Prepare, when set, is called with the command just before it starts:
	// the place where the VMM jail (vmmproc/jail: seccomp, namespaces,
	// credentials) wraps the process. It sets the command's namespaces
	// and environment and returns the jail-init that starts the VMM
	// (JailPrepare; Start fills in its descriptors and program), or nil
	// to start the VMM itself.
	Prepare func(cmd *exec.Cmd, spec LaunchSpec) (*vmmctl.JailInit, error)
}

// Start starts warren detached: its own session, stdin /dev/null, stdout
// and stderr appended to spec.Log. The daemon reaps it if it ends while
// the daemon runs; after a daemon restart the process is init's.
func (l *ExecLauncher) Start(spec LaunchSpec) (Proc, error) {
	logf, err := os.OpenFile(spec.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return Proc{}, err
	}
	defer logf.Close()
	cmd := exec.Command(l.Warren)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	var init *vmmctl.JailInit
	if l.Prepare != nil {
		if init, err = l.Prepare(cmd, spec); err != nil {
			return Proc{}, fmt.Errorf("prepare VMM: %w", err)
		}
	}
	args, err := spec.Launch.Args()
	if init != nil {
		// jail-init passes the files on to the VMM at the same numbers.
		init.ReportFD, init.PassFDs = 3, len(spec.ExtraFiles)
		if init.Program, err = filepath.Abs(cmd.Path); err == nil {
			args, err = init.Args()
		}
	}
	if err != nil {
		return Proc{}, err
	}
	cmd.Args = append(cmd.Args, args...)
	// Under a pid namespace's init (JailPrepare), the VMM is the init's
	// child, whose PID the init reports on fd 3.
	var report *os.File
	spawner := false
	if init != nil {
		var child *os.File
		if report, child, err = jail.InitReport(); err != nil {
			return Proc{}, err
		}
		defer report.Close()
		cmd.ExtraFiles = []*os.File{child}
		if c := spec.Confine; init.Spawn && c != nil && c.GrantKey != nil {
			if err := jail.SendGrantKey(report, c.GrantKey); err != nil {
				child.Close()
				return Proc{}, err
			}
			spawner = true
		}
	}
	if len(spec.ExtraFiles) > 0 {
		if report == nil {
			cmd.ExtraFiles = []*os.File{nil} // fd 3 stays closed
		}
		cmd.ExtraFiles = append(cmd.ExtraFiles, spec.ExtraFiles...)
	}
	if report == nil && len(spec.Cgroup) == 1 {
		// cgroup v2 (one hierarchy): born in the group.
		if _, err := os.Stat(filepath.Join(spec.Cgroup[0], "cgroup.controllers")); err == nil {
			dir, err := os.Open(spec.Cgroup[0])
			if err != nil {
				return Proc{}, fmt.Errorf("cgroup: %w", err)
			}
			defer dir.Close()
			cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(dir.Fd())
		}
	}
	err = cmd.Start()
	if report != nil {
		// Only the init holds the other end now: its end gives EOF.
		cmd.ExtraFiles[0].Close()
	}
	if err != nil {
		return Proc{}, err
	}
	go cmd.Wait()
	pid := cmd.Process.Pid
	if report != nil {
		// (32 inits starting at once in the nested KVM host took over 10 s)
		if pid, err = jail.ReceivePID(report, 2*time.Minute); err != nil {
			cmd.Process.Kill() // the init: its namespace goes with it
			return Proc{}, fmt.Errorf("VMM under %s (pid %d): %w", jail.InitVerb, cmd.Process.Pid, err)
		}
	}
	st, err := procStartTime(pid)
	if err != nil {
		return Proc{}, fmt.Errorf("VMM pid %d: %w", pid, err)
	}
	return Proc{PID: pid, StartTime: st, Spawner: spawner}, nil
}

// procStat returns the state letter and start time of pid from
// /proc/PID/stat.
func procStat(pid int) (state byte, start uint64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name (field 2) may hold spaces and parentheses: the
	// fields resume after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, errors.New("malformed /proc stat")
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state); field 22 (starttime) is f[19].
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, errors.New("malformed /proc stat")
	}
	start, err = strconv.ParseUint(string(f[19]), 10, 64)
	return f[0][0], start, err
}

func procStartTime(pid int) (uint64, error) {
	_, st, err := procStat(pid)
	return st, err
}

// alive reports whether pid runs and is the process that started at start
// (a zombie counts as dead).
func alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	state, st, err := procStat(pid)
	return err == nil && st == start && state != 'Z' && state != 'X'
}

// StopGrace is how long a VMM has to exit after SIGTERM (it closes its VM
// and exits at once on a real host) before the daemon sends SIGKILL. It is
// generous because SIGKILL is a last resort: in the emulated nested KVM
// host, VMMs SIGKILLed inside KVM_RUN were followed by host freezes.
const StopGrace = 15 * time.Second

// stopProc ends the process pid (if it is still the one that started at
// start): SIGTERM, then SIGKILL after grace.
func stopProc(pid int, start uint64, grace time.Duration) {
	if !alive(pid, start) {
		return
	}
	syscall.Kill(pid, syscall.SIGTERM)
	if waitDead(pid, start, grace) {
		return
	}
	syscall.Kill(pid, syscall.SIGKILL)
	waitDead(pid, start, 5*time.Second)
}

func waitDead(pid int, start uint64, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if !alive(pid, start) {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return !alive(pid, start)
}

// openVMMFile opens for reading a file a VMM wrote, in a directory its
// uid owns (a confined VMM could put a link, a FIFO or a device there):
// not through a link, without blocking on a FIFO, and a regular file
// only.
func openVMMFile(path string) (*os.File, os.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%s: not a regular file (%v)", path, fi.Mode().Type())
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

// tail returns the last n bytes of the file at path, trimmed ("" when
// it is not a regular file): a VMM's log or its guest's console
// (openVMMFile).
func tail(path string, n int64) string {
	if path == "" {
		return ""
	}
	f, fi, err := openVMMFile(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi.Size() > n {
		f.Seek(fi.Size()-n, 0)
	}
	b := make([]byte, n)
	k, _ := f.Read(b)
	return string(bytes.TrimSpace(b[:k]))
}

// strayVMMs returns the VMM processes of the daemon whose state directory
// is root that no record owns (every PID in owned is a recorded VMM):
//
//   - a `warren run` or `warren restore` (a template build's or a
//     sandbox's VMM) with an argument under root;
//   - a `warren fork-child` (a fork child, started by its parent VMM with
//     that command line alone) in the pid namespace of one of the
//     daemon's jailed VMM families, or holding a file under root open
//     (its log, for an unjailed parent);
//   - a `warren jail-init` with an argument under root whose pid
//     namespace holds no recorded VMM: a family whose every member is a
//     stray, or whose init had not started its VMM yet. Stopping the init
//     ends its whole namespace.
//
// A daemon killed between starting a VMM and recording its PID, or
// between a VMM's fork and the children's records, leaves such processes;
// nothing else should. The inits of families with a recorded member are
// not returned: each ends once its namespace is empty.
func strayVMMs(root string, owned map[int]bool) []Proc {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	prefix := filepath.Clean(root) + string(filepath.Separator)
	under := func(args []string) bool {
		return slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, prefix) })
	}
	var strays, forkKids []int
	nsOf := map[int]string{}
	inits := map[string]int{} // pid namespace -> its jail-init of ours
	ownedNS := map[string]bool{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		ns, _ := os.Readlink("/proc/" + e.Name() + "/ns/pid")
		if owned[pid] {
			ownedNS[ns] = true
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if len(argv) < 2 {
			continue
		}
		switch argv[1] {
		case "run", "restore":
			if under(argv[2:]) {
				strays = append(strays, pid)
			}
		case jail.InitVerb:
			if under(argv[2:]) && ns != "" {
				inits[ns] = pid
			}
		case "fork-child":
			nsOf[pid] = ns
			forkKids = append(forkKids, pid)
		}
	}
	for _, pid := range forkKids {
		if _, jailed := inits[nsOf[pid]]; (jailed && nsOf[pid] != "") || holdsFileUnder(pid, prefix) {
			strays = append(strays, pid)
		}
	}
	for ns, pid := range inits {
		if !ownedNS[ns] {
			strays = append(strays, pid)
		}
	}
	slices.Sort(strays)
	var out []Proc
	for _, pid := range strays {
		if st, err := procStartTime(pid); err == nil {
			out = append(out, Proc{PID: pid, StartTime: st})
		}
	}
	return out
}

// holdsFileUnder reports whether process pid has a file whose path
// starts with prefix open (one of its first 64 descriptors: a VMM's log
// is its stdout).
func holdsFileUnder(pid int, prefix string) bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for i, e := range ents {
		if i == 64 {
			break
		}
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.HasPrefix(l, prefix) {
			return true
		}
	}
	return false
}
