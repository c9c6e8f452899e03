//go:build linux && amd64

package jail

import (
	"fmt"
	"os"
	"slices"

	"golang.org/x/sys/unix"
)

// Profile selects an allowlist; see the package documentation.
type Profile int

const (
	// ProfileStrict allows what a running VMM needs after its setup and
	// nothing that creates processes: no execve, clone only with
	// CLONE_THREAD, signals only to itself.
	ProfileStrict Profile = 1 << iota
	// ProfileVMM is ProfileStrict plus what the VMM's fork API needs to
	// start `warren fork-child` (clone of a process, execve, wait,
	// pidfd), and what that child needs for its own setup under the
	// inherited filter (KVM create ioctls, tap ioctls, netlink, stacking
	// its own filter), plus the egress BPF map operations.
	ProfileVMM
)

func (p Profile) String() string {
	return enumName(p, "Profile", map[Profile]string{ProfileStrict: "strict", ProfileVMM: "vmm"})
}

// enumName returns v's name from names, or TYPE(N) for a value without
// one.
func enumName[T ~int](v T, typ string, names map[T]string) string {
	if n, ok := names[v]; ok {
		return n
	}
	return fmt.Sprintf("%s(%d)", typ, int(v))
}

// both is shorthand for table entries every profile allows.
const both = ProfileStrict | ProfileVMM

// Mode is what the filter does with a syscall it does not allow.
type Mode int

const (
	// ModeErrno fails the syscall with Options.Errno (EPERM by default):
	// the VMM logs the error and a missing entry is easy to diagnose.
	ModeErrno Mode = iota
	// ModeKill kills the whole process with SIGSYS
	// (SECCOMP_RET_KILL_PROCESS).
	ModeKill
	// ModeLog allows the syscall but logs it to the audit log / dmesg
	// (SECCOMP_RET_LOG): run a VMM this way to find what is missing.
	ModeLog
)

func (m Mode) String() string {
	return enumName(m, "Mode", map[Mode]string{ModeErrno: "errno", ModeKill: "kill", ModeLog: "log"})
}

// Seccomp return values (linux/seccomp.h).
const (
	retKillProcess = 0x80000000
	retErrno       = 0x00050000
	retLog         = 0x7ffc0000
	retAllow       = 0x7fff0000
)

// Options tune a filter.
type Options struct {
	// Mode is the action for what is not allowed (default ModeErrno).
	Mode Mode
	// Errno is the error of ModeErrno (default EPERM).
	Errno unix.Errno
	// BPFMaps allows bpf(2) map operations (lookup, update, delete,
	// iterate, batches, object info, link detach), never program loads or
	// map creation. ProfileVMM has them always (the egress filter's maps
	// are updated when the policy changes); set it to have them in
	// ProfileStrict for a VMM with egress.
	BPFMaps bool
	// NetworkFork (ProfileVMM only) allows what a fork child of a VMM with
	// a private network and egress (`warren run --private-net`) does for
	// its own network under the filter it inherits: unshare(CLONE_NEWNET)
	// exactly, and bpf(2) map creation, program and BTF loads, map freezes
	// and links (its egress filter on its own tap). That VMM keeps
	// CAP_SYS_ADMIN and CAP_NET_ADMIN for its children already; this is
	// the widest hole in the allowlist, so it is off unless asked for.
	NetworkFork bool
	// Spawned (ProfileVMM only) is for a VMM whose fork children its
	// jail-init starts (Spawner): it makes no process itself, so execve,
	// a process-making clone, waiting for children and what a child does
	// to harden itself leave the allowlist, and it may signal only
	// itself (a failed fork's children it kills through their pidfds).
	Spawned bool
	// Extra rules are appended to the profile's (say, a syscall found
	// missing with ModeLog, until the table is fixed).
	Extra []Rule
}

// Op is how a Cond compares an argument.
type Op int

const (
	// OpIn: the argument is one of Values.
	OpIn Op = iota
	// OpMaskEq: argument & Mask == Values[0].
	OpMaskEq
	// OpMaskNe: argument & Mask != Values[0].
	OpMaskNe
)

// Cond is a check on the low 32 bits of one syscall argument. Only the low
// half is compared: every argument filtered here is an int or unsigned int
// in the kernel (or, for clone and mmap, has all its flags there), so the
// kernel ignores the high half as well.
type Cond struct {
	Arg    int // 0..5
	Op     Op
	Mask   uint32
	Values []uint32
	// Names documents Values (for OpIn), same order; optional.
	Names []string
}

// Rule allows one syscall, when all of its Conds hold. With Errno set the
// syscall is not allowed but fails with that errno (clone3 -> ENOSYS, so
// callers fall back to clone, whose flags a filter can see).
type Rule struct {
	Name  string
	Nr    uint32
	Conds []Cond
	Errno unix.Errno
}

// Filter is an assembled allowlist: the rules, in the order the program
// tests them, and the classic-BPF program.
type Filter struct {
	Profile Profile
	Options Options
	Rules   []Rule
	Program []unix.SockFilter
}

// NewFilter builds the filter of a profile for the calling process (the
// signal rules of ProfileStrict name its pid).
func NewFilter(p Profile, opts Options) (*Filter, error) {
	if p != ProfileStrict && p != ProfileVMM {
		return nil, fmt.Errorf("jail: unknown profile %v", p)
	}
	rules := rulesFor(p, opts, os.Getpid())
	return assembleFilter(p, opts, rules)
}

