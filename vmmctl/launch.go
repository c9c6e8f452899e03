package vmmctl

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/warrenvm/warren/memsnap/vmsnap"
)

// Launch is what warren-hostd asks a VMM process to be: a VM booted from
// a kernel (Run: `warren run`) or one restored from a snapshot (Restore:
// `warren restore`); exactly one is set. Args encodes it as the warren
// binary's command line, and the binary decodes that with vmmproc's
// ParseRunArgs and ParseRestoreArgs back into the same Run or Restore
// (the round trip is tested there). It holds what the daemon passes and
// nothing else: the flags only a person gives (--kvm, -v, --mac, ...)
// are the CLI's.
type Launch struct {
	Run     *Run
	Restore *Restore
}

// Run is `warren run`: the VM of a template's build.
type Run struct {
	// KernelFD is the inherited descriptor the guest kernel is read from
	// (--kernel-fd: 3 or more, required); InitramfsFD, when not 0, the
	// initramfs's (--initramfs-fd). The daemon opens the files itself
	// and passes them (hostd/daemon's LaunchSpec.ExtraFiles).
	KernelFD, InitramfsFD int
	// MemMiB is the guest's memory and CPUs its vCPUs (--mem, --cpus:
	// both required, positive).
	MemMiB, CPUs int
	// Cmdline is the extra kernel command line (--cmdline).
	Cmdline string
	// Disks are the virtio-blk disks in order (--disk PATH[,ro]): the
	// first is /dev/vda.
	Disks []Disk
	// Vsock, API and Console are the vsock unix socket, the control API's
	// unix socket and the console file (--vsock, --api, --console).
	Vsock, API, Console string
	// Tap attaches virtio-net on this tap device (--tap); PrivateNet puts
	// it and its egress services in a network namespace of the VMM's own
	// (--private-net); HostIP is the tap's host address with its prefix
	// (10.200.0.1/24) and GuestIP the guest's (--host-ip, --guest-ip).
	Tap        string
	PrivateNet bool
	HostIP     string
	GuestIP    string
	// Egress is the egress policy file (--egress; it needs HostIP), and
	// the others its settings: the audit log, the resolver's fixed
	// addresses, the DNS upstream (ip:port), the proxy's upstream roots,
	// the upstream addresses allowed although private (comma-separated)
	// and whether wildcard credential hosts are allowed (--audit,
	// --hosts, --dns-upstream, --upstream-ca, --upstream-allow,
	// --allow-wildcard-credentials).
	Egress              string
	Audit               string
	Hosts               string
	DNSUpstream         string
	UpstreamCA          string
	UpstreamAllow       string
	WildcardCredentials bool
	// Balloon attaches a memory balloon with free page reporting
	// (--balloon): the guest gives the memory it frees back to the host,
	// and the control API sets its target (GET and PUT /v1/balloon). A
	// restore keeps the snapshot's.
	Balloon bool
	// Jail is the --jail value (Jail.Encode writes it, ParseJail and
	// vmmproc.ParseJail read it); empty: none.
	Jail string
}

// Disk is one disk of a Run.
type Disk struct {
	// Path is the disk's image (a raw image or a cow/disk overlay).
	Path string
	// ReadOnly attaches it read-only (and not through cow/disk).
	ReadOnly bool
}

// String is d as --disk spells it: PATH, or PATH,ro.
func (d Disk) String() string {
	if d.ReadOnly {
		return d.Path + ",ro"
	}
	return d.Path
}

// ParseDisk reads PATH[,ro|,rw] (--disk, and a template's disk names).
func ParseDisk(v string) (Disk, error) {
	parts := strings.Split(v, ",")
	d := Disk{Path: parts[0]}
	if d.Path == "" {
		return d, errors.New("empty disk path")
	}
	for _, opt := range parts[1:] {
		switch opt {
		case "ro":
			d.ReadOnly = true
		case "rw":
			d.ReadOnly = false
		default:
			return d, fmt.Errorf("unknown disk option %q (want ro or rw)", opt)
		}
	}
	return d, nil
}

