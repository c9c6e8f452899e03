package daemon

import (
	"context"
	"errors"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	hostclient "github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/wire"
)

// The file API's routes through hostd/client against the real guest agent
// (which, in the fake launcher, works on this host's files: the test's
// temporary directory stands in for the guest's).
func TestFileOps(t *testing.T) {
	_, c, hc, id := procSandbox(t)
	ctx := context.Background()
	root := t.TempDir()
	dir := filepath.Join(root, "a", "b")
	fi, err := hc.Mkdir(ctx, id, dir, 0o750, true)
	if err != nil || !fi.IsDir || fi.Mode.Perm() != 0o750 {
		t.Fatalf("mkdir -p: %+v %v", fi, err)
	}
	if _, err := hc.Mkdir(ctx, id, dir, 0o750, true); err != nil {
		t.Fatalf("mkdir -p of an existing directory: %v", err)
	}
	if _, err := hc.Mkdir(ctx, id, dir, 0o750, false); err == nil {
		t.Fatal("mkdir of an existing directory without parents: no error")
	}
	if _, err := hc.WriteFile(ctx, id, filepath.Join(dir, "f"), strings.NewReader("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	fi, err = hc.StatFile(ctx, id, filepath.Join(dir, "f"))
	if err != nil || fi.Size != 4 || fi.IsDir || fi.Name != "f" {
		t.Fatalf("stat: %+v %v", fi, err)
	}
	l, err := hc.ListFiles(ctx, id, root, 3)
	var paths []string
	for _, f := range l {
		paths = append(paths, strings.TrimPrefix(f.Path, root))
	}
	if err != nil || strings.Join(paths, " ") != "/a /a/b /a/b/f" {
		t.Fatalf("list depth 3: %q %v", paths, err)
	}
	if l, err := hc.ListFiles(ctx, id, root, 1); err != nil || len(l) != 1 || l[0].Name != "a" {
		t.Fatalf("list depth 1: %+v %v", l, err)
	}
	to := filepath.Join(root, "g")
	fi, err = hc.RenameFile(ctx, id, filepath.Join(dir, "f"), to)
	if err != nil || fi.Size != 4 {
		t.Fatalf("rename: %+v %v", fi, err)
	}
	if _, err := hc.StatFile(ctx, id, filepath.Join(dir, "f")); !hostclient.IsNotFound(err) {
		t.Fatalf("stat of a renamed file: %v, want 404", err)
	}
	if err := hc.RemoveFile(ctx, id, filepath.Join(root, "a"), false); err == nil {
		t.Fatal("remove of a non-empty directory without recursive: no error")
	}
	var del map[string]string
	c.ok(200, "DELETE", "/v1/sandboxes/"+id+"/files?recursive=1&path="+url.QueryEscape(filepath.Join(root, "a")), nil, &del)
	if del["deleted"] != filepath.Join(root, "a") {
		t.Fatalf("delete answered %v", del)
	}
	if err := hc.RemoveFile(ctx, id, to, false); err != nil {
		t.Fatal(err)
	}
	if l, err := hc.ListFiles(ctx, id, root, 1); err != nil || l == nil || len(l) != 0 {
		t.Fatalf("list of an empty directory: %v %v, want []", l, err)
	}
}

// Watch streams the agent's events, "ready" first, as they come.
func TestFileWatch(t *testing.T) {
	_, _, hc, id := procSandbox(t)
	root := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	events := make(chan wire.WatchEvent, 16)
	done := make(chan error, 1)
	go func() {
		done <- hc.WatchFiles(ctx, id, root, true, func(ev wire.WatchEvent) bool {
			events <- ev
			return ev.Op == "ready" || !strings.HasSuffix(ev.Path, "/new")
		})
	}()
	if ev := <-events; ev.Op != "ready" {
		t.Fatalf("first event %+v, want ready", ev)
	}
	if _, err := hc.WriteFile(ctx, id, filepath.Join(root, "new"), strings.NewReader("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for ev := range events {
		if strings.HasSuffix(ev.Path, "/new") {
			if ev.Op != "create" && ev.Op != "write" {
				t.Fatalf("event %+v", ev)
			}
			break
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("watch: %v", err)
	}
	// A directory that is not there: the agent's 404, before any event.
	err := hc.WatchFiles(ctx, id, filepath.Join(root, "nope"), false, func(wire.WatchEvent) bool { return true })
	if !hostclient.IsNotFound(err) {
		t.Fatalf("watch of a missing directory: %v, want 404", err)
	}
}

// Bad paths and bounds are refused before the agent is asked; another
// tenant's sandbox is not found.
func TestFileOpsLimits(t *testing.T) {
	td, c, _, id := procSandbox(t)
	base := "/v1/sandboxes/" + id + "/files"
	for _, r := range []struct {
		method, path string
		body         any
	}{
		{"GET", base + "/list?path=rel", nil},
		{"GET", base + "/list?path=/&depth=0", nil},
		{"GET", base + "/list?path=/&depth=33", nil},
		{"GET", base + "/list?path=/&depth=x", nil},
		{"GET", base + "/stat?path=", nil},
		{"GET", base + "/stat?path=/a%00b", nil},
		{"POST", base + "/mkdir?path=/tmp/x&mode=8", nil},
		{"POST", base + "/mkdir?path=/tmp/x&mode=1777", nil},
		{"POST", base + "/mkdir?path=/tmp/x&parents=yes", nil},
		{"DELETE", base + "?path=x", nil},
		{"DELETE", base + "?path=/tmp/x&recursive=2", nil},
		{"POST", base + "/rename", map[string]string{"from": "/a", "to": "b"}},
		{"POST", base + "/rename", map[string]string{"from": "", "to": "/b"}},
		{"POST", base + "/rename", map[string]any{"from": "/a", "to": "/b", "x": 1}},
		{"GET", base + "/watch?path=x", nil},
	} {
		if st, b := c.do(r.method, r.path, r.body); st != 400 {
			t.Errorf("%s %s %v: %d %s, want 400", r.method, r.path, r.body, st, b)
		}
	}
	bob := td.client(t, "bob")
	for _, r := range []struct{ method, path string }{
		{"GET", base + "/list?path=/"}, {"GET", base + "/stat?path=/"}, {"POST", base + "/mkdir?path=/tmp/x"},
		{"DELETE", base + "?path=/tmp/x"}, {"POST", base + "/rename"}, {"GET", base + "/watch?path=/"},
	} {
		if st, b := bob.do(r.method, r.path, nil); st != 404 {
			t.Errorf("bob: %s %s: %d %s, want 404", r.method, r.path, st, b)
		}
	}
	var he *hostclient.Error
	hc, _ := hostclient.New(td.sock, "alice", "")
	if _, err := hc.StatFile(context.Background(), id, "/no/such/file"); !errors.As(err, &he) || he.Status != 404 || he.Code == "" {
		t.Fatalf("stat of a missing file: %v, want 404 with the agent's code", err)
	}
}
