package image

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/guestinit/imageconfig"
	"github.com/warrenvm/warren/internal/atomicfile"
	"github.com/warrenvm/warren/internal/strictjson"
)

// FormatVersion is the builder's output format: part of every base's key,
// so that a change to what Build writes makes new bases rather than
// reusing old ones.
const FormatVersion = 1

// Store keeps one read-only ext4 base per image (config digest) and build
// options, under Dir:
//
//	Dir/bases/KEY/base.ext4  the file system (mode 0444, never written again)
//	Dir/bases/KEY/base.json  its Base record
//	Dir/locks/KEY.lock       flock(2) held while KEY is built or removed
//	Dir/locks/tmp.lock       held while a build directory is made, or Dir/tmp swept
//	Dir/tmp/*                builds in progress (each flocked by its builder)
//
// A base appears by the rename of a complete directory, so a reader sees
// a whole base or none. Builds of one key, from goroutines or processes,
// are serialized by the key's lock: one builds, the others find its base.
// The zero Tools finds e2fsprogs on PATH (and in /sbin, /usr/sbin).
//
// A Store holds no state of its own: any number of Store values (and
// processes) may use the same Dir at once.
type Store struct {
	Dir   string
	Tools Tools
}

// Base is a built root file system.
type Base struct {
	// Key names the base in its Store (see Store.Key).
	Key string `json:"key"`
	// Digest is the image's config digest "sha256:...".
	Digest string `json:"digest"`
	// Path is the ext4 image (mode 0444, never written again). It is
	// not stored in base.json but set by Lookup.
	Path string `json:"-"`
	// Config is what was written at imageconfig.Path inside the base
	// (its Ref is the one the first build was asked with).
	Config imageconfig.Config `json:"config"`
	// DiskBytes is the file system's (and the file's, sparse) size;
	// ContentBytes the image's visible regular files.
	DiskBytes    int64 `json:"disk_bytes"`
	ContentBytes int64 `json:"content_bytes"`
	// Layers is the image's layer count; Files its visible paths.
	Layers int `json:"layers"`
	Files  int `json:"files"`
	// Inodes and FreeInodes are the file system's inode counts.
	Inodes     int64 `json:"inodes"`
	FreeInodes int64 `json:"free_inodes"`
	// Format is the FormatVersion that built it.
	Format int `json:"format"`
	// Created is when it was published.
	Created time.Time `json:"created"`
	// BuildTime is how long the build took.
	BuildTime time.Duration `json:"build_ns"`
	// Cached is true when Build found the base already built.
	Cached bool `json:"-"`
}

// BuildOptions tune Build.
type BuildOptions struct {
	// DiskBytes is the file system's virtual size (sparse); it is
	// rounded up to a MiB. 0: DefaultDiskBytes, or more for a large
	// image (twice its content plus 1 GiB). At most MaxDiskBytes, and
	// enough for the content (Build says how much when it is not).
	DiskBytes int64
	// MaxUncompressed bounds the layers' uncompressed bytes, all of them
	// together (a gzip bomb past it is refused); 0:
	// DefaultMaxUncompressed.
	MaxUncompressed int64
	// MaxEntries bounds the tar entries of all layers together (and
	// the directories they imply); 0: flatten.DefaultMaxEntries.
	MaxEntries int
	// Ref is recorded in the base's imageconfig.Config.Ref.
	Ref string
	// Progress, if not nil, is called from the building goroutine.
	Progress func(Progress)
}

// Progress is one step of a build.
type Progress struct {
	// Step is what is happening: "fetching", "reading", "unpacking",
	// "formatting", "done" ("cached" when the base was there already).
	Step string
	// Layer (1-based) and Layers: which layer a step is at, when it is
	// at one.
	Layer, Layers int
	// Bytes done out of Total (0 when not known): compressed bytes
	// fetched, uncompressed bytes read, file bytes unpacked.
	Bytes, Total int64
}

