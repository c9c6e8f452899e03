package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/warrenvm/warren/fleet/fleettest"
	"github.com/warrenvm/warren/fleet/objstore"
	hc "github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/kube"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/internal/product"
)

// TestE2EBundle moves a suspended sandbox between two daemons (two state
// directories, real VMs) through a real S3 server (SeaweedFS), the way
// the fleet does (hostd/kube's ObjectSnapshots over fleet/objstore):
// daemon A runs a sandbox of a template with a writable disk, which
// writes a file to its disk and starts a process that holds a random
// value in memory; A suspends it and its bundle goes to the bucket;
// daemon B, which has never seen the template, imports it from there
// and resumes it. On B the file is there, and the same process, still
// running, gives back the value it held. WARREN_TESTDISK names the disk
// image (make testdisk); the S3 server's binaries are build/kubetools'
// (make kubetools).
func TestE2EBundle(t *testing.T) {
	warren, kernel, initrd := e2ePaths(t)
	img := os.Getenv("WARREN_TESTDISK")
	if img == "" {
		product.Missing(t, "the test disk (WARREN_TESTDISK is unset)", "make testdisk")
	}
	s3 := fleettest.StartS3(t)
	stateA, step := e2eState(t, "hostd-bundle-a-")
	stateB, _ := e2eState(t, "hostd-bundle-b-")
	root := repoRoot(t)
	gd := guestDir(t, map[string]string{kernel: "@" + filepath.Join(root, "build", kernel),
		initrd: "@" + filepath.Join(root, "build", initrd), "testdisk.img": "@" + img})
	mod := func(c *Config) { c.GuestDir = gd }
	tdA := startE2EDaemon(t, stateA, warren, mod)
	tdB := startE2EDaemon(t, stateB, warren, mod)
	const tenant = "tenant-move"
	cA, cB := tdA.client(t, tenant), tdB.client(t, tenant)
	var stop []store.Sandbox
	defer func() {
		for _, sb := range stop { // leave no VMM behind, whatever happened
			stopProc(sb.PID, sb.StartTime, time.Second)
		}
	}()
	sh := func(c *client, id, cmd string) string {
		t.Helper()
		st, b, err := c.try("POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"argv": []string{"sh", "-c", cmd}, "timeout_ms": 60000})
		if err == nil && st != 200 {
			err = fmt.Errorf("%d %s", st, b)
		}
		out, errOut, code := "", "", -1
		if err == nil {
			out, errOut, code, err = parseExec(b)
		}
		if err != nil || code != 0 {
			t.Fatalf("%q in %s: %v exit %d %q %q", cmd, id, err, code, out, errOut)
		}
		return out
	}

	var tp store.Template
	cA.ok(201, "POST", "/v1/templates", map[string]any{"kernel": kernel, "initramfs": initrd, "mem_mib": 256, "cpus": 1, "disks": []string{"testdisk.img"}}, &tp)
	step("A: template %s with a writable disk", tp.ID)
	sb := cA.create(tp.ID)
	stop = append(stop, sb)
	sh(cA, sb.ID, "echo moved-file-v1 > /mnt/data/f; sync")
	var pi wire.ProcessInfo
	cA.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/processes", map[string]any{"argv": []string{"sh", "-c",
		`V=$(cat /proc/sys/kernel/random/uuid); echo "$V" > /tmp/expected; while [ ! -e /tmp/go ]; do sleep 0.2; done; echo "held=$V"`}}, &pi)
	var want string
	for i := 0; i < 100 && want == ""; i++ {
		out, _, code, _ := cA.tryExec(sb.ID, "cat", "/tmp/expected")
		if code == 0 {
			want = strings.TrimSpace(out)
		} else {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if len(want) != 36 {
		t.Fatalf("the process's value: %q", want)
	}
	step("A: sandbox %s wrote /mnt/data/f; process %s (pid %d) holds %s", sb.ID, pi.ID, pi.Pid, want)
	cA.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/pause?to_disk=true", nil, nil)
	step("A: suspended")

	ctx := context.Background()
	st, err := objstore.New(ctx, objstore.Config{Endpoint: s3.Endpoint, Bucket: "warren-e2e", AccessKey: s3.AccessKey, SecretKey: s3.SecretKey,
		Region: s3.Region, CacheDir: filepath.Join(stateB, "objcache")})
	if err != nil {
		t.Fatal(err)
	}
	snaps := &kube.ObjectSnapshots{Store: st}
	hA, err := hc.New(tdA.sock, tenant, "")
	if err != nil {
		t.Fatal(err)
	}
	hB, err := hc.New(tdB.sock, tenant, "")
	if err != nil {
		t.Fatal(err)
	}
	ref, err := snaps.Upload(ctx, hA, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	step("uploaded: %s", ref)
	// A second upload of the same snapshot stores only what names the
	// memory layer's new file name: bundle.json, the state, "end", the
	// first chunk of the memory layer (its header) and the manifest.
	mc, err := minio.New(s3.Endpoint, &minio.Options{Creds: credentialsFor(s3), Region: s3.Region})
	if err != nil {
		t.Fatal(err)
	}
	count := func() (n int) {
		for o := range mc.ListObjects(ctx, "warren-e2e", minio.ListObjectsOptions{Prefix: tenant + "/", Recursive: true}) {
			if o.Err != nil {
				t.Fatal(o.Err)
			}
			n++
		}
		return n
	}
	before := count()
	if _, err := snaps.Upload(ctx, hA, sb.ID); err != nil {
		t.Fatalf("second upload: %v", err)
	}
	if after := count(); after-before > 5 {
		t.Fatalf("second upload of the same snapshot: %d objects more (of %d)", after-before, before)
	}
	step("a second upload added %d objects to the %d", count()-before, before)
	var tpls []store.Template
	cB.ok(200, "GET", "/v1/templates", nil, &tpls)
	if len(tpls) != 0 {
		t.Fatalf("B has templates: %+v", tpls)
	}
	id, err := snaps.Restore(ctx, hB, ref, map[string]string{"moved": "yes"})
	if err != nil {
		t.Fatal(err)
	}
	moved := cB.get(id)
	stop = append(stop, moved)
	if moved.Status != store.Running || moved.Labels["moved"] != "yes" {
		t.Fatalf("B: %+v", moved)
	}
	if !strings.HasPrefix(moved.RestoredFrom, filepath.Join(stateB, "tenants", tenant, "sandboxes", id)+"/") {
		t.Fatalf("B restored from %s", moved.RestoredFrom)
	}
	step("B: imported and resumed as %s (pid %d)", id, moved.PID)
	// Should the guest not answer, the VMM's log and console say why.
	diag := time.AfterFunc(2*time.Minute, func() {
		for _, p := range []string{moved.Log, moved.Console} {
			b, _ := os.ReadFile(p)
			t.Logf("%s (no answer for 2 min):\n%s", p, lastLines(string(b), 60))
		}
	})
	defer diag.Stop()
	step("B: guest answers: %q", strings.TrimSpace(sh(cB, id, "echo alive")))

	// The files: read from the disk itself.
	out := sh(cB, id, "sync; echo 3 > /proc/sys/vm/drop_caches; cat /mnt/data/f; dmesg")
	if strings.Contains(out, "EXT4-fs error") || strings.Contains(out, "I/O error") {
		t.Fatalf("B's guest logged disk errors:\n%s", out)
	}
	if f, _, _ := strings.Cut(out, "\n"); f != "moved-file-v1" {
		t.Fatalf("B reads /mnt/data/f = %q", f)
	}
	// The memory: the same process, still running, gives its value back.
	var got wire.ProcessInfo
	cB.ok(200, "GET", "/v1/sandboxes/"+id+"/processes/"+pi.ID, nil, &got)
	if got.Pid != pi.Pid || got.State != "running" {
		t.Fatalf("B: process %s is %+v, want pid %d running", pi.ID, got, pi.Pid)
	}
	sh(cB, id, "echo go > /tmp/go")
	var held string
	for i := 0; i < 100; i++ {
		st, b := cB.do("GET", "/v1/sandboxes/"+id+"/processes/"+pi.ID+"/output?follow=0&offset=0", nil)
		if st != 200 {
			t.Fatalf("output of %s: %d %s", pi.ID, st, b)
		}
		out, _, code, err := parseExec(b)
		if err != nil {
			t.Fatal(err)
		}
		if code == 0 && strings.Contains(out, "held=") {
			held = out
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(held, "held="+want) {
		t.Fatalf("B: the process's output %q, want held=%s", held, want)
	}
	step("B: /mnt/data/f intact; process %s gave back %s", pi.ID, want)

	// A's sandbox is still A's, suspended; the two are apart.
	if a := cA.get(sb.ID); a.Status != store.Suspended {
		t.Fatalf("A's sandbox: %+v", a)
	}
	sh(cB, id, "echo on-b > /mnt/data/f; sync")
	cA.ok(200, "POST", "/v1/sandboxes/"+sb.ID+"/resume", nil, nil)
	stop = append(stop, cA.get(sb.ID))
	if got := strings.TrimSpace(sh(cA, sb.ID, "cat /mnt/data/f")); got != "moved-file-v1" {
		t.Fatalf("A reads %q after B wrote", got)
	}
	step("A resumed its own copy, untouched by B's writes")
}
