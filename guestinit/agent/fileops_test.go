//go:build linux

package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/agentwire"
)

// mkTree makes files (ending in "/": directories) under dir.
func mkTree(t *testing.T, dir string, files ...string) {
	t.Helper()
	for _, f := range files {
		p := filepath.Join(dir, f)
		var err error
		if strings.HasSuffix(f, "/") {
			err = os.MkdirAll(p, 0o755)
		} else if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
			err = os.WriteFile(p, []byte(f), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestListDepth(t *testing.T) {
	c := start(t)
	dir := t.TempDir()
	mkTree(t, dir, "b/x/deep/far", "b/y", "a", "c/", "d/e/f/g/h")
	if err := os.Symlink(filepath.Join(dir, "b"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		depth int
		want  []string
	}{
		{1, []string{"a", "b/", "c/", "d/", "link"}},
		{3, []string{"a", "b/", "b/x/", "b/x/deep/", "b/y", "c/", "d/", "d/e/", "d/e/f/", "link"}},
		{agentwire.MaxListDepth, []string{"a", "b/", "b/x/", "b/x/deep/", "b/x/deep/far", "b/y", "c/", "d/", "d/e/", "d/e/f/", "d/e/f/g/", "d/e/f/g/h", "link"}},
	} {
		l, err := c.ListDepth(ctxT(t), dir, tc.depth)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, fi := range l {
			rel, err := filepath.Rel(dir, fi.Path)
			if err != nil || fi.Name != filepath.Base(fi.Path) {
				t.Fatalf("entry %+v", fi)
			}
			if fi.IsDir {
				rel += "/"
			}
			got = append(got, rel)
		}
		if strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("depth %d: %q, want %q", tc.depth, got, tc.want)
		}
	}
	// The old List is depth 1, now with paths.
	l, err := c.List(ctxT(t), dir)
	if err != nil || len(l) != 5 || l[4].Name != "link" || l[4].Link != filepath.Join(dir, "b") || l[0].Path != filepath.Join(dir, "a") {
		t.Fatalf("List: %+v, %v", l, err)
	}
	for _, depth := range []int{0, agentwire.MaxListDepth + 1} {
		_, err := c.ListDepth(ctxT(t), dir, depth)
		wantCode(t, asAgentError(err), agentwire.CodeBadRequest)
	}
	_, err = c.ListDepth(ctxT(t), filepath.Join(dir, "nope"), 2)
	wantCode(t, asAgentError(err), agentwire.CodeNotFound)
	_, err = c.ListDepth(ctxT(t), filepath.Join(dir, "a"), 2)
	wantCode(t, asAgentError(err), agentwire.CodeNotDirectory)
}

func TestListTreeBound(t *testing.T) {
	dir := t.TempDir()
	mkTree(t, dir, "a/b", "a/c", "d")
	if _, err := listTree(dir, 2, 4); err != nil {
		t.Fatal(err)
	}
	_, err := listTree(dir, 2, 3)
	if e := errorFrom(err); e.Code != agentwire.CodeBadRequest || !strings.Contains(e.Message, "too many entries") {
		t.Fatalf("err %v", err)
	}
}

func TestMkdirRenameRemove(t *testing.T) {
	c := start(t)
	dir := t.TempDir()
	ctx := ctxT(t)

	deep := filepath.Join(dir, "x/y/z")
	_, err := c.Mkdir(ctx, deep, 0o750, false)
	wantCode(t, asAgentError(err), agentwire.CodeNotFound)
	fi, err := c.Mkdir(ctx, deep, 0o750, true)
	if err != nil || !fi.IsDir || fi.Path != deep || fi.Mode.Perm() != 0o750 {
		t.Fatalf("Mkdir -p: %+v, %v", fi, err)
	}
	if _, err := c.Mkdir(ctx, deep, 0o700, true); err != nil { // exists: fine with parents
		t.Fatal(err)
	}
	_, err = c.Mkdir(ctx, deep, 0o700, false)
	wantCode(t, asAgentError(err), agentwire.CodeExists)
	mkTree(t, dir, "x/y/z/file")
	_, err = c.Mkdir(ctx, filepath.Join(deep, "file"), 0o700, true)
	wantCode(t, asAgentError(err), agentwire.CodeExists)
	_, err = c.Mkdir(ctx, "relative/path", 0o700, true)
	wantCode(t, asAgentError(err), agentwire.CodeBadRequest)

	to := filepath.Join(dir, "renamed")
	fi, err = c.Rename(ctx, filepath.Join(dir, "x"), to)
	if err != nil || !fi.IsDir || fi.Path != to || fi.Name != "renamed" {
		t.Fatalf("Rename: %+v, %v", fi, err)
	}
	if _, err := os.Stat(filepath.Join(to, "y/z/file")); err != nil {
		t.Fatal(err)
	}
	_, err = c.Rename(ctx, filepath.Join(dir, "x"), to)
	wantCode(t, asAgentError(err), agentwire.CodeNotFound)

	err = c.Remove(ctx, to, false)
	wantCode(t, asAgentError(err), agentwire.CodeExists) // not empty
	if err := c.Remove(ctx, filepath.Join(to, "y/z/file"), false); err != nil {
		t.Fatal(err)
	}
	mkTree(t, dir, "renamed/y/z/again", "renamed/q/")
	if err := os.Symlink(dir, filepath.Join(to, "y/up")); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(ctx, to, true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(to); !os.IsNotExist(err) {
		t.Fatalf("after recursive remove: %v", err)
	}
	if _, err := os.Stat(dir); err != nil { // the link was not followed
		t.Fatal(err)
	}
	wantCode(t, asAgentError(c.Remove(ctx, to, true)), agentwire.CodeNotFound)
	wantCode(t, asAgentError(c.Remove(ctx, "/", true)), agentwire.CodeBadRequest)
}

// watchEvents runs a watch of dir and sends its events on the channel
// returned; stop ends it and waits for Watch to return.
func watchEvents(t *testing.T, dir string, recursive bool) (<-chan agentwire.WatchEvent, func() error) {
	t.Helper()
	c := start(t)
	ctx, cancel := context.WithCancel(context.Background())
	evs := make(chan agentwire.WatchEvent, 1000)
	done := make(chan error, 1)
	go func() {
		done <- c.Watch(ctx, dir, recursive, func(ev agentwire.WatchEvent) bool { evs <- ev; return true })
	}()
	select {
	case ev := <-evs:
		if ev.Op != "ready" || ev.Path != dir {
			t.Fatalf("first event %+v", ev)
		}
	case err := <-done:
		t.Fatalf("Watch: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no ready event")
	}
	return evs, func() error { cancel(); return <-done }
}

// expectEvents reads events until each of want ("op path", path relative
// to dir) has been seen in that order (others may come between).
func expectEvents(t *testing.T, evs <-chan agentwire.WatchEvent, dir string, want ...string) {
	t.Helper()
	var seen []string
	timeout := time.After(10 * time.Second)
	for len(want) > 0 {
		select {
		case ev := <-evs:
			rel, _ := filepath.Rel(dir, ev.Path)
			s := ev.Op + " " + rel
			seen = append(seen, s)
			if s == want[0] {
				want = want[1:]
			}
		case <-timeout:
			t.Fatalf("still waiting for %q; saw %q", want, seen)
		}
	}
}

func TestWatchRecursive(t *testing.T) {
	dir := t.TempDir()
	mkTree(t, dir, "old/")
	evs, stop := watchEvents(t, dir, true)
	sub := filepath.Join(dir, "new/sub")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	expectEvents(t, evs, dir, "create new", "create new/sub")
	f := filepath.Join(sub, "f")
	if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f, []byte("more"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(f, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(f, filepath.Join(dir, "old/g")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "old/g")); err != nil {
		t.Fatal(err)
	}
	expectEvents(t, evs, dir, "create new/sub/f", "write new/sub/f", "chmod new/sub/f", "rename new/sub/f", "create old/g", "remove old/g")
	if err := os.RemoveAll(filepath.Join(dir, "new")); err != nil {
		t.Fatal(err)
	}
	expectEvents(t, evs, dir, "remove new/sub", "remove new")
	if err := stop(); err != context.Canceled {
		t.Fatalf("Watch after cancel: %v", err)
	}
	// The agent's handler ends too: its inotify instance is closed.
	for deadline := time.Now().Add(10 * time.Second); inotifyFDs(t) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d inotify instances open after the watch ended", inotifyFDs(t))
		}
	}
}

// inotifyFDs counts this process's open inotify instances.
func inotifyFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, de := range ents {
		if l, _ := os.Readlink("/proc/self/fd/" + de.Name()); l == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

func TestWatchFlatAndEnd(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "w")
	mkTree(t, dir, "sub/")
	evs, stop := watchEvents(t, dir, false)
	mkTree(t, dir, "sub/inner", "top")
	expectEvents(t, evs, dir, "create top")
	// Not recursive: nothing from sub/.
	for len(evs) > 0 {
		if ev := <-evs; strings.Contains(ev.Path, "inner") {
			t.Fatalf("event from a subdirectory: %+v", ev)
		}
	}
	// The directory removed: the stream ends.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	expectEvents(t, evs, dir, "remove .")
	if err := stop(); err != nil && err != context.Canceled {
		t.Fatalf("Watch: %v", err)
	}
}

func TestWatchErrors(t *testing.T) {
	c := start(t)
	dir := t.TempDir()
	mkTree(t, dir, "file")
	for _, tc := range []struct {
		path string
		code string
	}{
		{filepath.Join(dir, "nope"), agentwire.CodeNotFound},
		{filepath.Join(dir, "file"), agentwire.CodeNotDirectory},
		{"rel", agentwire.CodeBadRequest},
	} {
		err := c.Watch(ctxT(t), tc.path, true, func(agentwire.WatchEvent) bool { return true })
		wantCode(t, asAgentError(err), tc.code)
	}
}

func TestWatcherBound(t *testing.T) {
	dir := t.TempDir()
	mkTree(t, dir, "a/", "b/", "c/")
	if _, err := newWatcher(dir, true, 3); err == nil {
		t.Fatal("3 directories and the root watched with a bound of 3")
	}
	w, err := newWatcher(dir, true, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	if len(w.dirs) != 4 {
		t.Fatalf("%d watches", len(w.dirs))
	}
}