func assembleFilter(p Profile, opts Options, rules []Rule) (*Filter, error) {
	prog, err := buildProgram(rules, opts)
	if err != nil {
		return nil, err
	}
	return &Filter{Profile: p, Options: opts, Rules: rules, Program: prog}, nil
}

// AllowedSyscalls lists the syscalls a profile allows (some only with
// certain arguments, see the table in syscalls.go), in table order.
func AllowedSyscalls(p Profile) []string {
	var names []string
	for _, r := range rulesFor(p, Options{}, 1) {
		if r.Errno == 0 {
			names = append(names, r.Name)
		}
	}
	return names
}

// AllowedIoctls lists the ioctl requests a profile allows, by name.
func AllowedIoctls(p Profile) []string {
	var names []string
	for _, c := range ioctlTable() {
		if c.profiles&p != 0 {
			names = append(names, c.name)
		}
	}
	return names
}

// defaultRet is the action for what is not allowed.
func defaultRet(opts Options) uint32 {
	switch opts.Mode {
	case ModeKill:
		return retKillProcess
	case ModeLog:
		return retLog
	}
	return errnoRet(opts)
}

func errnoRet(opts Options) uint32 {
	e := opts.Errno
	if e == 0 {
		e = unix.EPERM
	}
	return retErrno | uint32(e)&0xffff
}

// buildProgram lays the program out as:
//
//	arch check (not x86_64: kill)
//	x32 check (nr has bit 30: refused)
//	dispatch on nr, in blocks with trampolines
//	default action
//	one body per rule with argument checks
//
// Every conditional jump is short by construction; assemble verifies it.
func buildProgram(rules []Rule, opts Options) ([]unix.SockFilter, error) {
	a := newAsm()
	deny := defaultRet(opts)
	x32 := deny // the x32 ABI is refused even by ModeLog
	if opts.Mode == ModeLog {
		x32 = errnoRet(opts)
	}

	a.ld(offArch)
	a.jeq(unix.AUDIT_ARCH_X86_64, "arch.ok", "")
	a.ret(retKillProcess)
	a.mark("arch.ok")
	a.ld(offNr)
	a.jset(0x40000000, "", "x32.no")
	a.ret(x32)
	a.mark("x32.no")

	var entries []dispatch
	type body struct {
		label string
		r     Rule
	}
	var bodies []body
	seen := map[uint32]string{}
	for _, r := range rules {
		if prev, dup := seen[r.Nr]; dup {
			return nil, fmt.Errorf("jail: syscall %d listed twice (%s, %s)", r.Nr, prev, r.Name)
		}
		seen[r.Nr] = r.Name
		switch {
		case r.Errno != 0:
			entries = append(entries, dispatch{r.Nr, target{isRet: true, ret: retErrno | uint32(r.Errno)&0xffff}})
		case len(r.Conds) == 0:
			entries = append(entries, dispatch{r.Nr, target{isRet: true, ret: retAllow}})
		default:
			l := a.newLabel("body." + r.Name)
			bodies = append(bodies, body{l, r})
			entries = append(entries, dispatch{r.Nr, target{label: l}})
		}
	}
	a.emitDispatch(entries)
	a.ret(deny)

	for _, b := range bodies {
		a.mark(b.label)
		for _, c := range b.r.Conds {
			if c.Arg < 0 || c.Arg > 5 {
				return nil, fmt.Errorf("jail: %s: argument %d out of range", b.r.Name, c.Arg)
			}
			a.ld(offArgLow(c.Arg))
			switch c.Op {
			case OpIn:
				pass := a.newLabel("pass")
				var es []dispatch
				for _, v := range c.Values {
					es = append(es, dispatch{v, target{label: pass}})
				}
				a.emitDispatch(es)
				a.ret(deny)
				a.mark(pass)
			case OpMaskEq, OpMaskNe:
				if len(c.Values) != 1 {
					return nil, fmt.Errorf("jail: %s: masked compare needs one value", b.r.Name)
				}
				a.and(c.Mask)
				fail := a.newLabel("fail")
				if c.Op == OpMaskEq {
					a.jeq(c.Values[0], "", fail)
				} else {
					a.jeq(c.Values[0], fail, "")
				}
				skip := a.newLabel("ok")
				a.jmp(skip)
				a.mark(fail)
				a.ret(deny)
				a.mark(skip)
			default:
				return nil, fmt.Errorf("jail: %s: unknown op %d", b.r.Name, c.Op)
			}
		}
		a.ret(retAllow)
	}
	return a.assemble()
}

// rulesFor returns the rules of a profile, table order, then opts.Extra.
func rulesFor(p Profile, opts Options, pid int) []Rule {
	var rules []Rule
	for _, s := range syscallTable(p, opts, pid) {
		if s.profiles&p == 0 {
			continue
		}
		rules = append(rules, s.rule)
	}
	for _, x := range opts.Extra {
		if i := slices.IndexFunc(rules, func(r Rule) bool { return r.Nr == x.Nr }); i >= 0 {
			rules[i] = x // an extra rule replaces the table's
			continue
		}
		rules = append(rules, x)
	}
	return rules
}
