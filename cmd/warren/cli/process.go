package cli

// The verbs that run the VMM process (run, restore, jail-init): their
// flags, parsed into vmmproc's specs. fork-child and jail-spawn take no
// flags of a user's (cli.go hands them over as they are).

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/warrenvm/warren/ebpf/policy"
	"github.com/warrenvm/warren/hostd/cgroup"
	"github.com/warrenvm/warren/vmmproc"
	"github.com/warrenvm/warren/vmmproc/credproxy"
	"github.com/warrenvm/warren/vmmproc/egress"
	"github.com/warrenvm/warren/vmmproc/jail"
)

// restoreCmd is `warren restore [--lazy] [--api PATH] [--vsock PATH] [--console FILE] DIR/NAME`:
// it rebuilds the VM of a snapshot, with the devices of the `warren run`
// that took it, and runs it in the foreground like `warren run`.
func restoreCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren restore", flag.ContinueOnError)
	fs.SetOutput(stderr)
	lazy := fs.Bool("lazy", false, "map the snapshot's memory copy-on-write (flattened once to DIR/NAME.<hash>.wraw) instead of reading it all first")
	api := fs.String("api", "", "serve the VM's control API (pause, resume, snapshot) on this unix socket")
	vsockPath := fs.String("vsock", "", "the vsock unix socket (default: the snapshotted VM's)")
	console := fs.String("console", "", "write the guest console to FILE instead of stdout")
	kvmPath := fs.String("kvm", "/dev/kvm", "KVM device")
	verbose := fs.Bool("v", false, "log VMM diagnostics to stderr")
	timing := fs.String("timing", "", "write the wall-clock time of the first KVM_RUN (Unix ns, one decimal line) to FILE, for benchmarks")
	jailFlag := fs.String("jail", "", "after setup, harden the VMM process: strict or vmm (seccomp allowlist, capabilities dropped, no_new_privs; see vmmproc/jail); vmm when --api may fork")
	var eo vmmproc.EgressOverrides
	fs.StringVar(&eo.Policy, "egress", "", "for a snapshot with egress: the policy in force from the start instead of the snapshot's (JSON; the resolver starts with no allowed addresses)")
	fs.StringVar(&eo.Secrets, "secrets", "", "for a snapshot with egress: the credential proxy's secrets file (JSON name to value, mode 0600) instead of the snapshot's")
	fs.StringVar(&eo.Audit, "audit", "", "for a snapshot with egress: the audit log instead of the snapshot's")
	dp := vmmproc.DiskPaths{}
	fs.Var(dp, "disk-path", "open the snapshot's writable disk I (from 0) at PATH, typically a cow/disk overlay over its image; the device keeps its saved name (`I=PATH`, repeatable)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	js, jerr := vmmproc.ParseJail(*jailFlag)
	if jerr != nil {
		fmt.Fprintf(stderr, "warren restore: %v\n", jerr)
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprint(stderr, "usage: warren restore [--lazy] [--api PATH] [--vsock PATH] [--console FILE] [--timing FILE] [--egress FILE] [--secrets FILE] [--audit FILE] [--disk-path I=PATH]... DIR/NAME\n")
		return 2
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "warren restore: "+format+"\n", a...)
		return 1
	}
	err := vmmproc.Restore(vmmproc.RestoreSpec{
		Snapshot: fs.Arg(0), Lazy: *lazy, API: *api, Vsock: *vsockPath,
		ConsoleFile: *console, Stdout: stdout, KVMPath: *kvmPath, Log: vmmproc.NewLogger(stderr, *verbose),
		Timing: *timing, Egress: eo, DiskPaths: dp, Jail: js,
	}, stdin)
	var usage *vmmproc.UsageError
	if errors.As(err, &usage) {
		fmt.Fprintf(stderr, "warren restore: %v\n", err)
		return 2
	}
	if err != nil {
		return fail("%v", err)
	}
	return 0
}

// netFlags are `warren run`'s network and egress flags.
type netFlags struct {
	hostIP, guestIP                                  *string
	policy, audit, secrets, hosts, dns, upCA, attach *string
	upAllow                                          *string
	wildcard                                         *bool
}

