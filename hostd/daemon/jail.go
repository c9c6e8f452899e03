package daemon

import (
	"crypto/rand"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/warrenvm/warren/hostd/cgroup"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/internal/atomicfile"
	"github.com/warrenvm/warren/vmmctl"
	"github.com/warrenvm/warren/vmmproc/jail"
)

// JailPrepare returns an ExecLauncher.Prepare that jails every VMM the
// daemon starts (vmmproc/jail): the VMM's spec with its jail set
// (vmmctl.Launch.WithJail: `--jail PROFILE` on its command line), so
// that the VMM hardens itself once its setup is done (seccomp allowlist,
// capabilities dropped, no_new_privs; its fork children inherit it), and
// new mount, ipc and uts namespaces, and a new, empty network namespace
// for a VMM without a network (its control socket and vsock are unix
// sockets by path, which work across network namespaces; its fork
// children share it). profile is "strict" or "vmm", optionally with
// ",log" (find missing syscalls) or ",kill".
//
// The daemon's VMMs serve the fork API (POST /v1/sandboxes/{id}/fork), so
// the default is "vmm": under "strict" a fork fails with EPERM.
//
// And a new pid namespace per VMM family: the VMM runs under `warren
// jail-init` (jail.RunInit), the namespace's pid 1, which mounts the
// namespace's /proc and reaps; the VMM's fork children live in the same
// namespace and outlive the VMM (the init stays while any does). The
// launcher returns the VMM's PID in the daemon's namespace (the init's
// child, which the init reports through SCM_CREDENTIALS: jail.ReceivePID),
// and the fork children's PIDs the VMM reports (its namespace's) are
// translated with jail.HostPID.
//
// Not used, deliberately:
//   - a network namespace for a network sandbox's VMM: it gets a private
//     one (`warren run --private-net`: its tap and egress services live
//     there) from its jail-init (`--net-helper`, Confinement.NetHelper),
//     and keeps the host's for its upstream connections;
//   - Pdeathsig: a VMM outlives the daemon, which re-adopts it when it
//     starts again.
func JailPrepare(profile string) (func(cmd *exec.Cmd, spec LaunchSpec) (*vmmctl.JailInit, error), error) {
	base, err := vmmctl.ParseJail(profile)
	if err != nil {
		return nil, err
	}
	if !base.On() || base.Root != "" || base.UID != 0 {
		return nil, fmt.Errorf("jail %q: want strict or vmm, optionally with ,log or ,kill", profile)
	}
	return func(cmd *exec.Cmd, spec LaunchSpec) (*vmmctl.JailInit, error) {
		// warren jail-init [...] -- warren SUBCOMMAND ... --jail PROFILE,...
		// (ExecLauncher fills in the descriptors.)
		jl := base
		init := &vmmctl.JailInit{Cgroups: spec.Cgroup}
		if c := spec.Confine; c != nil {
			c.confine(&jl)
			init.NetHelper = c.NetHelper
			if c.GrantKey != nil {
				// (ExecLauncher sends the key on the report socket.)
				init.Spawn, init.CgroupRoots = true, c.CgroupRoots
			}
		}
		v, err := jl.Encode()
		if err != nil {
			return nil, err
		}
		init.VMM = spec.Launch.WithJail(v)
		// jail-init checks that its mount namespace is not this one.
		mnt, err := jail.ParentMountNS()
		if err != nil {
			return nil, fmt.Errorf("jail: %w", err)
		}
		if cmd.Env == nil {
			cmd.Env = os.Environ()
		}
		cmd.Env = append(cmd.Env, mnt)
		attr := jail.SysProcAttr(jail.NSOptions{NetNS: !spec.Network})
		attr.Pdeathsig = 0
		cmd.SysProcAttr = attr
		return init, nil
	}, nil
}

// Confinement is where and as whom a jailed VMM runs once its setup is
// done (LaunchSpec.Confine): JailPrepare passes it on `--jail` (root=,
// user=, bind=, dev=), and the VMM pivot_roots into Root, a tmpfs holding
// only Binds at their own paths and its device nodes, and leaves root for
// UID/GID with no capability left (vmmproc/jail.PivotRoot, Enter).
type Confinement struct {
	// UID and GID are the VMM's own, from the daemon's --vmm-uid-range;
	// Groups are its fork ancestors' gids (familyGroups: their disk
	// layers its chain reads).
	UID, GID int
	Groups   []int
	// NetHelper starts the VMM's jail-init with --net-helper: a network
	// VMM's private network, and its fork children's, are made by
	// jail-init, which stays root, and handed over as descriptors
	// (vmmproc's nethelper.go), so the VMM needs no privilege.
	NetHelper bool
	// GrantKey, when set, has the VMM's jail-init start the family's
	// fork children (`jail-init --spawn`, vmmproc/jail.Spawner) under grants
	// signed with it (the family's key, vmmproc/jail.FamilyKey), into
	// cgroups under CgroupRoots: the VMM itself then makes no process.
	GrantKey    []byte
	CgroupRoots []string
	// Root is the jail directory (empty on the host; STATE/jail/ID).
	Root string
	// Binds are the host paths it still needs.
	Binds []vmmctl.Bind
}

