//go:build linux && amd64

package jail

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Fork children started by the family's helper. A confined VMM's fork
// children are not its own processes: it asks the family's jail-init
// (which stays root) to start each one under a Grant from warren-hostd,
// handing over the child's descriptors. Spawner starts `warren jail-spawn`
// (RunSpawn) with them, which joins the child's cgroup, leaves root for
// the grant's uid, gid and groups and execs the child: the child runs no
// instruction of its own outside its cgroup or as root, and the VMM needs
// neither execve nor a process-making clone (its filter is
// ProfileStrict, see SpawnEnv), nor any say in who its children are.

// SpawnVerb is the warren sub-command that runs RunSpawn.
const SpawnVerb = "jail-spawn"

// SpawnEnv is set to "1" in the environment of a VMM whose jail-init
// starts its fork children (RunInit with InitOptions.Spawner) and of each
// child so started: their forks go through the helper, so they need no
// process-making syscall after setup.
const SpawnEnv = "WARREN_JAIL_SPAWN"

// maxSpawnFiles bounds the descriptors a spawned child inherits.
const maxSpawnFiles = 64

// Spawner starts fork children for a family's helper. Its fields are set
// once by NewSpawner; Spawn may be called from several goroutines.
type Spawner struct {
	book *GrantBook
	// roots are the cgroup roots (one per hierarchy, O_PATH), opened
	// before the VMM's pivot_root hides them: a grant's cgroup is looked
	// up beneath each.
	roots []*os.File
	// exe is the warren binary, by the path it has in the jail too.
	exe string
	// start is the program jail-spawn runs from: this very binary
	// (/proc/self/exe: the spawner runs outside any jail), not whatever
	// exe's path holds now, since a warren binary replaced after the
	// family started (an upgrade) would parse the spawner's arguments with
	// other code. The child jail-spawn execs is exe's path in the
	// requester's root, where the daemon bound the binary the family
	// started with.
	start string
	// null is /dev/null, a child's standard input.
	null *os.File
}

// NewSpawner returns a Spawner for grants signed with key, whose children
// are born in cgroups beneath cgroupRoots.
func NewSpawner(key []byte, cgroupRoots []string) (*Spawner, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("spawner: %w", err)
	}
	s := &Spawner{book: NewGrantBook(key), exe: exe, start: "/proc/self/exe"}
	if s.null, err = os.Open(os.DevNull); err != nil {
		return nil, fmt.Errorf("spawner: %w", err)
	}
	for _, r := range cgroupRoots {
		fd, err := unix.Open(r, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("spawner: cgroup root %s: %w", r, err)
		}
		s.roots = append(s.roots, os.NewFile(uintptr(fd), r))
	}
	return s, nil
}

// Close releases what NewSpawner opened.
func (s *Spawner) Close() {
	closeAll(s.roots)
	if s.null != nil {
		s.null.Close()
	}
}

// Spawn starts `warren ARGS...` for the family member requester (a pid
// of the caller's pid namespace) as the grant signed allows (Grant), with
// the requester's root (its jail: jail-init's own root is the host's
// where the jail could only chroot, on an initramfs): files[0] is its
// standard output and error, files[1:] its descriptors 3, 4, ... It
// returns the child's pid in the caller's pid namespace, and a pidfd of
// it (nil where the kernel has none). The child is the caller's: RunInit
// reaps it.
func (s *Spawner) Spawn(signed string, args []string, files []*os.File, requester int) (int, *os.File, error) {
	if len(files) < 1 || len(files) > maxSpawnFiles {
		return 0, nil, fmt.Errorf("spawn: %d descriptors, want 1 to %d", len(files), maxSpawnFiles)
	}
	if requester <= 0 {
		return 0, nil, errors.New("spawn: the requester's pid is unknown (no SCM_CREDENTIALS)")
	}
	g, err := s.book.Use(signed, time.Now())
	if err != nil {
		return 0, nil, err
	}
	var procs []*os.File
	defer func() { closeAll(procs) }()
	if g.Cgroup != "" {
		if len(s.roots) == 0 {
			return 0, nil, fmt.Errorf("spawn: cgroup %q, but this helper has no cgroup root", g.Cgroup)
		}
		how := unix.OpenHow{Flags: unix.O_WRONLY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV}
		for _, r := range s.roots {
			fd, err := unix.Openat2(int(r.Fd()), g.Cgroup+"/cgroup.procs", &how)
			if err != nil {
				return 0, nil, fmt.Errorf("spawn: cgroup %s under %s: %w", g.Cgroup, r.Name(), err)
			}
			procs = append(procs, os.NewFile(uintptr(fd), g.Cgroup))
		}
	}
	argv := []string{s.exe, SpawnVerb, "--root", fmt.Sprintf("/proc/%d/root", requester),
		"--uid", strconv.Itoa(g.UID), "--gid", strconv.Itoa(g.GID)}
	if len(g.Groups) > 0 {
		gs := make([]string, len(g.Groups))
		for i, gr := range g.Groups {
			gs[i] = strconv.Itoa(gr)
		}
		argv = append(argv, "--groups", strings.Join(gs, ","))
	}
	if g.BPF {
		argv = append(argv, "--bpf")
	}
	pass := []*os.File{s.null, files[0], files[0]}
	pass = append(pass, files[1:]...)
	for _, p := range procs {
		argv = append(argv, "--cgroup-fd", strconv.Itoa(len(pass)))
		pass = append(pass, p)
	}
	argv = append(argv, "--", s.exe)
	argv = append(argv, args...)
	p, err := os.StartProcess(s.start, argv, &os.ProcAttr{Files: pass, Env: spawnEnv(),
		Sys: &syscall.SysProcAttr{Setsid: true}})
	if err != nil {
		return 0, nil, fmt.Errorf("spawn: %w", err)
	}
	pid := p.Pid
	p.Release() // RunInit's wait loop reaps it
	var pidfd *os.File
	if fd, err := unix.PidfdOpen(pid, 0); err == nil {
		pidfd = os.NewFile(uintptr(fd), "pidfd")
	}
	return pid, pidfd, nil
}

