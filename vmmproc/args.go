package vmmproc

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmmctl"
)

// The command lines of `warren run` and `warren restore`: the decoder of
// vmmctl.Launch's encoding (Launch.Args), which is the very flag parsing
// the warren binary runs (cmd/warren/cli calls ParseRunArgs and
// ParseRestoreArgs), so that what the daemon asks is what the VMM reads.

// Disk is one --disk of a Spec: the contract's (vmmctl.Disk).
type Disk = vmmctl.Disk

// LocalArgs are the flags of both verbs that only a person gives, on the
// host the VMM runs on.
type LocalArgs struct {
	// KVMPath is the KVM device (--kvm); Verbose logs diagnostics (-v).
	KVMPath string
	Verbose bool
}

// RunArgs is `warren run`'s command line: the part warren-hostd gives
// (vmmctl.Run) and the flags only a person gives.
type RunArgs struct {
	vmmctl.Run
	// Kernel and Initramfs are read from these paths instead of
	// descriptors (--kernel, --initramfs).
	Kernel, Initramfs string
	LocalArgs
	// NoRNG leaves out the virtio-rng device (--no-rng).
	NoRNG bool
	// MAC is the guest's MAC address for Tap (--mac; default random).
	MAC string
	// CID is the guest's vsock context ID (--cid).
	CID uint64
	// Secrets is the credential proxy's secrets file (--secrets; default:
	// WARREN_SECRET_<NAME> environment variables); EgressAttach how the
	// egress filter is attached (--egress-attach).
	Secrets      string
	EgressAttach string
}

