//go:build linux

package agent

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/agentwire"
)

// testEtc writes a passwd and group file for the user tests.
func testEtc(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		"group":  "root:x:0:\nwarren-test:x:4242:nobody\nnogroup:x:65534:\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// statusIDs returns the Uid, Gid and Groups lines of a /proc/PID/status.
func statusIDs(status string) (uid, gid, groups string) {
	for _, l := range strings.Split(status, "\n") {
		k, v, _ := strings.Cut(l, ":")
		v = strings.Join(strings.Fields(v), " ")
		switch k {
		case "Uid":
			uid = v
		case "Gid":
			gid = v
		case "Groups":
			groups = v
		}
	}
	return
}

// TestExecUser runs processes as other users (the agent as root, as PID 1
// is): credentials, supplementary groups, HOME from passwd, the default
// user and working directory, and the request's user winning over it.
func TestExecUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root to change credentials")
	}
	etcDir := testEtc(t)
	path := "PATH=" + os.Getenv("PATH")
	c := startOpts(t, ProcessWaiter{}, Options{Env: []string{path}, EtcDir: etcDir, User: "nobody", Dir: "/"})
	run := func(req agentwire.ExecRequest) string {
		t.Helper()
		var out, errb bytes.Buffer
		code, err := c.Exec(ctxT(t), req, &out, &errb)
		if err != nil || code != 0 {
			t.Fatalf("%v: code %d, %v, stderr %q", req.Argv, code, err, errb.String())
		}
		return out.String()
	}
	// The default user: nobody, with its supplementary group.
	uid, gid, groups := statusIDs(run(agentwire.ExecRequest{Argv: []string{"cat", "/proc/self/status"}}))
	if uid != "65534 65534 65534 65534" || gid != "65534 65534 65534 65534" || groups != "4242" {
		t.Errorf("default user: Uid %q Gid %q Groups %q", uid, gid, groups)
	}
	if got := run(agentwire.ExecRequest{Argv: []string{"sh", "-c", `echo "$HOME $(pwd)"`}}); got != "/nonexistent /\n" {
		t.Errorf("HOME and cwd %q", got)
	}
	// uid:gid, not in passwd: no supplementary groups.
	uid, gid, groups = statusIDs(run(agentwire.ExecRequest{Argv: []string{"cat", "/proc/self/status"}, User: "4000:4001"}))
	if uid != "4000 4000 4000 4000" || gid != "4001 4001 4001 4001" || groups != "" {
		t.Errorf("4000:4001: Uid %q Gid %q Groups %q", uid, gid, groups)
	}
	// The host's "root" for admin work.
	uid, _, _ = statusIDs(run(agentwire.ExecRequest{Argv: []string{"cat", "/proc/self/status"}, User: "root"}))
	if uid != "0 0 0 0" {
		t.Errorf("root: Uid %q", uid)
	}
	if got := run(agentwire.ExecRequest{Argv: []string{"sh", "-c", "echo $HOME"}, User: "root"}); got != "/root\n" {
		t.Errorf("root's HOME %q", got)
	}
	// The request's env still wins over HOME from passwd.
	if got := run(agentwire.ExecRequest{Argv: []string{"sh", "-c", "echo $HOME"}, Env: []string{"HOME=/elsewhere"}}); got != "/elsewhere\n" {
		t.Errorf("request HOME %q", got)
	}
	// An unknown user is a clear error, and nothing runs.
	_, err := c.Exec(ctxT(t), agentwire.ExecRequest{Argv: []string{"true"}, User: "ghost"}, nil, nil)
	var e *agentwire.Error
	if !errors.As(err, &e) || e.Code != agentwire.CodeBadRequest || !strings.Contains(e.Message, `no user "ghost"`) {
		t.Errorf("unknown user: %v", err)
	}
}

// TestExecUserNoDefault: without a default user nothing changes (the
// agent's own credentials and environment), and a user can still be asked
// for.
func TestExecUserNoDefault(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root to change credentials")
	}
	c := startOpts(t, ProcessWaiter{}, Options{Env: []string{"PATH=" + os.Getenv("PATH"), "HOME=/"}, EtcDir: testEtc(t)})
	var out bytes.Buffer
	if _, err := c.Exec(ctxT(t), agentwire.ExecRequest{Argv: []string{"sh", "-c", "id -u; echo $HOME"}}, &out, nil); err != nil {
		t.Fatal(err)
	}
	if out.String() != "0\n/\n" {
		t.Errorf("no default user: %q", out.String())
	}
	out.Reset()
	if _, err := c.Exec(ctxT(t), agentwire.ExecRequest{Argv: []string{"sh", "-c", "id -u; echo $HOME"}, User: "65534", Cwd: "/"}, &out, nil); err != nil {
		t.Fatal(err)
	}
	if out.String() != "65534\n/\n" { // the base environment's HOME stays
		t.Errorf("user 65534: %q", out.String())
	}
}

// TestApplyIdentityHostFiles: a fork's new hostname reaches /etc/hostname
// and the 127.0.1.1 line of /etc/hosts where they exist (run in a UTS
// namespace of its own, since it sets the hostname).
func TestApplyIdentityHostFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root for a UTS namespace")
	}
	dir := t.TempDir()
	old := HostnameEtcDir
	HostnameEtcDir = dir
	defer func() { HostnameEtcDir = old }()
	os.WriteFile(filepath.Join(dir, "hostname"), []byte("template\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "hosts"), []byte("127.0.0.1\tlocalhost\n127.0.1.1\ttemplate\n::1\tlocalhost\n10.1.2.3\tdb\n"), 0o644)
	errc := make(chan error, 1)
	var name string
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWUTS); err != nil {
			errc <- err
			return
		}
		err := ApplyIdentity(&agentwire.Identity{Hostname: "fork-7"})
		name, _ = os.Hostname()
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if name != "fork-7" {
		t.Errorf("hostname %q", name)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "hostname")); string(b) != "fork-7\n" {
		t.Errorf("/etc/hostname %q", b)
	}
	want := "127.0.0.1\tlocalhost\n127.0.1.1\tfork-7\n::1\tlocalhost\n10.1.2.3\tdb\n"
	if b, _ := os.ReadFile(filepath.Join(dir, "hosts")); string(b) != want {
		t.Errorf("/etc/hosts %q, want %q", b, want)
	}
}
