// Package jail hardens one VMM process (`warren run`, `warren restore`,
// `warren fork-child`) after its setup: its own namespaces, no privileges
// it no longer needs, and a seccomp allowlist. Linux, x86_64, no cgo: the
// classic-BPF program is assembled here (no libseccomp).
//
// # Order
//
// The daemon starts a VMM with SysProcAttr (new mount, pid, ipc and uts
// namespaces, a new network namespace with NSOptions.NetNS, a new session;
// no Pdeathsig: VMMs outlive the daemon), under RunInit, which joins the
// VMM's cgroup first so that the VMM is born in it. The VMM does its privileged setup (open
// /dev/kvm, create the VM and vCPUs, map guest memory, open disks and tap,
// attach the egress filter, bind its API socket) and then calls Enter once:
//
//  1. PrepareMounts: make every mount private (MS_REC|MS_PRIVATE on /);
//     optionally mount a fresh /proc for the new pid namespace. Then,
//     with Config.Root, PivotRoot (root.go): a tmpfs on the jail
//     directory, the paths the VMM still needs bind-mounted at their own
//     paths (nosuid, nodev, noexec unless asked, read-only unless asked),
//     its device nodes made there and owned by its uid, a /proc of its
//     pid namespace, pivot_root, the old root detached, the tmpfs
//     remounted read-only.
//  2. Privileges: with Config.User, empty the bounding set, switch uid/gid
//     (SetUser) and clear every capability; otherwise DropCapabilities
//     (Config.KeepCaps survive, everything else leaves the bounding,
//     ambient, permitted, effective and inheritable sets).
//  3. PR_SET_NO_NEW_PRIVS (execve can never gain privileges again).
//  4. The seccomp filter, with SECCOMP_FILTER_FLAG_TSYNC so that every
//     thread of the Go process gets it at once.
//
// Each step may need what a later one removes, and the filter refuses the
// calls of the steps before it, so the order is fixed. Capabilities,
// no_new_privs and uid are per thread in Linux: this package changes them
// on all threads with syscall.AllThreadsSyscall, which only exists for
// binaries built without cgo (the Makefile builds warren with
// CGO_ENABLED=0); in a cgo binary DropCapabilities and SetUser fail with
// ENOTSUP rather than half-apply. (seccomp itself is fine either way:
// TSYNC is done by the kernel.)
//
// # The filter
//
// The program first checks seccomp_data.arch (anything but
// AUDIT_ARCH_X86_64 is killed: an int 0x80 i386 syscall must not bypass
// the x86_64 numbers), then refuses the x32 ABI (bit 30 of the number),
// then compares the number against the table in syscalls.go, hottest
// first (ioctl, futex, read, write, epoll). Syscalls with argument checks
// jump to a body that compares the low 32 bits of the argument (the kernel
// reads those as int or unsigned int, or has all its flags there):
//
//   - ioctl: the request must be in the ioctl table: the KVM requests of
//     vmm/kvm by name (the run loop, vCPU and VM state for snapshots,
//     irqfd/ioeventfd, dirty logging; creation requests only in
//     ProfileVMM), the userfaultfd requests a running fault server issues
//     (UFFDIO_COPY, UFFDIO_ZEROPAGE, UFFDIO_WAKE, UFFDIO_UNREGISTER; the
//     userfaultfd is made and registered before the jail, so the
//     userfaultfd syscall, UFFDIO_API, UFFDIO_REGISTER and
//     USERFAULTFD_IOC_NEW are refused), FICLONE,
//     FIONBIO/FIONREAD/FIOCLEX/FIONCLEX, TCGETS and TIOCGWINSZ.
//     TUNSETIFF and friends only in ProfileVMM. TIOCSTI and everything
//     else is refused.
//   - socket: AF_UNIX, AF_INET, AF_INET6 (plus AF_NETLINK in ProfileVMM);
//     AF_PACKET, AF_VSOCK and the rest are refused. socketpair: AF_UNIX.
//   - clone: ProfileStrict allows threads only (CLONE_THREAD and the
//     Go runtime's companion flags, no namespace flag); ProfileVMM also
//     allows new processes but never CLONE_NEWUSER. clone3 fails with
//     ENOSYS (its flags are in memory the filter cannot read; Go uses
//     clone unless asked for a cgroup fd or a time namespace).
//   - mmap, mprotect: never PROT_WRITE and PROT_EXEC together.
//   - prctl: a short list (PR_SET_VMA for the Go runtime, names, reading
//     no_new_privs and capabilities; ProfileVMM adds PR_SET_PDEATHSIG and
//     capability drops).
//   - kill, tgkill: ProfileStrict only signals its own pid (Go preemption
//     sends SIGURG with tgkill, vCPU kicks too).
//   - bpf (ProfileVMM, or Options.BPFMaps): map lookups, updates,
//     deletes, iteration, batches, object info and link detach, for the
//     egress filter's maps; never BPF_PROG_LOAD or BPF_MAP_CREATE.
//
// Never allowed, in either profile: mount, umount2, pivot_root, chroot,
// unshare, setns, ptrace, process_vm_*, bpf program loads, kexec_*,
// init_module/finit_module/delete_module, reboot, swapon, perf_event_open,
// keyctl/add_key/request_key, userfaultfd, io_uring_*, open_by_handle_at,
// name_to_handle_at, mknod, clock_settime/settimeofday/adjtimex, acct,
// quotactl, syslog, iopl/ioperm, personality, seccomp in ProfileStrict,
// and anything else not in the table. The one exception is
// Options.NetworkFork under ProfileVMM, for a VMM with a private network
// and egress whose fork children make their own: unshare(CLONE_NEWNET)
// exactly, and bpf(2) map creation, program and BTF loads, map freezes,
// links and program attach/query. Such a VMM (vmmproc's jail.go)
// also keeps CAP_NET_BIND_SERVICE: its children's resolver and proxy bind
// ports 53, 80 and 443.
//
// # Profiles
//
// ProfileStrict is what a running VMM needs after its setup: the Go
// runtime (threads, memory, signals, timers, the netpoller), files
// (snapshots, disks, logs: openat, pread/pwrite, fallocate, fsync,
// rename, unlink, memfd_create, copy_file_range), sockets for the API,
// the vsock backends and the egress resolver/proxy, and the KVM requests
// of a built VM. It cannot create a process, exec, or signal anything but
// itself.
//
// ProfileVMM adds what the fork API needs: it starts `warren fork-child`
// with os/exec (clone of a process, execve, wait4/waitid, pidfd_*, setsid,
// setpgid, chdir), and a seccomp filter survives fork and execve, so the
// child does its whole setup under it: the KVM creation requests, the tap
// requests, AF_NETLINK, and what a fork child needs to harden itself in
// turn (capget/capset, capability prctls, seccomp to stack a filter,
// setresuid/setresgid/setgroups), plus the startup of an exec'd dynamic
// binary (brk, access, set_tid_address, set_robust_list, rseq).
//
// Which one the daemon should use: ProfileStrict for every VMM that does
// not serve the fork API (run, restore, and fork children themselves once
// set up); ProfileVMM only for a VMM whose fork API is enabled. Without a
// helper (below), a fork child with --netns also needs the parent to keep
// CAP_SYS_ADMIN (new network namespace) and CAP_NET_ADMIN (its tap):
// capabilities dropped in the parent are gone for its children too. A VMM with egress needs
// Options.BPFMaps under ProfileStrict.
//
// # A missing syscall
//
// The default action is SECCOMP_RET_ERRNO with EPERM, so a syscall the
// table lacks fails and shows up in the VMM's log as "operation not
// permitted" from an unexpected place. To find which: run the VMM with
// Options{Mode: ModeLog} (SECCOMP_RET_LOG, with SECCOMP_FILTER_FLAG_LOG):
// everything is allowed and each unlisted call is logged by the kernel
// (`dmesg | grep 'type=1326'` or `journalctl -k | grep audit`, or
// /var/log/audit/audit.log with auditd; the syscall= field is the x86_64
// number, `ausyscall <n>` names it). Add it to the table with a comment
// saying who needs it (or, until then, Options.Extra). ModeKill
// (SECCOMP_RET_KILL_PROCESS) kills the VMM with SIGSYS instead; the tests
// use it to prove the Go runtime needs nothing outside the table.
//
// # Use by warren and warren-hostd
//
// `warren run` and `warren restore` take --jail strict|vmm[,log|,kill]
// (vmmproc/jail.go): Enter runs once the VM is built, its devices,
// disks and egress attached and its control and vsock sockets listening,
// right before the vCPUs run; a `warren fork-child` inherits its parent's
// setting and enters the same jail after its own setup (without
// PrepareMounts: it shares its parent's, already private, mount
// namespace). warren-hostd --jail (default vmm) adds the flag to every
// VMM it starts (daemon.JailPrepare) and starts them with SysProcAttr's
// mount, pid, ipc and uts namespaces, under RunInit (`warren jail-init`)
// as the pid namespace's init (fork children must outlive their parent:
// they live on in the namespace while its init does, and the daemon finds
// their PIDs in its own namespace with HostPID), a new, empty network
// namespace for a VMM without a network but not for a network one (it
// gets its own for its tap and egress services from its jail-init, the
// helper below, and keeps the host's for upstream connections) and no Pdeathsig (VMMs outlive the daemon, which
// re-adopts them).
//
// A VMM may pivot_root only in a mount namespace that is not its
// starter's (doing so in the host's would move the host's root): either
// its parent's namespace differs from its own, or its parent is RunInit,
// which refuses to run in the namespace of the process that started it
// (named in its environment, ParentMountNSEnv) and tells its command so
// (InitEnv). A VMM that leaves root becomes non-dumpable, so it opens
// what it reads of /proc/self later (the pagemap, for forks) first.
//
// # Threat model: what each layer stops
//
// The attacker is a guest that found a bug in the VMM and runs code in it.
//
//   - Namespaces (mount, pid, ipc, uts, net): it cannot see or signal the
//     host's processes, reach the host's network (a VMM without one), or
//     change the host's mounts.
//   - The pivot_root jail (Config.Root): the host's files are not there
//     (no /etc/shadow, no key directory, no other tenant's tree, no
//     shell); only what the jail binds, at the same paths, and
//     read-only where it only reads. Open descriptors from before
//     (/dev/kvm, disks, sockets) keep working.
//   - Its own uid/gid (Config.User): inside the binds, file permissions
//     separate it from the other VMMs whose directories a shared bind
//     shows (a sibling sandbox's 0700 directory answers EACCES); it owns
//     nothing of the host's.
//   - No capabilities (bounding, permitted, effective, ambient empty)
//     and no_new_privs: no mount, mknod, chroot, raw I/O, module loads;
//     no setuid binary or file capability can give any back.
//   - Seccomp: the kernel's attack surface is the table's syscalls and
//     ioctls; mount, pivot_root, unshare, setns, ptrace, bpf loads,
//     keyctl, io_uring, userfaultfd and the rest fail even where a
//     capability were left.
//
// What warren-hostd does with it (hostd/daemon's jail.go, on by default:
// --vmm-uid-range 1000000:65536): every VMM it starts, template builds
// included, gets Config.Root, a jail directory STATE/jail/ID binding only
// its own files, and Config.User, a uid and gid of its own from the range
// (the owner of its directory, given back to root when a template's build
// ends). A
// peer that reaches the daemon's unix socket as root acts for any tenant,
// so no VMM may see that socket: none does, the jail does not bind it.
//
// # The helper: a network VMM's privileged work
//
// A network VMM needs a private network namespace with a tap in it, the
// tap's host address, the egress filter loaded and attached, and the
// resolver's and proxy's sockets listening on ports 53, 80 and 443 there;
// so does each of its fork children, which it starts long after it gave
// up its privileges. None of that is done by the VMM: its jail-init
// (RunInitWith with InitOptions.Helper; warren-hostd passes
// `jail-init --net-helper` for a network VMM, daemon.Confinement.NetHelper)
// stays root for the family's life and serves requests on a unix socket
// the VMM inherits ($HelperEnv) and hands to its fork children: it makes
// the network and hands it over as descriptors (helper.go;
// vmmproc's nethelper.go says what it accepts: a new namespace
// always, never the host's, a tap of a plain name, bounded and
// rate-limited). The VMM adopts them (egress.PreparedFromFiles,
// filter.FromFiles) and runs as its own uid with no capability, in the
// host's network namespace only for its threads' upstream connections
// (which need none). On kernels before 6.5 every bpf(2) call on the
// filter's maps needs CAP_BPF while kernel.unprivileged_bpf_disabled is
// set (BPFNeedsCap): there a network VMM keeps CAP_BPF alone, ambient so
// that its fork children keep it (Config.KeepCaps with Config.User); it
// lets it create maps and load socket-filter programs, not attach
// anything to a device (that needs CAP_NET_ADMIN) nor reach another
// process's BPF objects (that needs CAP_SYS_ADMIN).
//
// jail-init shares the VMM's mount namespace, so the VMM's pivot_root
// changes jail-init's root too: it opens /dev/net before it starts the
// VMM and makes taps through that descriptor. It is non-dumpable, and
// the jail binds nothing of its own, so a VMM can reach it only through
// the socket.
//
// # Fork children: started by jail-init, never by the VMM
//
// A VMM that warren-hostd confines makes no process (spawn.go): its
// jail-init (`jail-init --spawn`, InitOptions.Spawner) starts each fork
// child, handed the child's descriptors (its spec, ready pipe, the
// parent's memory files, the helper socket) over the helper socket, under
// a Grant from warren-hostd (grant.go): the child's uid, gid, groups and
// cgroup, signed with the family's key (FamilyKey, which the daemon sends
// jail-init on its report socket before it starts: never an argument,
// the environment or a file), valid for minutes and once. `warren
// jail-spawn` (RunSpawn), run by jail-init as root, joins the grant's
// cgroup (opened beneath the cgroup roots jail-init opened before the
// VMM's pivot_root, with RESOLVE_BENEATH), chroots into the requesting
// VMM's root (/proc/PID/root, PID from the kernel's SCM_CREDENTIALS on
// the helper socket: where the jail could only chroot, on an initramfs,
// jail-init's own root is still the host's), leaves root for the
// grant's ids and execs `warren fork-child`: the child runs nothing of
// its own outside its cgroup, its family's jail or as root. The VMM's filter then has no execve, no
// process-making clone, no waits and no foreign signals (Options.Spawned;
// a failed fork's children it kills through the pidfds jail-init hands
// back). A child, born unfiltered, hardens itself after its setup the
// way its parent did.
//
// Each child is a uid of its own (warren-hostd allocates it as for any
// sandbox), so a subverted child cannot signal, trace or read the memory
// of its parent or siblings, nor touch their files: its sandbox directory
// and its run directory are its own (0700); it makes its own disk
// overlays there (cow/disk CreateChild) and opens its own log. What it
// must read of its ancestors, the frozen disk layers its chain stands on,
// it reads as a member of each ancestor's group (the grant's groups): at
// each fork the parent makes its chain's layers readable by its group
// (0640; cow.Forker.ChildrenMakeDisks) and the daemon makes its directory
// passable by it (0710). A descendant can so read its ancestors' frozen
// layers, including ones frozen after it was forked (the parent's disk
// at a later fork): never write them, and nothing else of theirs.
//
// What is left (issue 16, hole 3), and what it would take:
//   - openat is allowed by path inside the jail (what the binds hold); a
//     Landlock ruleset or descriptors for every file would narrow it.
//   - Outside warren-hostd (`warren fork` on a VMM of `warren run
//     --jail vmm`), the VMM still execs its children, which inherit its
//     jail and filter.
//
// hostd/daemon's e2e tests check each confinement from outside, on the
// running VMMs and fork children (/proc/PID/status: uids in the range,
// capabilities, no_new_privs, seccomp; /proc/PID/root: its own directory
// there, the key directory and the secrets file not), the network VMMs'
// too (checkNetConfined: a uid of the range, no capability but CAP_BPF
// where BPFNeedsCap, no /dev/net/tun in the jail).
//
// Run for real (hostd/daemon's e2e test in the nested KVM host, every VMM
// under ProfileVMM, ModeLog then ModeErrno: template build, restore, exec,
// fork, pause/resume, daemon restart, pause to disk and resume, rolling
// and incremental snapshots, rollback), the table lacked nothing. The one
// call logged is, in each fork child (born under the filter), the
// bpf(BPF_MAP_CREATE) probe that github.com/cilium/ebpf/rlimit makes in
// its package init: refused on purpose (EPERM), and harmless for a child
// without egress (the probe's error is only used by rlimit.RemoveMemlock).
package jail
