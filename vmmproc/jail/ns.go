//go:build linux && amd64

package jail

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// NSOptions choose the namespaces of a VMM process.
type NSOptions struct {
	// NetNS gives the VMM its own network namespace. Leave it off when
	// the VMM's tap must live in the host namespace (egress through the
	// host); its tap must then exist before, or be created by the VMM
	// before it drops CAP_NET_ADMIN.
	NetNS bool
	// NoPidNS keeps the process in the caller's pid namespace. By default
	// it is pid 1 of a new one: it cannot see or signal other processes,
	// and when it ends everything else in the namespace is killed, so the
	// daemon starts RunInit there, with the VMM as its child.
	NoPidNS bool
}

// SysProcAttr is what the daemon sets on the exec.Cmd of a VMM: new mount,
// pid, ipc and uts namespaces (and network with opts.NetNS), a new session,
// and SIGKILL when the daemon (the thread that started it) dies.
//
// Pdeathsig is tied to the OS thread that forked: the daemon should start
// VMMs from a goroutine that holds runtime.LockOSThread for as long as the
// VMM runs, or accept that a VMM may outlive a daemon thread exit (the Go
// runtime rarely exits threads, only locked ones).
func SysProcAttr(opts NSOptions) *syscall.SysProcAttr {
	flags := uintptr(unix.CLONE_NEWNS | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS)
	if !opts.NoPidNS {
		flags |= unix.CLONE_NEWPID
	}
	if opts.NetNS {
		flags |= unix.CLONE_NEWNET
	}
	return &syscall.SysProcAttr{
		Cloneflags: flags,
		Setsid:     true,
		Pdeathsig:  syscall.SIGKILL,
	}
}

// MountOptions tune PrepareMounts.
type MountOptions struct {
	// Proc mounts a fresh /proc, so that it shows the new pid namespace
	// (the inherited one shows the daemon's). Needs CAP_SYS_ADMIN and a
	// new pid namespace to be meaningful.
	Proc bool
}

// PrepareMounts runs in the VMM, early, while it still has CAP_SYS_ADMIN:
// it makes every mount in its (new) mount namespace private, so nothing it
// mounts propagates to the host and host mounts stop propagating in, and
// optionally mounts a fresh /proc for its pid namespace.
//
// It does not pivot_root or chroot: the VMM opens its kernel, disks and
// snapshot files by the paths it is given.
func PrepareMounts(opts MountOptions) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("jail: make / private: %w", err)
	}
	if opts.Proc {
		if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("jail: mount /proc: %w", err)
		}
	}
	return nil
}

// Config is the whole hardening of a VMM, for Enter.
type Config struct {
	// Mounts, when set, runs PrepareMounts first (the VMM must be in its
	// own mount namespace, see SysProcAttr).
	Mounts *MountOptions
	// Root, when set, pivot_roots into a jail directory holding only
	// the files the VMM needs after its setup (PivotRoot), right after
	// PrepareMounts (which it needs: private mounts).
	Root *RootOptions
	// KeepCaps are the capabilities the VMM keeps (none by default). A
	// VMM that creates taps for fork children in new network namespaces
	// needs CAP_NET_ADMIN and CAP_SYS_ADMIN; see the package doc. With
	// User, they are kept across leaving root and made ambient, so that
	// the fork children it execs have them too (a network VMM's CAP_BPF
	// where BPFNeedsCap).
	KeepCaps []uintptr
	// User, when set, switches to this uid/gid, keeping KeepCaps only.
	User *User
	// Profile and Seccomp select the filter.
	Profile Profile
	Seccomp Options
}

// User is a uid and gid, and the supplementary groups (none by default).
type User struct {
	UID, GID int
	Groups   []int
}

// BecomeUser leaves root for u, on every thread, keeping the capabilities
// of keep (permitted, effective, inheritable and ambient, so that they
// survive an execve) and no others: the bounding set is emptied first (it
// needs CAP_SETPCAP; permitted and effective keep CAP_SETUID and
// CAP_SETGID for SetUser), then the process leaves root (with keepcaps
// while it does, when anything is kept), then whatever is left beyond keep
// (all of it, for uid 0) is cleared.
func BecomeUser(u User, keep []uintptr) error {
	mask := CapMask(keep)
	if err := dropBounding(mask); err != nil {
		return err
	}
	if mask != 0 {
		// Leaving root keeps the permitted set only with keepcaps.
		if err := allThreads(unix.SYS_PRCTL, unix.PR_SET_KEEPCAPS, 1, 0); err != nil {
			return fmt.Errorf("jail: prctl(PR_SET_KEEPCAPS): %w", err)
		}
	}
	if err := SetUser(u.UID, u.GID, u.Groups...); err != nil {
		return err
	}
	if err := setCaps(mask); err != nil {
		return err
	}
	if mask != 0 {
		if err := raiseAmbient(mask); err != nil {
			return err
		}
		if err := allThreads(unix.SYS_PRCTL, unix.PR_SET_KEEPCAPS, 0, 0); err != nil {
			return fmt.Errorf("jail: prctl(PR_SET_KEEPCAPS): %w", err)
		}
	}
	return nil
}

// Enter hardens the calling VMM process after its setup, in this order:
//
//  1. PrepareMounts (with Config.Mounts), then PivotRoot (with Config.Root)
//  2. SetUser (with Config.User), then DropCapabilities(KeepCaps)
//  3. PR_SET_NO_NEW_PRIVS
//  4. the seccomp filter, on all threads
//
// Each step needs the privileges the previous ones may remove last, and the
// filter comes last because it refuses the calls of the steps before it.
func Enter(cfg Config) error {
	if cfg.Mounts != nil {
		if err := PrepareMounts(*cfg.Mounts); err != nil {
			return err
		}
	}
	if cfg.Root != nil {
		if err := PivotRoot(*cfg.Root); err != nil {
			return err
		}
	}
	if cfg.User != nil {
		if err := BecomeUser(*cfg.User, cfg.KeepCaps); err != nil {
			return err
		}
	} else if err := DropCapabilities(cfg.KeepCaps); err != nil {
		return err
	}
	return Install(cfg.Profile, cfg.Seccomp)
}
