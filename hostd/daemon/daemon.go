// Package daemon is warren-hostd: one daemon per KVM host that owns the
// host's sandboxes. It keeps their records in a state directory
// (hostd/store), runs one VMM process (the warren binary) per sandbox in a
// cgroup of its own (hostd/cgroup), supervises them, and serves the JSON
// API described in hostd/openapi.yaml, per tenant.
//
// The VMMs are separate processes in their own sessions: a daemon that
// stops or is killed leaves them running, and a daemon that starts re-adopts
// every sandbox whose VMM is still the process it recorded (PID and start
// time) and answers on its control socket; the others are marked stopped
// and can be resumed from their latest snapshot.
package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/hostd/cgroup"
	"github.com/warrenvm/warren/hostd/crypt"
	"github.com/warrenvm/warren/hostd/pagestore"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
)

// Hooks are where other host components plug in.
type Hooks struct {
	// SnapshotWritten is called after a VMM wrote the snapshot DIR/NAME
	// (NAME.wstate and its NAME.*.wsnap layers) of tenant's sandbox or
	// template, before the daemon records it: at-rest encryption
	// (hostd/crypt) plugs in here.
	SnapshotWritten func(tenant, path string) error
	// BeforeRestore is called before a VMM is started on, or rolled back
	// to, the snapshot DIR/NAME (and the chain under it): decryption plugs
	// in here. It returns the snapshot path the VMM is to read (path, or
	// a decrypted working copy) and, optionally, done, which the daemon
	// calls once the VMM has loaded it (or failed to). A copy with no
	// done lasts (a template's: atrest.go) and is restored lazily; one
	// with done is restored eagerly. New wraps it (or none) with the page
	// store's: a chain with layers in the store is rebuilt into a working
	// copy (pagestore.go).
	BeforeRestore func(tenant, path string) (use string, done func(), err error)
	// (The VMM jail plugs into the Launcher: ExecLauncher.Prepare.)
}

// Observer receives measurements (a Prometheus exporter implements it).
type Observer interface {
	// ObserveRequest is called once per API request.
	ObserveRequest(tenant, method, route string, status int, d time.Duration)
	// ObserveOp is called when an operation ends: template_build, create,
	// resume_from_disk, pause_to_disk, fork, snapshot, exec.
	ObserveOp(op string, d time.Duration, err error)
}

type nopObserver struct{}

func (nopObserver) ObserveRequest(string, string, string, int, time.Duration) {}
func (nopObserver) ObserveOp(string, time.Duration, error)                    {}

