// Package store is warren-hostd's state directory: one JSON record per
// template and per sandbox, under the tenant that owns it, each written
// atomically (temporary file, fsync, rename, fsync of the directory) so a
// kill -9 of the daemon at any instant leaves either the old or the new
// record, never a torn one.
//
//	ROOT/tenants/<tenant>/secrets.json                   (the tenant's secrets, name to value, mode 0600;
//	                                                       sealed by the daemon for a tenant with a key)
//	ROOT/tenants/<tenant>/templates/<id>/template.json   (+ snap/: the template snapshot)
//	ROOT/tenants/<tenant>/sandboxes/<id>/sandbox.json    (+ snapshots/, vmm.log, console.log,
//	                                                       and with network egress.json, egress.jsonl, and
//	                                                       secrets.json for a tenant without a key)
//	ROOT/tenants/<tenant>/images/                        (image bases, one per image digest: package image's Store;
//	                                                       uploads/: images uploaded for a build, removed after it)
//	ROOT/run/<id>.api, <id>.vsock                        (sockets: short paths, < 108 bytes)
//	ROOT/pagestore/<tenant>/<namespace>/                 (the host's page store: hostd/pagestore; the sandboxes'
//	                                                       snapshot layers are reference files into it)
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/warrenvm/warren/internal/atomicfile"
	"github.com/warrenvm/warren/internal/ident"
)

// Record file names.
const (
	templateFile = "template.json"
	sandboxFile  = "sandbox.json"
	secretsFile  = "secrets.json"
)

// Template statuses.
const (
	TemplateBuilding = "building"
	TemplateReady    = "ready"
	TemplateFailed   = "failed"
)

// Sandbox statuses.
const (
	// Creating: the VMM is being started; a record still creating when
	// the daemon starts was interrupted and becomes failed.
	Creating = "creating"
	// Running: the VMM runs the guest.
	Running = "running"
	// Paused: the VMM holds the guest paused in memory.
	Paused = "paused"
	// Suspended: paused to disk, no VMM process; resume restores it.
	Suspended = "suspended"
	// Stopped: the VMM is gone (it exited, or the daemon found it dead
	// at start); Reason says why. Resume restores its latest snapshot,
	// if it has one.
	Stopped = "stopped"
	// Failed: creation failed; only delete is possible.
	Failed = "failed"
)

// Template is one template's record.
type Template struct {
	ID        string   `json:"id"`
	Tenant    string   `json:"tenant"`
	Status    string   `json:"status"`
	Error     string   `json:"error,omitempty"`
	Kernel    string   `json:"kernel"`
	Initramfs string   `json:"initramfs,omitempty"`
	Disks     []string `json:"disks,omitempty"`
	// DiskBases are, by index in Disks, the template's own frozen images
	// of its writable disks (a cow/disk Clone in its directory, made
	// read-only once the template is snapshotted; each sandbox gets a
	// cow/disk overlay over it); "" for a disk given with ",ro", which
	// every sandbox shares read-only. Empty when no disk is writable.
	DiskBases []string `json:"disk_bases,omitempty"`
	MemMiB    int      `json:"mem_mib"`
	CPUs      int      `json:"cpus"`
	Cmdline   string   `json:"cmdline,omitempty"`
	// Network: the template's VMM, and so every sandbox restored from it,
	// has a private network with egress services (see the daemon).
	Network bool `json:"network,omitempty"`
	// Balloon: the template's VMM, and so every sandbox restored from it,
	// has a memory balloon (`warren run --balloon`) whose target the
	// daemon sets per sandbox.
	Balloon   bool      `json:"balloon,omitempty"`
	Snapshot  string    `json:"snapshot,omitempty"` // DIR/NAME of its snapshot
	PID       int       `json:"pid,omitempty"`      // the build's VMM while building
	StartTime uint64    `json:"start_time,omitempty"`
	Created   time.Time `json:"created"`
	BuildMS   float64   `json:"build_ms,omitempty"`
	// WorkingSetPages is the number of pages of the template's working
	// set (the pages its first create's guest touched until its agent
	// answered and a first command ran, recorded by a daemon that
	// restores by userfaultfd, warren-hostd --restore-memory uffd, and
	// prefetched by the later creates); 0: none recorded.
	WorkingSetPages uint64 `json:"working_set_pages,omitempty"`
	// Image is set for a template made from a container image: its
	// root file system is disk 0 (DiskBases[0], an overlay of the
	// template's own over the image's shared base).
	Image *TemplateImage `json:"image,omitempty"`
}