func addNetFlags(fs *flag.FlagSet) *netFlags {
	return &netFlags{
		hostIP:   fs.String("host-ip", "", "with --tap: the tap's host address and prefix (10.200.0.1/24), the guest's gateway, resolver and credential proxy"),
		guestIP:  fs.String("guest-ip", "", "with --host-ip: the guest's address; eth0, its route and resolver are set on the kernel command line"),
		policy:   fs.String("egress", "", "filter the guest's traffic with this egress policy (JSON, see ebpf/README.md); needs --host-ip"),
		audit:    fs.String("audit", "", "with --egress: the JSON-lines audit log (default: warren-egress-<tap>.jsonl in the current directory)"),
		secrets:  fs.String("secrets", "", "with --egress: a JSON file of secret name to value, mode 0600 (default: environment variables WARREN_SECRET_<NAME>)"),
		hosts:    fs.String("hosts", "", "with --egress: an /etc/hosts-style file of fixed addresses for the resolver and the credential proxy"),
		dns:      fs.String("dns-upstream", "", "with --egress: the DNS server allowed names are asked of, ip:port (default: the host's /etc/resolv.conf)"),
		upCA:     fs.String("upstream-ca", "", "with --egress: PEM roots the credential proxy trusts upstream instead of the system's"),
		attach:   fs.String("egress-attach", "auto", "with --egress: how to attach the filter: auto (tcx, else clsact), tcx or clsact"),
		upAllow:  fs.String("upstream-allow", "", "with --egress: comma-separated addresses or CIDRs the credential proxy may connect to although loopback, private, link-local or the host's own (the operator's allowance; by default none)"),
		wildcard: fs.Bool("allow-wildcard-credentials", false, "with --egress: allow credential hosts such as *.example.com (the secret then goes to any name below)"),
	}
}

// options turns the flags into egress options (nil without --egress) and
// the kernel command-line arguments that configure the guest's network.
func (f *netFlags) options(tap string) (*vmmproc.EgressOptions, string, error) {
	var cmdline string
	var host netip.Prefix
	var guest netip.Addr
	var err error
	if *f.hostIP != "" {
		if tap == "" {
			return nil, "", errors.New("--host-ip needs --tap")
		}
		if host, err = netip.ParsePrefix(*f.hostIP); err != nil || !host.Addr().Is4() {
			return nil, "", fmt.Errorf("--host-ip %q: want an IPv4 address with a prefix length", *f.hostIP)
		}
	}
	if *f.guestIP != "" {
		if !host.IsValid() {
			return nil, "", errors.New("--guest-ip needs --host-ip")
		}
		if guest, err = netip.ParseAddr(*f.guestIP); err != nil || !host.Contains(guest) || guest == host.Addr() {
			return nil, "", fmt.Errorf("--guest-ip %q: want another address in %v", *f.guestIP, host.Masked())
		}
		cmdline = fmt.Sprintf("warren.ip=%v/%d warren.gw=%v warren.dns=%v", guest, host.Bits(), host.Addr(), host.Addr())
	}
	if *f.policy == "" {
		for _, s := range []*string{f.audit, f.secrets, f.hosts, f.dns, f.upCA} {
			if *s != "" {
				return nil, "", errors.New("--audit, --secrets, --hosts, --dns-upstream and --upstream-ca need --egress")
			}
		}
		return nil, cmdline, nil
	}
	if !host.IsValid() {
		return nil, "", errors.New("--egress needs --tap and --host-ip")
	}
	allow, err := policy.ParsePrefixes(*f.upAllow)
	if err != nil {
		return nil, "", fmt.Errorf("--upstream-allow: %w", err)
	}
	p, err := policy.LoadWith(*f.policy, policy.Options{WildcardCredentials: *f.wildcard})
	if err != nil {
		return nil, "", err
	}
	e := &vmmproc.EgressOptions{HostAddr: host, GuestAddr: guest, Audit: *f.audit, DNSUpstream: *f.dns,
		Attach: *f.attach, Sandbox: tap, State: egress.State{Policy: p}, UpstreamAllow: allow, WildcardCredentials: *f.wildcard}
	if e.Audit == "" {
		e.Audit = "warren-egress-" + tap + ".jsonl"
	}
	for _, p := range []struct{ in, out *string }{{&e.Audit, &e.Audit}, {f.secrets, &e.Secrets}, {f.hosts, &e.Hosts}, {f.upCA, &e.UpstreamCA}} {
		if *p.in != "" {
			if *p.out, err = filepath.Abs(*p.in); err != nil {
				return nil, "", err
			}
		}
	}
	if _, err := vmmproc.ParseAttach(e.Attach); err != nil {
		return nil, "", err
	}
	// Read what can be checked now, so that a mistake fails before the VM.
	if e.Secrets != "" {
		if err := (credproxy.FileStore{Path: e.Secrets}).Check(); err != nil {
			return nil, "", err
		}
	}
	if e.Hosts != "" {
		if _, err := egress.ReadHosts(e.Hosts); err != nil {
			return nil, "", err
		}
	}
	return e, cmdline, nil
}

