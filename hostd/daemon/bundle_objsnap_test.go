package daemon

import (
	"bytes"
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/warrenvm/warren/fleet/fleettest"
	hc "github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/kube"
	"github.com/warrenvm/warren/hostd/store"
)

// TestObjectSnapshots moves a sandbox between two daemons (fake VMMs,
// real snapshot formats) through a real S3 server with hostd/kube's
// ObjectSnapshots, as warren-hostd --kube-s3 configures it: the moved
// sandbox runs on B with A's memory; a reference of another tenant and a
// tampered blob are refused before anything is imported.
func TestObjectSnapshots(t *testing.T) {
	s3 := fleettest.StartS3(t)
	for _, keyed := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "sealed"}[keyed], func(t *testing.T) { objectSnapshots(t, s3, keyed) })
	}
}

// objectSnapshots is TestObjectSnapshots for a tenant without a key, or
// with one: the two daemons then share the tenants' keys (a fleet's
// hosts do), and neither the bucket nor B's state directory may hold
// the sandbox's plaintext.
func objectSnapshots(t *testing.T, s3 *fleettest.S3, keyed bool) {
	var mod []func(*Config)
	keysDir := ""
	if keyed {
		keys := newProvider(t)
		keysDir = keys.Dir
		mod = append(mod, withKeys(t, keys, ""))
	}
	bucket := map[bool]string{false: "moves", true: "moves-sealed"}[keyed]
	f := newBundleFixture(t, mod...)
	tdB, _, _ := aliceDaemon(t, mod...)
	creds := filepath.Join(t.TempDir(), "s3.json")
	if err := os.WriteFile(creds, []byte(`{"access_key":"`+s3.AccessKey+`","secret_key":"`+s3.SecretKey+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// The flags, as warren-hostd parses them.
	var k kubeFlags
	fs := flag.NewFlagSet("warren-hostd", flag.ContinueOnError)
	fs.String("keys", "", "")
	k.register(fs)
	if err := fs.Parse([]string{"--kube-s3", s3.Endpoint, "--kube-s3-insecure", "--kube-s3-credentials", creds, "--kube-s3-bucket", bucket}); err != nil {
		t.Fatal(err)
	}
	ss, err := k.s3.store(tdB.state, keysDir)
	if err != nil {
		t.Fatal(err)
	}
	snaps := ss.(*kube.ObjectSnapshots)
	ctx := context.Background()
	hA, _ := hc.New(f.td.sock, "alice", "")
	hB, _ := hc.New(tdB.sock, "alice", "")
	ref, err := snaps.Upload(ctx, hA, f.id)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ref, "s3://"+bucket+"/alice/") {
		t.Fatalf("ref %s", ref)
	}
	// The bucket keeps the memory's chunks once: a snapshot that changed
	// one page of memory adds that page's chunk (and the files that name
	// the new layer: bundle.json, the state, the layer's header and
	// index, "end"), not the others.
	mc, err := minio.New(s3.Endpoint, &minio.Options{Creds: credentialsFor(s3), Region: s3.Region})
	if err != nil {
		t.Fatal(err)
	}
	blobs := func() int {
		n := 0
		for range mc.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: "alice/blobs/", Recursive: true}) {
			n++
		}
		return n
	}
	before := blobs()
	s := f.td.sandbox("alice", f.id)
	s.mu.Lock()
	mem := bytes.Clone(f.mem)
	copy(mem[len(mem)/2:], "changed since the first upload")
	f.writeSnapshot(t, s, mem)
	s.mu.Unlock()
	if _, err := snaps.Upload(ctx, hA, f.id); err != nil {
		t.Fatal(err)
	}
	// (Every chunk of the fixture's memory holds data: the first upload
	// made a blob of each.)
	if added, chunks := blobs()-before, bundleTestMem/memoryGroupMin; before < chunks || added > 7 || added < 2 {
		t.Fatalf("a second upload with one page changed added %d blobs to %d (the memory alone is %d chunks)", added, before, chunks)
	}
	// Another tenant's client may not restore it.
	hBob, _ := hc.New(tdB.sock, "bob", "")
	if _, err := snaps.Restore(ctx, hBob, ref, nil); err == nil {
		t.Fatal("bob restored alice's snapshot")
	}
	bobRef := strings.Replace(ref, "/alice/", "/bob/", 1)
	if _, err := snaps.Restore(ctx, hBob, bobRef, nil); err == nil {
		t.Fatal("bob restored alice's snapshot under his own prefix")
	}
	// A tampered blob: refused, nothing imported.
	var victim string
	var orig []byte
	for o := range mc.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: "alice/blobs/", Recursive: true}) {
		if o.Size > 1<<20 {
			victim = o.Key
			break
		}
	}
	if victim == "" {
		t.Fatal("no large blob")
	}
	obj, _ := mc.GetObject(ctx, bucket, victim, minio.GetObjectOptions{})
	orig, _ = io.ReadAll(obj)
	obj.Close()
	bad := bytes.Clone(orig)
	bad[len(bad)/3] ^= 0x80
	mc.PutObject(ctx, bucket, victim, bytes.NewReader(bad), int64(len(bad)), minio.PutObjectOptions{})
	if _, err := snaps.Restore(ctx, hB, ref, nil); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("tampered blob: %v", err)
	}
	// (The client's request ends when its body fails; the daemon's
	// import then cleans up.)
	for i := 0; len(sandboxDirs(t, tdB, "alice")) != 0; i++ {
		if i == 100 {
			t.Fatalf("a refused restore left %v", sandboxDirs(t, tdB, "alice"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	var list []store.Sandbox
	tdB.client(t, "alice").ok(200, "GET", "/v1/sandboxes", nil, &list)
	if len(list) != 0 {
		t.Fatalf("a refused restore recorded %+v", list)
	}
	mc.PutObject(ctx, bucket, victim, bytes.NewReader(orig), int64(len(orig)), minio.PutObjectOptions{})

	if keyed {
		// Nothing in the bucket is plaintext: not the disk's bytes, nor
		// the manifest's or bundle.json's fields.
		for o := range mc.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: "alice/", Recursive: true}) {
			obj, _ := mc.GetObject(ctx, bucket, o.Key, minio.GetObjectOptions{})
			b, _ := io.ReadAll(obj)
			obj.Close()
			for _, marker := range [][]byte{[]byte("written after the base"), f.rw[8192 : 8192+64], []byte(`"entries"`), []byte(`"mem_mib"`)} {
				if bytes.Contains(b, marker) {
					t.Fatalf("object %s holds plaintext %q", o.Key, marker[:min(len(marker), 24)])
				}
			}
		}
	}
	id, err := snaps.Restore(ctx, hB, ref, map[string]string{"from": "a"})
	if err != nil {
		t.Fatal(err)
	}
	sb := tdB.client(t, "alice").get(id)
	if sb.Status != store.Running || sb.Labels["from"] != "a" {
		t.Fatalf("restored: %+v", sb)
	}
	if keyed {
		// On B, the imported snapshot is sealed at rest, as its own are.
		rec := tdB.client(t, "alice").get(id)
		if ok, err := isSealed(rec.Snapshots[0].Path + ".wstate"); err != nil || !ok {
			t.Fatalf("B's imported snapshot is not sealed: %v %v", ok, err)
		}
	}
	// Fetched objects are cached, sealed as they came, in the state directory.
	if m, _ := filepath.Glob(filepath.Join(tdB.state, "objcache", "alice", "blobs", "*")); len(m) == 0 {
		t.Fatal("nothing cached")
	}
}

func TestS3Flags(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	os.WriteFile(good, []byte(`{"access_key":"a","secret_key":"b"}`), 0o600)
	open := filepath.Join(dir, "open.json")
	os.WriteFile(open, []byte(`{"access_key":"a","secret_key":"b"}`), 0o644)
	empty := filepath.Join(dir, "empty.json")
	os.WriteFile(empty, []byte(`{"access_key":"a"}`), 0o600)
	unknown := filepath.Join(dir, "unknown.json")
	os.WriteFile(unknown, []byte(`{"access_key":"a","secret_key":"b","x":1}`), 0o600)
	for name, s := range map[string]s3Flags{
		"no credentials":         {endpoint: "127.0.0.1:1"},
		"insecure not loopback":  {endpoint: "10.0.0.1:9000", insecure: true, credentials: good},
		"insecure hostname":      {endpoint: "s3.example.com:9000", insecure: true, credentials: good},
		"credentials readable":   {endpoint: "127.0.0.1:1", insecure: true, credentials: open},
		"credentials incomplete": {endpoint: "127.0.0.1:1", insecure: true, credentials: empty},
		"credentials unknown":    {endpoint: "127.0.0.1:1", insecure: true, credentials: unknown},
	} {
		if _, err := s.store(dir, ""); err == nil {
			t.Errorf("%s: accepted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	if ss, err := (&s3Flags{}).store(dir, ""); ss != nil || err != nil {
		t.Fatalf("without --kube-s3: %v %v", ss, err)
	}
}

func credentialsFor(s3 *fleettest.S3) *credentials.Credentials {
	return credentials.NewStaticV4(s3.AccessKey, s3.SecretKey, "")
}
