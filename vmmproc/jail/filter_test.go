//go:build linux && amd64

package jail

import (
	"fmt"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// seccompData is struct seccomp_data, for the test interpreter.
type seccompData struct {
	nr   uint32
	arch uint32
	args [6]uint64
}

func (d seccompData) word(off uint32) uint32 {
	switch {
	case off == 0:
		return d.nr
	case off == 4:
		return d.arch
	case off >= 16 && off < 64 && off%4 == 0:
		a := d.args[(off-16)/8]
		if (off-16)%8 == 0 {
			return uint32(a)
		}
		return uint32(a >> 32)
	}
	panic(fmt.Sprintf("load at %d", off))
}

// run interprets the subset of classic BPF the builder emits, checking on
// the way what the kernel's checker would: in-range jumps, no fall-off.
func run(t *testing.T, prog []unix.SockFilter, d seccompData) uint32 {
	t.Helper()
	var acc uint32
	for pc := 0; ; pc++ {
		if pc >= len(prog) {
			t.Fatalf("fell off the program")
		}
		in := prog[pc]
		switch in.Code {
		case bpfLdWAbs:
			acc = d.word(in.K)
		case bpfAndK:
			acc &= in.K
		case bpfRetK:
			return in.K
		case bpfJA:
			pc += int(in.K)
		case bpfJEqK, bpfJSetK:
			var ok bool
			if in.Code == bpfJEqK {
				ok = acc == in.K
			} else {
				ok = acc&in.K != 0
			}
			if ok {
				pc += int(in.Jt)
			} else {
				pc += int(in.Jf)
			}
		default:
			t.Fatalf("unexpected opcode %#x at %d", in.Code, pc)
		}
		if pc+1 > len(prog) {
			t.Fatalf("jump out of the program at %d", pc)
		}
	}
}

func call(nr uintptr, args ...uint64) seccompData {
	d := seccompData{nr: uint32(nr), arch: unix.AUDIT_ARCH_X86_64}
	copy(d.args[:], args)
	return d
}

const (
	eperm  = retErrno | uint32(unix.EPERM)
	enosys = retErrno | uint32(unix.ENOSYS)
	// goThreadClone is the Go runtime's newosproc flags.
	goThreadClone = unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND |
		unix.CLONE_SYSVSEM | unix.CLONE_THREAD
	execClone = unix.CLONE_VFORK | unix.CLONE_VM | uint64(unix.SIGCHLD)
)

func mustFilter(t *testing.T, p Profile, opts Options, pid int) *Filter {
	t.Helper()
	f, err := assembleFilter(p, opts, rulesFor(p, opts, pid))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestFilterSemantics(t *testing.T) {
	const pid = 4242
	strict := mustFilter(t, ProfileStrict, Options{}, pid).Program
	vmm := mustFilter(t, ProfileVMM, Options{}, pid).Program
	kill := mustFilter(t, ProfileStrict, Options{Mode: ModeKill}, pid).Program
	logp := mustFilter(t, ProfileStrict, Options{Mode: ModeLog}, pid).Program
	t.Logf("program lengths: strict %d, vmm %d", len(strict), len(vmm))

	rwx := uint64(unix.PROT_READ | unix.PROT_WRITE | unix.PROT_EXEC)
	cases := []struct {
		name        string
		d           seccompData
		strict, vmm uint32
	}{
		{"futex", call(unix.SYS_FUTEX), retAllow, retAllow},
		{"read", call(unix.SYS_READ), retAllow, retAllow},
		{"exit_group", call(unix.SYS_EXIT_GROUP), retAllow, retAllow},
		{"shutdown (last of both)", call(unix.SYS_SHUTDOWN), retAllow, retAllow},
		{"mount", call(unix.SYS_MOUNT), eperm, eperm},
		{"ptrace", call(unix.SYS_PTRACE), eperm, eperm},
		{"unshare", call(unix.SYS_UNSHARE), eperm, eperm},
		{"kexec_load", call(unix.SYS_KEXEC_LOAD), eperm, eperm},
		{"init_module", call(unix.SYS_INIT_MODULE), eperm, eperm},
		{"execve", call(unix.SYS_EXECVE), eperm, retAllow},
		{"bpf prog load", call(unix.SYS_BPF, unix.BPF_PROG_LOAD), eperm, eperm},
		{"bpf map update", call(unix.SYS_BPF, unix.BPF_MAP_UPDATE_ELEM), eperm, retAllow},
		{"ioctl KVM_RUN", call(unix.SYS_IOCTL, 3, 0xae80), retAllow, retAllow},
		{"ioctl KVM_RUN, high bits", call(unix.SYS_IOCTL, 3, 0xffffffff0000ae80), retAllow, retAllow},
		{"ioctl KVM_CREATE_VM", call(unix.SYS_IOCTL, 3, 0xae01), eperm, retAllow},
		{"ioctl KVM_CREATE_VCPU (vCPU threads, after the jail)", call(unix.SYS_IOCTL, 3, uint64(kio(0x41))), retAllow, retAllow},
		{"ioctl KVM_SET_CPUID2", call(unix.SYS_IOCTL, 3, uint64(kiow(0x90, 8))), retAllow, retAllow},
		{"ioctl KVM_SET_TSC_KHZ", call(unix.SYS_IOCTL, 3, uint64(kio(0xa2))), retAllow, retAllow},
		{"ioctl TUNSETIFF", call(unix.SYS_IOCTL, 3, unix.TUNSETIFF), eperm, retAllow},
		{"ioctl FIONBIO", call(unix.SYS_IOCTL, 3, fionbio), retAllow, retAllow},
		{"ioctl TIOCSTI", call(unix.SYS_IOCTL, 3, unix.TIOCSTI), eperm, eperm},
		{"ioctl random", call(unix.SYS_IOCTL, 3, 0xdeadbeef), eperm, eperm},
		// userfaultfd: a running fault server's requests only; the
		// descriptor is made and registered before the jail.
		{"ioctl UFFDIO_COPY", call(unix.SYS_IOCTL, 3, 0xc028aa03), retAllow, retAllow},
		{"ioctl UFFDIO_ZEROPAGE", call(unix.SYS_IOCTL, 3, 0xc020aa04), retAllow, retAllow},
		{"ioctl UFFDIO_WAKE", call(unix.SYS_IOCTL, 3, 0x8010aa02), retAllow, retAllow},
		{"ioctl UFFDIO_UNREGISTER", call(unix.SYS_IOCTL, 3, 0x8010aa01), retAllow, retAllow},
		{"ioctl UFFDIO_API", call(unix.SYS_IOCTL, 3, 0xc018aa3f), eperm, eperm},
		{"ioctl UFFDIO_REGISTER", call(unix.SYS_IOCTL, 3, 0xc020aa00), eperm, eperm},
		{"ioctl UFFDIO_MOVE", call(unix.SYS_IOCTL, 3, 0xc028aa05), eperm, eperm},
		{"ioctl UFFDIO_WRITEPROTECT", call(unix.SYS_IOCTL, 3, 0xc018aa06), eperm, eperm},
		{"ioctl USERFAULTFD_IOC_NEW", call(unix.SYS_IOCTL, 3, 0xaa00), eperm, eperm},
		{"userfaultfd", call(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK), eperm, eperm},
		{"socket AF_UNIX", call(unix.SYS_SOCKET, unix.AF_UNIX), retAllow, retAllow},
		{"socket AF_INET6", call(unix.SYS_SOCKET, unix.AF_INET6), retAllow, retAllow},
		{"socket AF_NETLINK", call(unix.SYS_SOCKET, unix.AF_NETLINK), eperm, retAllow},
		{"socket AF_PACKET", call(unix.SYS_SOCKET, unix.AF_PACKET), eperm, eperm},
		{"socket AF_VSOCK", call(unix.SYS_SOCKET, unix.AF_VSOCK), eperm, eperm},
		{"clone thread", call(unix.SYS_CLONE, goThreadClone), retAllow, retAllow},
		{"clone process", call(unix.SYS_CLONE, execClone), eperm, retAllow},
		{"clone netns", call(unix.SYS_CLONE, execClone|unix.CLONE_NEWNET), eperm, retAllow},
		{"clone thread+newns", call(unix.SYS_CLONE, goThreadClone|unix.CLONE_NEWNS), eperm, retAllow},
		{"clone userns", call(unix.SYS_CLONE, execClone|unix.CLONE_NEWUSER), eperm, eperm},
		{"clone3", call(unix.SYS_CLONE3), enosys, enosys},
		{"mmap rw", call(unix.SYS_MMAP, 0, 4096, unix.PROT_READ|unix.PROT_WRITE), retAllow, retAllow},
		{"mmap rx", call(unix.SYS_MMAP, 0, 4096, unix.PROT_READ|unix.PROT_EXEC), retAllow, retAllow},
		{"mmap rwx", call(unix.SYS_MMAP, 0, 4096, rwx), eperm, eperm},
		{"mprotect rwx", call(unix.SYS_MPROTECT, 0, 4096, rwx), eperm, eperm},
		{"tgkill self", call(unix.SYS_TGKILL, pid, 7, uint64(unix.SIGURG)), retAllow, retAllow},
		{"tgkill other", call(unix.SYS_TGKILL, 1, 1, uint64(unix.SIGURG)), eperm, retAllow},
		{"kill other", call(unix.SYS_KILL, 1, 9), eperm, retAllow},
		{"prctl PR_SET_VMA (Go runtime)", call(unix.SYS_PRCTL, unix.PR_SET_VMA), retAllow, retAllow},
		{"prctl PR_SET_NAME", call(unix.SYS_PRCTL, unix.PR_SET_NAME), retAllow, retAllow},
		{"prctl PR_SET_PDEATHSIG", call(unix.SYS_PRCTL, unix.PR_SET_PDEATHSIG), eperm, retAllow},
		{"prctl PR_SET_SECCOMP", call(unix.SYS_PRCTL, unix.PR_SET_SECCOMP), eperm, eperm},
		{"x32 read", call(0x40000000 | unix.SYS_READ), eperm, eperm},
		{"i386 arch", seccompData{nr: 3, arch: unix.AUDIT_ARCH_I386}, retKillProcess, retKillProcess},
		{"unknown nr", call(999), eperm, eperm},
	}
	for _, c := range cases {
		if got := run(t, strict, c.d); got != c.strict {
			t.Errorf("strict: %s: got %#x, want %#x", c.name, got, c.strict)
		}
		if got := run(t, vmm, c.d); got != c.vmm {
			t.Errorf("vmm: %s: got %#x, want %#x", c.name, got, c.vmm)
		}
	}
	if got := run(t, kill, call(unix.SYS_MOUNT)); got != retKillProcess {
		t.Errorf("kill mode: mount: %#x", got)
	}
	if got := run(t, kill, call(unix.SYS_FUTEX)); got != retAllow {
		t.Errorf("kill mode: futex: %#x", got)
	}
	if got := run(t, logp, call(unix.SYS_MOUNT)); got != retLog {
		t.Errorf("log mode: mount: %#x", got)
	}
	if got := run(t, logp, call(0x40000000|unix.SYS_READ)); got != eperm {
		t.Errorf("log mode: x32: %#x", got)
	}
}

// TestNetworkFork: Options.NetworkFork opens, under ProfileVMM only,
// unshare(CLONE_NEWNET) exactly and the bpf(2) commands a fork child's
// egress filter needs; nothing else changes.
func TestNetworkFork(t *testing.T) {
	const pid = 4242
	netfork := mustFilter(t, ProfileVMM, Options{NetworkFork: true}, pid).Program
	strictNF := mustFilter(t, ProfileStrict, Options{NetworkFork: true, BPFMaps: true}, pid).Program
	cases := []struct {
		name            string
		d               seccompData
		netfork, strict uint32
	}{
		{"unshare netns", call(unix.SYS_UNSHARE, unix.CLONE_NEWNET), retAllow, eperm},
		{"unshare mountns", call(unix.SYS_UNSHARE, unix.CLONE_NEWNS), eperm, eperm},
		{"unshare netns+userns", call(unix.SYS_UNSHARE, unix.CLONE_NEWNET|unix.CLONE_NEWUSER), eperm, eperm},
		{"setns", call(unix.SYS_SETNS), eperm, eperm},
		{"bpf prog load", call(unix.SYS_BPF, unix.BPF_PROG_LOAD), retAllow, eperm},
		{"bpf map create", call(unix.SYS_BPF, unix.BPF_MAP_CREATE), retAllow, eperm},
		{"bpf link create", call(unix.SYS_BPF, unix.BPF_LINK_CREATE), retAllow, eperm},
		{"bpf map update", call(unix.SYS_BPF, unix.BPF_MAP_UPDATE_ELEM), retAllow, retAllow},
		{"bpf raw tracepoint", call(unix.SYS_BPF, unix.BPF_RAW_TRACEPOINT_OPEN), eperm, eperm},
		{"bpf prog get by id", call(unix.SYS_BPF, unix.BPF_PROG_GET_FD_BY_ID), eperm, eperm},
		{"clone userns", call(unix.SYS_CLONE, execClone|unix.CLONE_NEWUSER), eperm, eperm},
	}
	for _, c := range cases {
		if got := run(t, netfork, c.d); got != c.netfork {
			t.Errorf("vmm+NetworkFork: %s: got %#x, want %#x", c.name, got, c.netfork)
		}
		if got := run(t, strictNF, c.d); got != c.strict {
			t.Errorf("strict+NetworkFork: %s: got %#x, want %#x", c.name, got, c.strict)
		}
	}
}

// TestSpawned: Options.Spawned (a VMM whose jail-init starts its fork
// children) takes execve, process-making clones, waiting, foreign kills
// and a child's hardening calls out of ProfileVMM, and keeps what the
// VMM itself needs (threads, vCPU creation, pidfd signals).
func TestSpawned(t *testing.T) {
	const pid = 4242
	spawned := mustFilter(t, ProfileVMM, Options{Spawned: true}, pid).Program
	vmm := mustFilter(t, ProfileVMM, Options{}, pid).Program
	cases := []struct {
		name         string
		d            seccompData
		spawned, vmm uint32
	}{
		{"execve", call(unix.SYS_EXECVE), eperm, retAllow},
		{"clone process", call(unix.SYS_CLONE, execClone), eperm, retAllow},
		{"clone thread", call(unix.SYS_CLONE, goThreadClone), retAllow, retAllow},
		{"wait4", call(unix.SYS_WAIT4), eperm, retAllow},
		{"setresuid", call(unix.SYS_SETRESUID), eperm, retAllow},
		{"seccomp", call(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER), eperm, retAllow},
		{"kill other", call(unix.SYS_KILL, 1, 9), eperm, retAllow},
		{"kill self", call(unix.SYS_KILL, pid, 23), retAllow, retAllow},
		{"prctl PR_SET_PDEATHSIG", call(unix.SYS_PRCTL, unix.PR_SET_PDEATHSIG), eperm, retAllow},
		{"pidfd_send_signal", call(unix.SYS_PIDFD_SEND_SIGNAL), retAllow, retAllow},
		{"KVM_CREATE_VCPU", call(unix.SYS_IOCTL, 3, uint64(kio(0x41))), retAllow, retAllow},
	}
	for _, c := range cases {
		if got := run(t, spawned, c.d); got != c.spawned {
			t.Errorf("vmm+Spawned: %s: got %#x, want %#x", c.name, got, c.spawned)
		}
		if got := run(t, vmm, c.d); got != c.vmm {
			t.Errorf("vmm: %s: got %#x, want %#x", c.name, got, c.vmm)
		}
	}
}

// longRules is a list far over 255 instructions: 600 made-up syscalls
// (beyond any real number) and a rule with a 400-value argument set.
func longRules(base []Rule) []Rule {
	rules := slices.Clone(base)
	for i := range 600 {
		rules = append(rules, Rule{Name: fmt.Sprintf("fake%d", i), Nr: uint32(1000 + i)})
	}
	var vals []uint32
	for i := range 400 {
		vals = append(vals, uint32(7000+3*i))
	}
	rules = append(rules, Rule{Name: "fakeargs", Nr: 1900, Conds: []Cond{{Arg: 1, Op: OpIn, Values: vals}}})
	return rules
}

func TestLongProgramJumps(t *testing.T) {
	f, err := assembleFilter(ProfileStrict, Options{}, longRules(rulesFor(ProfileStrict, Options{}, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Program) < 1000 {
		t.Fatalf("program only %d instructions", len(f.Program))
	}
	t.Logf("long program: %d instructions", len(f.Program))
	for i := range 600 {
		if got := run(t, f.Program, call(uintptr(1000+i))); got != retAllow {
			t.Fatalf("fake%d: %#x", i, got)
		}
	}
	for _, nr := range []uintptr{1600, 1899, 1901, unix.SYS_MOUNT} {
		if got := run(t, f.Program, call(nr)); got != eperm {
			t.Fatalf("nr %d: %#x", nr, got)
		}
	}
	for i := range 400 {
		if got := run(t, f.Program, call(1900, 0, uint64(7000+3*i))); got != retAllow {
			t.Fatalf("fakeargs %d: %#x", i, got)
		}
		if got := run(t, f.Program, call(1900, 0, uint64(7001+3*i))); got != eperm {
			t.Fatalf("fakeargs %d+1: %#x", i, got)
		}
	}
	// A jump that cannot be short is an error, not a wrong program.
	a := newAsm()
	a.jeq(1, "far", "")
	for range 300 {
		a.ret(0)
	}
	a.mark("far")
	a.ret(0)
	if _, err := a.assemble(); err == nil {
		t.Fatal("a 300-instruction conditional jump assembled")
	}
	// Too long for the kernel.
	var huge []Rule
	for i := range 5000 {
		huge = append(huge, Rule{Name: "x", Nr: uint32(10000 + i)})
	}
	if _, err := assembleFilter(ProfileStrict, Options{}, huge); err == nil {
		t.Fatal("a program over 4096 instructions assembled")
	}
}

func TestIoctlNumbers(t *testing.T) {
	// Values from the kernel headers (linux/kvm.h, x86_64).
	want := map[string]uint32{
		"KVM_RUN":                    0xae80,
		"KVM_CREATE_VM":              0xae01,
		"KVM_GET_REGS":               0x8090ae81,
		"KVM_SET_REGS":               0x4090ae82,
		"KVM_GET_SREGS":              0x8138ae83,
		"KVM_GET_FPU":                0x81a0ae8c,
		"KVM_GET_XSAVE":              0x9000aea4,
		"KVM_GET_XSAVE2":             0x9000aecf,
		"KVM_GET_XCRS":               0x8188aea6,
		"KVM_GET_MSRS":               0xc008ae88,
		"KVM_SET_MSRS":               0x4008ae89,
		"KVM_GET_LAPIC":              0x8400ae8e,
		"KVM_SET_CPUID2":             0x4008ae90,
		"KVM_GET_MP_STATE":           0x8004ae98,
		"KVM_GET_VCPU_EVENTS":        0x8040ae9f,
		"KVM_GET_DEBUGREGS":          0x8080aea1,
		"KVM_SET_USER_MEMORY_REGION": 0x4020ae46,
		"KVM_IRQ_LINE":               0x4008ae61,
		"KVM_IRQFD":                  0x4020ae76,
		"KVM_IOEVENTFD":              0x4040ae79,
		"KVM_GET_CLOCK":              0x8030ae7c,
		"KVM_GET_DIRTY_LOG":          0x4010ae42,
		"KVM_CLEAR_DIRTY_LOG":        0xc018aec0,
		"KVM_GET_IRQCHIP":            0xc208ae62,
		"KVM_SET_IRQCHIP":            0x8208ae63,
		"KVM_CREATE_PIT2":            0x4040ae77,
		"KVM_GET_PIT2":               0x8070ae9f,
		"KVM_ENABLE_CAP":             0x4068aea3,
		"KVM_SET_IDENTITY_MAP_ADDR":  0x4008ae48,
	}
	got := map[string]uint32{}
	for _, e := range ioctlTable() {
		if _, dup := got[e.name]; dup {
			t.Errorf("%s listed twice", e.name)
		}
		got[e.name] = e.req
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s = %#x, want %#x", name, got[name], w)
		}
	}
}

func TestAllowedSyscalls(t *testing.T) {
	strict, vmm := AllowedSyscalls(ProfileStrict), AllowedSyscalls(ProfileVMM)
	for _, s := range []string{"futex", "ioctl", "mmap", "clone", "tgkill", "epoll_pwait", "openat", "socket", "memfd_create"} {
		if !slices.Contains(strict, s) || !slices.Contains(vmm, s) {
			t.Errorf("%s missing", s)
		}
	}
	for _, s := range []string{"execve", "wait4", "bpf", "setresuid"} {
		if slices.Contains(strict, s) {
			t.Errorf("strict allows %s", s)
		}
		if !slices.Contains(vmm, s) {
			t.Errorf("vmm lacks %s", s)
		}
	}
	for _, s := range []string{"mount", "ptrace", "unshare", "kexec_load", "init_module", "clone3", "userfaultfd", "setns", "pivot_root"} {
		if slices.Contains(strict, s) || slices.Contains(vmm, s) {
			t.Errorf("%s allowed", s)
		}
	}
	if !slices.Contains(AllowedIoctls(ProfileStrict), "KVM_RUN") || slices.Contains(AllowedIoctls(ProfileStrict), "KVM_CREATE_VM") {
		t.Error("strict ioctls wrong")
	}
	s := mustFilter(t, ProfileStrict, Options{BPFMaps: true}, 1)
	if got := run(t, s.Program, call(unix.SYS_BPF, unix.BPF_MAP_LOOKUP_ELEM)); got != retAllow {
		t.Errorf("strict+BPFMaps: bpf map lookup %#x", got)
	}
	x := mustFilter(t, ProfileStrict, Options{Extra: []Rule{{Name: "mount", Nr: unix.SYS_MOUNT}}}, 1)
	if got := run(t, x.Program, call(unix.SYS_MOUNT)); got != retAllow {
		t.Errorf("extra rule: mount %#x", got)
	}
}