// diskFlag is a repeatable --disk PATH[,ro] flag.
type diskFlag []vmmproc.Disk

func (d *diskFlag) String() string {
	var s []string
	for _, x := range *d {
		if x.ReadOnly {
			s = append(s, x.Path+",ro")
		} else {
			s = append(s, x.Path)
		}
	}
	return strings.Join(s, " ")
}

// Set parses PATH[,ro] (or PATH,rw).
func (d *diskFlag) Set(v string) error {
	parts := strings.Split(v, ",")
	spec := vmmproc.Disk{Path: parts[0]}
	if spec.Path == "" {
		return fmt.Errorf("empty disk path")
	}
	for _, opt := range parts[1:] {
		switch opt {
		case "ro":
			spec.ReadOnly = true
		case "rw":
			spec.ReadOnly = false
		default:
			return fmt.Errorf("unknown disk option %q (want ro or rw)", opt)
		}
	}
	*d = append(*d, spec)
	return nil
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kernel := fs.String("kernel", "", "guest kernel: an ELF vmlinux with a PVH note, or a bzImage (required)")
	initramfs := fs.String("initramfs", "", "initramfs (cpio) to pass to the guest")
	kernelFD := fs.Int("kernel-fd", -1, "read the guest kernel from this inherited descriptor instead of --kernel (a regular file; warren-hostd opens a template's kernel itself)")
	initramfsFD := fs.Int("initramfs-fd", -1, "read the initramfs from this inherited descriptor instead of --initramfs")
	memMiB := fs.Int("mem", 256, "guest memory in MiB")
	cpus := fs.Int("cpus", 1, "number of vCPUs")
	cmdline := fs.String("cmdline", "", "extra kernel command-line arguments")
	console := fs.String("console", "", "write the guest console to FILE instead of stdout")
	kvmPath := fs.String("kvm", "/dev/kvm", "KVM device")
	verbose := fs.Bool("v", false, "log VMM diagnostics to stderr")
	noRNG := fs.Bool("no-rng", false, "do not give the guest a virtio-rng entropy device")
	var disks diskFlag
	fs.Var(&disks, "disk", "attach a raw disk image as virtio-blk: PATH[,ro] (repeatable; the first is /dev/vda)")
	tap := fs.String("tap", "", "attach virtio-net on this tap device (created if missing)")
	macFlag := fs.String("mac", "", "guest MAC address for --tap (default: random, locally administered)")
	vsockPath := fs.String("vsock", "", "attach virtio-vsock; the host reaches the guest through this unix socket (CONNECT <port>), and the agent answers warren exec/cp/health on it")
	cid := fs.Uint64("cid", 3, "the guest's vsock context ID, with --vsock")
	api := fs.String("api", "", "serve the VM's control API (pause, resume, snapshot) on this unix socket; turns on dirty-page tracking")
	nf := addNetFlags(fs)
	privateNet := fs.Bool("private-net", false, "with --tap: put the tap and its egress services in a network namespace of this VMM's own (upstream traffic of the resolver and proxy still leaves through the host's); recorded in snapshots, so restores and forks get their own too")
	jailFlag := fs.String("jail", "", "after setup, harden the VMM process: strict or vmm (seccomp allowlist, capabilities dropped, no_new_privs; see vmmproc/jail); vmm when --api may fork")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "warren run: unexpected arguments %q\n", fs.Args())
		return 2
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "warren run: "+format+"\n", a...)
		return 1
	}
	if *kernel == "" && *kernelFD < 0 {
		return fail("--kernel or --kernel-fd is required")
	}
	js, err := vmmproc.ParseJail(*jailFlag)
	if err != nil {
		return fail("%v", err)
	}
	if *memMiB <= 0 {
		return fail("--mem must be a positive number of MiB, got %d", *memMiB)
	}
	k, err := readBootFile("kernel", *kernel, *kernelFD)
	if err != nil {
		return fail("%v", err)
	}
	rd, err := readBootFile("initramfs", *initramfs, *initramfsFD)
	if err != nil {
		return fail("%v", err)
	}
	out, closeOut, err := vmmproc.OpenConsole(*console, stdout)
	if err != nil {
		return fail("%v", err)
	}
	defer closeOut()
	log := vmmproc.NewLogger(stderr, *verbose)
	mac, err := vmmproc.ParseMAC(*macFlag)
	if err != nil {
		return fail("%v", err)
	}
	if *macFlag != "" && *tap == "" {
		return fail("--mac needs --tap")
	}
	eg, netCmdline, err := nf.options(*tap)
	if err != nil {
		return fail("%v", err)
	}
	if netCmdline != "" {
		*cmdline = strings.TrimSpace(netCmdline + " " + *cmdline)
	}
	err = vmmproc.Run(vmmproc.Spec{
		MemMiB: *memMiB, CPUs: *cpus, Kernel: k, Initramfs: rd, Cmdline: *cmdline, Egress: eg,
		Console: out, KVMPath: *kvmPath, Log: log, RNG: !*noRNG,
		Disks: disks, Tap: *tap, MAC: mac, Vsock: *vsockPath, CID: *cid,
		API: *api, PrivateNet: *privateNet, Jail: js,
	}, stdin)
	if err != nil {
		return fail("%v", err)
	}
	return 0
}