// confine adds c to the jail j: its root with the devices a VMM needs
// and c's binds, and its user.
func (c *Confinement) confine(j *vmmctl.Jail) {
	j.Root, j.Devices, j.Binds = c.Root, []string{"kvm", "null"}, c.Binds
	if c.UID != 0 {
		j.UID, j.GID, j.Groups = c.UID, c.GID, c.Groups
	}
}

// UIDRange is the range VMM uids (and gids, the same numbers) are drawn
// from: First to First+Count-1 (warren-hostd --vmm-uid-range FIRST:COUNT,
// Firecracker jailer's --uid/--gid). None of them may be a user or group
// of the host (CheckUnused).
type UIDRange struct{ First, Count int }

// DefaultUIDRange is warren-hostd's --vmm-uid-range: 65536 ids from one
// million, above the ranges distributions hand out to users (below 60000)
// and to user namespaces by /etc/subuid (from 100000, 65536 a user).
const DefaultUIDRange = "1000000:65536"

// CheckUnused refuses r when a line of one of the passwd- or group-style
// files names an id in it (a VMM would then act as that user or group).
// A file that does not exist is skipped.
func (r *UIDRange) CheckUnused(files ...string) error {
	for _, f := range files {
		b, err := os.ReadFile(f)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("--vmm-uid-range: %w", err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			fields := strings.Split(line, ":")
			if len(fields) < 3 {
				continue
			}
			if id, err := strconv.Atoi(fields[2]); err == nil && r.has(id) {
				return fmt.Errorf("--vmm-uid-range %d:%d holds %s's id %d (%s): choose a range no user or group of the host has",
					r.First, r.Count, fields[0], id, f)
			}
		}
	}
	return nil
}

// ParseUIDRange parses "FIRST:COUNT" ("" or "off": none).
func ParseUIDRange(v string) (*UIDRange, error) {
	if v == "" || v == "off" {
		return nil, nil
	}
	a, b, ok := strings.Cut(v, ":")
	first, err1 := strconv.Atoi(a)
	count, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || first < 1000 || count < 1 || first+count > 1<<31-2 {
		return nil, fmt.Errorf("--vmm-uid-range %q: want FIRST:COUNT, FIRST at least 1000", v)
	}
	return &UIDRange{First: first, Count: count}, nil
}

func (r *UIDRange) has(uid int) bool { return r != nil && uid >= r.First && uid < r.First+r.Count }

// uidAllocMu serializes uid allocations (an allocation is the chown of
// the sandbox's directory: the owner is the record).
var uidAllocMu sync.Mutex

// dirOwner returns the owner of dir, or -1.
func dirOwner(dir string) int {
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() {
		return -1
	}
	return int(fi.Sys().(*syscall.Stat_t).Uid)
}

// sandboxUID returns the uid of sandbox id's VMMs: the owner of its
// directory when that is in the range (so a restarted daemon, a resume
// and a fork child keep it), else a new one no other sandbox directory
// of the state owns (probed from a hash of the id), which then owns dir.
func (d *Daemon) sandboxUID(dir, id string) (int, error) {
	r := d.cfg.VMMUIDs
	uidAllocMu.Lock()
	defer uidAllocMu.Unlock()
	if u := dirOwner(dir); r.has(u) {
		return u, nil
	}
	used := map[int]bool{}
	tenants, _ := os.ReadDir(filepath.Join(d.store.Root, "tenants"))
	for _, t := range tenants {
		for _, kind := range []string{"sandboxes", "templates"} {
			ents, _ := os.ReadDir(filepath.Join(d.store.Root, "tenants", t.Name(), kind))
			for _, e := range ents {
				if u := dirOwner(filepath.Join(d.store.Root, "tenants", t.Name(), kind, e.Name())); r.has(u) {
					used[u] = true
				}
			}
		}
	}
	h := fnv.New32a()
	h.Write([]byte(id))
	start := int(h.Sum32() % uint32(r.Count))
	for i := range r.Count {
		u := r.First + (start+i)%r.Count
		if !used[u] {
			if err := os.Chown(dir, u, u); err != nil {
				return 0, err
			}
			return u, nil
		}
	}
	return 0, fmt.Errorf("jail: every uid of --vmm-uid-range %d:%d is in use", r.First, r.Count)
}

