//go:build linux && amd64

package jail

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/warrenvm/warren/vmmctl"
	"golang.org/x/sys/unix"
)

// InitVerb is the warren sub-command that runs RunInit: the daemon starts
// a jailed VMM as `warren jail-init -- warren restore ...` in a new pid
// namespace (NSOptions without NoPidNS).
const InitVerb = vmmctl.JailInitVerb

// ParentMountNSEnv names, in RunInit's environment, the mount namespace
// of the process that started it (its /proc/self/ns/mnt link, as
// ParentMountNS gives it): RunInit refuses to run in that one.
const ParentMountNSEnv = "WARREN_JAIL_PARENT_MNTNS"

// ParentMountNS is the environment entry for RunInit's ParentMountNSEnv:
// the caller's mount namespace.
func ParentMountNS() (string, error) {
	ns, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return "", err
	}
	return ParentMountNSEnv + "=" + ns, nil
}

// InitEnv is set to "1" in the environment of the command RunInit
// starts: its parent is RunInit, which checked that it is in a mount
// namespace of its own (not the host's) and made every mount there
// private. The VMM, in that same namespace, may then pivot_root
// (Config.Root); without it, a VMM whose parent shares its mount
// namespace must not (the namespace could be the host's).
const InitEnv = "WARREN_JAIL_INIT"

// RunInit is pid 1 of a VMM's own pid namespace. A VMM cannot be that pid
// 1 itself: when a namespace's init ends, the kernel kills everything else
// in it, and a VMM's fork children must outlive it. So RunInit, in the
// new pid and mount namespaces, makes the mounts private and mounts a
// /proc of the namespace (PrepareMounts: the VMM and its children then see
// their own PIDs there, and no process outside), starts argv (the VMM) as
// its child, reaps every process of the namespace that ends (the VMM's
// fork children become its children when the VMM ends), and returns
// once none is left, with the VMM's exit status. SIGTERM and SIGINT are
// passed on to the VMM while it runs.
//
// The daemon supervises the VMM, not RunInit: it finds the VMM's PID in
// its own namespace as the child of RunInit's process, and the PIDs the
// VMM reports for its fork children (its namespace's) through NSpid
// (HostPID). Nothing signals RunInit's process: killing it would kill the
// whole family.
//
// reportFD, when not negative, is a unix socket on which RunInit sends,
// once the VMM is started, one message whose SCM_CREDENTIALS carry the
// VMM's PID: the kernel translates it into the receiver's pid namespace,
// so the daemon learns the VMM's PID in its own (ReceivePID), whatever
// /proc it has mounted.
//
// passFDs are descriptors RunInit inherited for the VMM (the daemon's
// files for it: a template's kernel and initramfs): the VMM inherits each
// at the same number, and RunInit closes its own copies once it started.
func RunInit(argv []string, reportFD int, passFDs ...int) int {
	return RunInitWith(argv, InitOptions{ReportFD: reportFD, PassFDs: passFDs})
}

// InitOptions are RunInitWith's: RunInit's reportFD and passFDs, and the
// family's privileged helper.
type InitOptions struct {
	ReportFD int
	PassFDs  []int
	// Helper, when set, is served (ServeHelper) on a socket whose other end
	// the VMM inherits at the descriptor $HelperEnv names, for as long as
	// a process of the family holds it.
	Helper HelperFunc
	// Spawner, when set, is the one Helper starts fork children with
	// (the VMM is told so: SpawnEnv).
	Spawner *Spawner
}

