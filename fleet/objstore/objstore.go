package objstore

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"golang.org/x/sync/errgroup"

	"github.com/warrenvm/warren/hostd/crypt"
	"github.com/warrenvm/warren/internal/atomicfile"
	"github.com/warrenvm/warren/internal/strictjson"
)

// Bounds on what a bundle holds and on what is read back.
const (
	// MaxBlob is the most bytes one file of a bundle may hold.
	MaxBlob = 16 << 20
	// MaxEntries is the most files one bundle may hold.
	MaxEntries = 1 << 17
	// MaxManifest is the most bytes a manifest may take (encoded).
	MaxManifest = 32 << 20
	// Parallel is how many blobs a PutBundle or a GetBundle has in
	// flight at once (each at most MaxBlob bytes in memory): a bundle's
	// memory is one blob per memsnap chunk, hundreds to thousands of
	// requests, whose round trips overlap.
	Parallel = 8
	// maxNameLen bounds a file name in a bundle.
	maxNameLen = 200
)

// ManifestVersion is the version of the manifests this package writes
// and reads.
const ManifestVersion = 1

// Sentinel errors; test with errors.Is.
var (
	// ErrCorrupt: an object read back is not what its name says (wrong
	// digest, fails authentication, too large, malformed).
	ErrCorrupt = errors.New("objstore: object corrupt or not this tenant's")
	// ErrNotFound: no such manifest or blob.
	ErrNotFound = errors.New("objstore: not found")
)

// Config is how a Store reaches its bucket.
type Config struct {
	// Endpoint is the server's host:port; Secure uses https.
	Endpoint string
	Secure   bool
	// Bucket is made when missing.
	Bucket string
	// Region is signed for (default us-east-1).
	Region string
	// AccessKey and SecretKey are the store's credentials.
	AccessKey, SecretKey string
	// NameSecret keys the names of objects (see the package doc); every
	// host of a fleet needs the same one. Empty: derived from SecretKey.
	NameSecret []byte
	// Keys are the tenants' encryption keys; nil: nothing is encrypted.
	// A tenant for which Keys answers crypt.ErrNoKey is stored plain;
	// any other error (a revoked key) fails the call.
	Keys crypt.Provider
	// CacheDir, when set, keeps fetched objects (see the package doc).
	CacheDir string
	// Transport, when set, is the HTTP transport (tests).
	Transport http.RoundTripper
}

// Store is a bucket of bundles.
type Store struct {
	cfg Config
	mc  *minio.Client
}

// New connects to the bucket of cfg, making it when missing.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Endpoint == "" || cfg.Bucket == "" || cfg.AccessKey == "" || cfg.SecretKey == "" {
		return nil, errors.New("objstore: Endpoint, Bucket, AccessKey and SecretKey are required")
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	if len(cfg.NameSecret) == 0 {
		m := hmac.New(sha256.New, []byte(cfg.SecretKey))
		m.Write([]byte("warren objstore name secret v1"))
		cfg.NameSecret = m.Sum(nil)
	}
	mc, err := minio.New(cfg.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure: cfg.Secure, Region: cfg.Region, Transport: cfg.Transport})
	if err != nil {
		return nil, fmt.Errorf("objstore: %w", err)
	}
	s := &Store{cfg: cfg, mc: mc}
	ok, err := mc.BucketExists(ctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("objstore: bucket %s: %w", cfg.Bucket, err)
	}
	if !ok {
		if err := mc.MakeBucket(ctx, cfg.Bucket, minio.MakeBucketOptions{Region: cfg.Region}); err != nil {
			if ok2, err2 := mc.BucketExists(ctx, cfg.Bucket); err2 != nil || !ok2 { // another host made it meanwhile
				return nil, fmt.Errorf("objstore: make bucket %s: %w", cfg.Bucket, err)
			}
		}
	}
	return s, nil
}

// Bucket is the store's bucket.
func (s *Store) Bucket() string { return s.cfg.Bucket }

// Ref names a stored bundle: s3://BUCKET/TENANT/MANIFEST.
type Ref struct {
	Bucket, Tenant, Manifest string
}

func (r Ref) String() string { return "s3://" + r.Bucket + "/" + r.Tenant + "/" + r.Manifest }

