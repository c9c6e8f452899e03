package pagestore

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/hostd/crypt"
	"github.com/warrenvm/warren/internal/atomicfile"
	"github.com/warrenvm/warren/internal/ident"
	"github.com/warrenvm/warren/memsnap"
)

// PlainNamespace is the namespace name of a tenant without a key.
const PlainNamespace = "plain"

// Store is the store directory of one host. Its methods may be called from
// several goroutines; operations on one namespace are serialised.
type Store struct {
	root string

	mu    sync.Mutex             // mu protects locks
	locks map[string]*sync.Mutex // one per namespace directory
}

// Open opens (making it if needed, mode 0700) the store at root.
func Open(root string) (*Store, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("pagestore: %w", err)
	}
	return &Store{root: root, locks: map[string]*sync.Mutex{}}, nil
}

// Root returns the store's directory.
func (s *Store) Root() string { return s.root }

// validNS reports whether name is a namespace's directory name (plain, or
// a key's ID).
func validNS(name string) bool { return ident.Name(name, 64) }

// Namespace is one tenant's part of the store under one key (or none).
type Namespace struct {
	s      *Store
	tenant string
	name   string
	dir    string
	// key seals new chunks and idKey names them; both are zero in a
	// plain namespace.
	key   crypt.Key
	idKey []byte
	// provider opens sealed chunks and reference files.
	provider crypt.Provider
	// stopAfter, in tests, is called after each step of Ingest; an error
	// stops it there as a crash would (nothing cleaned up).
	stopAfter func(step string) error
}

// errStop is what a test's stopAfter returns to simulate a crash.
var errStop = errors.New("stopped (simulated crash)")

// step runs the test hook for step.
func (ns *Namespace) step(name string) error {
	if ns.stopAfter == nil {
		return nil
	}
	return ns.stopAfter(name)
}

// Plain returns tenant's namespace for a tenant without a key.
func (s *Store) Plain(tenant string) (*Namespace, error) {
	return s.namespace(tenant, PlainNamespace, nil)
}

// Keyed returns tenant's namespace under its current key from p: chunks
// sealed under it and named with a secret only the key opens (idkey,
// made on first use). Errors are p's (crypt.ErrNoKey, crypt.ErrRevoked).
func (s *Store) Keyed(ctx context.Context, tenant string, p crypt.Provider) (*Namespace, error) {
	k, err := p.Key(ctx, tenant)
	if err != nil {
		return nil, err
	}
	ns, err := s.namespace(tenant, k.ID(), p)
	if err != nil {
		return nil, err
	}
	ns.key = k
	lock := s.lock(ns.dir)
	lock.Lock()
	defer lock.Unlock()
	if ns.idKey, err = ns.loadIDKey(ctx); err != nil {
		return nil, err
	}
	return ns, nil
}

func (s *Store) namespace(tenant, name string, p crypt.Provider) (*Namespace, error) {
	if !ident.Tenant(tenant) {
		return nil, fmt.Errorf("pagestore: bad tenant name %q", tenant)
	}
	if !validNS(name) {
		return nil, fmt.Errorf("pagestore: bad namespace name %q", name)
	}
	dir := filepath.Join(s.root, tenant, name)
	if err := os.MkdirAll(filepath.Join(dir, "chunks"), 0o700); err != nil {
		return nil, fmt.Errorf("pagestore: %w", err)
	}
	return &Namespace{s: s, tenant: tenant, name: name, dir: dir, provider: p}, nil
}

func (s *Store) lock(dir string) *sync.Mutex {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.locks[dir]
	if l == nil {
		l = &sync.Mutex{}
		s.locks[dir] = l
	}
	return l
}

// Name returns the namespace's name: PlainNamespace or the key's ID.
func (ns *Namespace) Name() string { return ns.name }

// Keyed reports whether the namespace seals its chunks.
func (ns *Namespace) Keyed() bool { return ns.key.Valid() }