// RunInitWith is RunInit with a helper (InitOptions.Helper).
func RunInitWith(argv []string, o InitOptions) int {
	reportFD, passFDs := o.ReportFD, o.PassFDs
	if len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "jail-init: no command")
		return 2
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "jail-init: not pid 1 of a new pid namespace")
		return 2
	}
	// Making mounts private in the starter's namespace (maybe the
	// host's) would change its mounts: RunInit must be in another.
	self, err := os.Readlink("/proc/self/ns/mnt")
	if parent := os.Getenv(ParentMountNSEnv); err != nil || parent == "" || self == parent {
		fmt.Fprintf(os.Stderr, "jail-init: not in a mount namespace of its own (%s; its starter's %q, from $%s; %v)\n", self, parent, ParentMountNSEnv, err)
		return 2
	}
	if err := PrepareMounts(MountOptions{Proc: true}); err != nil {
		fmt.Fprintln(os.Stderr, "jail-init:", err)
		return 1
	}
	// RunInit keeps root, its capabilities and the namespace's whole
	// tree (a VMM that could not pivot_root, on an initramfs, only
	// chroots): non-dumpable, its /proc entries (root, cwd, fds) are
	// closed to the VMMs of its namespace, whatever their uid.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "jail-init: not dumpable:", err)
		return 1
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	files := []*os.File{os.Stdin, os.Stdout, os.Stderr}
	for _, fd := range passFDs {
		if fd < 3 || fd == reportFD || fd > 1<<16 {
			fmt.Fprintf(os.Stderr, "jail-init: cannot pass descriptor %d\n", fd)
			return 2
		}
		for len(files) <= fd {
			files = append(files, nil) // closed in the VMM
		}
		files[fd] = os.NewFile(uintptr(fd), "passed-"+strconv.Itoa(fd))
	}
	env := append(initChildEnv(), InitEnv+"=1")
	if o.Spawner != nil {
		env = append(env, SpawnEnv+"=1")
	}
	var helper *os.File
	if o.Helper != nil {
		h, theirs, err := helperPair()
		if err != nil {
			fmt.Fprintln(os.Stderr, "jail-init:", err)
			return 1
		}
		helper = h
		env = append(env, HelperEnv+"="+strconv.Itoa(len(files)))
		files = append(files, theirs)
	}
	p, err := os.StartProcess(argv[0], argv, &os.ProcAttr{Files: files, Env: env})
	for _, f := range files[3:] {
		if f != nil {
			f.Close()
		}
	}
	if helper != nil {
		if err == nil {
			go ServeHelper(helper, o.Helper)
		} else {
			helper.Close()
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "jail-init:", err)
		return 1
	}
	if reportFD >= 0 {
		cred := unix.Ucred{Pid: int32(p.Pid), Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())}
		err := unix.Sendmsg(reportFD, []byte("vmm"), unix.UnixCredentials(&cred), nil, 0)
		unix.Close(reportFD)
		if err != nil {
			fmt.Fprintln(os.Stderr, "jail-init: report the VMM's pid:", err)
		}
	}
	var vmm atomic.Int64 // its pid while it runs, else 0
	vmm.Store(int64(p.Pid))
	go func() {
		for s := range sigs {
			if pid := int(vmm.Load()); pid != 0 {
				unix.Kill(pid, s.(syscall.Signal))
			}
		}
	}()
	code := 0
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil { // ECHILD: the namespace is empty
			return code
		}
		if pid == p.Pid {
			vmm.Store(0)
			switch {
			case ws.Exited():
				code = ws.ExitStatus()
			case ws.Signaled():
				code = 128 + int(ws.Signal())
			}
		}
	}
}

// initChildEnv is RunInit's environment less its own entries, for the
// processes it starts.
func initChildEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case ParentMountNSEnv, InitEnv, HelperEnv, SpawnEnv:
		default:
			env = append(env, kv)
		}
	}
	return env
}