// famRunDir is the run directory of sb's VMM family: its fork children's
// sockets, consoles and logs, each child's in a directory of its own there
// when its family's jail-init starts it (forkGrants); a child's is its
// parent's.
func (d *Daemon) famRunDir(sb *store.Sandbox) string {
	if sb.Family != "" {
		return filepath.Join(d.store.RunDir(), "j-"+sb.Family)
	}
	if dir := filepath.Dir(sb.API); dir != filepath.Clean(d.store.RunDir()) {
		return dir
	}
	return filepath.Join(d.store.RunDir(), "j-"+sb.ID)
}

// confinement prepares the files of sandbox sb's next VMM for its uid and
// returns its Confinement, or nil when VMMs are not confined (no
// --vmm-uid-range). A network sandbox's VMM is jailed the same way, its
// network made by its jail-init (networkBinds says what it reads).
//
// Its directory (and what the daemon made in it: overlays, snapshots/)
// is owned by its uid, 0700 (0710 once it forked: its children, in its
// group, read its frozen layers); the tenant's sandboxes directory is
// bound writable (its own directory is there: the uid's permissions keep
// the siblings' closed, 0711 lets it reach its own), its
// template and image bases read-only (fork children follow their disk
// chains down to them by path: made readable, under a directory only the
// tenant's jails bind), the family's run directory writable (root's,
// 0711, holding each fork child's own directory), the warren
// binary executable (fork children), /sys/module read-only (the host
// profile), and the decryption directory (a rollback's working copy,
// granted to the uid by grantVMM).
func (d *Daemon) confinement(sb *store.Sandbox) (*Confinement, error) {
	if d.cfg.VMMUIDs == nil {
		return nil, nil
	}
	dir := d.store.SandboxDir(sb.Tenant, sb.ID)
	uid, err := d.sandboxUID(dir, sb.ID)
	if err != nil {
		return nil, err
	}
	tenant := filepath.Join(d.store.Root, "tenants", sb.Tenant)
	sbs, tpls, imgs := filepath.Join(tenant, "sandboxes"), filepath.Join(tenant, "templates"), filepath.Join(tenant, "images")
	if err := os.MkdirAll(filepath.Join(dir, "snapshots"), 0o700); err != nil {
		return nil, err
	}
	if err := chownTree(dir, uid); err != nil {
		return nil, fmt.Errorf("jail: %w", err)
	}
	// Its children's own directories go in the family's run directory
	// (forkGrants): root's, which each may pass through.
	run := d.famRunDir(sb)
	if err := os.MkdirAll(run, 0o711); err != nil {
		return nil, err
	}
	if err := os.Chown(run, 0, 0); err != nil {
		return nil, err
	}
	if err := os.Chmod(run, 0o711); err != nil {
		return nil, err
	}
	os.Chmod(sbs, 0o711)
	os.Chmod(tpls, 0o711)
	if sb.Template != "" {
		readableTree(filepath.Join(tpls, sb.Template))
	}
	readableTree(imgs)
	c := &Confinement{UID: uid, GID: uid, Groups: d.familyGroups(sb), Root: filepath.Join(d.store.Root, "jail", sb.ID),
		Binds: []vmmctl.Bind{{Path: sbs, Writable: true}, {Path: tpls}, {Path: run, Writable: true}}}
	if err := os.MkdirAll(c.Root, 0o700); err != nil {
		return nil, err
	}
	if _, err := os.Stat(imgs); err == nil {
		c.Binds = append(c.Binds, vmmctl.Bind{Path: imgs})
	}
	if exe, err := filepath.EvalSymlinks(d.cfg.Warren); err == nil && d.cfg.Warren != "" {
		// At the path the VMM resolves for itself (/proc/self/exe).
		exe, _ = filepath.Abs(exe)
		c.Binds = append(c.Binds, vmmctl.Bind{Path: exe, Exec: true})
	}
	if _, err := os.Stat("/sys/module"); err == nil {
		c.Binds = append(c.Binds, vmmctl.Bind{Path: "/sys/module"})
	}
	if d.cfg.DecryptDir != "" {
		if _, err := os.Stat(d.cfg.DecryptDir); err == nil {
			os.Chmod(d.cfg.DecryptDir, 0o711)
			c.Binds = append(c.Binds, vmmctl.Bind{Path: filepath.Clean(d.cfg.DecryptDir), Writable: true})
		}
	}
	if sb.Network {
		c.NetHelper = true
		c.Binds = append(c.Binds, d.networkBinds()...)
	}
	if d.grantSecret != nil {
		c.GrantKey = jail.FamilyKey(d.grantSecret, run)
		if d.cg != nil {
			c.CgroupRoots = d.cg.Roots()
		}
	}
	return c, nil
}