// loadIDKey reads the namespace's idkey, making it when there is none
// (ns's lock held).
func (ns *Namespace) loadIDKey(ctx context.Context) ([]byte, error) {
	path := filepath.Join(ns.dir, "idkey")
	r, err := crypt.Open(ctx, path, ns.provider, ns.tenant)
	if err == nil {
		defer r.Close()
		b, err := io.ReadAll(io.LimitReader(r, 64))
		if err != nil {
			return nil, fmt.Errorf("pagestore: %s: %w", path, err)
		}
		if len(b) != 32 {
			return nil, fmt.Errorf("pagestore: %s: %d bytes, want 32: %w", path, len(b), ErrCorrupt)
		}
		return b, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("pagestore: %s: %w", path, err)
	}
	b := make([]byte, 32)
	rand.Read(b)
	if err := atomicfile.WriteFunc(path, 0o600, func(f *os.File) error { return seal(f, ns.key, b) }); err != nil {
		return nil, fmt.Errorf("pagestore: %s: %w", path, err)
	}
	return b, nil
}

// seal writes data to w sealed under key.
func seal(w io.Writer, key crypt.Key, data []byte) error {
	cw, err := crypt.NewWriter(w, key, nil)
	if err != nil {
		return err
	}
	if _, err := cw.Write(data); err != nil {
		return err
	}
	return cw.Close()
}

// name returns the store name of a chunk whose compressed bytes have
// SHA-256 sum.
func (ns *Namespace) nameOf(sum [32]byte) Name {
	if ns.idKey == nil {
		return sum
	}
	m := hmac.New(sha256.New, ns.idKey)
	m.Write([]byte("warren pagestore chunk v1\x00"))
	m.Write(sum[:])
	var n Name
	m.Sum(n[:0])
	return n
}

// chunkPath is where chunk n lives.
func (ns *Namespace) chunkPath(n Name) string {
	h := n.String()
	return filepath.Join(ns.dir, "chunks", h[:2], h)
}

// chunkFileSize is the size a complete file of a chunk of clen compressed
// bytes has.
func (ns *Namespace) chunkFileSize(clen uint32) int64 {
	if ns.Keyed() {
		return crypt.EncryptedSize(int64(clen), 0)
	}
	return int64(clen)
}

// IngestReport says what Ingest did.
type IngestReport struct {
	Chunks    int   // the layer's chunks
	NewChunks int   // those the namespace did not have
	NewBytes  int64 // bytes of chunk files written
	LayerSize int64 // the layer file's size (before)
	RefSize   int64 // the reference file's size (after)
}

// Ingest replaces the plaintext memsnap layer at path by a reference file,
// adding the chunks the namespace lacks (see Crash safety in the package
// documentation). A file that is already a reference file is left alone
// (report zero, nil); a file that is not a plaintext layer is an error.
func (ns *Namespace) Ingest(path string) (IngestReport, error) {
	var rep IngestReport
	fail := func(err error) (IngestReport, error) {
		return IngestReport{}, fmt.Errorf("pagestore: ingest %s: %w", path, err)
	}
	f, err := os.Open(path)
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	magic := make([]byte, 8)
	if _, err := io.ReadFull(f, magic); err == nil && IsRef(magic) {
		return rep, nil
	}
	l, err := memsnap.Open(path)
	if err != nil {
		return fail(err)
	}
	defer l.Close()
	st, err := f.Stat()
	if err != nil {
		return fail(err)
	}
	start, end := l.DataRange()
	head := make([]byte, start)
	tail := make([]byte, l.FileSize()-end)
	if _, err := f.ReadAt(head, 0); err != nil {
		return fail(err)
	}
	if _, err := f.ReadAt(tail, end); err != nil {
		return fail(err)
	}
	chunks := l.ChunkRefs()
	names := make([]Name, len(chunks))
	rep.Chunks, rep.LayerSize = len(chunks), l.FileSize()

	lock := ns.s.lock(ns.dir)
	lock.Lock()
	defer lock.Unlock()
	type pending struct{ tmp, final string }
	var written []pending
	defer func() {
		for _, p := range written {
			os.Remove(p.tmp) // left only on failure
		}
	}()
	buf := make([]byte, 0, 1<<20)
	seen := map[Name]bool{}
	for i, c := range chunks {
		n := ns.nameOf(c.Sum)
		names[i] = n
		if seen[n] {
			continue
		}
		seen[n] = true
		final := ns.chunkPath(n)
		if fi, err := os.Stat(final); err == nil && fi.Size() == ns.chunkFileSize(c.Length) {
			continue
		}
		if cap(buf) < int(c.Length) {
			buf = make([]byte, 0, c.Length)
		}
		data := buf[:c.Length]
		if _, err := f.ReadAt(data, c.Offset); err != nil {
			return fail(fmt.Errorf("read chunk %d: %w", i, err))
		}
		if sha256.Sum256(data) != c.Sum {
			return fail(fmt.Errorf("chunk %d: checksum mismatch: %w", i, memsnap.ErrCorrupt))
		}
		tmp, err := ns.writeTemp(filepath.Dir(final), data)
		if err != nil {
			return fail(err)
		}
		written = append(written, pending{tmp, final})
		rep.NewChunks++
		rep.NewBytes += ns.chunkFileSize(c.Length)
	}
	if err := ns.step("chunks written"); err != nil {
		written = nil
		return fail(err)
	}
	if len(written) > 0 {
		// Contents durable, then names, then the reference file.
		if err := syncfs(ns.dir); err != nil {
			return fail(err)
		}
		for _, p := range written {
			if err := os.Rename(p.tmp, p.final); err != nil {
				return fail(err)
			}
		}
		written = nil
		if err := syncfs(ns.dir); err != nil {
			return fail(err)
		}
	}
	if err := ns.step("chunks renamed"); err != nil {
		return fail(err)
	}
	ref := encodeRef(l, head, tail, names, ns.Keyed())
	if err := atomicfile.Write(path, ref, st.Mode().Perm(), owner(st)...); err != nil {
		return fail(err)
	}
	rep.RefSize = int64(len(ref))
	return rep, nil
}

