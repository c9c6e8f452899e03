// Package cli is the warren command's flag parsing and wiring; behaviour
// lives in the vmm packages.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/warrenvm/warren/hostd/cgroup"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmmproc/jail"
)

const usage = `VM-level commands (warren [vm] <command> [flags]):
  run      boot a microVM and stream its console until it powers off
  exec     run a command in a VM's guest: warren exec VM -- PROGRAM [ARGS...]
  cp       copy a file into or out of a VM: warren cp SRC DST (VM:/path on one side)
  health   show a VM's guest agent health: warren health VM
  pause    pause a running VM: warren pause API
  resume   resume a paused VM: warren resume API
  snapshot snapshot a running VM: warren snapshot [--incremental] [--every D --max-chain N] API DIR/NAME
  restore  run a VM from a snapshot: warren restore [--lazy] [--api PATH] [--vsock PATH] [--console FILE] DIR/NAME
  fork     make running copy-on-write children of a VM: warren fork [-n N] API
  flatten  write a fork's disk overlay and the images under it as one raw image: warren flatten OVERLAY OUT
  rollback put a running VM back to one of its snapshots in place: warren rollback API DIR/NAME
  compact  merge a snapshot's memory chain into a new full snapshot: warren compact DIR/NAME DIR/NEW

VM is the path of the VM's vsock unix socket (warren run --vsock PATH); API the
path of its control socket (warren run --api PATH).
`

// Main runs the warren command with args (without the program name) and
// returns the process exit code. stdin feeds the guest's serial console.
// The sandbox verbs talk to warren-hostd (daemon.go); the VM-level verbs
// of the same names run when their target is a VM's socket path.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, daemonUsage+usage)
		return 2
	}
	if code, ok := daemonMain(args, stdin, stdout, stderr); ok {
		return code
	}
	return vmMain(args, stdin, stdout, stderr)
}

// vmMain runs the VM-level verbs (`warren vm VERB ...`).
func vmMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	switch args[0] {
	case "run":
		return run(args[1:], stdin, stdout, stderr)
	case "exec":
		return execCmd(args[1:], stdin, stdout, stderr)
	case "cp":
		return cpCmd(args[1:], stdin, stdout, stderr)
	case "health":
		return healthCmd(args[1:], stdout, stderr)
	case "pause", "resume":
		return pauseCmd(args[0], args[1:], stdout, stderr)
	case "snapshot":
		return snapshotCmd(args[1:], stdout, stderr)
	case "restore":
		return restoreCmd(args[1:], stdin, stdout, stderr)
	case "fork":
		return forkCmd(args[1:], stdout, stderr)
	case "fork-child":
		return forkChildCmd(args[1:], stdout, stderr)
	case jail.InitVerb:
		// pid 1 of a jailed VMM's pid namespace (warren-hostd --jail)
		return jailInitCmd(args[1:], stderr)
	case jail.SpawnVerb:
		// a fork child on its way from jail-init's helper (vmmproc/jail.Spawner)
		return jail.RunSpawn(args[1:], stderr)
	case "flatten":
		return flattenCmd(args[1:], stdout, stderr)
	case "rollback":
		return rollbackCmd(args[1:], stdout, stderr)
	case "egress":
		return egressCmd(args[1:], stdout, stderr)
	case "compact":
		return compactCmd(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "warren: unknown command %q\n%s", args[0], usage)
		return 2
	}
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
	js, err := parseJail(*jailFlag)
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
	out, closeOut, err := openConsole(*console, stdout)
	if err != nil {
		return fail("%v", err)
	}
	defer closeOut()
	log := newLogger(stderr, *verbose)
	mac, err := parseMAC(*macFlag)
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
	o := vmOptions{
		memMiB: *memMiB, cpus: *cpus, kernel: k, initramfs: rd, cmdline: *cmdline, egress: eg,
		console: out, kvmPath: *kvmPath, log: log, rng: !*noRNG,
		disks: disks, tap: *tap, mac: mac, vsock: *vsockPath, cid: *cid,
		trackDirty: *api != "", privateNet: *privateNet,
	}
	b, err := build(o)
	if err != nil {
		return fail("%v", err)
	}
	defer b.close()
	if *api != "" {
		stopAPI, err := startAPI(*api, b, o, log, "", "")
		if err != nil {
			return fail("%v", err)
		}
		defer stopAPI()
	}
	if err := enterJail(js, &o, log); err != nil {
		return fail("%v", err)
	}
	return runForeground(b.vm, stdin, fail)
}

// maxBootFile bounds a kernel or initramfs read from a descriptor.
const maxBootFile = 1 << 30

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

// runForeground feeds stdin to the guest's console and runs vm until it
// powers off (0), fails or is interrupted (fail's code).
func runForeground(vm *vmm.VM, stdin io.Reader, fail func(string, ...any) int) int {
	// The console's input: what arrives on stdin goes to the guest's COM1
	// (as with QEMU's -serial stdio). A terminal stays in its normal mode,
	// so lines are sent on Enter and Ctrl-C still stops warren.
	if stdin != nil {
		go func() {
			buf := make([]byte, 4096)
			for {
				n, err := stdin.Read(buf)
				if n > 0 {
					vm.SerialInput(buf[:n])
				}
				if err != nil {
					return
				}
			}
		}()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := vm.Run(ctx); err != nil {
		if errors.Is(err, context.Canceled) {
			return fail("interrupted")
		}
		return fail("%v", err)
	}
	return 0
}

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
	o := jail.InitOptions{ReportFD: *fd, PassFDs: fds}
	devNet := -1
	if *netHelper {
		var err error
		if devNet, err = openDevNet(); err != nil {
			fmt.Fprintf(stderr, "warren %s: %v\n", jail.InitVerb, err)
			return 1
		}
	}
	if *spawn {
		key, err := jail.ReceiveGrantKey(*fd, 2*time.Minute)
		if err == nil {
			o.Spawner, err = jail.NewSpawner(key, cgroupRoots)
		}
		if err != nil {
			fmt.Fprintf(stderr, "warren %s: %v\n", jail.InitVerb, err)
			return 1
		}
	}
	if devNet >= 0 || o.Spawner != nil {
		o.Helper = newFamilyHelper(devNet, o.Spawner)
	}
	return jail.RunInitWith(fs.Args(), o)
}