// Config configures a Daemon.
type Config struct {
	// State is the state directory.
	State string
	// Launcher starts VMMs; default an ExecLauncher on Warren.
	Launcher Launcher
	// Warren is the warren binary (for the default launcher).
	Warren string
	// Log is the daemon's log (default: JSON on stderr).
	Log *slog.Logger
	// Audit receives one JSON line per API request (default: none).
	Audit io.Writer
	// CgroupRoot is where cgroup hierarchies are mounted (default
	// /sys/fs/cgroup); "none" runs without cgroups.
	CgroupRoot string
	// CgroupParent is the daemon's parent group (default "warren").
	CgroupParent string
	// BootTimeout bounds a template's boot to its agent's first answer
	// (default 5 min); RestoreTimeout a restore's (default 2 min).
	BootTimeout, RestoreTimeout time.Duration
	// MonitorInterval is how often VMM processes are checked (default 1 s).
	MonitorInterval time.Duration
	// TemplateCacheIdle is how long a template of a tenant without a key
	// keeps its memory layer and flattened image, caches of the page
	// store, after its last create (templatepages.go): default 1 h when
	// 0; negative, for ever.
	TemplateCacheIdle time.Duration
	// MemOverheadMiB is added to a sandbox's memory for its VMM's cgroup
	// limit (default 128).
	MemOverheadMiB int
	// MaxRestores is how many VMMs may be restoring at once, from their
	// start until their guest's agent answers (default: the host's CPUs);
	// further creates and resumes queue (admission.go).
	MaxRestores int
	// RestoreMemory is how creates restore their template's memory:
	// RestoreMmap ("mmap", the default when empty: `warren restore
	// --lazy=mmap`, the snapshot flattened once and mapped copy-on-write)
	// or RestoreUffd ("uffd": `--lazy=uffd`, pages filled by userfaultfd
	// as the guest touches them, the template's recorded working set
	// prefetched; see workingset.go). Other restores keep theirs. New
	// refuses any other value.
	RestoreMemory string
	// Keys, when set, turns on at-rest encryption of the snapshots and
	// the secrets file of every tenant that has a key there (see
	// atrest.go and secrets.go), the /v1/keys API, and the Hooks that are
	// unset. DecryptDir is where restores decrypt their working copies
	// and where the VMMs of those tenants' network sandboxes read their
	// secrets (default STATE/run/decrypted; a tmpfs such as
	// /run/warren/decrypted keeps them off disks).
	Keys       *crypt.LocalProvider
	DecryptDir string
	// Jail, for the default launcher, jails every VMM: "strict" or "vmm"
	// (see JailPrepare); "" or "off" for none.
	Jail string
	// VMMUIDs, when set, confines every VMM (sandboxes, their fork
	// children, template builds: Confinement): a pivot_root jail with only
	// its files, and, without a network, its own uid and gid from the
	// range. Needs a jailed launcher.
	VMMUIDs *UIDRange
	// EgressHosts, DNSUpstream and UpstreamCA are passed to the build VMM
	// of every network template (`warren run --hosts`, `--dns-upstream`,
	// `--upstream-ca`; recorded in its snapshot), and so are in force in
	// all its sandboxes: an /etc/hosts-style file of fixed addresses for
	// the resolver and the credential proxy, the DNS server (IP:PORT)
	// allowed names are asked of, and the PEM roots the credential proxy
	// trusts upstream. Empty: the VMM's defaults (the host's
	// /etc/resolv.conf, the system's roots).
	EgressHosts, DNSUpstream, UpstreamCA string
	// EgressUpstreamAllow are the operator's addresses or CIDRs
	// (comma-separated) the credential proxies of network templates may
	// connect to although loopback, private, link-local or the host's own
	// (`warren run --upstream-allow`, recorded in the template's
	// snapshot); "" is none. WildcardCredentials allows credential hosts
	// such as "*.example.com" in tenants' policies (checked here and by
	// the VMMs: `warren run --allow-wildcard-credentials`).
	EgressUpstreamAllow string
	WildcardCredentials bool
	// GuestDir is the operator's guest directory: the kernels, initramfs
	// and raw disk images templates name, by name (guestfiles.go); ""
	// for none (templates then come from images only). It must be owned
	// by root or the daemon's user and writable by no one else.
	GuestDir string
	// GuestKernel and GuestInitramfs are the guest kernel and initramfs
	// of templates made from images whose requests name none (images.go):
	// names in GuestDir, or paths of the operator's.
	GuestKernel, GuestInitramfs string
	// ImageDiskMiB is the default size of an image's root file system
	// (default 4096); MaxImageBytes bounds an image's uncompressed layers
	// (package image's default when 0); MaxUploadBytes bounds an
	// uploaded image archive (default 16 GiB).
	ImageDiskMiB                  int
	MaxImageBytes, MaxUploadBytes int64
	// Registries are the registry hosts (host or host:port) the operator
	// allows although they resolve to loopback, private or link-local
	// addresses, and over plain HTTP (insecure_registry); every other
	// registry is pulled from only at public addresses, over HTTPS.
	Registries []string

	Hooks    Hooks
	Observer Observer
}

// Daemon is the host daemon.
type Daemon struct {
	cfg      Config
	store    *store.Store
	log      *slog.Logger
	launcher Launcher
	cg       *cgroup.Manager
	// grantSecret is what the families' grant keys derive from (nil: the
	// VMMs fork on their own; jail.go's loadGrantSecret).
	grantSecret []byte
	obs         Observer
	events      *bus
	audit       *auditLog
	atRest      *atRest
	// pages is the host's page store of snapshot memory (pagestore.go).
	pages *pageStore
	// disks seals tenants' idle disk files (diskseal.go).
	disks diskSeal
	// restores admits restores (admission.go).
	restores *restoreGate

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// egressTally backs EgressDenied (egressmetrics.go).
	egressTally egressTally

	// secretsMu serialises the reads and writes of tenants' secret files
	// and of sandboxes' secrets files (network.go, secrets.go); it is
	// taken after an sbState's mu, never before.
	secretsMu sync.Mutex

	mu        sync.Mutex
	templates map[string]*tplState
	sandboxes map[string]*sbState
	servers   []*http.Server
}