// TemplateImage is what a template made from an image was made of.
type TemplateImage struct {
	// Ref is the reference asked for ("upload:ID" for an uploaded one).
	Ref string `json:"ref"`
	// Digest is the image's config digest; Base the key and Path of the
	// read-only ext4 base the template's disk 0 sits on.
	Digest string `json:"digest"`
	Base   string `json:"base"`
	Path   string `json:"path"`
	// StartCmd is the supervised start command the template runs
	// (shell command line, or the image's argv joined for people), and
	// ReadyCmd what it waited for before its snapshot.
	StartCmd string `json:"start_cmd,omitempty"`
	ReadyCmd string `json:"ready_cmd,omitempty"`
	// PullMS and BaseMS time the build's image steps: resolving and
	// fetching, and making the base (0 when it was cached).
	PullMS float64 `json:"pull_ms,omitempty"`
	BaseMS float64 `json:"base_ms,omitempty"`
	// Cached says the base was already there.
	Cached bool `json:"cached,omitempty"`
}

// Image is one image base of a tenant (GET /v1/images).
type Image struct {
	// Key names the base (its image's config digest and build options);
	// Digest is the config digest.
	Key    string `json:"key"`
	Digest string `json:"digest"`
	Ref    string `json:"ref,omitempty"`
	// DiskBytes is the file system's size, ContentBytes what the image's
	// files hold.
	DiskBytes    int64 `json:"disk_bytes"`
	ContentBytes int64 `json:"content_bytes"`
	Layers       int   `json:"layers"`
	// Templates are the tenant's templates on it.
	Templates []string `json:"templates"`
}

// Snapshot is one snapshot of a sandbox.
type Snapshot struct {
	Name  string    `json:"name"`
	Path  string    `json:"path"` // DIR/NAME as `warren snapshot` takes it
	Kind  string    `json:"kind"` // full or incremental
	Time  time.Time `json:"time"`
	Bytes int64     `json:"layer_bytes,omitempty"`
	// PauseMS is how long the guest was paused for it.
	PauseMS float64 `json:"pause_ms,omitempty"`
	// Rolling marks a snapshot taken by the rolling snapshotter (pruned by it).
	Rolling bool `json:"rolling,omitempty"`
	// Disks are the sandbox's writable disks as the snapshot holds them:
	// each one's frozen layer and the chain under it (from the VMM's
	// answer). None for a snapshot taken before snapshots held disks, or
	// of a sandbox without writable disks.
	Disks []DiskLayer `json:"disks,omitempty"`
}

// DiskLayer is one writable disk in a snapshot: the frozen cow/disk layer
// that holds it as it was at the snapshot's instant, never written again.
type DiskLayer struct {
	// Index is the disk's index in its template's disks.
	Index int `json:"index"`
	// Layer is the layer's absolute path; Chain is Layer and every image
	// under it, top first, down to the bottom image.
	Layer string   `json:"layer"`
	Chain []string `json:"chain"`
}

// LiveDisk is one writable disk of a sandbox's VMM: the live top it writes
// to and the chain of frozen images under it.
type LiveDisk struct {
	Index int      `json:"index"`
	Top   string   `json:"top"`
	Chain []string `json:"chain"`
}