// ParseRunArgs parses `warren run`'s arguments (after the verb). A
// mistake is reported on stderr, as the flag package does, and returned
// as a *UsageError; what the values mean is checked by the caller.
func ParseRunArgs(args []string, stderr io.Writer) (RunArgs, error) {
	var a RunArgs
	fs := newFlagSet("run", stderr, &a.LocalArgs, &a.Console, &a.Jail)
	fs.StringVar(&a.Kernel, "kernel", "", "guest kernel: an ELF vmlinux with a PVH note, or a bzImage (required)")
	fs.StringVar(&a.Initramfs, "initramfs", "", "initramfs (cpio) to pass to the guest")
	fs.Var(fdFlag{&a.KernelFD}, "kernel-fd", "read the guest kernel from this inherited descriptor (3 or more) instead of --kernel (a regular file; warren-hostd opens a template's kernel itself)")
	fs.Var(fdFlag{&a.InitramfsFD}, "initramfs-fd", "read the initramfs from this inherited descriptor (3 or more) instead of --initramfs")
	fs.IntVar(&a.MemMiB, "mem", 256, "guest memory in MiB")
	fs.IntVar(&a.CPUs, "cpus", 1, "number of vCPUs")
	fs.StringVar(&a.Cmdline, "cmdline", "", "extra kernel command-line arguments")
	fs.BoolVar(&a.NoRNG, "no-rng", false, "do not give the guest a virtio-rng entropy device")
	fs.BoolVar(&a.Balloon, "balloon", false, "give the guest a virtio-balloon with free page reporting: the memory it frees goes back to the host, and the control API (--api) sets a target (GET/PUT /v1/balloon); restores keep it")
	fs.Var((*diskFlag)(&a.Disks), "disk", "attach a raw disk image as virtio-blk: PATH[,ro] (repeatable; the first is /dev/vda)")
	fs.StringVar(&a.Tap, "tap", "", "attach virtio-net on this tap device (created if missing)")
	fs.StringVar(&a.MAC, "mac", "", "guest MAC address for --tap (default: random, locally administered)")
	fs.StringVar(&a.Vsock, "vsock", "", "attach virtio-vsock; the host reaches the guest through this unix socket (CONNECT <port>), and the agent answers warren exec/cp/health on it")
	fs.Uint64Var(&a.CID, "cid", 3, "the guest's vsock context ID, with --vsock")
	fs.StringVar(&a.API, "api", "", "serve the VM's control API (pause, resume, snapshot) on this unix socket; turns on dirty-page tracking")
	fs.StringVar(&a.HostIP, "host-ip", "", "with --tap: the tap's host address and prefix (10.200.0.1/24), the guest's gateway, resolver and credential proxy")
	fs.StringVar(&a.GuestIP, "guest-ip", "", "with --host-ip: the guest's address; eth0, its route and resolver are set on the kernel command line")
	fs.StringVar(&a.Egress, "egress", "", "filter the guest's traffic with this egress policy (JSON, see ebpf/README.md); needs --host-ip")
	fs.StringVar(&a.Audit, "audit", "", "with --egress: the JSON-lines audit log (default: warren-egress-<tap>.jsonl in the current directory)")
	fs.StringVar(&a.Secrets, "secrets", "", "with --egress: a JSON file of secret name to value, mode 0600 (default: environment variables WARREN_SECRET_<NAME>)")
	fs.StringVar(&a.Hosts, "hosts", "", "with --egress: an /etc/hosts-style file of fixed addresses for the resolver and the credential proxy")
	fs.StringVar(&a.DNSUpstream, "dns-upstream", "", "with --egress: the DNS server allowed names are asked of, ip:port (default: the host's /etc/resolv.conf)")
	fs.StringVar(&a.UpstreamCA, "upstream-ca", "", "with --egress: PEM roots the credential proxy trusts upstream instead of the system's")
	fs.StringVar(&a.EgressAttach, "egress-attach", "auto", "with --egress: how to attach the filter: auto (tcx, else clsact), tcx or clsact")
	fs.StringVar(&a.UpstreamAllow, "upstream-allow", "", "with --egress: comma-separated addresses or CIDRs the credential proxy may connect to although loopback, private, link-local or the host's own (the operator's allowance; by default none)")
	fs.BoolVar(&a.WildcardCredentials, "allow-wildcard-credentials", false, "with --egress: allow credential hosts such as *.example.com (the secret then goes to any name below)")
	fs.BoolVar(&a.PrivateNet, "private-net", false, "with --tap: put the tap and its egress services in a network namespace of this VMM's own (upstream traffic of the resolver and proxy still leaves through the host's); recorded in snapshots, so restores and forks get their own too")
	if err := fs.Parse(args); err != nil {
		return RunArgs{}, &UsageError{err}
	}
	if fs.NArg() > 0 {
		err := fmt.Errorf("unexpected arguments %q", fs.Args())
		fmt.Fprintf(stderr, "warren run: %v\n", err)
		return RunArgs{}, &UsageError{err}
	}
	return a, nil
}

// RestoreArgs is `warren restore`'s command line: the part warren-hostd
// gives (vmmctl.Restore) and the flags only a person gives.
type RestoreArgs struct {
	vmmctl.Restore
	LocalArgs
	// Timing, when set, is where the first KVM_RUN's wall-clock time is
	// written (--timing).
	Timing string
}