type tplState struct {
	mu  sync.Mutex // held while the template is built or deleted
	rec *store.Template
	// warm is held by the first restore of the template since the daemon
	// started (until warmed, which it guards, is set by one that
	// succeeded): a lazy restore flattens the snapshot once, and
	// concurrent first restores would all flatten it; in uffd mode the
	// first restore records the template's working set, which the others
	// wait for (workingset.go). It also guards rec.WorkingSetPages, the
	// only field of a ready template's record that changes (written with
	// warm held, by that restore or forgetWorkingSets).
	warm   sync.Mutex
	warmed bool
	// creating counts the creates from the template in flight (from
	// before they take warm to their end), lastUsed is when one last
	// started or ended, or the template was built, exported or adopted
	// (Unix ns): a cache is dropped only while creating is 0 and
	// lastUsed is older than Config.TemplateCacheIdle (templatepages.go).
	creating atomic.Int32
	lastUsed atomic.Int64
	// view is a copy of rec as last saved.
	view atomic.Pointer[store.Template]
}

// saveTemplate writes t's record and publishes it to readers.
func (d *Daemon) saveTemplate(t *tplState) error {
	c := *t.rec
	t.view.Store(&c)
	err := d.store.SaveTemplate(t.rec)
	if err != nil {
		d.log.Error("save record", "template", t.rec.ID, "err", err)
	}
	return err
}

type sbState struct {
	mu  sync.Mutex // serialises the sandbox's operations and guards rec
	rec *store.Sandbox
	// agent is the client of its guest agent.
	agent *agentclient.Client
	// chainOK says the VMM took a snapshot into the sandbox's directory
	// since it started or rolled back, so an incremental one has its
	// parent there.
	chainOK bool
	// chain counts the layers of the rolling snapshotter's current chain.
	chain int
	// stopRolling stops the rolling snapshotter.
	stopRolling context.CancelFunc
	cgroup      *cgroup.Group
	deleted     bool
	// view is a copy of rec as last saved, for readers that must not wait
	// for an operation in progress.
	view atomic.Pointer[store.Sandbox]
}

// save writes s's record and publishes it to readers (caller holds s.mu
// or owns s).
func (d *Daemon) save(s *sbState) error {
	err := d.store.SaveSandbox(s.rec)
	c := copyRec(s.rec)
	s.view.Store(&c)
	if err != nil {
		d.log.Error("save record", "sandbox", s.rec.ID, "err", err)
	}
	return err
}