// Rolling is a sandbox's rolling-snapshot setting.
type Rolling struct {
	Every string `json:"every"` // a Go duration
	Keep  int    `json:"keep"`  // most layers in one chain, and chains kept: see the daemon
}

// Sandbox is one sandbox's record.
type Sandbox struct {
	ID       string `json:"id"`
	Tenant   string `json:"tenant"`
	Template string `json:"template"`
	Status   string `json:"status"`
	Reason   string `json:"reason,omitempty"`
	// The VMM process: PID and its start time (field 22 of
	// /proc/PID/stat), which tells a reused PID apart.
	PID       int    `json:"pid,omitempty"`
	StartTime uint64 `json:"start_time,omitempty"`
	API       string `json:"api"`
	Vsock     string `json:"vsock"`
	Console   string `json:"console,omitempty"`
	Log       string `json:"log,omitempty"`
	// Limits: the guest's size comes from the template; these are the
	// cgroup limits of its VMM process.
	MemMiB int `json:"mem_mib"`
	CPUs   int `json:"cpus"`
	// Cgroup is "none" or the cgroup paths of the VMM.
	Cgroup []string `json:"cgroup,omitempty"`
	// Network is its template's: the VMM has a private network, and
	// Egress (an ebpf/policy policy, JSON) and Secrets (names of the
	// tenant's secrets) are applied to it.
	Network bool              `json:"network,omitempty"`
	Egress  json.RawMessage   `json:"egress,omitempty"`
	Env     []string          `json:"env,omitempty"`
	Secrets []string          `json:"secrets,omitempty"`
	Labels  map[string]string `json:"labels,omitempty"`
	// BalloonTargetMiB is the balloon target last set for it (PUT
	// /v1/sandboxes/{id}/balloon; absent: never set), in MiB of the
	// guest's memory. Its VMM's balloon keeps it, and so do the
	// snapshots taken after; a rollback to, or a restore from, an earlier
	// snapshot brings back that snapshot's target, and a fork child's
	// VMM starts with its parent's (GET .../balloon answers the one in
	// force).
	BalloonTargetMiB *uint64 `json:"balloon_target_mib,omitempty"`
	// Parent is the sandbox this one was forked from.
	Parent string `json:"parent,omitempty"`
	// Spawner says its VMM's jail-init starts the VMM's fork children
	// (`jail-init --spawn`): its forks carry grants (vmmproc/jail.Grant).
	Spawner bool `json:"spawner,omitempty"`
	// Family is the sandbox whose VMM's start made the jail-init its VMM
	// runs under (itself, unless it is a fork child still in its parent's
	// family): it names the family's run directory and grant key.
	Family    string     `json:"family,omitempty"`
	Snapshots []Snapshot `json:"snapshots,omitempty"`
	Rolling   *Rolling   `json:"rolling,omitempty"`
	// Disks are its VMM's writable disks as last reported (live top and
	// chain), kept once the VMM is gone until the next one replaces them:
	// with the snapshots' disks, what its disk files are referenced by.
	Disks []LiveDisk `json:"disks,omitempty"`
	// RestoredFrom is the snapshot its current VMM was restored from.
	RestoredFrom string    `json:"restored_from,omitempty"`
	Created      time.Time `json:"created"`
	Updated      time.Time `json:"updated"`
}

// Latest returns the sandbox's newest snapshot, or nil.
func (s *Sandbox) Latest() *Snapshot {
	if len(s.Snapshots) == 0 {
		return nil
	}
	return &s.Snapshots[len(s.Snapshots)-1]
}

// ValidTenant reports whether name is a tenant name: [a-z0-9-]{1,63}.
func ValidTenant(name string) bool { return ident.Tenant(name) }

// ValidID reports whether id looks like an id the daemon makes.
func ValidID(id string) bool {
	kind, hex, ok := strings.Cut(id, "-")
	return ok && ident.Lower(kind, 2, 3) && ident.LowerHex(hex, 12)
}