// spawnEnv is a spawned child's environment: RunInit's, less what is
// RunInit's own, with SpawnEnv.
func spawnEnv() []string {
	return append(initChildEnv(), SpawnEnv+"=1")
}

// RunSpawn is `warren jail-spawn [--root DIR] --uid U --gid G [--groups
// G1,G2] [--bpf] [--cgroup-fd N]... -- PROGRAM ARGS...`, run as root by
// Spawner: it moves itself into each cgroup whose cgroup.procs it
// inherited open at N, chroots into DIR (the requesting VMM's root,
// /proc/PID/root), leaves root for U and G (keeping CAP_BPF alone,
// ambient, with --bpf), and execs PROGRAM (by its path in DIR), which
// inherits its other descriptors.
func RunSpawn(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren "+SpawnVerb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	uid := fs.Int("uid", 0, "the uid to run as (not 0)")
	gid := fs.Int("gid", 0, "the gid to run as (not 0)")
	groups := fs.String("groups", "", "supplementary groups, comma-separated")
	bpf := fs.Bool("bpf", false, "keep CAP_BPF (ambient)")
	root := fs.String("root", "", "chroot into this directory first")
	var cgroups []int
	fs.Func("cgroup-fd", "an inherited cgroup.procs to join (repeatable)", func(v string) error {
		fd, err := strconv.Atoi(v)
		if err != nil || fd < 3 {
			return fmt.Errorf("not a descriptor: %q", v)
		}
		cgroups = append(cgroups, fd)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "warren %s: %v\n", SpawnVerb, err)
		return 1
	}
	u := User{UID: *uid, GID: *gid}
	if *groups != "" {
		for _, s := range strings.Split(*groups, ",") {
			g, err := strconv.Atoi(s)
			if err != nil || g <= 0 {
				return fail(fmt.Errorf("--groups: %q", s))
			}
			u.Groups = append(u.Groups, g)
		}
	}
	if u.UID <= 0 || u.GID <= 0 || fs.NArg() == 0 {
		return fail(errors.New("want --uid and --gid (not root) and a program"))
	}
	for _, fd := range cgroups {
		// "0" is the writer itself, on cgroup v1 and v2 alike.
		_, err := unix.Write(fd, []byte("0"))
		unix.Close(fd)
		if err != nil {
			return fail(fmt.Errorf("join cgroup (descriptor %d): %w", fd, err))
		}
	}
	if *root != "" {
		if err := unix.Chroot(*root); err != nil {
			return fail(fmt.Errorf("chroot %s: %w", *root, err))
		}
		if err := unix.Chdir("/"); err != nil {
			return fail(err)
		}
	}
	var keep []uintptr
	if *bpf {
		keep = []uintptr{unix.CAP_BPF}
	}
	if err := BecomeUser(u, keep); err != nil {
		return fail(err)
	}
	argv := fs.Args()
	return fail(syscall.Exec(argv[0], argv, os.Environ()))
}