// New opens the state directory, re-adopts the sandboxes whose VMMs still
// run and starts supervising them. It serves nothing until Serve.
func New(cfg Config) (*Daemon, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
	if cfg.BootTimeout == 0 {
		cfg.BootTimeout = 5 * time.Minute
	}
	if cfg.RestoreTimeout == 0 {
		cfg.RestoreTimeout = 2 * time.Minute
	}
	if cfg.TemplateCacheIdle == 0 {
		cfg.TemplateCacheIdle = time.Hour
	}
	if cfg.MonitorInterval == 0 {
		cfg.MonitorInterval = time.Second
	}
	if cfg.MemOverheadMiB == 0 {
		cfg.MemOverheadMiB = 128
	}
	if cfg.MaxRestores <= 0 {
		cfg.MaxRestores = runtime.NumCPU()
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "warren"
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	mode, err := checkRestoreMemory(cfg.RestoreMemory)
	if err != nil {
		return nil, err
	}
	cfg.RestoreMemory = mode
	st, err := store.Open(cfg.State)
	if err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, store: st, log: cfg.Log, obs: cfg.Observer, events: newBus(),
		audit: &auditLog{w: cfg.Audit}, templates: map[string]*tplState{}, sandboxes: map[string]*sbState{},
		restores: newRestoreGate(cfg.MaxRestores)}
	d.launcher = cfg.Launcher
	if d.launcher == nil {
		if cfg.Warren == "" {
			return nil, errors.New("daemon: no warren binary and no launcher")
		}
		el := &ExecLauncher{Warren: cfg.Warren}
		if cfg.Jail != "" && cfg.Jail != "off" {
			if el.Prepare, err = JailPrepare(cfg.Jail); err != nil {
				return nil, err
			}
		}
		d.launcher = el
	} else if el, ok := d.launcher.(*ExecLauncher); ok && d.cfg.Warren == "" {
		d.cfg.Warren = el.Warren // the binary confined VMMs' fork children run
	}
	if cfg.Keys != nil {
		if cfg.DecryptDir == "" {
			cfg.DecryptDir = filepath.Join(st.RunDir(), "decrypted")
		}
		d.atRest = &atRest{keys: cfg.Keys, work: cfg.DecryptDir, templateOf: d.templateOfSnapshot}
		if d.cfg.Hooks.SnapshotWritten == nil {
			d.cfg.Hooks.SnapshotWritten = d.atRest.SnapshotWritten
		}
		if d.cfg.Hooks.BeforeRestore == nil {
			d.cfg.Hooks.BeforeRestore = d.atRest.BeforeRestore
		}
		// Working copies left by a daemon that died mid-restore (only
		// what BeforeRestore makes: TENANT-NNN directories).
		if ents, err := os.ReadDir(cfg.DecryptDir); err == nil {
			for _, e := range ents {
				if e.IsDir() && (workDirRE.MatchString(e.Name()) || strings.HasPrefix(e.Name(), tplCopyPrefix) || strings.HasPrefix(e.Name(), ".tpl-tmp-")) {
					os.RemoveAll(filepath.Join(cfg.DecryptDir, e.Name()))
				}
			}
		}
		d.cfg.DecryptDir = cfg.DecryptDir
	}
	if cfg.CgroupRoot != "none" {
		root := cfg.CgroupRoot
		if root == "" {
			root = "/sys/fs/cgroup"
		}
		if d.cg, err = cgroup.Detect(root, cfg.CgroupParent); err != nil {
			d.log.Warn("no usable cgroup hierarchy: VMMs run without memory and CPU limits", "err", err)
			d.cg = nil
		} else {
			d.log.Info("cgroups", "version", d.cg.Version)
		}
	}
	if cfg.VMMUIDs != nil {
		// Confined VMMs' fork children are started by their jail-init
		// under the daemon's grants (jail.go's forkGrants).
		if d.grantSecret, err = loadGrantSecret(st.Root); err != nil {
			return nil, err
		}
	}
	ps, err := pagestore.Open(st.PageStoreDir())
	if err != nil {
		return nil, err
	}
	d.pages = &pageStore{st: ps}
	if d.atRest != nil {
		d.atRest.pages = d.pageNS
		d.atRest.rehome = d.rehomePages
	}
	// Restores of snapshots in the store get working copies
	// (pagestore.go), after any decryption.
	d.cfg.Hooks.BeforeRestore = d.restoreHook(d.cfg.Hooks.BeforeRestore)
	d.disks.pins = map[string]int{}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	d.adopt()
	d.ingestAllPages()
	d.templatesIntoStore()
	d.sealAll()
	d.settleWorkingSets()
	d.sweepWorkSecrets()
	d.wg.Add(1)
	go d.monitor()
	if d.cfg.TemplateCacheIdle > 0 {
		d.wg.Add(1)
		go d.templateCaches(min(d.cfg.TemplateCacheIdle/4, time.Minute))
	}
	return d, nil
}

// templateOfSnapshot returns the template whose snapshot path is.
func (d *Daemon) templateOfSnapshot(path string) (tenant, id string, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, ts := range d.templates {
		if t := ts.view.Load(); t != nil && t.Snapshot == path {
			return t.Tenant, t.ID, true
		}
	}
	return "", "", false
}