// Restore is `warren restore`: a sandbox's VM from a snapshot.
type Restore struct {
	// Snapshot is the snapshot's DIR/NAME (required).
	Snapshot string
	// Lazy maps its memory copy-on-write (--lazy: vmsnap.Mmap) instead of
	// reading it all first. LazyMode, when set, names the memory mode
	// instead (--lazy=MODE: vmsnap.Eager, Mmap or Uffd); give one of the
	// two. Mode says which applies.
	Lazy     bool
	LazyMode vmsnap.MemoryMode
	// RecordWorkingSet, with the Uffd mode, records the pages the guest
	// touches first, which the control API's POST /v1/working-set/save
	// writes to this file (--record-working-set). Prefetch, with the Uffd
	// mode, is a working set the VMM prefetches while the guest runs
	// (--prefetch; a missing, stale or corrupt one is logged and ignored).
	RecordWorkingSet, Prefetch string
	// API, Vsock and Console are the control API's unix socket, the
	// vsock socket replacing the snapshotted VM's, and the console file
	// (--api, --vsock, --console).
	API, Vsock, Console string
	// Egress, Secrets and Audit replace the snapshot's egress policy
	// file, the credential proxy's secrets file and the audit log
	// (--egress, --secrets, --audit); empty: the snapshot's.
	Egress, Secrets, Audit string
	// DiskPaths opens the snapshot's writable disk I at DiskPaths[I]
	// (--disk-path I=PATH), typically a cow/disk overlay.
	DiskPaths map[int]string
	// Jail is the --jail value (Jail.Encode writes it, ParseJail and
	// vmmproc.ParseJail read it); empty: none.
	Jail string
}

// Mode is r's memory mode: LazyMode when set, else vmsnap.Mmap with Lazy,
// else vmsnap.Eager.
func (r *Restore) Mode() vmsnap.MemoryMode {
	switch {
	case r.LazyMode != "":
		return r.LazyMode
	case r.Lazy:
		return vmsnap.Mmap
	}
	return vmsnap.Eager
}

// Verb is the warren subcommand l runs: "run" or "restore" ("" when
// neither or both are set).
func (l Launch) Verb() string {
	switch {
	case l.Run != nil && l.Restore == nil:
		return "run"
	case l.Restore != nil && l.Run == nil:
		return "restore"
	}
	return ""
}

// WithJail returns l with its --jail value set to v; l's own Run or
// Restore is not changed (the copy's is a new one).
func (l Launch) WithJail(v string) Launch {
	if l.Run != nil {
		r := *l.Run
		r.Jail, l.Run = v, &r
	}
	if l.Restore != nil {
		r := *l.Restore
		r.Jail, l.Restore = v, &r
	}
	return l
}

// Args checks l and encodes it as warren's arguments, the subcommand
// first (`run ...` or `restore ... SNAPSHOT`).
func (l Launch) Args() ([]string, error) {
	switch l.Verb() {
	case "run":
		return l.Run.args()
	case "restore":
		return l.Restore.args()
	}
	return nil, errors.New("launch: want exactly one of run and restore")
}

// args checks r and encodes it.
func (r *Run) args() ([]string, error) {
	e := encoder{verb: "run", args: []string{"run"}}
	if r.KernelFD < 3 {
		e.fail("kernel descriptor %d: want an inherited one (3 or more)", r.KernelFD)
	}
	if r.InitramfsFD != 0 && r.InitramfsFD < 3 {
		e.fail("initramfs descriptor %d: want an inherited one (3 or more), or 0 for none", r.InitramfsFD)
	}
	if r.MemMiB <= 0 || r.CPUs <= 0 {
		e.fail("memory %d MiB, %d vCPUs: want both positive", r.MemMiB, r.CPUs)
	}
	e.int("--kernel-fd", r.KernelFD)
	if r.InitramfsFD != 0 {
		e.int("--initramfs-fd", r.InitramfsFD)
	}
	e.int("--mem", r.MemMiB)
	e.int("--cpus", r.CPUs)
	e.str("--cmdline", r.Cmdline)
	for i, d := range r.Disks {
		if d.Path == "" || strings.Contains(d.Path, ",") {
			e.fail("disk %d: path %q: want one without a comma", i, d.Path)
		}
		e.abs("--disk", d.Path)
		e.str("--disk", d.String())
	}
	e.path("--vsock", r.Vsock)
	e.path("--api", r.API)
	e.path("--console", r.Console)
	e.flag("--private-net", r.PrivateNet)
	e.str("--tap", r.Tap)
	// Each address needs the setting before it, and must parse.
	for _, a := range []struct {
		flag, v, what, need, needWhat, want string
		parse                               func(string) error
	}{
		{"--host-ip", r.HostIP, "host address", r.Tap, "a tap", "an address with a prefix length",
			func(v string) error { _, err := netip.ParsePrefix(v); return err }},
		{"--guest-ip", r.GuestIP, "guest address", r.HostIP, "a host address", "an address",
			func(v string) error { _, err := netip.ParseAddr(v); return err }},
	} {
		if a.v != "" {
			if a.need == "" {
				e.fail("a %s without %s", a.what, a.needWhat)
			}
			if a.parse(a.v) != nil {
				e.fail("%s %q: want %s", a.what, a.v, a.want)
			}
		}
		e.str(a.flag, a.v)
	}
	if r.PrivateNet && r.Tap == "" {
		e.fail("a private network without a tap")
	}
	if r.Egress == "" && (r.Audit != "" || r.Hosts != "" || r.DNSUpstream != "" || r.UpstreamCA != "" || r.UpstreamAllow != "" || r.WildcardCredentials) {
		e.fail("egress settings without an egress policy")
	}
	if r.Egress != "" && r.HostIP == "" {
		e.fail("an egress policy without a host address")
	}
	e.path("--egress", r.Egress)
	e.path("--audit", r.Audit)
	e.path("--hosts", r.Hosts)
	e.str("--dns-upstream", r.DNSUpstream)
	e.path("--upstream-ca", r.UpstreamCA)
	e.str("--upstream-allow", r.UpstreamAllow)
	e.flag("--allow-wildcard-credentials", r.WildcardCredentials)
	e.flag("--balloon", r.Balloon)
	e.str("--jail", r.Jail)
	return e.done()
}