// owner keeps a file's owner when it is replaced (a confined VMM's).
func owner(st fs.FileInfo) []atomicfile.Option {
	if uid, ok := fileUID(st); ok && uid != os.Getuid() {
		return []atomicfile.Option{atomicfile.Owner(uid)}
	}
	return nil
}

// writeTemp writes a chunk's compressed bytes (sealed in a keyed
// namespace) to a new temporary file in dir and returns its path.
func (ns *Namespace) writeTemp(dir string, data []byte) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	f, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return "", err
	}
	if ns.Keyed() {
		err = seal(f, ns.key, data)
	} else {
		_, err = f.Write(data)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// syncfs flushes the file system that holds dir.
func syncfs(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", dir, err)
	}
	return nil
}

// ReadRef reads and parses the reference file at path, opening it through
// the namespace's provider when it is sealed. Errors wrap ErrNotRef for a
// memsnap layer (plain or sealed: only its first bytes are read) and, for
// a file sealed under another key, crypt.ErrWrongKey.
func (ns *Namespace) ReadRef(path string) (*Ref, error) {
	b, err := ns.readFile(path, MaxRefBytes, true)
	if err != nil {
		return nil, fmt.Errorf("pagestore: %w", err)
	}
	return ParseRef(path, b)
}

// MaxRefBytes bounds the size of a reference file a reader accepts.
const MaxRefBytes = refFixedLen + MaxHeaderLen + MaxTailLen + MaxChunks*nameLen + 4

// readFile reads path (at most max bytes), decrypting it when sealed.
// With refOnly, a file whose plaintext does not start with the reference
// file magic is not read further (ErrNotRef).
func (ns *Namespace) readFile(path string, max int64, refOnly bool) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = f
	magic := make([]byte, len(crypt.Magic))
	n, _ := io.ReadFull(f, magic)
	if string(magic[:n]) == crypt.Magic {
		if ns.provider == nil {
			return nil, fmt.Errorf("%s is sealed and namespace %s has no key: %w", path, ns.name, errSealed)
		}
		st, err := f.Stat()
		if err != nil {
			return nil, err
		}
		cr, err := crypt.OpenReader(f, st.Size(), ns.provider, ns.tenant)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		defer cr.Close()
		r = cr
	} else if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	var head []byte
	if refOnly {
		head = make([]byte, len(refMagic))
		n, err := io.ReadFull(r, head)
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if !IsRef(head[:n]) {
			return nil, fmt.Errorf("%s: %w", path, ErrNotRef)
		}
	}
	b, err := io.ReadAll(io.LimitReader(r, max+1-int64(len(head))))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	b = append(head, b...)
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s: more than %d bytes: %w", path, max, ErrCorrupt)
	}
	return b, nil
}