var (
	tenantRE = regexp.MustCompile(`^[a-z0-9-]{1,63}$`)
	objRE    = regexp.MustCompile(`^[0-9a-f]{64}$`)
	bucketRE = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)
	fileRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]*$`)
)

// ParseRef parses s3://BUCKET/TENANT/MANIFEST.
func ParseRef(s string) (Ref, error) {
	rest, ok := strings.CutPrefix(s, "s3://")
	parts := strings.Split(rest, "/")
	if !ok || len(parts) != 3 || !bucketRE.MatchString(parts[0]) || !tenantRE.MatchString(parts[1]) || !objRE.MatchString(parts[2]) {
		return Ref{}, fmt.Errorf("objstore: %q is not s3://BUCKET/TENANT/MANIFEST", s)
	}
	return Ref{Bucket: parts[0], Tenant: parts[1], Manifest: parts[2]}, nil
}

// Manifest lists a bundle's files in order. It holds nothing else (no
// time): the same bundle stored twice has the same reference.
type Manifest struct {
	Version int     `json:"version"`
	Tenant  string  `json:"tenant"`
	Entries []Entry `json:"entries"`
}

// Entry is one file of a bundle: its name in the tar stream, its blob's
// name and its size in bytes.
type Entry struct {
	Name string `json:"name"`
	Blob string `json:"blob"`
	Size int64  `json:"size"`
}

// validFile reports whether name may name a file of a bundle: a relative
// path of [A-Za-z0-9._/-], no "." or ".." element, at most maxNameLen.
func validFile(name string) bool {
	if len(name) > maxNameLen || !fileRE.MatchString(name) || strings.HasSuffix(name, "/") {
		return false
	}
	for _, el := range strings.Split(name, "/") {
		if el == "" || el == "." || el == ".." {
			return false
		}
	}
	return true
}

// check validates a manifest read for tenant.
func (m *Manifest) check(tenant string) error {
	if m.Version != ManifestVersion {
		return fmt.Errorf("manifest version %d, want %d", m.Version, ManifestVersion)
	}
	if m.Tenant != tenant {
		return fmt.Errorf("manifest of tenant %q, read for %q", m.Tenant, tenant)
	}
	if len(m.Entries) > MaxEntries {
		return fmt.Errorf("%d entries, at most %d", len(m.Entries), MaxEntries)
	}
	for i, e := range m.Entries {
		if !validFile(e.Name) || !objRE.MatchString(e.Blob) || e.Size < 0 || e.Size > MaxBlob {
			return fmt.Errorf("entry %d (%.80q): bad name, blob or size", i, e.Name)
		}
	}
	return nil
}

// tenantKeys is what a call needs of its tenant: the name key, the
// mode its names commit to and its encryption key (invalid: plain).
type tenantKeys struct {
	tenant string
	name   []byte
	mode   string
	key    crypt.Key
}

func (s *Store) keysFor(ctx context.Context, tenant string) (*tenantKeys, error) {
	if !tenantRE.MatchString(tenant) {
		return nil, fmt.Errorf("objstore: bad tenant %q", tenant)
	}
	m := hmac.New(sha256.New, s.cfg.NameSecret)
	m.Write([]byte("warren objstore names v1\x00" + tenant))
	tk := &tenantKeys{tenant: tenant, name: m.Sum(nil), mode: "plain"}
	if s.cfg.Keys != nil {
		k, err := s.cfg.Keys.Key(ctx, tenant)
		switch {
		case err == nil:
			tk.key, tk.mode = k, "key:"+k.ID()
		case errors.Is(err, crypt.ErrNoKey):
		default:
			return nil, fmt.Errorf("objstore: tenant %s: %w", tenant, err)
		}
	}
	return tk, nil
}

// nameOf is the object name of plaintext b.
func (tk *tenantKeys) nameOf(b []byte) string {
	d := sha256.Sum256(b)
	m := hmac.New(sha256.New, tk.name)
	m.Write([]byte(tk.mode))
	m.Write([]byte{0})
	m.Write(d[:])
	return hex.EncodeToString(m.Sum(nil))
}

// seal is what is stored for plaintext b.
func (tk *tenantKeys) seal(b []byte) ([]byte, error) {
	if !tk.key.Valid() {
		return b, nil
	}
	var buf bytes.Buffer
	w, err := crypt.NewWriter(&buf, tk.key, nil)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(b); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// singleKey serves one tenant's one key (what opening a sealed object
// checks against).
type singleKey struct {
	tenant string
	key    crypt.Key
}

func (p singleKey) Key(_ context.Context, tenant string) (crypt.Key, error) {
	if tenant != p.tenant {
		return crypt.Key{}, crypt.ErrNoKey
	}
	return p.key, nil
}

// open checks an object fetched by name and returns its plaintext, at
// most limit bytes.
func (tk *tenantKeys) open(ctx context.Context, obj []byte, name string, limit int64) ([]byte, error) {
	plain := obj
	if tk.key.Valid() {
		r, err := crypt.OpenReaderContext(ctx, bytes.NewReader(obj), int64(len(obj)), singleKey{tk.tenant, tk.key}, tk.tenant, nil)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, name, err)
		}
		if r.Size() > limit {
			return nil, fmt.Errorf("%w: %s: %d bytes, at most %d", ErrCorrupt, name, r.Size(), limit)
		}
		plain = make([]byte, r.Size())
		if _, err := r.ReadAt(plain, 0); err != nil && !(errors.Is(err, io.EOF) && r.Size() == 0) {
			return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, name, err)
		}
	} else if int64(len(obj)) > limit {
		return nil, fmt.Errorf("%w: %s: %d bytes, at most %d", ErrCorrupt, name, len(obj), limit)
	}
	if got := tk.nameOf(plain); !hmac.Equal([]byte(got), []byte(name)) {
		return nil, fmt.Errorf("%w: %s: its contents hash to %s", ErrCorrupt, name, got)
	}
	return plain, nil
}

// sealedLimit bounds a stored object of at most n plaintext bytes
// (hostd/crypt adds a header and a tag per chunk).
func sealedLimit(n int64) int64 { return n + n/64 + 64<<10 }

func objectKey(tenant, kind, name string) string { return tenant + "/" + kind + "/" + name }

// put stores plaintext b as an object of kind unless it exists; it
// returns its name.
func (s *Store) put(ctx context.Context, tk *tenantKeys, kind string, b []byte) (string, error) {
	name := tk.nameOf(b)
	key := objectKey(tk.tenant, kind, name)
	if _, err := s.mc.StatObject(ctx, s.cfg.Bucket, key, minio.StatObjectOptions{}); err == nil {
		return name, nil
	} else if minio.ToErrorResponse(err).Code != "NoSuchKey" && minio.ToErrorResponse(err).StatusCode != http.StatusNotFound {
		return "", fmt.Errorf("objstore: stat %s: %w", key, err)
	}
	obj, err := tk.seal(b)
	if err != nil {
		return "", fmt.Errorf("objstore: seal %s: %w", key, err)
	}
	if _, err := s.mc.PutObject(ctx, s.cfg.Bucket, key, bytes.NewReader(obj), int64(len(obj)),
		minio.PutObjectOptions{ContentType: "application/octet-stream"}); err != nil {
		return "", fmt.Errorf("objstore: put %s: %w", key, err)
	}
	return name, nil
}

// get fetches the object kind/name (from the cache when it holds it) and
// returns its checked plaintext.
func (s *Store) get(ctx context.Context, tk *tenantKeys, kind, name string, limit int64) ([]byte, error) {
	if !objRE.MatchString(name) {
		return nil, fmt.Errorf("%w: bad object name %q", ErrCorrupt, name)
	}
	objLimit := limit
	if tk.key.Valid() {
		objLimit = sealedLimit(limit)
	}
	cached := ""
	if s.cfg.CacheDir != "" {
		cached = filepath.Join(s.cfg.CacheDir, tk.tenant, kind, name)
		if obj, err := readLimited(cached, objLimit); err == nil {
			if b, err := tk.open(ctx, obj, name, limit); err == nil {
				return b, nil
			}
			os.Remove(cached) // corrupt or stale: fetch it again
		}
	}
	key := objectKey(tk.tenant, kind, name)
	o, err := s.mc.GetObject(ctx, s.cfg.Bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, fmt.Errorf("objstore: get %s: %w", key, err)
	}
	defer o.Close()
	obj, err := io.ReadAll(io.LimitReader(o, objLimit+1))
	if err != nil {
		if r := minio.ToErrorResponse(err); r.Code == "NoSuchKey" || r.StatusCode == http.StatusNotFound {
			return nil, fmt.Errorf("%w: %s", ErrNotFound, key)
		}
		return nil, fmt.Errorf("objstore: get %s: %w", key, err)
	}
	if int64(len(obj)) > objLimit {
		return nil, fmt.Errorf("%w: %s: more than %d bytes", ErrCorrupt, key, objLimit)
	}
	b, err := tk.open(ctx, obj, name, limit)
	if err != nil {
		return nil, err
	}
	if cached != "" {
		if err := os.MkdirAll(filepath.Dir(cached), 0o700); err == nil {
			atomicfile.Write(cached, obj, 0o600) // best effort: the next read checks it again
		}
	}
	return b, nil
}

// readLimited reads file p if it holds at most limit bytes.
func readLimited(p string, limit int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err == nil && int64(len(b)) > limit {
		err = errors.New("too large")
	}
	return b, err
}

// PutBundle stores the tar stream r (regular files only, each at most
// MaxBlob bytes, at most MaxEntries, names as validFile allows) as
// tenant's and returns its reference. Blobs the bucket holds already are
// not uploaded again.
func (s *Store) PutBundle(ctx context.Context, tenant string, r io.Reader) (Ref, error) {
	tk, err := s.keysFor(ctx, tenant)
	if err != nil {
		return Ref{}, err
	}
	m := Manifest{Version: ManifestVersion, Tenant: tenant}
	tr := tar.NewReader(r)
	// Each file is put by a goroutine of its own, Parallel at most (Go
	// waits for a slot: the stream is read no further ahead), and its
	// blob's name written into its entry's slot of names.
	ctx, cancel := context.WithCancel(ctx) // a return stops the puts in flight
	defer cancel()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(Parallel)
	var mu sync.Mutex
	names := map[int]string{}
	for gctx.Err() == nil {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return Ref{}, fmt.Errorf("objstore: bundle: %w", err)
		}
		if h.Typeflag != tar.TypeReg || !validFile(h.Name) || h.Size < 0 || h.Size > MaxBlob {
			return Ref{}, fmt.Errorf("objstore: bundle file %.80q: want a regular file of at most %d bytes with a plain relative name", h.Name, MaxBlob)
		}
		if len(m.Entries) == MaxEntries {
			return Ref{}, fmt.Errorf("objstore: bundle of more than %d files", MaxEntries)
		}
		b := make([]byte, h.Size)
		if _, err := io.ReadFull(tr, b); err != nil {
			return Ref{}, fmt.Errorf("objstore: bundle file %s: %w", h.Name, err)
		}
		i := len(m.Entries)
		m.Entries = append(m.Entries, Entry{Name: h.Name, Size: h.Size})
		g.Go(func() error {
			name, err := s.put(gctx, tk, "blobs", b)
			if err != nil {
				return err
			}
			mu.Lock()
			names[i] = name
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return Ref{}, err
	}
	for i := range m.Entries {
		m.Entries[i].Blob = names[i]
	}
	mb, err := json.Marshal(m)
	if err != nil {
		return Ref{}, err
	}
	if len(mb) > MaxManifest {
		return Ref{}, fmt.Errorf("objstore: manifest of %d bytes, at most %d", len(mb), MaxManifest)
	}
	name, err := s.put(ctx, tk, "manifests", mb)
	if err != nil {
		return Ref{}, err
	}
	return Ref{Bucket: s.cfg.Bucket, Tenant: tenant, Manifest: name}, nil
}

// Manifest fetches and checks the manifest ref names, for tenant.
func (s *Store) Manifest(ctx context.Context, ref Ref, tenant string) (*Manifest, error) {
	tk, err := s.keysFor(ctx, tenant)
	if err != nil {
		return nil, err
	}
	return s.manifest(ctx, tk, ref)
}

func (s *Store) manifest(ctx context.Context, tk *tenantKeys, ref Ref) (*Manifest, error) {
	if ref.Bucket != s.cfg.Bucket {
		return nil, fmt.Errorf("objstore: %s is in bucket %s, this store's is %s", ref, ref.Bucket, s.cfg.Bucket)
	}
	if ref.Tenant != tk.tenant {
		return nil, fmt.Errorf("objstore: %s is tenant %s's, not %s's", ref, ref.Tenant, tk.tenant)
	}
	b, err := s.get(ctx, tk, "manifests", ref.Manifest, MaxManifest)
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := strictjson.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%w: manifest %s: %v", ErrCorrupt, ref.Manifest, err)
	}
	if err := m.check(tk.tenant); err != nil {
		return nil, fmt.Errorf("%w: manifest %s: %v", ErrCorrupt, ref.Manifest, err)
	}
	return &m, nil
}

// GetBundle writes the bundle ref names, as tenant's, to w as a tar
// stream: the files PutBundle was given, in order, each checked before
// it is written. An error may come after some files were written: the
// stream is then cut short (no end-of-archive marker).
func (s *Store) GetBundle(ctx context.Context, ref Ref, tenant string, w io.Writer) error {
	tk, err := s.keysFor(ctx, tenant)
	if err != nil {
		return err
	}
	m, err := s.manifest(ctx, tk, ref)
	if err != nil {
		return err
	}
	// Up to Parallel blobs are fetched ahead of the one written next,
	// each into a channel of its own; a return cancels the rest.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type fetched struct {
		b   []byte
		err error
	}
	ahead := make([]chan fetched, len(m.Entries))
	started := 0
	tw := tar.NewWriter(w)
	for i, e := range m.Entries {
		for ; started < len(m.Entries) && started <= i+Parallel-1; started++ {
			c := make(chan fetched, 1)
			ahead[started] = c
			blob := m.Entries[started].Blob
			go func() {
				b, err := s.get(ctx, tk, "blobs", blob, MaxBlob)
				c <- fetched{b, err}
			}()
		}
		f := <-ahead[i]
		ahead[i] = nil
		b, err := f.b, f.err
		if err != nil {
			return err
		}
		if int64(len(b)) != e.Size {
			return fmt.Errorf("%w: blob %s of %s: %d bytes, the manifest says %d", ErrCorrupt, e.Blob, e.Name, len(b), e.Size)
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e.Name, Size: e.Size, Mode: 0o600, Format: tar.FormatPAX}); err != nil {
			return err
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
	}
	return tw.Close()
}