// Store is a state directory.
type Store struct {
	Root string
}

// Open creates (if needed) and returns the state directory at root.
func Open(root string) (*Store, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	for _, d := range []string{root, filepath.Join(root, "tenants"), filepath.Join(root, "run")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("store: %w", err)
		}
	}
	return &Store{Root: root}, nil
}

// RunDir holds the VMMs' sockets.
func (s *Store) RunDir() string { return filepath.Join(s.Root, "run") }

// PageStoreDir is the host's content-addressed page store
// (hostd/pagestore).
func (s *Store) PageStoreDir() string { return filepath.Join(s.Root, "pagestore") }

// TemplateDir is a template's directory.
func (s *Store) TemplateDir(tenant, id string) string {
	return filepath.Join(s.Root, "tenants", tenant, "templates", id)
}

// ImageDir is where tenant's image bases live (package image's Store.Dir).
func (s *Store) ImageDir(tenant string) string {
	return filepath.Join(s.Root, "tenants", tenant, "images")
}

// UploadDir is where images uploaded by tenant wait for a template build.
func (s *Store) UploadDir(tenant string) string {
	return filepath.Join(s.ImageDir(tenant), "uploads")
}

// SandboxDir is a sandbox's directory.
func (s *Store) SandboxDir(tenant, id string) string {
	return filepath.Join(s.Root, "tenants", tenant, "sandboxes", id)
}

// SecretsPath is the file of tenant's secrets. LoadSecrets and
// SaveSecrets read and write it as plaintext JSON; the daemon seals it
// (hostd/crypt) for a tenant with a key, using ParseSecrets and
// EncodeSecrets around its own encryption.
func (s *Store) SecretsPath(tenant string) string {
	return filepath.Join(s.Root, "tenants", tenant, secretsFile)
}

// LoadSecrets returns tenant's secrets, name to value (empty when it has
// none), from the plaintext file.
func (s *Store) LoadSecrets(tenant string) (map[string]string, error) {
	m := map[string]string{}
	if _, err := readJSON(s.SecretsPath(tenant), &m); err != nil {
		return nil, err
	}
	if m == nil {
		m = map[string]string{}
	}
	return m, nil
}

// SaveSecrets replaces tenant's secrets atomically, in plaintext (mode
// 0600).
func (s *Store) SaveSecrets(tenant string, m map[string]string) error {
	return WriteJSON(s.SecretsPath(tenant), m)
}

// ParseSecrets decodes the contents of a secrets file (never nil on
// success).
func ParseSecrets(b []byte) (map[string]string, error) {
	m := map[string]string{}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("store: secrets: %w", err)
	}
	if m == nil {
		m = map[string]string{}
	}
	return m, nil
}

