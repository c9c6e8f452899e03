//go:build linux && amd64

package jail

import (
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/memsnap/uffd"
	"github.com/warrenvm/warren/vmm/kvm"
)

// sc is one table entry: a rule and the profiles that have it.
type sc struct {
	profiles Profile
	rule     Rule
}

func allow(p Profile, name string, nr uintptr, conds ...Cond) sc {
	return sc{p, Rule{Name: name, Nr: uint32(nr), Conds: conds}}
}

func in(arg int, names []string, vals []uint32) Cond {
	return Cond{Arg: arg, Op: OpIn, Values: vals, Names: names}
}

// Flags not in every x/sys version, and the bpf(2) commands.
const (
	cloneNamespaces = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
		unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET
	// cloneThreadFlags are what the Go runtime's newosproc passes.
	cloneThreadFlags = unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES |
		unix.CLONE_SIGHAND | unix.CLONE_THREAD
)

// syscallTable is THE allowlist. Order matters only for speed: the program
// tests rules in this order, so the hottest syscalls of a running VMM
// (ioctl for KVM_RUN and friends, futex, the netpoller, read/write of
// devices) come first. pid is the process's own pid, for the signal rules
// of ProfileStrict.
func syscallTable(p Profile, opts Options, pid int) []sc {
	self := []uint32{uint32(pid)}
	selfName := []string{"self"}

	// socket(2) domains. AF_UNIX: the control API, vsock device backends
	// (devices/virtio/vsock dials and listens on unix sockets), fork
	// hand-offs. AF_INET/AF_INET6: the egress resolver and credential
	// proxy (vmmproc/egress) live in the VMM process. AF_NETLINK: only the
	// fork child (tap in a new netns, egress attach) and the egress clsact
	// teardown; not ProfileStrict. AF_VSOCK: the VMM never opens host vsock
	// sockets (its vsock device is built on unix sockets), so refused.
	domNames := []string{"AF_UNIX", "AF_INET", "AF_INET6"}
	doms := []uint32{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6}
	if p == ProfileVMM {
		domNames = append(domNames, "AF_NETLINK")
		doms = append(doms, unix.AF_NETLINK)
	}

	// ioctl(2) requests, see ioctlTable.
	var ioNames []string
	var ioVals []uint32
	for _, c := range ioctlTable() {
		if c.profiles&p != 0 {
			ioNames = append(ioNames, c.name)
			ioVals = append(ioVals, c.req)
		}
	}

	// prctl(2) options. The Go runtime uses none after start; these are
	// for Enter itself (a second Install stacks a filter) and, in
	// ProfileVMM, for os/exec's child (PR_SET_PDEATHSIG) and a fork child
	// hardening itself (capability drops).
	// PR_SET_VMA: the Go runtime (1.25+) names its anonymous mappings
	// (GODEBUG=decoratemappings=1, the default) and ignores EPERM, but
	// ModeKill would not forgive it.
	prNames := []string{"PR_SET_VMA", "PR_GET_NAME", "PR_SET_NAME", "PR_GET_DUMPABLE", "PR_CAPBSET_READ",
		"PR_GET_NO_NEW_PRIVS", "PR_SET_NO_NEW_PRIVS", "PR_GET_SECCOMP"}
	prVals := []uint32{unix.PR_SET_VMA, unix.PR_GET_NAME, unix.PR_SET_NAME, unix.PR_GET_DUMPABLE, unix.PR_CAPBSET_READ,
		unix.PR_GET_NO_NEW_PRIVS, unix.PR_SET_NO_NEW_PRIVS, unix.PR_GET_SECCOMP}
	if p == ProfileVMM && !opts.Spawned {
		prNames = append(prNames, "PR_SET_PDEATHSIG", "PR_GET_PDEATHSIG", "PR_CAPBSET_DROP", "PR_CAP_AMBIENT")
		prVals = append(prVals, unix.PR_SET_PDEATHSIG, unix.PR_GET_PDEATHSIG, unix.PR_CAPBSET_DROP, unix.PR_CAP_AMBIENT)
	}

	// clone(2): ProfileStrict allows threads only (the Go runtime's
	// newosproc: CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_THREAD|
	// CLONE_SYSVSEM...), so no new process can be made. ProfileVMM also
	// allows processes (os/exec: CLONE_VFORK|CLONE_VM|SIGCHLD, maybe
	// CLONE_PIDFD and CLONE_NEWNET for `fork --netns`) but never
	// CLONE_NEWUSER, the door to most namespace attack surface; with
	// Options.Spawned it allows threads only, as ProfileStrict.
	var clone sc
	if p == ProfileVMM && !opts.Spawned {
		clone = allow(ProfileVMM, "clone", unix.SYS_CLONE,
			Cond{Arg: 0, Op: OpMaskEq, Mask: unix.CLONE_NEWUSER, Values: []uint32{0}})
	} else {
		clone = allow(p, "clone", unix.SYS_CLONE,
			Cond{Arg: 0, Op: OpMaskEq, Mask: cloneThreadFlags | cloneNamespaces, Values: []uint32{cloneThreadFlags}})
	}

	// mmap/mprotect: W^X, never writable and executable at once. Nothing
	// in a pure-Go VMM maps executable memory (guest memory is RW; KVM
	// executes it without host PROT_EXEC); ld.so of an exec'd dynamic
	// binary maps code R-X, which passes.
	wx := Cond{Arg: 2, Op: OpMaskNe, Mask: unix.PROT_WRITE | unix.PROT_EXEC, Values: []uint32{unix.PROT_WRITE | unix.PROT_EXEC}}

	t := []sc{
		// --- hot path of a running VMM ---
		allow(both, "ioctl", unix.SYS_IOCTL, in(1, ioNames, ioVals)),                 // vCPU threads: KVM_RUN; devices: irqfd
		allow(both, "futex", unix.SYS_FUTEX),                                         // Go runtime: locks, sleeping Ms
		allow(both, "read", unix.SYS_READ),                                           // everyone
		allow(both, "write", unix.SYS_WRITE),                                         // everyone
		allow(both, "epoll_pwait", unix.SYS_EPOLL_PWAIT),                             // Go netpoller
		allow(both, "epoll_wait", unix.SYS_EPOLL_WAIT),                               // Go netpoller (older runtimes)
		allow(both, "epoll_pwait2", unix.SYS_EPOLL_PWAIT2),                           // x/sys users
		allow(both, "nanosleep", unix.SYS_NANOSLEEP),                                 // Go runtime: usleep
		allow(both, "clock_nanosleep", unix.SYS_CLOCK_NANOSLEEP),                     // time.Sleep fallbacks
		allow(both, "sched_yield", unix.SYS_SCHED_YIELD),                             // Go runtime: osyield
		allow(both, "clock_gettime", unix.SYS_CLOCK_GETTIME),                         // Go runtime when the vDSO is absent
		allow(both, "gettimeofday", unix.SYS_GETTIMEOFDAY),                           // same
		allow(both, "pread64", unix.SYS_PREAD64),                                     // virtio-blk, snapshots
		allow(both, "pwrite64", unix.SYS_PWRITE64),                                   // virtio-blk, snapshots
		allow(both, "preadv", unix.SYS_PREADV),                                       // virtio-blk scatter/gather
		allow(both, "pwritev", unix.SYS_PWRITEV),                                     // virtio-blk scatter/gather
		allow(both, "preadv2", unix.SYS_PREADV2),                                     // x/sys Preadv may use it
		allow(both, "pwritev2", unix.SYS_PWRITEV2),                                   // x/sys Pwritev may use it
		allow(both, "readv", unix.SYS_READV),                                         // virtio-net tap reads
		allow(both, "writev", unix.SYS_WRITEV),                                       // virtio-net tap writes
		allow(both, "tgkill", unix.SYS_TGKILL, selfOnly(p, opts, self, selfName)...), // Go preemption (SIGURG), vCPU kicks (vmm/vm.go)

		// --- Go runtime: memory, threads, signals ---
		allow(both, "mmap", unix.SYS_MMAP, wx),         // heap, guest memory, memfd maps
		allow(both, "mprotect", unix.SYS_MPROTECT, wx), // ld.so of an exec'd child; guard pages
		allow(both, "munmap", unix.SYS_MUNMAP),         // heap scavenger, guest memory
		allow(both, "madvise", unix.SYS_MADVISE),       // heap scavenger, guest memory (MADV_DONTNEED)
		allow(both, "mremap", unix.SYS_MREMAP),         // growing mappings
		allow(both, "membarrier", unix.SYS_MEMBARRIER), // harmless; some runtimes use it
		clone, // threads (see above)
		{both, Rule{Name: "clone3", Nr: unix.SYS_CLONE3, Errno: unix.ENOSYS}}, // flags hidden in memory: ENOSYS -> callers use clone
		allow(both, "exit", unix.SYS_EXIT),                                    // thread exit
		allow(both, "exit_group", unix.SYS_EXIT_GROUP),                        // process exit
		allow(both, "rt_sigaction", unix.SYS_RT_SIGACTION),                    // os/signal, runtime
		allow(both, "rt_sigprocmask", unix.SYS_RT_SIGPROCMASK),
		allow(both, "rt_sigreturn", unix.SYS_RT_SIGRETURN),
		allow(both, "sigaltstack", unix.SYS_SIGALTSTACK),                         // every new M
		allow(both, "kill", unix.SYS_KILL, selfOnly(p, opts, self, selfName)...), // runtime raiseproc; ProfileVMM: signalling children
		allow(both, "pidfd_send_signal", unix.SYS_PIDFD_SEND_SIGNAL),             // a failed fork's children, by the pidfds the helper gave
		allow(both, "gettid", unix.SYS_GETTID),
		allow(both, "getpid", unix.SYS_GETPID),
		allow(both, "getppid", unix.SYS_GETPPID),
		allow(both, "getuid", unix.SYS_GETUID),
		allow(both, "geteuid", unix.SYS_GETEUID),
		allow(both, "getgid", unix.SYS_GETGID),
		allow(both, "getegid", unix.SYS_GETEGID),
		allow(both, "sched_getaffinity", unix.SYS_SCHED_GETAFFINITY), // runtime start, GOMAXPROCS updates
		allow(both, "sched_setaffinity", unix.SYS_SCHED_SETAFFINITY), // vCPU thread pinning
		allow(both, "getrandom", unix.SYS_GETRANDOM),                 // crypto/rand, map seeds
		allow(both, "uname", unix.SYS_UNAME),                         // internal/syscall/unix.KernelVersion
		allow(both, "restart_syscall", unix.SYS_RESTART_SYSCALL),
		allow(both, "getrlimit", unix.SYS_GETRLIMIT),
		allow(both, "prlimit64", unix.SYS_PRLIMIT64), // os/exec restores RLIMIT_NOFILE in the child
		allow(both, "setrlimit", unix.SYS_SETRLIMIT),
		allow(both, "arch_prctl", unix.SYS_ARCH_PRCTL),     // runtime start (an exec'd child)
		allow(both, "mincore", unix.SYS_MINCORE),           // runtime start without /proc/self/auxv
		allow(both, "timer_create", unix.SYS_TIMER_CREATE), // runtime CPU profiler (pprof)
		allow(both, "timer_settime", unix.SYS_TIMER_SETTIME),
		allow(both, "timer_delete", unix.SYS_TIMER_DELETE),
		allow(both, "setitimer", unix.SYS_SETITIMER),
		allow(both, "prctl", unix.SYS_PRCTL, in(0, prNames, prVals)),

		// --- descriptors and polling ---
		allow(both, "close", unix.SYS_CLOSE),
		allow(both, "fcntl", unix.SYS_FCNTL), // O_NONBLOCK, FD_CLOEXEC, F_DUPFD_CLOEXEC
		allow(both, "dup", unix.SYS_DUP),
		allow(both, "dup3", unix.SYS_DUP3),
		allow(both, "epoll_create1", unix.SYS_EPOLL_CREATE1),
		allow(both, "epoll_ctl", unix.SYS_EPOLL_CTL),
		allow(both, "eventfd2", unix.SYS_EVENTFD2), // netpoll wakeups, irqfd/ioeventfd
		allow(both, "pipe2", unix.SYS_PIPE2),
		allow(both, "ppoll", unix.SYS_PPOLL),
		allow(both, "poll", unix.SYS_POLL),
		allow(both, "pselect6", unix.SYS_PSELECT6),
		allow(both, "timerfd_create", unix.SYS_TIMERFD_CREATE),
		allow(both, "timerfd_settime", unix.SYS_TIMERFD_SETTIME),
		allow(both, "timerfd_gettime", unix.SYS_TIMERFD_GETTIME),

		// --- files: disks, snapshots, logs, the audit log ---
		allow(both, "openat", unix.SYS_OPENAT), // snapshot files, /proc/self/*
		allow(both, "lseek", unix.SYS_LSEEK),
		allow(both, "fstat", unix.SYS_FSTAT),
		allow(both, "newfstatat", unix.SYS_NEWFSTATAT),
		allow(both, "statx", unix.SYS_STATX),
		allow(both, "fstatfs", unix.SYS_FSTATFS),
		allow(both, "faccessat", unix.SYS_FACCESSAT),
		allow(both, "faccessat2", unix.SYS_FACCESSAT2),
		allow(both, "readlinkat", unix.SYS_READLINKAT), // os.Executable
		allow(both, "getdents64", unix.SYS_GETDENTS64),
		allow(both, "getcwd", unix.SYS_GETCWD),
		allow(both, "fsync", unix.SYS_FSYNC),
		allow(both, "fdatasync", unix.SYS_FDATASYNC),
		allow(both, "ftruncate", unix.SYS_FTRUNCATE),
		allow(both, "fallocate", unix.SYS_FALLOCATE), // sparse disks: punch holes
		allow(both, "flock", unix.SYS_FLOCK),         // disk images are locked
		allow(both, "rename", unix.SYS_RENAME),
		allow(both, "renameat", unix.SYS_RENAMEAT),
		allow(both, "renameat2", unix.SYS_RENAMEAT2),
		allow(both, "unlinkat", unix.SYS_UNLINKAT),
		allow(both, "mkdirat", unix.SYS_MKDIRAT),
		allow(both, "fchmod", unix.SYS_FCHMOD),
		allow(both, "fchmodat", unix.SYS_FCHMODAT),
		allow(both, "utimensat", unix.SYS_UTIMENSAT),
		allow(both, "memfd_create", unix.SYS_MEMFD_CREATE),       // guest memory, fork
		allow(both, "copy_file_range", unix.SYS_COPY_FILE_RANGE), // io.Copy between files
		allow(both, "sendfile", unix.SYS_SENDFILE),               // io.Copy file -> socket
		allow(both, "splice", unix.SYS_SPLICE),                   // io.Copy socket -> file

		// --- sockets: control API, vsock backends, egress services ---
		allow(both, "socket", unix.SYS_SOCKET, in(0, domNames, doms)),
		allow(both, "socketpair", unix.SYS_SOCKETPAIR, in(0, []string{"AF_UNIX"}, []uint32{unix.AF_UNIX})),
		allow(both, "bind", unix.SYS_BIND),
		allow(both, "listen", unix.SYS_LISTEN),
		allow(both, "accept4", unix.SYS_ACCEPT4),
		allow(both, "accept", unix.SYS_ACCEPT),
		allow(both, "connect", unix.SYS_CONNECT),
		allow(both, "getsockopt", unix.SYS_GETSOCKOPT),
		allow(both, "setsockopt", unix.SYS_SETSOCKOPT),
		allow(both, "getsockname", unix.SYS_GETSOCKNAME),
		allow(both, "getpeername", unix.SYS_GETPEERNAME),
		allow(both, "sendto", unix.SYS_SENDTO),
		allow(both, "recvfrom", unix.SYS_RECVFROM),
		allow(both, "sendmsg", unix.SYS_SENDMSG),
		allow(both, "recvmsg", unix.SYS_RECVMSG),
		allow(both, "sendmmsg", unix.SYS_SENDMMSG),
		allow(both, "recvmmsg", unix.SYS_RECVMMSG),
		allow(both, "shutdown", unix.SYS_SHUTDOWN),

		// --- ProfileVMM: the fork API starts `warren fork-child` (os/exec) ---
		allow(ProfileVMM, "execve", unix.SYS_EXECVE),
		allow(ProfileVMM, "wait4", unix.SYS_WAIT4),
		allow(ProfileVMM, "waitid", unix.SYS_WAITID),
		allow(ProfileVMM, "pidfd_open", unix.SYS_PIDFD_OPEN),
		allow(ProfileVMM, "setsid", unix.SYS_SETSID),   // SysProcAttr.Setsid
		allow(ProfileVMM, "setpgid", unix.SYS_SETPGID), // SysProcAttr.Setpgid
		allow(ProfileVMM, "chdir", unix.SYS_CHDIR),     // exec.Cmd.Dir
		allow(ProfileVMM, "umask", unix.SYS_UMASK),
		// an exec'd dynamically linked binary's loader (tests exec /bin/true)
		allow(ProfileVMM, "brk", unix.SYS_BRK),
		allow(ProfileVMM, "access", unix.SYS_ACCESS),
		allow(ProfileVMM, "set_tid_address", unix.SYS_SET_TID_ADDRESS),
		allow(ProfileVMM, "set_robust_list", unix.SYS_SET_ROBUST_LIST),
		allow(ProfileVMM, "rseq", unix.SYS_RSEQ),
		// the fork child hardens itself under the inherited filter
		allow(ProfileVMM, "capget", unix.SYS_CAPGET),
		allow(ProfileVMM, "capset", unix.SYS_CAPSET),
		allow(ProfileVMM, "seccomp", unix.SYS_SECCOMP, in(0,
			[]string{"SECCOMP_SET_MODE_FILTER", "SECCOMP_GET_ACTION_AVAIL"},
			[]uint32{unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_GET_ACTION_AVAIL})),
		allow(ProfileVMM, "setresuid", unix.SYS_SETRESUID),
		allow(ProfileVMM, "setresgid", unix.SYS_SETRESGID),
		allow(ProfileVMM, "setgroups", unix.SYS_SETGROUPS),
	}

	// bpf(2): map operations of the egress filter (vmmproc/egress SetPolicy,
	// Stats) and link detach at Close; with NetworkFork also what loading
	// and attaching a fork child's own filter takes (cilium/ebpf's feature
	// probes, BTF, frozen read-only maps, tcx links).
	if p == ProfileVMM || opts.BPFMaps {
		names := []string{"BPF_MAP_LOOKUP_ELEM", "BPF_MAP_UPDATE_ELEM", "BPF_MAP_DELETE_ELEM",
			"BPF_MAP_GET_NEXT_KEY", "BPF_OBJ_GET_INFO_BY_FD", "BPF_MAP_LOOKUP_AND_DELETE_ELEM",
			"BPF_MAP_LOOKUP_BATCH", "BPF_MAP_LOOKUP_AND_DELETE_BATCH", "BPF_MAP_UPDATE_BATCH",
			"BPF_MAP_DELETE_BATCH", "BPF_LINK_DETACH"}
		vals := []uint32{unix.BPF_MAP_LOOKUP_ELEM, unix.BPF_MAP_UPDATE_ELEM, unix.BPF_MAP_DELETE_ELEM,
			unix.BPF_MAP_GET_NEXT_KEY, unix.BPF_OBJ_GET_INFO_BY_FD, unix.BPF_MAP_LOOKUP_AND_DELETE_ELEM,
			unix.BPF_MAP_LOOKUP_BATCH, unix.BPF_MAP_LOOKUP_AND_DELETE_BATCH, unix.BPF_MAP_UPDATE_BATCH,
			unix.BPF_MAP_DELETE_BATCH, unix.BPF_LINK_DETACH}
		if p == ProfileVMM && opts.NetworkFork {
			names = append(names, "BPF_MAP_CREATE", "BPF_PROG_LOAD", "BPF_BTF_LOAD", "BPF_MAP_FREEZE",
				"BPF_LINK_CREATE", "BPF_PROG_QUERY", "BPF_PROG_ATTACH", "BPF_PROG_DETACH")
			vals = append(vals, unix.BPF_MAP_CREATE, unix.BPF_PROG_LOAD, unix.BPF_BTF_LOAD, unix.BPF_MAP_FREEZE,
				unix.BPF_LINK_CREATE, unix.BPF_PROG_QUERY, unix.BPF_PROG_ATTACH, unix.BPF_PROG_DETACH)
		}
		t = append(t, allow(p, "bpf", unix.SYS_BPF, in(0, names, vals)))
	}
	// unshare(CLONE_NEWNET) and nothing else: a private-network fork
	// child makes its network namespace (NetworkFork).
	if p == ProfileVMM && opts.Spawned {
		t = withoutChildMaking(t)
	}
	if p == ProfileVMM && opts.NetworkFork {
		t = append(t, allow(p, "unshare", unix.SYS_UNSHARE, in(0, []string{"CLONE_NEWNET"}, []uint32{unix.CLONE_NEWNET})))
	}
	return t
}