// grantFile holds the daemon's secret its families' grant keys derive
// from (vmmproc/jail.FamilyKey), under the state directory.
const grantFile = "grant.key"

// loadGrantSecret returns the secret in the state directory's grantFile,
// made on first use: kept across restarts, so that the families of VMMs
// the daemon adopts still take its grants.
func loadGrantSecret(root string) ([]byte, error) {
	p := filepath.Join(root, grantFile)
	b, err := os.ReadFile(p)
	if err == nil && len(b) == 32 {
		return b, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("grant secret: %w", err)
	}
	b = make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	if err := atomicfile.Write(p, b, 0o600); err != nil {
		return nil, fmt.Errorf("grant secret: %w", err)
	}
	return b, nil
}

// forkPlan is what a fork's children will be where the parent's
// jail-init starts them (forkGrants): per child, its grant, its cgroup
// (nil without cgroups), and its run directory and path prefix, its own.
type forkPlan struct {
	grants   []string
	groups   []*cgroup.Group
	runDirs  []string
	prefixes []string
	// secrets are the children's secrets files (forkSecrets), if any.
	secrets []string
}

// undo removes what the plan made for child k, one that never started.
func (p *forkPlan) undo(k int) {
	if p == nil {
		return
	}
	if k < len(p.secrets) && p.secrets[k] != "" {
		os.Remove(p.secrets[k])
	}
	if p.groups[k] != nil {
		p.groups[k].Remove()
	}
	if p.runDirs[k] != "" {
		os.RemoveAll(p.runDirs[k])
	}
}

// forkGrants prepares parent's fork children (ids, their sandbox
// directories dirs, made) where the parent's jail-init starts them
// (store.Sandbox.Spawner): each child gets a uid of its own (the owner of
// its directory, as any sandbox's), its own cgroup (named by its id, with
// the parent's limits; none without cgroups), its own run directory in
// the family's (famRunDir/ID, the child's, 0700), and a grant saying so,
// signed with the family's key, whose groups are the parent's gid and
// the parent's own groups: the gids of every fork ancestor, whose frozen
// disk layers the child's chain reads (made readable by their group at
// each fork: cow.Forker.ChildrenMakeDisks; each ancestor's directory is
// 0710 for it). It returns nil for any other parent. On an error nothing
// of it is left.
func (d *Daemon) forkGrants(parent *store.Sandbox, ids, dirs []string) (plan *forkPlan, err error) {
	if !parent.Spawner || d.grantSecret == nil {
		return nil, nil
	}
	pdir := d.store.SandboxDir(parent.Tenant, parent.ID)
	puid := dirOwner(pdir)
	if d.cfg.VMMUIDs == nil || !d.cfg.VMMUIDs.has(puid) {
		return nil, fmt.Errorf("fork: sandbox %s's VMM has no uid of the range (%d)", parent.ID, puid)
	}
	if err := os.Chmod(pdir, 0o710); err != nil {
		return nil, fmt.Errorf("fork: %w", err)
	}
	groups := append([]int{puid}, d.familyGroups(parent)...)
	key := jail.FamilyKey(d.grantSecret, d.famRunDir(parent))
	n := len(ids)
	plan = &forkPlan{grants: make([]string, n), groups: make([]*cgroup.Group, n), runDirs: make([]string, n), prefixes: make([]string, n)}
	defer func() {
		if err != nil {
			for k := range ids {
				plan.undo(k)
			}
			plan = nil
		}
	}()
	for k, id := range ids {
		uid, err := d.sandboxUID(dirs[k], id)
		if err != nil {
			return nil, err
		}
		run := filepath.Join(d.famRunDir(parent), id)
		if err := os.Mkdir(run, 0o700); err != nil {
			return nil, fmt.Errorf("fork: %w", err)
		}
		plan.runDirs[k], plan.prefixes[k] = run, filepath.Join(run, "vm")
		if err := os.Chown(run, uid, uid); err != nil {
			return nil, fmt.Errorf("fork: %w", err)
		}
		g := jail.Grant{UID: uid, GID: uid, Groups: groups, BPF: parent.Network && jail.BPFNeedsCap()}
		if d.cg != nil {
			cg, err := d.cg.Create(id, cgroup.Limits{MemoryBytes: int64(parent.MemMiB+d.cfg.MemOverheadMiB) << 20, CPUs: float64(parent.CPUs)})
			if err != nil {
				return nil, fmt.Errorf("fork: cgroup: %w", err)
			}
			plan.groups[k], g.Cgroup = cg, id
		}
		if plan.grants[k], err = jail.NewGrant(key, g); err != nil {
			return nil, err
		}
	}
	return plan, nil
}

