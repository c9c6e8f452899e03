package agentclient_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/agentclient/agentstub"
	"github.com/warrenvm/warren/agentwire"
)

// fileAgent is an agent with a file API over an in-memory guest: /dir is
// a directory, every other path a file.
type fileAgent struct {
	mu    sync.Mutex
	files map[string][]byte
	modes map[string]fs.FileMode
}

func (a *fileAgent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := r.URL.Query().Get("path")
	notFound := func() {
		w.WriteHeader(http.StatusNotFound)
		json.NewEncoder(w).Encode(agentwire.Error{Message: p + ": no such file", Code: agentwire.CodeNotFound})
	}
	switch {
	case r.URL.Path == "/stat" && p == "/dir":
		json.NewEncoder(w).Encode(agentwire.FileInfo{Name: "dir", IsDir: true, Mode: fs.ModeDir | 0o755})
	case r.URL.Path == "/stat" && a.files[p] != nil:
		json.NewEncoder(w).Encode(agentwire.FileInfo{Name: filepath.Base(p), Size: int64(len(a.files[p])), Mode: a.modes[p]})
	case r.URL.Path == "/stat":
		notFound()
	case r.URL.Path == "/files" && r.Method == http.MethodPut:
		b, _ := io.ReadAll(r.Body)
		m, _ := strconv.ParseUint(r.URL.Query().Get("mode"), 8, 32)
		a.files[p], a.modes[p] = append([]byte{}, b...), fs.FileMode(m)
		json.NewEncoder(w).Encode(agentwire.FileInfo{Name: filepath.Base(p), Size: int64(len(b)), Mode: fs.FileMode(m)})
	case r.URL.Path == "/files" && a.files[p] != nil:
		w.Header().Set(agentwire.ModeHeader, strconv.FormatUint(uint64(a.modes[p]), 8))
		w.Write(a.files[p])
	default:
		notFound()
	}
}

func TestCopy(t *testing.T) {
	agent := &fileAgent{files: map[string][]byte{}, modes: map[string]fs.FileMode{}}
	vm := agentstub.StartHandler(t, agent).Path
	ctx := context.Background()
	dir := t.TempDir()
	host := filepath.Join(dir, "script.sh")
	if err := os.WriteFile(host, []byte("echo hi\n"), 0o750); err != nil {
		t.Fatal(err)
	}

	// In: a file keeps its mode; into a directory its base name; stdin is 0644.
	if err := agentclient.Copy(ctx, host, vm+":/a", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := agentclient.Copy(ctx, host, vm+":/dir", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := agentclient.Copy(ctx, "-", vm+":/in", strings.NewReader("from stdin"), nil); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]struct {
		data string
		mode fs.FileMode
	}{"/a": {"echo hi\n", 0o750}, "/dir/script.sh": {"echo hi\n", 0o750}, "/in": {"from stdin", 0o644}} {
		if got := string(agent.files[p]); got != want.data || agent.modes[p] != want.mode {
			t.Errorf("guest %s: %q mode %v, want %q %v", p, got, agent.modes[p], want.data, want.mode)
		}
	}

	// Out: to a file (its mode), into a directory (the base name), to stdout.
	out := filepath.Join(dir, "out")
	if err := agentclient.Copy(ctx, vm+":/a", out, nil, nil); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "echo hi\n" {
		t.Errorf("copied out: %q %v", b, err)
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("copied out: mode %v %v", fi.Mode(), err)
	}
	if err := agentclient.Copy(ctx, vm+":/in", dir, nil, nil); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "in")); err != nil || string(b) != "from stdin" {
		t.Errorf("copied into a directory: %q %v", b, err)
	}
	var stdout bytes.Buffer
	if err := agentclient.Copy(ctx, vm+":/a", "-", nil, &stdout); err != nil || stdout.String() != "echo hi\n" {
		t.Errorf("copied to stdout: %q %v", stdout.String(), err)
	}

	// A failed copy out leaves the host file as it was, and no temporary file.
	if err := agentclient.Copy(ctx, vm+":/missing", out, nil, nil); err == nil {
		t.Error("copied a missing guest file")
	}
	if b, _ := os.ReadFile(out); string(b) != "echo hi\n" {
		t.Errorf("a failed copy changed the host file: %q", b)
	}
	if l, _ := os.ReadDir(dir); len(l) != 3 {
		t.Errorf("host directory after a failed copy: %v", l)
	}

	for _, tc := range []struct{ src, dst, want string }{
		{"a", "b", "exactly one of a and b must be VM:/guest/path"},
		{vm + ":/a", vm + ":/b", "exactly one of"},
		{":/a", "b", "empty VM socket path"},
		{"a", "", "empty path"},
		{dir, vm + ":/x", "is a directory; warren cp copies files"},
		{filepath.Join(dir, "nope"), vm + ":/x", "no such file"},
	} {
		if err := agentclient.Copy(ctx, tc.src, tc.dst, nil, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Copy(%q, %q): %v, want %q", tc.src, tc.dst, err, tc.want)
		}
	}
}