// Size bounds and defaults.
const (
	DefaultDiskBytes       = 4 << 30
	MinDiskBytes           = 64 << 20
	MaxDiskBytes           = 1 << 40
	DefaultMaxUncompressed = 16 << 30
)

// ErrBusy is returned by Remove while the base is being built.
var ErrBusy = errors.New("image: a build of this base is in progress")

var keyRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// Key is the key of the base of the image whose config digest is digest,
// built with the size asked for (0 for the default): a hash of both and
// FormatVersion. The config digest names the content (Build checks every
// layer against the config's diff_ids).
func (s *Store) Key(digest string, diskBytes int64) string {
	h := sha256.New()
	fmt.Fprintf(h, "warren image base\x00format %d\x00%s\x00disk %d", FormatVersion, digest, roundDisk(diskBytes))
	return hex.EncodeToString(h.Sum(nil))[:32]
}

func roundDisk(n int64) int64 {
	if n <= 0 {
		return 0
	}
	return (n + 1<<20 - 1) &^ (1<<20 - 1)
}

func (s *Store) basesDir() string { return filepath.Join(s.Dir, "bases") }
func (s *Store) tmpDir() string   { return filepath.Join(s.Dir, "tmp") }
func (s *Store) lockPath(key string) string {
	return filepath.Join(s.Dir, "locks", key+".lock")
}

// init makes the store's directories (mode 0700).
func (s *Store) init() error {
	if s.Dir == "" {
		return errors.New("image: Store.Dir is empty")
	}
	for _, d := range []string{s.Dir, s.basesDir(), s.tmpDir(), filepath.Dir(s.lockPath("x"))} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("image store: %w", err)
		}
	}
	return nil
}

// Lookup returns the base of key; an error wrapping fs.ErrNotExist when
// there is none.
func (s *Store) Lookup(key string) (*Base, error) {
	if !keyRE.MatchString(key) {
		return nil, fmt.Errorf("image: base %q: %w", key, fs.ErrNotExist)
	}
	dir := filepath.Join(s.basesDir(), key)
	f, err := os.Open(filepath.Join(dir, "base.json"))
	if err != nil {
		return nil, fmt.Errorf("image: base %s: %w", key, err)
	}
	defer f.Close()
	const maxRecord = 4 << 20
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(f, maxRecord+1)); err != nil {
		return nil, fmt.Errorf("image: base %s: %w", key, err)
	}
	if buf.Len() > maxRecord {
		return nil, fmt.Errorf("image: base %s: base.json of more than %d bytes", key, maxRecord)
	}
	var b Base
	if err := strictjson.Decode(&buf, &b); err != nil {
		return nil, fmt.Errorf("image: base %s: base.json: %w", key, err)
	}
	if b.Key != key {
		return nil, fmt.Errorf("image: base %s: base.json is for %q", key, b.Key)
	}
	b.Path = filepath.Join(dir, "base.ext4")
	fi, err := os.Stat(b.Path)
	if err != nil {
		return nil, fmt.Errorf("image: base %s: %w", key, err)
	}
	if fi.Size() != b.DiskBytes {
		return nil, fmt.Errorf("image: base %s: base.ext4 is %d bytes, base.json says %d", key, fi.Size(), b.DiskBytes)
	}
	return &b, nil
}