// errSealed: a plain namespace met a sealed file (never one of its
// reference files: those of a tenant that got a key are materialized
// before its files are sealed).
var errSealed = errors.New("sealed")

// readChunk reads chunk i of r from the store and checks it.
func (ns *Namespace) readChunk(r *Ref, i int) ([]byte, error) {
	c := r.Chunks[i]
	p := ns.chunkPath(r.Names[i])
	b, err := ns.readFile(p, int64(c.Length), false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("chunk %d (%s): %w", i, r.Names[i], ErrMissing)
	}
	if err != nil {
		return nil, fmt.Errorf("chunk %d: %w", i, err)
	}
	if len(b) != int(c.Length) || sha256.Sum256(b) != c.Sum {
		return nil, fmt.Errorf("chunk %d (%s): %d bytes, content does not match the layer's index: %w", i, r.Names[i], len(b), ErrCorrupt)
	}
	return b, nil
}

// Materialize writes the layer that the reference file at src stands for
// to dst (which may be src: the layer then replaces its reference file),
// byte for byte, atomically, mode 0600 (uid, when not negative, its
// owner). Every chunk is checked; the written layer is opened and its
// Hash compared with the recorded one. A missing or corrupt chunk fails it
// (ErrMissing, ErrCorrupt) and leaves dst as it was.
func (ns *Namespace) Materialize(src, dst string, uid int) error {
	r, err := ns.ReadRef(src)
	if err != nil {
		return err
	}
	defer r.Close()
	if r.Keyed != ns.Keyed() {
		return fmt.Errorf("pagestore: materialize %s: its chunks are in a %s namespace, not in %s/%s", src, map[bool]string{true: "keyed", false: "plain"}[r.Keyed], ns.tenant, ns.name)
	}
	var opts []atomicfile.Option
	if uid >= 0 && uid != os.Getuid() {
		opts = append(opts, atomicfile.Owner(uid))
	}
	err = atomicfile.WriteFunc(dst, 0o600, func(f *os.File) error {
		if _, err := f.Write(r.head); err != nil {
			return err
		}
		for i := range r.Chunks {
			b, err := ns.readChunk(r, i)
			if err != nil {
				return err
			}
			if _, err := f.Write(b); err != nil {
				return err
			}
		}
		_, err := f.Write(r.tail)
		return err
	}, opts...)
	if err != nil {
		return fmt.Errorf("pagestore: materialize %s: %w", src, err)
	}
	l, err := memsnap.Open(dst)
	if err != nil {
		return fmt.Errorf("pagestore: materialize %s: %w", src, err)
	}
	defer l.Close()
	if l.Hash() != r.Layer.Hash() {
		return fmt.Errorf("pagestore: materialize %s: layer hash %s, recorded %s: %w", src, l.Hash().Short(), r.Layer.Hash().Short(), ErrCorrupt)
	}
	return nil
}

// Stats describes a namespace (also the API's wire.StoreNamespace).
type Stats struct {
	Tenant    string `json:"tenant"`
	Namespace string `json:"namespace"`
	Keyed     bool   `json:"keyed"`
	// Refs is the number of reference files found, LogicalBytes the
	// sizes of the layers they stand for (what they took before the
	// store), RefBytes their own sizes and ChunkRefs the chunks they name.
	Refs         int   `json:"refs"`
	LogicalBytes int64 `json:"logical_bytes"`
	RefBytes     int64 `json:"ref_bytes"`
	ChunkRefs    int64 `json:"chunk_refs"`
	// Chunks and ChunkBytes are the chunk files in the store and their
	// size; Unreferenced of them no reference file names (a sweep
	// removes them).
	Chunks       int64 `json:"chunks"`
	ChunkBytes   int64 `json:"chunk_bytes"`
	Unreferenced int64 `json:"unreferenced"`
	// Layers and LayerBytes are plain layer files found under the roots
	// (not in the store: a VMM's latest layer).
	Layers     int   `json:"layers"`
	LayerBytes int64 `json:"layer_bytes"`
	// Caches and CacheBytes are what can be dropped and rebuilt from the
	// store: plain layers kept beside a reference file of their own (a
	// template's, see CacheRefDir) and flattened images (*.wraw, their
	// allocated bytes). They are neither logical nor stored bytes.
	Caches     int   `json:"caches"`
	CacheBytes int64 `json:"cache_bytes"`
}