// readBootFile reads a kernel or initramfs (what) from the file at path
// or, when fd is not negative, from the inherited descriptor fd (a
// regular file, closed once read: a forked child of the VMM must not
// inherit it); neither gives nil. Both at once is an error.
func readBootFile(what, path string, fd int) ([]byte, error) {
	switch {
	case fd < 0 && path == "":
		return nil, nil
	case fd < 0:
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", what, err)
		}
		return b, nil
	case path != "":
		return nil, fmt.Errorf("--%s and --%s-fd: give one", what, what)
	case fd < 3:
		return nil, fmt.Errorf("--%s-fd %d: not an inherited descriptor (3 or more)", what, fd)
	}
	f := os.NewFile(uintptr(fd), what)
	if f == nil {
		return nil, fmt.Errorf("--%s-fd %d: not open", what, fd)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("--%s-fd %d: %w", what, fd, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("--%s-fd %d: not a regular file (%s)", what, fd, fi.Mode().Type())
	}
	if fi.Size() > maxBootFile {
		return nil, fmt.Errorf("--%s-fd %d: %d bytes, more than %d", what, fd, fi.Size(), maxBootFile)
	}
	// ReadAt from 0: the descriptor's offset is shared with the daemon's.
	b := make([]byte, fi.Size())
	if _, err := f.ReadAt(b, 0); err != nil && !(errors.Is(err, io.EOF) && fi.Size() == 0) {
		return nil, fmt.Errorf("read %s from descriptor %d: %w", what, fd, err)
	}
	return b, nil
}

// maxBootFile bounds a kernel or initramfs read from a descriptor.
const maxBootFile = 1 << 30

// jailInitCmd is `warren jail-init [--report-fd N] [--pass-fds N]
// [--cgroup DIR]... [--net-helper] [--spawn [--cgroup-root DIR]...] --
// COMMAND...`: vmmproc/jail.RunInit with the family's helper
// (familyhelper.go).
func jailInitCmd(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren "+jail.InitVerb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fd := fs.Int("report-fd", -1, "unix socket to report the command's pid on (SCM_CREDENTIALS)")
	pass := fs.Int("pass-fds", 0, "pass descriptors 4 to 3+N on to the command at the same numbers (the daemon's files for the VMM)")
	netHelper := fs.Bool("net-helper", false, "serve the VMM family's private networks (a network VMM that leaves root asks for them: nethelper.go)")
	spawn := fs.Bool("spawn", false, "start the VMM family's fork children under warren-hostd's grants (vmmproc/jail.Spawner), whose key comes first on the report socket")
	var cgroups, cgroupRoots stringsFlag
	fs.Var(&cgroups, "cgroup", "join this cgroup directory before starting the command, which is then born in it (repeatable: one per v1 hierarchy)")
	fs.Var(&cgroupRoots, "cgroup-root", "with --spawn: the directory fork children's cgroups are under (repeatable: one per v1 hierarchy)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := cgroup.JoinSelf(cgroups); err != nil {
		fmt.Fprintf(stderr, "warren %s: %v\n", jail.InitVerb, err)
		return 1
	}
	if *pass < 0 || *pass > 64 {
		fmt.Fprintf(stderr, "warren %s: --pass-fds %d: want 0 to 64\n", jail.InitVerb, *pass)
		return 2
	}
	var fds []int
	for i := range *pass {
		fds = append(fds, 4+i)
	}
	code, err := vmmproc.JailInit(vmmproc.InitSpec{ReportFD: *fd, PassFDs: fds, NetHelper: *netHelper,
		Spawn: *spawn, CgroupRoots: cgroupRoots, Command: fs.Args()})
	if err != nil {
		fmt.Fprintf(stderr, "warren %s: %v\n", jail.InitVerb, err)
	}
	return code
}