// selfOnly restricts kill/tgkill to the process itself in ProfileStrict
// (the Go runtime signals only itself) and for a Spawned VMM; ProfileVMM
// signals its children.
func selfOnly(p Profile, opts Options, self []uint32, names []string) []Cond {
	if p == ProfileVMM && !opts.Spawned {
		return nil
	}
	return []Cond{in(0, names, self)}
}

// childMaking are the ProfileVMM rules for starting `warren fork-child`
// and for what that child does under the inherited filter, which a
// Spawned VMM goes without.
var childMaking = map[string]bool{"execve": true, "wait4": true, "waitid": true, "pidfd_open": true,
	"setsid": true, "setpgid": true, "chdir": true, "umask": true, "brk": true, "access": true,
	"set_tid_address": true, "set_robust_list": true, "rseq": true, "capget": true, "capset": true,
	"seccomp": true, "setresuid": true, "setresgid": true, "setgroups": true}

// withoutChildMaking is t less the childMaking rules.
func withoutChildMaking(t []sc) []sc {
	out := t[:0:0]
	for _, e := range t {
		if !childMaking[e.rule.Name] {
			out = append(out, e)
		}
	}
	return out
}

// Linux _IOC encoding (x86_64), as in vmm/kvm/ioctl.go.
func ioc(dir, typ, nr, size uintptr) uint32 { return uint32(dir<<30 | size<<16 | typ<<8 | nr) }