// adopt loads the records and settles each against the processes found.
func (d *Daemon) adopt() {
	tpls, sbs, errs := d.store.Load()
	for _, err := range errs {
		d.log.Error("unreadable record skipped", "err", err)
	}
	for _, t := range tpls {
		if t.Status == store.TemplateBuilding {
			stopProc(t.PID, t.StartTime, StopGrace)
			t.Status, t.Error, t.PID, t.StartTime = store.TemplateFailed, "build interrupted by a daemon restart", 0, 0
		}
		ts := &tplState{rec: t}
		ts.lastUsed.Store(time.Now().UnixNano())
		d.saveTemplate(ts)
		d.templates[t.ID] = ts
	}
	for _, sb := range sbs {
		if isRecorder(sb.ID) {
			// A build's working-set recorder, cut short: never a
			// tenant's sandbox (workingset_build.go).
			d.discardRecorderRecord(sb)
			continue
		}
		s := &sbState{rec: sb, agent: agentclient.New(sb.Vsock)}
		s.cgroup = d.adoptCgroup(sb)
		c := copyRec(sb)
		s.view.Store(&c)
		d.sandboxes[sb.ID] = s
		switch sb.Status {
		case store.Running, store.Paused:
			if !alive(sb.PID, sb.StartTime) {
				d.markStopped(s, fmt.Sprintf("VMM (pid %d) was gone when the daemon started", sb.PID))
				continue
			}
			if err := vmmAnswers(sb.API); err != nil {
				stopProc(sb.PID, sb.StartTime, StopGrace)
				d.markStopped(s, fmt.Sprintf("VMM (pid %d) did not answer on its control socket when the daemon started (%v); stopped", sb.PID, err))
				continue
			}
			d.log.Info("re-adopted sandbox", "tenant", sb.Tenant, "sandbox", sb.ID, "pid", sb.PID, "status", sb.Status)
			if sb.Rolling != nil {
				d.startRolling(s)
			}
		case store.Creating:
			stopProc(sb.PID, sb.StartTime, StopGrace)
			sb.Status, sb.Reason, sb.PID, sb.StartTime = store.Failed, "creation interrupted by a daemon restart", 0, 0
			d.save(s)
			d.dropSecrets(sb, false)
		}
	}
	// VMMs that no record owns: started by a daemon killed before it
	// recorded them. They hold memory and sockets and nothing can reach
	// them through the API, so they go.
	owned := map[int]bool{}
	for _, s := range d.sandboxes {
		if st := s.rec.Status; (st == store.Running || st == store.Paused) && s.rec.PID > 0 {
			owned[s.rec.PID] = true
		}
	}
	for _, p := range strayVMMs(d.store.Root, owned) {
		d.log.Warn("stopping a VMM that no record owns (its daemon was killed while starting it)", "pid", p.PID)
		stopProc(p.PID, p.StartTime, StopGrace)
	}
	// Sandbox directories without a record: fork children whose daemon
	// was killed before it recorded them (their VMMs were strays, stopped
	// above), or deletes cut short. Nothing can name them through the API.
	for _, r := range d.store.RecordlessSandboxes() {
		d.log.Warn("removing a sandbox directory that no record owns", "tenant", r.Tenant, "sandbox", r.ID)
		if d.cg != nil {
			if err := d.cg.Open(r.ID).Remove(); err != nil {
				d.log.Warn("cgroup remove", "sandbox", r.ID, "err", err)
			}
		}
		if err := d.store.RemoveSandbox(r.Tenant, r.ID); err != nil {
			d.log.Error("remove a sandbox directory that no record owns", "sandbox", r.ID, "err", err)
		}
	}
	d.sweepRecorders()
}

// adoptCgroup returns the cgroup of sandbox sb found at start: the one its
// record names, or, when the record names none, one bearing its id all
// the same (the group is made before the VMM starts and recorded after:
// a daemon killed between the two left it, and no record said so), so
// that the sandbox's stop or delete removes it. nil without cgroups or
// without such a group.
func (d *Daemon) adoptCgroup(sb *store.Sandbox) *cgroup.Group {
	if d.cg == nil {
		return nil
	}
	g := d.cg.Open(sb.ID)
	if len(sb.Cgroup) > 0 && sb.Cgroup[0] != "none" {
		return g
	}
	if _, err := os.Stat(g.Dirs[0]); err != nil {
		return nil
	}
	return g
}

// markStopped records that s's VMM is gone and removes the secrets file
// it read from the decrypt directory (caller holds s.mu or owns s).
func (d *Daemon) markStopped(s *sbState, reason string) {
	sb := s.rec
	if s.stopRolling != nil {
		s.stopRolling()
		s.stopRolling = nil
	}
	sb.Status, sb.Reason, sb.PID, sb.StartTime = store.Stopped, reason, 0, 0
	s.chainOK = false
	d.dropSecrets(sb, false) // (before the record says stopped)
	d.save(s)
	d.log.Warn("sandbox stopped", "tenant", sb.Tenant, "sandbox", sb.ID, "reason", reason)
	d.events.publish(sb.Tenant, wire.Event{Type: "stopped", Sandbox: sb.ID, Detail: reason})
}

// monitor notices VMMs that ended on their own.
func (d *Daemon) monitor() {
	defer d.wg.Done()
	t := time.NewTicker(d.cfg.MonitorInterval)
	defer t.Stop()
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C:
		}
		for _, s := range d.allSandboxes() {
			if !s.mu.TryLock() { // an operation is under way: it settles the status
				continue
			}
			sb := s.rec
			if !s.deleted && (sb.Status == store.Running || sb.Status == store.Paused) && !alive(sb.PID, sb.StartTime) {
				reason := fmt.Sprintf("VMM (pid %d) exited", sb.PID)
				if t := tail(sb.Log, 300); t != "" {
					reason += ": " + t
				}
				d.markStopped(s, reason)
				d.sealIdleDisks(sb.Tenant)
			}
			s.mu.Unlock()
		}
	}
}