// HostPID returns the PID, in the caller's pid namespace, of the process
// whose PID is nsPID in member's pid namespace (member is a PID of the
// caller's): the same number when member is in the caller's namespace,
// else the process of member's namespace whose NSpid ends with nsPID.
func HostPID(member, nsPID int) (int, error) {
	want, err := os.Readlink("/proc/" + strconv.Itoa(member) + "/ns/pid")
	if err != nil {
		return 0, err
	}
	if self, err := os.Readlink("/proc/self/ns/pid"); err == nil && self == want {
		return nsPID, nil
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ns, err := os.Readlink("/proc/" + e.Name() + "/ns/pid"); err != nil || ns != want {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(l, "NSpid:"); ok {
				f := strings.Fields(v)
				if len(f) > 0 && f[len(f)-1] == strconv.Itoa(nsPID) {
					return pid, nil
				}
				break
			}
		}
	}
	return 0, fmt.Errorf("jail: no process %d in the pid namespace of process %d", nsPID, member)
}

// InitReport makes the socket pair of RunInit's report: give child to the
// init (it is the init's reportFD: `jail-init --report-fd 3` with child as
// the command's first ExtraFiles), keep parent for ReceivePID. Both are
// non-blocking.
func InitReport() (parent, child *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := unix.SetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_PASSCRED, 1); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, nil, err
	}
	return os.NewFile(uintptr(fds[0]), "init-report"), os.NewFile(uintptr(fds[1]), "init-report-child"), nil
}

// SendGrantKey sends a family's grant key (FamilyKey) on parent, the
// daemon's end of InitReport, before the init starts: RunInit's caller
// (`jail-init --spawn`) reads it first (ReceiveGrantKey), so that the key
// reaches the family's root process only, never an argument, the
// environment or a file.
func SendGrantKey(parent *os.File, key []byte) error {
	if len(key) < 16 || len(key) > 64 {
		return fmt.Errorf("jail: a grant key of %d bytes", len(key))
	}
	if err := unix.Sendmsg(int(parent.Fd()), key, nil, nil, unix.MSG_DONTWAIT); err != nil {
		return fmt.Errorf("jail: send the grant key: %w", err)
	}
	return nil
}

// ReceiveGrantKey waits up to limit for the key SendGrantKey sent on fd
// (the init's report socket).
func ReceiveGrantKey(fd int, limit time.Duration) ([]byte, error) {
	if fd < 0 {
		return nil, errors.New("jail: no report socket to read the grant key from")
	}
	buf := make([]byte, 65)
	for deadline := time.Now().Add(limit); ; {
		n, _, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT)
		switch {
		case err == nil && (n < 16 || n > 64):
			return nil, fmt.Errorf("jail: a grant key of %d bytes", n)
		case err == nil:
			return buf[:n], nil
		case !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR):
			return nil, fmt.Errorf("jail: receive the grant key: %w", err)
		case time.Now().After(deadline):
			return nil, fmt.Errorf("jail: no grant key within %v", limit)
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		unix.Poll(pfd, int(time.Until(deadline).Milliseconds())+1)
	}
}

// ReceivePID waits up to limit for RunInit's report on parent (from
// InitReport) and returns the VMM's PID in the caller's pid namespace.
func ReceivePID(parent *os.File, limit time.Duration) (int, error) {
	if err := parent.SetReadDeadline(time.Now().Add(limit)); err != nil {
		return 0, err
	}
	rc, err := parent.SyscallConn()
	if err != nil {
		return 0, err
	}
	buf, oob := make([]byte, 16), make([]byte, unix.CmsgSpace(unix.SizeofUcred))
	var n, oobn int
	var rerr error
	err = rc.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf, oob, 0)
		return !errors.Is(rerr, unix.EAGAIN)
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return 0, fmt.Errorf("jail-init's report: %w", err)
	}
	if n == 0 {
		return 0, errors.New("jail-init ended without reporting its VMM")
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) == 0 {
		return 0, fmt.Errorf("jail-init's report has no credentials (%v)", err)
	}
	cred, err := unix.ParseUnixCredentials(&msgs[0])
	if err != nil {
		return 0, fmt.Errorf("jail-init's report: %w", err)
	}
	return int(cred.Pid), nil
}
