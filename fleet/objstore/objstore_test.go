package objstore

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"

	"github.com/warrenvm/warren/fleet/fleettest"
	"github.com/warrenvm/warren/hostd/crypt"
)

// bundle is a tar stream of files, in order.
type file struct {
	name string
	data []byte
}

func tarOf(t *testing.T, files []file) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Size: int64(len(f.data)), Mode: 0o600}); err != nil {
			t.Fatal(err)
		}
		tw.Write(f.data)
	}
	tw.Close()
	return buf.Bytes()
}

func untar(t *testing.T, b []byte) []file {
	t.Helper()
	var out []file
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		d, _ := io.ReadAll(tr)
		out = append(out, file{h.Name, d})
	}
}

// sample is a bundle with a repeated file (one blob), an empty one and
// a recognisable plaintext.
func sample() []file {
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	return []file{
		{"bundle.json", []byte(`{"hello":"PLAINTEXT-MARKER-1234567890"}`)},
		{"memory/0000000000000000", big},
		{"disk0/0000000000000000", big},
		{"empty", nil},
		{"end", []byte("PLAINTEXT-MARKER-1234567890 the end")},
	}
}

type env struct {
	s3   *fleettest.S3
	keys *crypt.LocalProvider
	mc   *minio.Client
}

func newEnv(t *testing.T) *env {
	s3 := fleettest.StartS3(t)
	dir := filepath.Join(t.TempDir(), "keys")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	e := &env{s3: s3, keys: &crypt.LocalProvider{Dir: dir}}
	return e
}

func (e *env) store(t *testing.T, bucket, cache string, keys crypt.Provider) *Store {
	t.Helper()
	s, err := New(context.Background(), Config{Endpoint: e.s3.Endpoint, Bucket: bucket, AccessKey: e.s3.AccessKey, SecretKey: e.s3.SecretKey,
		Region: e.s3.Region, Keys: keys, CacheDir: cache})
	if err != nil {
		t.Fatal(err)
	}
	e.mc = s.mc
	return s
}

// objects lists the bucket's keys under prefix.
func (e *env) objects(t *testing.T, bucket, prefix string) []string {
	t.Helper()
	var out []string
	for o := range e.mc.ListObjects(context.Background(), bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		out = append(out, o.Key)
	}
	return out
}