// snapshotsDir makes sure sb's snapshots directory is there, and its
// VMM's when that is confined (a fork child's, whose directory the daemon
// made for its uid, has none until its first snapshot).
func (d *Daemon) snapshotsDir(sb *store.Sandbox) error {
	dir := d.store.SandboxDir(sb.Tenant, sb.ID)
	snaps := filepath.Join(dir, "snapshots")
	if err := os.MkdirAll(snaps, 0o700); err != nil {
		return err
	}
	if u := dirOwner(dir); d.cfg.VMMUIDs != nil && d.cfg.VMMUIDs.has(u) && dirOwner(snaps) != u {
		return os.Chown(snaps, u, u)
	}
	return nil
}

// forkSecrets writes the secrets file of each of network parent's fork
// children (ids, planned: their directories are their uids') and returns
// their paths: a child's credential proxy reads its own, as its uid, not
// its parent's.
func (d *Daemon) forkSecrets(parent *store.Sandbox, ids []string, plan *forkPlan) ([]string, error) {
	d.secretsMu.Lock()
	defer d.secretsMu.Unlock()
	plan.secrets = make([]string, len(ids))
	for k, id := range ids {
		path, err := d.sandboxSecretsPath(parent.Tenant, id)
		if err != nil {
			return nil, err
		}
		kid := store.Sandbox{Tenant: parent.Tenant, ID: id, Secrets: parent.Secrets}
		if err := d.writeSandboxSecrets(&kid, path); err != nil {
			return nil, err
		}
		plan.secrets[k] = path
	}
	return plan.secrets, nil
}

// familyGroups are the gids of sb's fork ancestors' VMMs (the owners of
// their directories, in the range), nearest first: the groups sb's VMM is
// in, for their frozen disk layers in its chain.
func (d *Daemon) familyGroups(sb *store.Sandbox) []int {
	var gs []int
	p := sb.Parent
	for depth := 0; p != "" && depth < 32; depth++ {
		d.mu.Lock()
		ps := d.sandboxes[p]
		d.mu.Unlock()
		if ps == nil {
			break
		}
		// (Tenant, ID and Parent never change once a record is made: read
		// without its lock, which a caller may hold for a descendant.)
		tenant, id, parent := ps.rec.Tenant, ps.rec.ID, ps.rec.Parent
		if u := dirOwner(d.store.SandboxDir(tenant, id)); d.cfg.VMMUIDs != nil && d.cfg.VMMUIDs.has(u) && !slices.Contains(gs, u) {
			gs = append(gs, u)
		}
		p = parent
	}
	return gs
}

// networkBinds are the host files a network VMM and its fork children
// read after the jail (read-only): the resolver's upstream
// (/etc/resolv.conf, unless --dns-upstream names one), the operator's
// --egress-hosts and --upstream-ca files, and the system's trust roots for
// the credential proxy's upstream TLS (/etc/ssl, /etc/pki), and
// /sys/devices/system/cpu/possible (a fork child's egress filter sizes its
// per-CPU maps by it). Those that do not exist are left out.
//
// A network VMM is jailed like any other, as its own uid with no
// capability (CAP_BPF alone on kernels before 6.5, for its filter's maps:
// vmmproc/jail.BPFNeedsCap): its private network, and its fork children's,
// come from its jail-init (Confinement.NetHelper).
func (d *Daemon) networkBinds() []vmmctl.Bind {
	var paths []string
	if d.cfg.DNSUpstream == "" {
		paths = append(paths, "/etc/resolv.conf")
	}
	paths = append(paths, d.cfg.EgressHosts, d.cfg.UpstreamCA, "/etc/ssl", "/etc/pki", "/sys/devices/system/cpu/possible")
	var binds []vmmctl.Bind
	for _, p := range paths {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			binds = append(binds, vmmctl.Bind{Path: filepath.Clean(p)})
		}
	}
	return binds
}

