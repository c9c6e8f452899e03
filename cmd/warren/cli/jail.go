package cli

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/warrenvm/warren/hostd/jail"
	"golang.org/x/sys/unix"
)

// The VMM jail (`--jail strict|vmm[,log|,kill]` on `warren run` and
// `warren restore`; a fork child inherits its parent's): once the VM is
// built, its devices, disks, tap and egress attached and its sockets
// listening, and right before the vCPUs run, the VMM hardens itself with
// hostd/jail.Enter: private mounts (only in a mount namespace of its own,
// as the daemon starts it), every capability dropped but those its fork
// children need (CAP_NET_ADMIN and CAP_SYS_ADMIN with a tap, under
// ProfileVMM), no_new_privs, and the seccomp allowlist on all threads.
//
// Profiles: "strict" (jail.ProfileStrict) for a VMM that never starts a
// process; "vmm" (jail.ProfileVMM) for one whose control API may fork
// (POST /v1/fork starts `warren fork-child` processes, which do their
// setup under the inherited filter). A VMM whose --api serves forks needs
// "vmm": under "strict" a fork fails with EPERM. The daemon passes "vmm"
// by default. The suffix ",log" logs (SECCOMP_RET_LOG) instead of refusing
// what the table lacks, to find missing syscalls (dmesg | grep type=1326);
// ",kill" kills the process instead.

// jailSpec is a parsed --jail value; the zero value is no jail.
type jailSpec struct {
	profile jail.Profile
	mode    jail.Mode
}

func (j jailSpec) on() bool { return j.profile != 0 }

// String gives the flag's value back (for a fork child's spec).
func (j jailSpec) String() string {
	if !j.on() {
		return ""
	}
	s := j.profile.String()
	if j.mode != jail.ModeErrno {
		s += "," + j.mode.String()
	}
	return s
}

// parseJail parses "" / "off", "strict" or "vmm", optionally followed by
// ",errno", ",log" or ",kill".
func parseJail(v string) (jailSpec, error) {
	prof, mode, _ := strings.Cut(strings.TrimSpace(v), ",")
	var j jailSpec
	switch prof {
	case "", "off", "none":
		if mode != "" {
			return j, fmt.Errorf("--jail %q: a mode without a profile", v)
		}
		return j, nil
	case "strict":
		j.profile = jail.ProfileStrict
	case "vmm":
		j.profile = jail.ProfileVMM
	default:
		return j, fmt.Errorf("--jail %q: want strict or vmm (optionally ,log or ,kill)", v)
	}
	switch mode {
	case "", "errno":
		j.mode = jail.ModeErrno
	case "log":
		j.mode = jail.ModeLog
	case "kill":
		j.mode = jail.ModeKill
	default:
		return j, fmt.Errorf("--jail %q: mode %q: want errno, log or kill", v, mode)
	}
	return j, nil
}

// activeJail is the jail this process entered: fork children are started
// with it (they are born under its filter and harden themselves the same
// way after their own setup).
var activeJail struct {
	sync.Mutex
	spec jailSpec
}

func currentJail() string {
	activeJail.Lock()
	defer activeJail.Unlock()
	return activeJail.spec.String()
}

// jailConfig is the jail.Config for the VM of o under j.
func jailConfig(j jailSpec, o *vmOptions) jail.Config {
	cfg := jail.Config{Profile: j.profile, Seccomp: jail.Options{Mode: j.mode}}
	if o != nil && o.egress != nil {
		cfg.Seccomp.BPFMaps = true
	}
	if o != nil && o.tap != "" && j.profile == jail.ProfileVMM {
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
	if ownMountNS() {
		cfg.Mounts = &jail.MountOptions{}
	}
	return cfg
}

// ownMountNS reports whether this process is in another mount namespace
// than its parent (as the daemon starts a VMM: CLONE_NEWNS): only then
// are its mounts made private (in its parent's namespace that would
// change the propagation of the parent's mounts). A fork child is in its
// parent's namespace, which was made private already, and cannot call
// mount under the inherited filter anyway.
func ownMountNS() bool {
	if isForkChild() {
		return false
	}
	self, err1 := os.Readlink("/proc/self/ns/mnt")
	parent, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid()))
	return err1 == nil && err2 == nil && self != parent
}

// isForkChild is set by forkChildCmd.
var forkChildProcess bool

func isForkChild() bool { return forkChildProcess }

// enterJail hardens this VMM process (see above); a no-op for the zero
// spec. It is called after the VM's setup, right before runForeground.
func enterJail(j jailSpec, o *vmOptions, log *slog.Logger) error {
	if !j.on() {
		return nil
	}
	cfg := jailConfig(j, o)
	if isForkChild() {
		if err := enterInherited(cfg); err != nil {
			return fmt.Errorf("jail (%s): %w", j, err)
		}
	} else if err := jail.Enter(cfg); err != nil {
		return fmt.Errorf("jail (%s): %w", j, err)
	}
	activeJail.Lock()
	activeJail.spec = j
	activeJail.Unlock()
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
