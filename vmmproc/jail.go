package vmmproc

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/warrenvm/warren/vmm/guestmem"
	"github.com/warrenvm/warren/vmmctl"
	"github.com/warrenvm/warren/vmmproc/jail"
	"golang.org/x/sys/unix"
)

// The VMM jail (`--jail strict|vmm[,log|,kill]` on `warren run` and
// `warren restore`; a fork child inherits its parent's): once the VM is
// built, its devices, disks, tap and egress attached and its sockets
// listening, and right before the vCPUs run, the VMM hardens itself with
// vmmproc/jail.Enter: private mounts (only in a mount namespace of its own,
// as the daemon starts it), every capability dropped but those its fork
// children need (CAP_NET_ADMIN and CAP_SYS_ADMIN with a tap, under
// ProfileVMM, unless the family's helper makes their networks:
// nethelper.go), no_new_privs, and the seccomp allowlist on all threads.
//
// Profiles: "strict" (jail.ProfileStrict) for a VMM that never starts a
// process; "vmm" (jail.ProfileVMM) for one whose control API may fork
// (POST /v1/fork starts `warren fork-child` processes, which do their
// setup under the inherited filter). Under warren-hostd, whose VMMs'
// jail-init starts their fork children (familyhelper.go), "vmm" leaves
// out every process-making call (jail.Options.Spawned). A VMM whose --api serves forks needs
// "vmm": under "strict" a fork fails with EPERM. The daemon passes "vmm"
// by default. The suffix ",log" logs (SECCOMP_RET_LOG) instead of refusing
// what the table lacks, to find missing syscalls (dmesg | grep type=1326);
// ",kill" kills the process instead.

// The daemon confines a VMM further with options after the profile and
// mode, comma-separated (paths may hold neither ',' nor ':'):
//
//	root=DIR             pivot_root into a jail on DIR (jail.PivotRoot)
//	user=UID:GID         then leave root for this uid and gid (no capability kept)
//	groups=G1:G2...      with these supplementary groups (after user=; a
//	                     fork child's ancestors', for their disk layers)
//	bind=PATH[:rw][:exec] a path visible in the jail, at the same path
//	dev=kvm|tun|null     a device node made in the jail, owned by the user
//
// A fork child inherits them all (its parent's mount namespace, root, uid
// and filter; one its jail-init started gets its uid from the daemon's
// grant and installs the filter itself): the spec it is given carries the
// profile and mode only.

// JailSpec is a parsed --jail value; the zero value is no jail.
type JailSpec struct {
	profile jail.Profile
	mode    jail.Mode
	root    *jail.RootOptions
	user    *jail.User
}

func (j JailSpec) on() bool { return j.profile != 0 }

// String gives the flag's value back (for a fork child's spec).
func (j JailSpec) String() string {
	if !j.on() {
		return ""
	}
	s := j.profile.String()
	if j.mode != jail.ModeErrno {
		s += "," + j.mode.String()
	}
	return s
}

// ParseJail parses a --jail value (vmmctl.ParseJail: "" / "off",
// "strict" or "vmm", optionally followed by ",errno", ",log" or ",kill",
// then by the confinement options above) into the jail the process
// enters.
func ParseJail(v string) (JailSpec, error) {
	c, err := vmmctl.ParseJail(v)
	if err != nil {
		return JailSpec{}, err
	}
	return jailSpecOf(c), nil
}

// jailSpecOf is the jail of the checked contract value c.
func jailSpecOf(c vmmctl.Jail) JailSpec {
	var j JailSpec
	switch c.Profile {
	case "":
		return j
	case "strict":
		j.profile = jail.ProfileStrict
	case "vmm":
		j.profile = jail.ProfileVMM
	}
	switch c.Mode {
	case "", "errno":
		j.mode = jail.ModeErrno
	case "log":
		j.mode = jail.ModeLog
	case "kill":
		j.mode = jail.ModeKill
	}
	if c.UID != 0 {
		j.user = &jail.User{UID: c.UID, GID: c.GID, Groups: c.Groups}
	}
	if c.Root != "" {
		j.root = &jail.RootOptions{Dir: c.Root, Owner: j.user}
		for _, b := range c.Binds {
			j.root.Binds = append(j.root.Binds, jail.Bind{Path: b.Path, Writable: b.Writable, Exec: b.Exec})
		}
		for _, d := range c.Devices {
			j.root.Devices = append(j.root.Devices, map[string]jail.Device{"kvm": jail.DevKVM, "tun": jail.DevTun, "null": jail.DevNull}[d])
		}
	}
	return j
}