// CacheRefDir is the subdirectory in which a layer kept plain, as a cache,
// has its reference file: DIR/CacheRefDir/NAME stands for DIR/NAME, which
// is then counted as a cache (Stats.Caches), not as a plain layer, and may
// be removed and rebuilt by Materialize (a template's layer: every create
// restores it in place; hostd/daemon templatepages.go).
const CacheRefDir = "pages"

// rawExt names flattened images (memsnap/vmsnap's RawExt).
const rawExt = ".wraw"

// StoredBytes is what the namespace's snapshots take on disk: chunk files,
// reference files and plain layers.
func (s *Stats) StoredBytes() int64 { return s.ChunkBytes + s.RefBytes + s.LayerBytes }

// scan reads every *.wsnap under roots: reference files' chunk names into
// live, their sizes and the plain layers' into st. A reference file that
// cannot be read is an error. Sealed files the namespace cannot open are
// counted as errors too (they may be reference files).
func (ns *Namespace) scan(roots []string, live map[Name]bool, st *Stats) error {
	for _, root := range roots {
		err := filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if !de.Type().IsRegular() || atomicfile.IsTemp(de.Name()) {
				return nil
			}
			if strings.HasSuffix(de.Name(), rawExt) {
				if fi, err := de.Info(); err == nil {
					st.Caches++
					st.CacheBytes += allocated(fi)
				}
				return nil
			}
			if !strings.HasSuffix(de.Name(), memsnap.Ext) {
				return nil
			}
			r, err := ns.ReadRef(p)
			if errors.Is(err, errSealed) || errors.Is(err, crypt.ErrWrongKey) {
				return nil // another namespace's (a plain one's, another key's)
			}
			if errors.Is(err, ErrNotRef) {
				if fi, err := de.Info(); err == nil {
					if IsRefFile(filepath.Join(filepath.Dir(p), CacheRefDir, de.Name())) {
						st.Caches++
						st.CacheBytes += fi.Size()
					} else {
						st.Layers++
						st.LayerBytes += fi.Size()
					}
				}
				return nil
			}
			if err != nil {
				return err
			}
			defer r.Close()
			if r.Keyed != ns.Keyed() {
				return nil // the other kind of namespace's
			}
			for _, n := range r.Names {
				live[n] = true
			}
			st.Refs++
			st.LogicalBytes += r.Size
			st.ChunkRefs += int64(len(r.Names))
			if fi, err := de.Info(); err == nil {
				st.RefBytes += fi.Size()
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// walkChunks calls fn for each chunk file (and each temporary file, with
// temp true) of the namespace.
func (ns *Namespace) walkChunks(fn func(path string, n Name, size int64, temp bool) error) error {
	return filepath.WalkDir(filepath.Join(ns.dir, "chunks"), func(p string, de fs.DirEntry, err error) error {
		if err != nil || !de.Type().IsRegular() {
			return err
		}
		fi, err := de.Info()
		if err != nil {
			return nil
		}
		if strings.HasPrefix(de.Name(), ".tmp-") {
			return fn(p, Name{}, fi.Size(), true)
		}
		var n Name
		if b, err := hex.DecodeString(de.Name()); err == nil && len(b) == nameLen {
			copy(n[:], b)
			return fn(p, n, fi.Size(), false)
		}
		return nil // not the store's
	})
}

// Sweep removes the chunks that no reference file under roots names, and
// the temporary files of interrupted ingests. roots must hold every
// reference file of the namespace (for the daemon: the tenant's
// directory). It removes nothing when a reference file cannot be read.
// It returns how many chunk files it removed and their bytes.
func (ns *Namespace) Sweep(roots ...string) (removed int, bytes int64, err error) {
	lock := ns.s.lock(ns.dir)
	lock.Lock()
	defer lock.Unlock()
	live := map[Name]bool{}
	if err := ns.scan(roots, live, &Stats{}); err != nil {
		return 0, 0, fmt.Errorf("pagestore: sweep %s/%s: nothing removed: %w", ns.tenant, ns.name, err)
	}
	err = ns.walkChunks(func(p string, n Name, size int64, temp bool) error {
		if temp || !live[n] {
			if err := os.Remove(p); err == nil {
				removed++
				bytes += size
			}
		}
		return nil
	})
	return removed, bytes, err
}

// Stats scans roots (as Sweep) and the namespace's chunks.
func (ns *Namespace) Stats(roots ...string) (Stats, error) {
	lock := ns.s.lock(ns.dir)
	lock.Lock()
	defer lock.Unlock()
	st := Stats{Tenant: ns.tenant, Namespace: ns.name, Keyed: ns.Keyed()}
	live := map[Name]bool{}
	if err := ns.scan(roots, live, &st); err != nil {
		return st, fmt.Errorf("pagestore: stats %s/%s: %w", ns.tenant, ns.name, err)
	}
	err := ns.walkChunks(func(_ string, n Name, size int64, temp bool) error {
		if temp {
			return nil
		}
		st.Chunks++
		st.ChunkBytes += size
		if !live[n] {
			st.Unreferenced++
		}
		return nil
	})
	return st, err
}

// Check reports whether the layer that the reference file at path stands
// for can be rebuilt from the namespace: the file parses and every chunk
// it names is there, at the length the layer's index gives (contents are
// checked by Materialize, which reads them). Before a cache is dropped.
func (ns *Namespace) Check(path string) error {
	r, err := ns.ReadRef(path)
	if err != nil {
		return err
	}
	defer r.Close()
	if r.Keyed != ns.Keyed() {
		return fmt.Errorf("pagestore: %s: its chunks are not in %s/%s", path, ns.tenant, ns.name)
	}
	for i, n := range r.Names {
		fi, err := os.Stat(ns.chunkPath(n))
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("pagestore: %s: chunk %d (%s): %w", path, i, n, ErrMissing)
		}
		if err != nil {
			return fmt.Errorf("pagestore: %s: %w", path, err)
		}
		if fi.Size() != ns.chunkFileSize(r.Chunks[i].Length) {
			return fmt.Errorf("pagestore: %s: chunk %d (%s): %d bytes: %w", path, i, n, fi.Size(), ErrCorrupt)
		}
	}
	return nil
}

// IsRefFile reports whether the file at path is a plaintext reference
// file.
func IsRefFile(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, len(refMagic))
	_, err = io.ReadFull(f, b)
	return err == nil && bytes.Equal(b, refMagic[:])
}

// NamespaceDir names one namespace directory of the store.
type NamespaceDir struct {
	Tenant, Name string
}

// Namespaces lists the store's namespace directories, by tenant then name.
func (s *Store) Namespaces() ([]NamespaceDir, error) {
	tenants, err := os.ReadDir(s.root)
	if err != nil {
		return nil, fmt.Errorf("pagestore: %w", err)
	}
	var out []NamespaceDir
	for _, t := range tenants {
		if !t.IsDir() || !ident.Tenant(t.Name()) {
			continue
		}
		nss, _ := os.ReadDir(filepath.Join(s.root, t.Name()))
		for _, n := range nss {
			if n.IsDir() && validNS(n.Name()) {
				out = append(out, NamespaceDir{Tenant: t.Name(), Name: n.Name()})
			}
		}
	}
	return out, nil
}

// Usage counts the chunk files of namespace dir and their bytes, without
// its key (no reference file is read).
func (s *Store) Usage(dir NamespaceDir) (chunks, bytes int64, err error) {
	ns := &Namespace{s: s, tenant: dir.Tenant, name: dir.Name, dir: filepath.Join(s.root, dir.Tenant, dir.Name)}
	err = ns.walkChunks(func(_ string, _ Name, size int64, temp bool) error {
		if !temp {
			chunks++
			bytes += size
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	return chunks, bytes, err
}