// EncodeSecrets encodes m as SaveSecrets writes it.
func EncodeSecrets(m map[string]string) ([]byte, error) {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// SaveTemplate writes t's record atomically.
func (s *Store) SaveTemplate(t *Template) error {
	return WriteJSON(filepath.Join(s.TemplateDir(t.Tenant, t.ID), templateFile), t)
}

// SaveSandbox writes sb's record atomically, stamping Updated.
func (s *Store) SaveSandbox(sb *Sandbox) error {
	sb.Updated = time.Now().UTC()
	return WriteJSON(filepath.Join(s.SandboxDir(sb.Tenant, sb.ID), sandboxFile), sb)
}

// RemoveTemplate deletes a template's directory.
func (s *Store) RemoveTemplate(tenant, id string) error {
	return removeDir(s.TemplateDir(tenant, id))
}

// RemoveSandbox deletes a sandbox's directory.
func (s *Store) RemoveSandbox(tenant, id string) error {
	return removeDir(s.SandboxDir(tenant, id))
}

// removeDir removes the record first (atomically: a crash leaves either a
// whole record or none), then the rest.
func removeDir(dir string) error {
	for _, f := range []string{templateFile, sandboxFile} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	atomicfile.SyncDir(dir)
	return os.RemoveAll(dir)
}

// Load reads every record. A directory without a record (a delete cut
// short, a create that never wrote one) is skipped; an unreadable record
// is returned in errs and skipped.
func (s *Store) Load() (tpls []*Template, sbs []*Sandbox, errs []error) {
	tenants, _ := os.ReadDir(filepath.Join(s.Root, "tenants"))
	for _, te := range tenants {
		if !te.IsDir() || !ValidTenant(te.Name()) {
			continue
		}
		tn := te.Name()
		tpls = loadRecords(s, tn, "templates", templateFile, &errs, tpls, func(t *Template) (string, string) { return t.ID, t.Tenant })
		sbs = loadRecords(s, tn, "sandboxes", sandboxFile, &errs, sbs, func(sb *Sandbox) (string, string) { return sb.ID, sb.Tenant })
	}
	return tpls, sbs, errs
}

// loadRecords appends to out tenant tn's records of a kind ("templates",
// "sandboxes"): file in each of its directories, where the record's id and
// tenant (as key says) are the directory's. Unreadable ones go to errs.
func loadRecords[R any](s *Store, tn, kind, file string, errs *[]error, out []*R, key func(*R) (id, tenant string)) []*R {
	ids, _ := os.ReadDir(filepath.Join(s.Root, "tenants", tn, kind))
	for _, e := range ids {
		var r R
		if ok, err := readJSON(filepath.Join(s.Root, "tenants", tn, kind, e.Name(), file), &r); err != nil {
			*errs = append(*errs, err)
		} else if id, tenant := key(&r); ok && id == e.Name() && tenant == tn {
			out = append(out, &r)
		}
	}
	return out
}

// SandboxRef names one sandbox directory.
type SandboxRef struct{ Tenant, ID string }

// RecordlessSandboxes lists the sandbox directories that hold no record
// (Load skips them): a delete cut short after its record went, or a fork
// child whose daemon was killed before it recorded the child. A
// directory whose record exists but cannot be read is not listed.
func (s *Store) RecordlessSandboxes() []SandboxRef {
	var out []SandboxRef
	tenants, _ := os.ReadDir(filepath.Join(s.Root, "tenants"))
	for _, te := range tenants {
		if !te.IsDir() || !ValidTenant(te.Name()) {
			continue
		}
		ids, _ := os.ReadDir(filepath.Join(s.Root, "tenants", te.Name(), "sandboxes"))
		for _, e := range ids {
			if !e.IsDir() {
				continue
			}
			_, err := os.Lstat(filepath.Join(s.SandboxDir(te.Name(), e.Name()), sandboxFile))
			if errors.Is(err, os.ErrNotExist) {
				out = append(out, SandboxRef{te.Name(), e.Name()})
			}
		}
	}
	return out
}

func readJSON(path string, v any) (bool, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("store: %s: %w", path, err)
	}
	return true, nil
}

// WriteJSON writes v as JSON to path atomically and durably: a temporary
// file in the same directory, fsync, rename over path, fsync of the
// directory. The directory is created if missing.
func WriteJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	return WriteFileAtomic(path, b, 0o600)
}

// WriteFileAtomic is WriteJSON for bytes.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) error {
	return WriteFileAtomicOwned(path, data, mode, -1)
}

// WriteFileAtomicOwned is WriteFileAtomic for a file owned by uid (and its
// group of the same number) from the moment it appears; uid -1 leaves it
// the caller's.
func WriteFileAtomicOwned(path string, data []byte, mode os.FileMode, uid int) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	var opts []atomicfile.Option
	if uid >= 0 {
		opts = append(opts, atomicfile.Owner(uid))
	}
	if err := atomicfile.Write(path, data, mode, opts...); err != nil {
		return fmt.Errorf("store: write %s: %w", path, err)
	}
	return nil
}