func (e *env) read(t *testing.T, bucket, key string) []byte {
	t.Helper()
	o, err := e.mc.GetObject(context.Background(), bucket, key, minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	b, err := io.ReadAll(o)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (e *env) write(t *testing.T, bucket, key string, b []byte) {
	t.Helper()
	if _, err := e.mc.PutObject(context.Background(), bucket, key, bytes.NewReader(b), int64(len(b)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestObjstore(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.keys.Create("sealed"); err != nil {
		t.Fatal(err)
	}
	s := e.store(t, "bundles", t.TempDir(), e.keys)
	files := sample()
	in := tarOf(t, files)

	t.Run("RoundTripDedup", func(t *testing.T) {
		for _, tenant := range []string{"plain", "sealed"} {
			ref, err := s.PutBundle(ctx, tenant, bytes.NewReader(in))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(ref.String(), "s3://bundles/"+tenant+"/") {
				t.Fatalf("ref %s", ref)
			}
			if back, err := ParseRef(ref.String()); err != nil || back != ref {
				t.Fatalf("ParseRef(%s) = %v, %v", ref, back, err)
			}
			objs := e.objects(t, "bundles", tenant+"/")
			// 4 distinct files (the two 1 MiB ones are equal) + 1 manifest.
			if len(objs) != 5 {
				t.Fatalf("%s: %d objects, want 5: %v", tenant, len(objs), objs)
			}
			ref2, err := s.PutBundle(ctx, tenant, bytes.NewReader(in))
			if err != nil || ref2 != ref {
				t.Fatalf("second put: %v %v (first %v)", ref2, err, ref)
			}
			if n := len(e.objects(t, "bundles", tenant+"/")); n != 5 {
				t.Fatalf("second put made objects: %d", n)
			}
			var out bytes.Buffer
			if err := s.GetBundle(ctx, ref, tenant, &out); err != nil {
				t.Fatal(err)
			}
			got := untar(t, out.Bytes())
			if len(got) != len(files) {
				t.Fatalf("%d files back, want %d", len(got), len(files))
			}
			for i := range files {
				if got[i].name != files[i].name || !bytes.Equal(got[i].data, files[i].data) {
					t.Fatalf("file %d: %s (%d bytes), want %s (%d bytes)", i, got[i].name, len(got[i].data), files[i].name, len(files[i].data))
				}
			}
		}
	})

	t.Run("ManyFilesInOrder", func(t *testing.T) {
		// More files than Parallel, several times over, some equal: put
		// and fetched concurrently, they come back in their order.
		var many []file
		for i := range 5*Parallel + 3 {
			data := bytes.Repeat([]byte{byte(i % 7)}, 1000+i)
			if i%5 == 0 {
				data = []byte("the same piece again")
			}
			many = append(many, file{fmt.Sprintf("memory/%016x", i*4096), data})
		}
		ref, err := s.PutBundle(ctx, "plain", bytes.NewReader(tarOf(t, many)))
		if err != nil {
			t.Fatal(err)
		}
		m, err := s.Manifest(ctx, ref, "plain")
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Entries) != len(many) || m.Entries[0].Blob != m.Entries[5].Blob || m.Entries[1].Blob == m.Entries[2].Blob {
			t.Fatalf("manifest of %d entries for %d files", len(m.Entries), len(many))
		}
		var out bytes.Buffer
		if err := s.GetBundle(ctx, ref, "plain", &out); err != nil {
			t.Fatal(err)
		}
		got := untar(t, out.Bytes())
		if len(got) != len(many) {
			t.Fatalf("%d files back, want %d", len(got), len(many))
		}
		for i := range many {
			if got[i].name != many[i].name || !bytes.Equal(got[i].data, many[i].data) {
				t.Fatalf("file %d: %s, want %s", i, got[i].name, many[i].name)
			}
		}
	})

	t.Run("NamesDifferAcrossTenants", func(t *testing.T) {
		names := map[string]string{}
		for _, tenant := range []string{"plain", "sealed"} {
			for _, k := range e.objects(t, "bundles", tenant+"/") {
				base := filepath.Base(k)
				if other, ok := names[base]; ok {
					t.Fatalf("object name %s is both %s's and %s's", base, other, tenant)
				}
				names[base] = tenant
			}
		}
	})

	t.Run("SealedNotPlaintext", func(t *testing.T) {
		for _, k := range e.objects(t, "bundles", "sealed/") {
			b := e.read(t, "bundles", k)
			if bytes.Contains(b, []byte("PLAINTEXT-MARKER")) || bytes.Contains(b, []byte("0123456789abcdef0123")) || bytes.Contains(b, []byte(`"entries"`)) {
				t.Fatalf("sealed object %s holds plaintext", k)
			}
		}
		found := false
		for _, k := range e.objects(t, "bundles", "plain/") {
			found = found || bytes.Contains(e.read(t, "bundles", k), []byte("PLAINTEXT-MARKER"))
		}
		if !found {
			t.Fatal("the plain tenant's objects do not hold the marker: the check above proves nothing")
		}
	})

	t.Run("TenantIsolation", func(t *testing.T) {
		for _, pair := range [][2]string{{"plain", "other"}, {"sealed", "plain"}, {"plain", "sealed"}} {
			owner, thief := pair[0], pair[1]
			ref, err := s.PutBundle(ctx, owner, bytes.NewReader(in))
			if err != nil {
				t.Fatal(err)
			}
			// The owner's reference, read as another tenant: refused.
			if err := s.GetBundle(ctx, ref, thief, io.Discard); err == nil {
				t.Fatalf("%s read %s's bundle %s", thief, owner, ref)
			}
			// The owner's objects copied under the thief's prefix: the
			// names do not hold for the thief (and sealed ones do not open).
			for _, k := range e.objects(t, "bundles", owner+"/") {
				e.write(t, "bundles", thief+strings.TrimPrefix(k, owner), e.read(t, "bundles", k))
			}
			stolen := Ref{Bucket: ref.Bucket, Tenant: thief, Manifest: ref.Manifest}
			if err := s.GetBundle(ctx, stolen, thief, io.Discard); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("%s read %s's copied objects: %v", thief, owner, err)
			}
		}
	})

	t.Run("TamperedRefused", func(t *testing.T) {
		for _, tenant := range []string{"plain", "sealed"} {
			tenant := tenant
			s2 := e.store(t, "tamper-"+tenant, "", e.keys) // no cache: every read goes to the bucket
			ref, err := s2.PutBundle(ctx, tenant, bytes.NewReader(in))
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range e.objects(t, "tamper-"+tenant, tenant+"/blobs/") {
				b := e.read(t, "tamper-"+tenant, k)
				if len(b) == 0 {
					continue
				}
				orig := bytes.Clone(b)
				b[len(b)/2] ^= 0x40
				e.write(t, "tamper-"+tenant, k, b)
				if err := s2.GetBundle(ctx, ref, tenant, io.Discard); !errors.Is(err, ErrCorrupt) {
					t.Fatalf("%s: blob %s tampered: %v", tenant, k, err)
				}
				e.write(t, "tamper-"+tenant, k, orig)
			}
			// Truncated / swapped manifest.
			mk := tenant + "/manifests/" + ref.Manifest
			m := e.read(t, "tamper-"+tenant, mk)
			e.write(t, "tamper-"+tenant, mk, m[:len(m)/2])
			if err := s2.GetBundle(ctx, ref, tenant, io.Discard); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("%s: manifest truncated: %v", tenant, err)
			}
			e.write(t, "tamper-"+tenant, mk, m)
			if err := s2.GetBundle(ctx, ref, tenant, io.Discard); err != nil {
				t.Fatalf("%s: restored objects: %v", tenant, err)
			}
		}
	})

	t.Run("CacheChecked", func(t *testing.T) {
		cache := t.TempDir()
		s3 := e.store(t, "bundles", cache, e.keys)
		ref, err := s3.PutBundle(ctx, "plain", bytes.NewReader(in))
		if err != nil {
			t.Fatal(err)
		}
		if err := s3.GetBundle(ctx, ref, "plain", io.Discard); err != nil {
			t.Fatal(err)
		}
		cached, _ := filepath.Glob(filepath.Join(cache, "plain", "blobs", "*"))
		if len(cached) != 4 {
			t.Fatalf("%d blobs cached, want 4", len(cached))
		}
		// A corrupt cached copy is dropped and fetched again.
		os.WriteFile(cached[0], []byte("garbage"), 0o600)
		var out bytes.Buffer
		if err := s3.GetBundle(ctx, ref, "plain", &out); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Bytes(), mustGet(t, s, ref, "plain")) {
			t.Fatal("bundle differs after a corrupt cached blob")
		}
		// With the bucket's blobs gone, the cache serves.
		for _, k := range e.objects(t, "bundles", "plain/blobs/") {
			e.mc.RemoveObject(ctx, "bundles", k, minio.RemoveObjectOptions{})
		}
		if err := s3.GetBundle(ctx, ref, "plain", io.Discard); err != nil {
			t.Fatalf("from the cache: %v", err)
		}
		if err := e.store(t, "bundles", "", e.keys).GetBundle(ctx, ref, "plain", io.Discard); !errors.Is(err, ErrNotFound) {
			t.Fatalf("without cache and blobs: %v", err)
		}
	})

	t.Run("BoundsRefused", func(t *testing.T) {
		for name, files := range map[string][]file{
			"too large": {{"big", make([]byte, MaxBlob+1)}},
			"dotdot":    {{"../etc/passwd", []byte("x")}},
			"absolute":  {{"/etc/passwd", []byte("x")}},
			"dot":       {{"a/./b", []byte("x")}},
			"long name": {{strings.Repeat("a", maxNameLen+1), []byte("x")}},
			"odd chars": {{"a b", []byte("x")}},
		} {
			if _, err := s.PutBundle(ctx, "plain", bytes.NewReader(tarOf(t, files))); err == nil {
				t.Errorf("%s: accepted", name)
			}
		}
		if validFile("a/") || validFile("a//b") || !validFile("disk0/00000000") {
			t.Error("validFile")
		}
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "link", Linkname: "/etc/passwd"})
		tw.Close()
		if _, err := s.PutBundle(ctx, "plain", &buf); err == nil {
			t.Error("symlink accepted")
		}
		for _, bad := range []string{"s3://bundles/plain", "s3://bundles/Plain/" + strings.Repeat("0", 64), "s3://b/plain/" + strings.Repeat("0", 64),
			"s3://bundles/plain/../x", "http://bundles/plain/" + strings.Repeat("0", 64)} {
			if _, err := ParseRef(bad); err == nil {
				t.Errorf("ParseRef(%q) accepted", bad)
			}
		}
	})

	t.Run("ManifestBounds", func(t *testing.T) {
		tk, err := s.keysFor(ctx, "plain")
		if err != nil {
			t.Fatal(err)
		}
		for name, body := range map[string]string{
			"other tenant": `{"version":1,"tenant":"sealed","entries":[]}`,
			"version":      `{"version":2,"tenant":"plain","entries":[]}`,
			"size":         fmt.Sprintf(`{"version":1,"tenant":"plain","entries":[{"name":"a","blob":"%s","size":%d}]}`, strings.Repeat("0", 64), MaxBlob+1),
			"path":         fmt.Sprintf(`{"version":1,"tenant":"plain","entries":[{"name":"../a","blob":"%s","size":1}]}`, strings.Repeat("0", 64)),
			"unknown":      `{"version":1,"tenant":"plain","entries":[],"x":1}`,
		} {
			mname, err := s.put(ctx, tk, "manifests", []byte(body))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.GetBundle(ctx, Ref{Bucket: "bundles", Tenant: "plain", Manifest: mname}, "plain", io.Discard); !errors.Is(err, ErrCorrupt) {
				t.Errorf("manifest %s: %v", name, err)
			}
		}
	})
}

func mustGet(t *testing.T, s *Store, ref Ref, tenant string) []byte {
	t.Helper()
	var out bytes.Buffer
	if err := s.GetBundle(context.Background(), ref, tenant, &out); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}