// args checks r and encodes it.
func (r *Restore) args() ([]string, error) {
	e := encoder{verb: "restore", args: []string{"restore"}}
	switch {
	case r.LazyMode != "" && r.Lazy:
		e.fail("lazy and memory mode %q: give one", r.LazyMode)
	case r.LazyMode != "":
		if _, err := vmsnap.ParseMemoryMode(string(r.LazyMode)); err != nil {
			e.fail("%v", err)
		}
		// One argument: --lazy alone is a boolean flag.
		e.args = append(e.args, "--lazy="+string(r.LazyMode))
	default:
		e.flag("--lazy", r.Lazy)
	}
	if (r.RecordWorkingSet != "" || r.Prefetch != "") && r.Mode() != vmsnap.Uffd {
		e.fail("a working set to record or prefetch needs the uffd memory mode, not %s", r.Mode())
	}
	e.path("--record-working-set", r.RecordWorkingSet)
	e.path("--prefetch", r.Prefetch)
	e.path("--api", r.API)
	e.path("--vsock", r.Vsock)
	e.path("--console", r.Console)
	e.path("--egress", r.Egress)
	e.path("--secrets", r.Secrets)
	e.path("--audit", r.Audit)
	for _, i := range slices.Sorted(maps.Keys(r.DiskPaths)) {
		if i < 0 {
			e.fail("disk %d: want an index from 0", i)
		}
		p := r.DiskPaths[i]
		if p == "" {
			e.fail("disk %d: no path", i)
		}
		e.abs("--disk-path", p)
		e.str("--disk-path", strconv.Itoa(i)+"="+p)
	}
	e.str("--jail", r.Jail)
	if r.Snapshot == "" {
		e.fail("no snapshot")
	}
	e.abs("snapshot", r.Snapshot)
	e.str("", r.Snapshot)
	return e.done()
}

// encoder appends flags to args and keeps the first error.
type encoder struct {
	verb string
	args []string
	err  error
}

func (e *encoder) fail(format string, a ...any) {
	if e.err == nil {
		e.err = fmt.Errorf("launch %s: "+format, append([]any{e.verb}, a...)...)
	}
}

// str appends name v when v is set; an empty name appends v alone (an
// operand).
func (e *encoder) str(name, v string) {
	if v == "" {
		return
	}
	if strings.ContainsRune(v, 0) {
		e.fail("%s %q: a NUL byte", name, v)
	}
	if name != "" {
		e.args = append(e.args, name)
	}
	e.args = append(e.args, v)
}

// abs checks that the path v (what) is absolute when set: it then
// never reads as a flag either.
func (e *encoder) abs(what, v string) {
	if v != "" && !filepath.IsAbs(v) {
		e.fail("%s %q: want an absolute path", what, v)
	}
}

// path is str for a path, which must be absolute.
func (e *encoder) path(name, v string) {
	e.abs(name, v)
	e.str(name, v)
}

func (e *encoder) int(name string, v int) { e.args = append(e.args, name, strconv.Itoa(v)) }

func (e *encoder) flag(name string, on bool) {
	if on {
		e.args = append(e.args, name)
	}
}

func (e *encoder) done() ([]string, error) {
	if e.err != nil {
		return nil, e.err
	}
	return e.args, nil
}