// jailConfig is the jail.Config for the VM of o under j.
func jailConfig(j JailSpec, o *vmOptions) jail.Config {
	cfg := jail.Config{Profile: j.profile, Seccomp: jail.Options{Mode: j.mode}, Root: j.root, User: j.user}
	if o != nil && o.egress != nil {
		cfg.Seccomp.BPFMaps = true
	}
	var p *process
	if o != nil {
		p = o.proc
	}
	if o != nil && o.tap != "" && p.helperConn() != nil && o.privateNet {
		// Its network and its fork children's come from the family's
		// helper (nethelper.go): nothing to keep for them, but on older
		// kernels the filter's maps answer only to CAP_BPF.
		if o.egress != nil && jail.BPFNeedsCap() {
			cfg.KeepCaps = []uintptr{unix.CAP_BPF}
		}
	} else if o != nil && o.tap != "" && j.profile == jail.ProfileVMM && j.user == nil {
		// A fork child creates its own tap (CAP_NET_ADMIN), maybe in a
		// new network namespace (CAP_SYS_ADMIN): capabilities dropped
		// here would be gone for it too.
		cfg.KeepCaps = []uintptr{unix.CAP_NET_ADMIN, unix.CAP_SYS_ADMIN}
		// A private-network fork child makes its namespace (unshare)
		// and loads its own egress filter under the inherited filter,
		// and its resolver and proxy bind ports 53, 80 and 443.
		cfg.Seccomp.NetworkFork = o.privateNet
		if o.privateNet && o.egress != nil {
			cfg.KeepCaps = append(cfg.KeepCaps, unix.CAP_NET_BIND_SERVICE)
		}
	}
	// Its fork children are started by its jail-init (familyhelper.go):
	// it makes no process itself.
	cfg.Seccomp.Spawned = p.spawnsViaHelper()
	if ownMountNS(p) {
		cfg.Mounts = &jail.MountOptions{}
	} else {
		cfg.Root = nil // only in a mount namespace of its own
	}
	if p.isForkChild() {
		cfg.Root, cfg.User = nil, nil // inherited
	}
	return cfg
}

// ownMountNS reports whether this process is in a mount namespace that
// is not its parent's (CLONE_NEWNS) or that its parent, jail-init (as the
// daemon starts every jailed VMM), made for it (jail.InitEnv, checked by
// jail.RunInit): only then are its mounts made private and may it
// pivot_root (in the parent's namespace that would change the parent's
// mounts, maybe the host's). A fork child is in its parent's namespace,
// which was made private already, and cannot call mount under the
// inherited filter anyway.
func ownMountNS(p *process) bool {
	if p.isForkChild() {
		return false
	}
	if os.Getenv(jail.InitEnv) == "1" && os.Getppid() == 1 {
		return true
	}
	self, err1 := os.Readlink("/proc/self/ns/mnt")
	parent, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid()))
	return err1 == nil && err2 == nil && self != parent
}

// enterJail hardens this VMM process (see above); a no-op for the zero
// spec. It is called after the VM's setup, right before runForeground.
func enterJail(j JailSpec, o *vmOptions, log *slog.Logger) error {
	if !j.on() {
		return nil
	}
	cfg := jailConfig(j, o)
	p := o.proc
	if cfg.Root != nil {
		// Fork children are started from this binary by the path it
		// has now (bound into the jail at the same path).
		p.fixExecutable()
	}
	if cfg.User != nil || p.isForkChild() {
		// Leaving root makes the process non-dumpable: its own
		// /proc/self/pagemap (for forks) then no longer opens.
		if err := guestmem.KeepPagemap(); err != nil {
			return fmt.Errorf("jail (%s): %w", j, err)
		}
	}
	if p.isForkChild() {
		if err := enterInherited(cfg); err != nil {
			return fmt.Errorf("jail (%s): %w", j, err)
		}
	} else if err := jail.Enter(cfg); err != nil {
		return fmt.Errorf("jail (%s): %w", j, err)
	}
	p.setJail(j)
	if log != nil {
		log.Debug("jailed", "profile", j.profile.String(), "mode", j.mode.String(), "keep_caps", len(cfg.KeepCaps), "private_mounts", cfg.Mounts != nil)
	}
	return nil
}

// enterInherited is Enter for a fork child, born of a jailed parent: its
// capabilities are the parent's (dropping again needs CAP_SETPCAP, which
// the parent dropped: so only when it has more than cfg keeps),
// no_new_privs is inherited, and so is the parent's filter, the same
// profile: it is installed only when the process has none, since every
// generation of forks would otherwise stack another copy (each one run on
// every syscall, and the kernel bounds their total length).
func enterInherited(cfg jail.Config) error {
	st, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err
	}
	field := func(name string) string {
		for _, l := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(l, name+":"); ok {
				return strings.TrimSpace(v)
			}
		}
		return ""
	}
	mask := jail.CapMask(cfg.KeepCaps)
	for _, set := range []string{"CapBnd", "CapPrm", "CapEff", "CapAmb"} {
		v, err := strconv.ParseUint(field(set), 16, 64)
		if err != nil || v&^mask != 0 {
			if err := jail.DropCapabilities(cfg.KeepCaps); err != nil {
				return err
			}
			break
		}
	}
	if field("NoNewPrivs") != "1" {
		if err := jail.SetNoNewPrivs(); err != nil {
			return err
		}
	}
	if field("Seccomp") == "2" {
		return nil
	}
	return jail.Install(cfg.Profile, cfg.Seccomp)
}