// templateConfinement prepares template t's build directory dir for a
// confined build VMM and returns its Confinement, or nil when VMMs are not
// confined (a network template's: as confinement does). The build VMM
// runs the guest's first boot and the image's start command, tenant code,
// so it is confined like a sandbox's: its own uid (which owns dir while
// it runs: its disk clones, console, snapshot), dir bound writable, the
// tenant's image bases read-only (an image template's root disk is an
// overlay of one), /sys/module read-only. release gives dir back to root
// once the VMM is gone, freeing the uid; call it whatever the build's
// outcome.
func (d *Daemon) templateConfinement(t *store.Template, dir string) (c *Confinement, release func(), err error) {
	release = func() {}
	if d.cfg.VMMUIDs == nil {
		return nil, release, nil
	}
	uid, err := d.sandboxUID(dir, t.ID)
	if err != nil {
		return nil, release, err
	}
	root := filepath.Join(d.store.Root, "jail", t.ID)
	release = func() {
		chownTree(dir, 0)
		os.Remove(root) // an empty mount point on the host's side
	}
	if err := os.MkdirAll(filepath.Join(dir, "snap"), 0o700); err != nil {
		return nil, release, err
	}
	if err := chownTree(dir, uid); err != nil {
		return nil, release, fmt.Errorf("jail: %w", err)
	}
	c = &Confinement{UID: uid, GID: uid, Root: root,
		Binds: []vmmctl.Bind{{Path: dir, Writable: true}}}
	if err := os.MkdirAll(c.Root, 0o700); err != nil {
		return nil, release, err
	}
	imgs := filepath.Join(d.store.Root, "tenants", t.Tenant, "images")
	if _, err := os.Stat(imgs); err == nil {
		readableTree(imgs)
		c.Binds = append(c.Binds, vmmctl.Bind{Path: imgs})
	}
	if _, err := os.Stat("/sys/module"); err == nil {
		c.Binds = append(c.Binds, vmmctl.Bind{Path: "/sys/module"})
	}
	if t.Network {
		c.NetHelper = true
		c.Binds = append(c.Binds, d.networkBinds()...)
	}
	return c, release, nil
}

// grantVMM gives s's confined VMM (its directory's owner, in the range)
// the working copy at path (a rollback's, under the decryption
// directory): its directory and files become the uid's.
func (d *Daemon) grantVMM(sb *store.Sandbox, path string) {
	if d.cfg.VMMUIDs == nil || d.cfg.DecryptDir == "" {
		return
	}
	uid := dirOwner(d.store.SandboxDir(sb.Tenant, sb.ID))
	work := filepath.Dir(path)
	if !d.cfg.VMMUIDs.has(uid) || !strings.HasPrefix(work, filepath.Clean(d.cfg.DecryptDir)+"/") {
		return
	}
	chownTree(work, uid)
}

// shareDir gives a fork child's directory to its parent's uid (the
// parent's VMM makes the child's overlays there, and the child runs as
// the parent's uid).
func (d *Daemon) shareDir(parent *store.Sandbox, dir string) {
	if d.cfg.VMMUIDs == nil {
		return
	}
	if uid := dirOwner(d.store.SandboxDir(parent.Tenant, parent.ID)); d.cfg.VMMUIDs.has(uid) {
		os.Chown(dir, uid, uid)
	}
}

// chownTree gives dir and everything in it (not following symlinks, the
// record excepted) to uid.
func chownTree(dir string, uid int) error {
	return filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.Name() == "sandbox.json" && filepath.Dir(p) == dir {
			return nil
		}
		return os.Lchown(p, uid, uid)
	})
}

// readableTree makes dir's directories 0755 and its files readable by
// all, owned by root (a template's frozen bases, the tenant's image
// bases: reachable only through the tenant's jails' binds, under the
// state directory's 0700).
func readableTree(dir string) {
	filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		fi, err := e.Info()
		if err != nil {
			return nil
		}
		os.Lchown(p, 0, 0)
		if e.IsDir() {
			os.Chmod(p, 0o755)
		} else if fi.Mode().IsRegular() {
			os.Chmod(p, fi.Mode().Perm()|0o444)
		}
		return nil
	})
}