// ParseRestoreArgs parses `warren restore`'s arguments (after the verb).
// A mistake is reported on stderr, as the flag package does, and
// returned as a *UsageError.
func ParseRestoreArgs(args []string, stderr io.Writer) (RestoreArgs, error) {
	var a RestoreArgs
	fs := newFlagSet("restore", stderr, &a.LocalArgs, &a.Console, &a.Jail)
	fs.Var(lazyFlag{&a.Lazy, &a.LazyMode}, "lazy", "how to restore memory: --lazy or --lazy=mmap maps the snapshot's memory copy-on-write (flattened once to DIR/NAME.<hash>.wraw); --lazy=uffd fills a fresh memfd page by page as the guest touches it, by userfaultfd (mmap where the host cannot); --lazy=eager, or no --lazy, reads it all first")
	fs.StringVar(&a.RecordWorkingSet, "record-working-set", "", "with --lazy=uffd: record the pages the guest touches first; the control API's POST /v1/working-set/save writes them to FILE")
	fs.StringVar(&a.Prefetch, "prefetch", "", "with --lazy=uffd: prefetch the working set in FILE while the guest runs (a missing, stale or corrupt FILE is logged and ignored)")
	fs.StringVar(&a.API, "api", "", "serve the VM's control API (pause, resume, snapshot) on this unix socket")
	fs.StringVar(&a.Vsock, "vsock", "", "the vsock unix socket (default: the snapshotted VM's)")
	fs.StringVar(&a.Timing, "timing", "", "write the wall-clock time of the first KVM_RUN (Unix ns, one decimal line) to FILE, for benchmarks")
	fs.StringVar(&a.Egress, "egress", "", "for a snapshot with egress: the policy in force from the start instead of the snapshot's (JSON; the resolver starts with no allowed addresses)")
	fs.StringVar(&a.Secrets, "secrets", "", "for a snapshot with egress: the credential proxy's secrets file (JSON name to value, mode 0600) instead of the snapshot's")
	fs.StringVar(&a.Audit, "audit", "", "for a snapshot with egress: the audit log instead of the snapshot's")
	dp := DiskPaths{}
	fs.Var(dp, "disk-path", "open the snapshot's writable disk I (from 0) at PATH, typically a cow/disk overlay over its image; the device keeps its saved name (`I=PATH`, repeatable)")
	if err := fs.Parse(args); err != nil {
		return RestoreArgs{}, &UsageError{err}
	}
	if fs.NArg() != 1 {
		fmt.Fprint(stderr, "usage: warren restore [--lazy[=eager|mmap|uffd]] [--record-working-set FILE] [--prefetch FILE] [--api PATH] [--vsock PATH] [--console FILE] [--timing FILE] [--egress FILE] [--secrets FILE] [--audit FILE] [--disk-path I=PATH]... DIR/NAME\n")
		return RestoreArgs{}, &UsageError{fmt.Errorf("want one snapshot, got %d arguments", fs.NArg())}
	}
	if (a.RecordWorkingSet != "" || a.Prefetch != "") && a.Mode() != vmsnap.Uffd {
		err := fmt.Errorf("--record-working-set and --prefetch need --lazy=uffd")
		fmt.Fprintf(stderr, "warren restore: %v\n", err)
		return RestoreArgs{}, &UsageError{err}
	}
	a.Snapshot = fs.Arg(0)
	if len(dp) > 0 {
		a.DiskPaths = dp
	}
	return a, nil
}

// newFlagSet returns the flag set of `warren VERB`, which reports its
// mistakes on stderr, with the flags both verbs take: --kvm, -v,
// --console and --jail.
func newFlagSet(verb string, stderr io.Writer, local *LocalArgs, console, jail *string) *flag.FlagSet {
	fs := flag.NewFlagSet("warren "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&local.KVMPath, "kvm", "/dev/kvm", "KVM device")
	fs.BoolVar(&local.Verbose, "v", false, "log VMM diagnostics to stderr")
	fs.StringVar(console, "console", "", "write the guest console to FILE instead of stdout")
	fs.StringVar(jail, "jail", "", "after setup, harden the VMM process: strict or vmm (seccomp allowlist, capabilities dropped, no_new_privs; see vmmproc/jail); vmm when --api may fork")
	return fs
}

// lazyFlag is --lazy: alone (a boolean flag) the Mmap mode, as it always
// was (Lazy); --lazy=MODE names a memory mode (LazyMode); --lazy=true and
// --lazy=false are the boolean's spellings. It must be given as one
// argument: --lazy uffd would read uffd as the snapshot.
type lazyFlag struct {
	lazy *bool
	mode *vmsnap.MemoryMode
}

func (f lazyFlag) String() string {
	switch {
	case f.mode != nil && *f.mode != "":
		return string(*f.mode)
	case f.lazy != nil && *f.lazy:
		return "true"
	}
	return ""
}

// IsBoolFlag lets --lazy stand alone.
func (f lazyFlag) IsBoolFlag() bool { return true }

// Set reads true, false, eager, mmap or uffd.
func (f lazyFlag) Set(v string) error {
	switch v {
	case "true", "false":
		*f.lazy, *f.mode = v == "true", ""
		return nil
	}
	m, err := vmsnap.ParseMemoryMode(v)
	if err != nil {
		return err
	}
	*f.lazy, *f.mode = false, m
	return nil
}

