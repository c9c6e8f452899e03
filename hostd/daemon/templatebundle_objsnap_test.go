package daemon

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenvm/warren/fleet/fleettest"
	hc "github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/kube"
	"github.com/warrenvm/warren/hostd/store"
)

// TestObjectSnapshotsTemplate moves a template between two daemons (fake
// VMMs, real snapshot formats) through a real S3 server with hostd/kube's
// ObjectSnapshots as a TemplateStore, as warren-hostd --kube-s3
// configures it: B records it ready and creates a sandbox of it; another
// tenant's client is refused; a sandbox's reference is not a template.
func TestObjectSnapshotsTemplate(t *testing.T) {
	s3 := fleettest.StartS3(t)
	f := newTemplateBundleFixture(t)
	tdB, _, _ := aliceDaemon(t)
	creds := filepath.Join(t.TempDir(), "s3.json")
	if err := os.WriteFile(creds, []byte(`{"access_key":"`+s3.AccessKey+`","secret_key":"`+s3.SecretKey+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	var k kubeFlags
	fs := flag.NewFlagSet("warren-hostd", flag.ContinueOnError)
	fs.String("keys", "", "")
	k.register(fs)
	if err := fs.Parse([]string{"--kube-s3", s3.Endpoint, "--kube-s3-insecure", "--kube-s3-credentials", creds, "--kube-s3-bucket", "templates"}); err != nil {
		t.Fatal(err)
	}
	ss, err := k.s3.store(tdB.state, "")
	if err != nil {
		t.Fatal(err)
	}
	ts, ok := ss.(kube.TemplateStore)
	if !ok {
		t.Fatalf("%T is no TemplateStore", ss)
	}
	ctx := context.Background()
	hA, _ := hc.New(f.td.sock, "alice", "")
	hB, _ := hc.New(tdB.sock, "alice", "")
	ref, err := ts.UploadTemplate(ctx, hA, f.id)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ref, "s3://templates/alice/") {
		t.Fatalf("ref %s", ref)
	}
	// Uploading it again (two hosts racing) stores another manifest
	// (the memory layer's name differs) over the same chunks; both
	// import.
	again, err := ts.UploadTemplate(ctx, hA, f.id)
	if err != nil {
		t.Fatal(err)
	}
	hBob, _ := hc.New(tdB.sock, "bob", "")
	if _, err := ts.ImportTemplate(ctx, hBob, ref); err == nil {
		t.Fatal("bob imported alice's template")
	}
	// A sandbox's snapshot in the store is not a template.
	sbf := newBundleFixture(t)
	hS, _ := hc.New(sbf.td.sock, "alice", "")
	sbRef, err := ss.Upload(ctx, hS, sbf.id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ts.ImportTemplate(ctx, hB, sbRef); err == nil || !strings.Contains(err.Error(), "not a \"template\"") {
		t.Fatalf("a sandbox's snapshot imported as a template: %v", err)
	}
	if d := templateDirs(tdB, "alice"); len(d) != 0 {
		t.Fatalf("refused imports left %v", d)
	}
	tp, err := ts.ImportTemplate(ctx, hB, ref)
	if err != nil {
		t.Fatal(err)
	}
	if tp.Status != store.TemplateReady || len(tp.DiskBases) != 2 || !strings.HasPrefix(tp.Snapshot, tdB.state) {
		t.Fatalf("imported %+v", tp)
	}
	tdB.client(t, "alice").create(tp.ID)
	if tp2, err := ts.ImportTemplate(ctx, hB, again); err != nil || tp2.Status != store.TemplateReady || tp2.ID == tp.ID {
		t.Fatalf("the second upload's import: %+v (%v)", tp2, err)
	}
}