// allSandboxes returns the daemon's sandboxes.
func (d *Daemon) allSandboxes() []*sbState {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Collect(maps.Values(d.sandboxes))
}

// Serve serves the API on l until Close; auth names the tenant of each
// request (PeerAuth or HeaderAuth for a unix socket, TokenAuth for TCP).
// Each unix-socket connection's peer credentials (SO_PEERCRED) are in its
// requests' context (PeerCredOf). l may be a TLS listener (tls.NewListener
// with ServerTLS's configuration).
func (d *Daemon) Serve(l net.Listener, auth Authenticator) error {
	return d.ServeHandler(l, d.Handler(auth))
}

// ServeHandler is Serve with the handler given: the daemon's Handler,
// wrapped (the tests check every answer against hostd/openapi.yaml so).
func (d *Daemon) ServeHandler(l net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ConnContext: peerConnContext,
		// TLS handshake failures (no client certificate, plain HTTP)
		// and the like go to the daemon's log.
		ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelWarn)}
	d.mu.Lock()
	d.servers = append(d.servers, srv)
	d.mu.Unlock()
	err := srv.Serve(l)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops serving and supervising, abruptly (open requests are cut),
// and leaves every VMM running: a new daemon on the same state directory
// re-adopts them. It is what a kill of the daemon does, minus the records
// being written: they always are before an operation answers.
func (d *Daemon) Close() error {
	d.mu.Lock()
	srvs := d.servers
	d.servers = nil
	d.mu.Unlock()
	for _, s := range srvs {
		s.Close()
	}
	d.cancel()
	d.wg.Wait()
	return nil
}

// StopAll stops every VMM, each sandbox suspended to disk first when
// suspend is set (a host shutdown), otherwise just stopped.
func (d *Daemon) StopAll(suspend bool) {
	var wg sync.WaitGroup
	for _, s := range d.allSandboxes() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.rec.Status != store.Running && s.rec.Status != store.Paused {
				return
			}
			if suspend {
				if _, err := d.suspendLocked(d.ctx, s, newOp()); err == nil {
					return
				}
			}
			stopProc(s.rec.PID, s.rec.StartTime, StopGrace)
			d.markStopped(s, "stopped with the daemon")
		}()
	}
	wg.Wait()
}

// newID returns prefix-<12 hex digits>.
func newID(prefix string) string {
	var b [6]byte
	rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

// template returns tenant's template id, or nil.
func (d *Daemon) template(tenant, id string) *tplState {
	return owned(d, d.templates, tenant, id, func(t *tplState) string { return t.rec.Tenant })
}

// sandbox returns tenant's sandbox id, or nil: another tenant's is
// indistinguishable from a missing one.
func (d *Daemon) sandbox(tenant, id string) *sbState {
	return owned(d, d.sandboxes, tenant, id, func(s *sbState) string { return s.rec.Tenant })
}

// owned returns m[id] (d.mu held) when owner says tenant's, or nil.
func owned[S any](d *Daemon, m map[string]*S, tenant, id string, owner func(*S) string) *S {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := m[id]
	if s == nil || owner(s) != tenant {
		return nil
	}
	return s
}

// listSandboxes returns copies of tenant's sandbox records, by creation.
func (d *Daemon) listSandboxes(tenant string) []store.Sandbox {
	var out []store.Sandbox
	for _, s := range d.allSandboxes() {
		if s.rec.Tenant != tenant {
			continue
		}
		out = append(out, d.snapshotRec(s))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

// snapshotRec returns a copy of s's record as last saved.
func (d *Daemon) snapshotRec(s *sbState) store.Sandbox { return *s.view.Load() }

func copyRec(r *store.Sandbox) store.Sandbox {
	c := *r
	c.Snapshots = append([]store.Snapshot(nil), r.Snapshots...)
	return c
}

// sockets returns the control and vsock socket paths for id.
func (d *Daemon) sockets(id string) (api, vsock string) {
	return filepath.Join(d.store.RunDir(), id+".api"), filepath.Join(d.store.RunDir(), id+".vsock")
}

// StatusCounts counts the daemon's sandboxes, of every tenant, by status
// (for the warren_sandboxes gauge).
func (d *Daemon) StatusCounts() map[string]int {
	out := map[string]int{}
	for _, s := range d.allSandboxes() {
		out[d.snapshotRec(s).Status]++
	}
	return out
}