// fdFlag is an inherited descriptor's number (--kernel-fd N): 3 or more;
// unset, 0.
type fdFlag struct{ p *int }

func (f fdFlag) String() string {
	if f.p == nil || *f.p == 0 {
		return ""
	}
	return strconv.Itoa(*f.p)
}

// Set parses N, 3 or more (0 to 2 are stdin, stdout and stderr).
func (f fdFlag) Set(v string) error {
	n, err := strconv.Atoi(v)
	if err != nil {
		return err
	}
	if n < 3 {
		return fmt.Errorf("%d: not an inherited descriptor (3 or more)", n)
	}
	*f.p = n
	return nil
}

// diskFlag is a repeatable --disk PATH[,ro] flag.
type diskFlag []Disk

func (d *diskFlag) String() string {
	if d == nil {
		return ""
	}
	var s []string
	for _, x := range *d {
		s = append(s, x.String())
	}
	return strings.Join(s, " ")
}

// Set parses PATH[,ro] (or PATH,rw): vmmctl.ParseDisk.
func (d *diskFlag) Set(v string) error {
	spec, err := vmmctl.ParseDisk(v)
	if err != nil {
		return err
	}
	*d = append(*d, spec)
	return nil
}

// JailInitArgs is `warren jail-init`'s command line (vmmctl.JailInit's
// encoding): what JailInit runs, and the cgroups to join before it (the
// daemon's business: hostd/cgroup.JoinSelf).
type JailInitArgs struct {
	InitSpec
	Cgroups []string
}

// ParseJailInitArgs parses `warren jail-init`'s arguments (after the
// verb): its flags, then "--" and the VMM's command line. A mistake is
// reported on stderr and returned as a *UsageError.
func ParseJailInitArgs(args []string, stderr io.Writer) (JailInitArgs, error) {
	var a JailInitArgs
	fs := flag.NewFlagSet("warren "+vmmctl.JailInitVerb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&a.ReportFD, "report-fd", -1, "unix socket to report the command's pid on (SCM_CREDENTIALS)")
	pass := fs.Int("pass-fds", 0, "pass descriptors 4 to 3+N on to the command at the same numbers (the daemon's files for the VMM)")
	fs.BoolVar(&a.NetHelper, "net-helper", false, "serve the VMM family's private networks (a network VMM that leaves root asks for them: nethelper.go)")
	fs.BoolVar(&a.Spawn, "spawn", false, "start the VMM family's fork children under warren-hostd's grants (vmmproc/jail.Spawner), whose key comes first on the report socket")
	fs.Var((*stringsFlag)(&a.Cgroups), "cgroup", "join this cgroup directory before starting the command, which is then born in it (repeatable: one per v1 hierarchy)")
	fs.Var((*stringsFlag)(&a.CgroupRoots), "cgroup-root", "with --spawn: the directory fork children's cgroups are under (repeatable: one per v1 hierarchy)")
	if err := fs.Parse(args); err != nil {
		return JailInitArgs{}, &UsageError{err}
	}
	fail := func(format string, v ...any) (JailInitArgs, error) {
		err := fmt.Errorf(format, v...)
		fmt.Fprintf(stderr, "warren %s: %v\n", vmmctl.JailInitVerb, err)
		return JailInitArgs{}, &UsageError{err}
	}
	if *pass < 0 || *pass > vmmctl.MaxPassFDs {
		return fail("--pass-fds %d: want 0 to %d", *pass, vmmctl.MaxPassFDs)
	}
	for i := range *pass {
		a.PassFDs = append(a.PassFDs, 4+i)
	}
	if fs.NArg() == 0 {
		return fail("no command")
	}
	a.Command = fs.Args()
	return a, nil
}

// stringsFlag is a repeatable string flag.
type stringsFlag []string

func (s *stringsFlag) String() string     { return strings.Join(*s, " ") }
func (s *stringsFlag) Set(v string) error { *s = append(*s, v); return nil }