// List returns every base of the store, by key.
func (s *Store) List() ([]*Base, error) {
	ents, err := os.ReadDir(s.basesDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	var out []*Base
	for _, e := range ents {
		if !keyRE.MatchString(e.Name()) {
			continue
		}
		b, err := s.Lookup(e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Remove deletes the base of key (an error wrapping fs.ErrNotExist when
// there is none, ErrBusy while it is being built). The base disappears at
// once (a rename); VMMs that have its file open keep reading it. Whoever
// calls Remove must know that no template still needs it.
func (s *Store) Remove(key string) error {
	if !keyRE.MatchString(key) {
		return fmt.Errorf("image: base %q: %w", key, fs.ErrNotExist)
	}
	if err := s.init(); err != nil {
		return err
	}
	l, err := tryLock(s.lockPath(key))
	if err != nil {
		return err
	}
	if l == nil {
		return fmt.Errorf("image: base %s: %w", key, ErrBusy)
	}
	defer l.Close()
	dir := filepath.Join(s.basesDir(), key)
	if _, err := os.Lstat(dir); err != nil {
		return fmt.Errorf("image: base %s: %w", key, err)
	}
	gone := filepath.Join(s.tmpDir(), "removed-"+key+"-"+randHex())
	if err := os.Rename(dir, gone); err != nil {
		return fmt.Errorf("image: remove base %s: %w", key, err)
	}
	if err := atomicfile.SyncDir(s.basesDir()); err != nil {
		return fmt.Errorf("image: remove base %s: %w", key, err)
	}
	if err := os.RemoveAll(gone); err != nil {
		return fmt.Errorf("image: remove base %s: %w", key, err)
	}
	return nil
}

// lockFile is a held flock(2).
type lockFile struct{ f *os.File }

func (l *lockFile) Close() error { return l.f.Close() }

// tryLock takes path's lock if it is free; nil, nil if it is held.
func tryLock(path string) (*lockFile, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, fmt.Errorf("image store: lock %s: %w", path, err)
	}
	return &lockFile{f: f}, nil
}

// lock takes path's lock, waiting for it until ctx is done. (Each call
// opens the file anew, so goroutines of one process exclude each other as
// processes do.)
func lock(ctx context.Context, path string) (*lockFile, error) {
	wait := 10 * time.Millisecond
	for {
		l, err := tryLock(path)
		if err != nil || l != nil {
			return l, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 250*time.Millisecond)
	}
}

// buildDir is a private directory (0700) under Dir/tmp, flocked for as
// long as its builder lives, so that cleanTmp never takes it for a
// leftover.
type buildDir struct {
	path string
	fd   *os.File
}

// tmpLock guards Dir/tmp's entries between their creation and their
// builder's flock: new build directories are made under it shared,
// cleanTmp sweeps under it exclusive.
func (s *Store) tmpLock(how int) (*os.File, error) {
	f, err := os.OpenFile(s.lockPath("tmp"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func (s *Store) newBuildDir(key string) (*buildDir, error) {
	tl, err := s.tmpLock(unix.LOCK_SH)
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	defer tl.Close()
	p := filepath.Join(s.tmpDir(), "build-"+key+"-"+randHex())
	if err := os.Mkdir(p, 0o700); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	f, err := os.Open(p)
	if err == nil {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		os.RemoveAll(p)
		return nil, fmt.Errorf("image store: lock %s: %w", p, err)
	}
	return &buildDir{path: p, fd: f}, nil
}

// remove deletes the directory and what is left in it.
func (b *buildDir) remove() {
	os.RemoveAll(b.path)
	b.fd.Close()
}

// cleanTmp removes what interrupted builds and removals left under
// Dir/tmp: every entry whose lock nobody holds.
func (s *Store) cleanTmp() {
	tl, err := s.tmpLock(unix.LOCK_EX | unix.LOCK_NB)
	if err != nil {
		return // another builder is making its directory: sweep next time
	}
	defer tl.Close()
	ents, err := os.ReadDir(s.tmpDir())
	if err != nil {
		return
	}
	for _, e := range ents {
		p := filepath.Join(s.tmpDir(), e.Name())
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) == nil {
			os.RemoveAll(p)
		}
		f.Close()
	}
}

func randHex() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// writeSynced writes a new file, fsynced, with mode perm.
func writeSynced(path string, b []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// uuidFor is a deterministic file-system UUID for a key (RFC 4122 layout,
// version 4 bits, from the key's hash), so builds are reproducible.
func uuidFor(key string) string {
	h := sha256.Sum256([]byte("warren image base uuid\x00" + key))
	h[6] = h[6]&0x0f | 0x40
	h[8] = h[8]&0x3f | 0x80
	x := hex.EncodeToString(h[:16])
	return x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32]
}