const (
	kvmio    = 0xAE
	iocNone  = 0
	iocWrite = 1
	iocRead  = 2
)

func kio(nr uintptr) uint32          { return ioc(iocNone, kvmio, nr, 0) }
func kior(nr, size uintptr) uint32   { return ioc(iocRead, kvmio, nr, size) }
func kiow(nr, size uintptr) uint32   { return ioc(iocWrite, kvmio, nr, size) }
func kiowr(nr, size uintptr) uint32  { return ioc(iocRead|iocWrite, kvmio, nr, size) }
func size[T any]() uintptr           { var v T; return unsafe.Sizeof(v) }
func kiorT[T any](nr uintptr) uint32 { return kior(nr, size[T]()) }
func kiowT[T any](nr uintptr) uint32 { return kiow(nr, size[T]()) }

// Terminal and file ioctls x/sys does not name on amd64.
const (
	fionbio  = 0x5421
	fionread = 0x541b
	fioclex  = 0x5451
	fionclex = 0x5450
)

type ioctlEntry struct {
	profiles Profile
	name     string
	req      uint32
}

// ioctlTable lists every ioctl request allowed, by name. The KVM numbers are
// those vmm/kvm issues (same encoding and, where exported, the same
// struct types for the size; the unexported ones are sized here: keep in
// sync with vmm/kvm/types.go). "Setup" requests are only in ProfileVMM,
// whose fork child builds its VM under the inherited filter.
func ioctlTable() []ioctlEntry {
	const setup = ProfileVMM
	return []ioctlEntry{
		// vCPU run loop and state (run, pause, snapshot, restore)
		{both, "KVM_RUN", kio(0x80)},
		{both, "KVM_GET_REGS", kiorT[kvm.Regs](0x81)},
		{both, "KVM_SET_REGS", kiowT[kvm.Regs](0x82)},
		{both, "KVM_GET_SREGS", kiorT[kvm.Sregs](0x83)},
		{both, "KVM_SET_SREGS", kiowT[kvm.Sregs](0x84)},
		{both, "KVM_GET_FPU", kiorT[kvm.FPU](0x8c)},
		{both, "KVM_SET_FPU", kiowT[kvm.FPU](0x8d)},
		{both, "KVM_GET_XSAVE", kiorT[kvm.Xsave](0xa4)},
		{both, "KVM_GET_XSAVE2", kiorT[kvm.Xsave](0xcf)},
		{both, "KVM_SET_XSAVE", kiowT[kvm.Xsave](0xa5)},
		{both, "KVM_GET_XCRS", kiorT[kvm.XCRs](0xa6)},
		{both, "KVM_SET_XCRS", kiowT[kvm.XCRs](0xa7)},
		{both, "KVM_GET_MSRS", kiowr(0x88, 8)},
		{both, "KVM_SET_MSRS", kiow(0x89, 8)},
		{both, "KVM_GET_LAPIC", kiorT[kvm.LAPICState](0x8e)},
		{both, "KVM_SET_LAPIC", kiowT[kvm.LAPICState](0x8f)},
		{both, "KVM_GET_CPUID2", kiowr(0x91, 8)},
		{both, "KVM_GET_MP_STATE", kior(0x98, 4)},
		{both, "KVM_SET_MP_STATE", kiow(0x99, 4)},
		{both, "KVM_GET_VCPU_EVENTS", kiorT[kvm.VCPUEvents](0x9f)},
		{both, "KVM_SET_VCPU_EVENTS", kiowT[kvm.VCPUEvents](0xa0)},
		{both, "KVM_GET_DEBUGREGS", kiorT[kvm.DebugRegs](0xa1)},
		{both, "KVM_SET_DEBUGREGS", kiowT[kvm.DebugRegs](0xa2)},
		{both, "KVM_GET_TSC_KHZ", kio(0xa3)},
		// VM: interrupts, clocks, dirty logging, irqchip/PIT state
		{both, "KVM_IRQ_LINE", kiow(0x61, 8)},
		{both, "KVM_IRQFD", kiowT[kvm.IRQFD](0x76)},
		{both, "KVM_IOEVENTFD", kiowT[kvm.IOEventFD](0x79)},
		{both, "KVM_GET_CLOCK", kiorT[kvm.ClockData](0x7c)},
		{both, "KVM_SET_CLOCK", kiowT[kvm.ClockData](0x7b)},
		{both, "KVM_GET_DIRTY_LOG", kiow(0x42, 16)},
		{both, "KVM_CLEAR_DIRTY_LOG", kiowr(0xc0, 24)},
		{both, "KVM_GET_IRQCHIP", kiowr(0x62, size[kvm.IRQChip]())},
		{both, "KVM_SET_IRQCHIP", kiorT[kvm.IRQChip](0x63)}, // _IOR in the kernel header
		{both, "KVM_GET_PIT2", kiorT[kvm.PITState2](0x9f)},
		{both, "KVM_SET_PIT2", kiowT[kvm.PITState2](0xa0)},
		{both, "KVM_SET_USER_MEMORY_REGION", kiowT[kvm.UserspaceMemoryRegion](0x46)}, // restore, fork: remap memory
		{both, "KVM_CHECK_EXTENSION", kio(0x03)},
		// vCPU creation and its CPUID and TSC frequency: each vCPU's own
		// thread makes and sets up its vCPU when the VM starts, after the
		// jail (vmm.VM: one thread owns a vCPU), so both profiles allow
		// them. (`warren run|restore --jail strict` failed with
		// KVM_CREATE_VCPU EPERM before: TestHostileGuestProgram.)
		{both, "KVM_CREATE_VCPU", kio(0x41)},
		{both, "KVM_SET_CPUID2", kiow(0x90, 8)},
		{both, "KVM_SET_TSC_KHZ", kio(0xa2)},
		// VM creation: setup only
		{setup, "KVM_GET_API_VERSION", kio(0x00)},
		{setup, "KVM_CREATE_VM", kio(0x01)},
		{setup, "KVM_GET_VCPU_MMAP_SIZE", kio(0x04)},
		{setup, "KVM_GET_SUPPORTED_CPUID", kiowr(0x05, 8)},
		{setup, "KVM_GET_MSR_INDEX_LIST", kiowr(0x02, 4)},
		{setup, "KVM_SET_TSS_ADDR", kio(0x47)},
		{setup, "KVM_SET_IDENTITY_MAP_ADDR", kiow(0x48, 8)},
		{setup, "KVM_CREATE_IRQCHIP", kio(0x60)},
		{setup, "KVM_CREATE_PIT2", kiowT[kvm.PITConfig](0x77)},
		{setup, "KVM_ENABLE_CAP", kiow(0xa3, 104)},
		// tap (devices/virtio/net): setup only
		{setup, "TUNSETIFF", unix.TUNSETIFF},
		{setup, "TUNSETVNETHDRSZ", unix.TUNSETVNETHDRSZ},
		{setup, "TUNSETOFFLOAD", unix.TUNSETOFFLOAD},
		// guest memory served by userfaultfd (memsnap/uffd, `warren
		// restore --lazy=uffd`): what its fault server issues while the
		// guest runs and to finish (Complete). The userfaultfd(2) syscall,
		// UFFDIO_API and UFFDIO_REGISTER (and /dev/userfaultfd's
		// USERFAULTFD_IOC_NEW) happen before the jail and stay refused.
		{both, "UFFDIO_COPY", uffd.IoctlCopy},
		{both, "UFFDIO_ZEROPAGE", uffd.IoctlZeropage},
		{both, "UFFDIO_WAKE", uffd.IoctlWake},
		{both, "UFFDIO_UNREGISTER", uffd.IoctlUnregister},
		// files: reflink copies of disk layers (cow/disk)
		{both, "FICLONE", unix.FICLONE},
		// descriptors and consoles (Go's os, x/term-style tty checks)
		{both, "FIONBIO", fionbio},
		{both, "FIONREAD", fionread},
		{both, "FIOCLEX", fioclex},
		{both, "FIONCLEX", fionclex},
		{both, "TCGETS", unix.TCGETS},
		{both, "TIOCGWINSZ", unix.TIOCGWINSZ},
	}
}
