package daemon

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmm/testguest"
	"github.com/warrenvm/warren/vmmctl"
)

// testDaemon is a Daemon served on a unix socket in a temp dir.
type testDaemon struct {
	*Daemon
	state string // the state directory
	sock  string
	audit *testguest.SyncBuffer
	done  chan struct{}
}

func startDaemon(t testing.TB, state string, l Launcher, mod ...func(*Config)) *testDaemon {
	t.Helper()
	cfg := Config{State: state, Launcher: l, CgroupRoot: "none", MonitorInterval: 100 * time.Millisecond,
		BootTimeout: 20 * time.Second, RestoreTimeout: 20 * time.Second,
		Log: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	for _, m := range mod {
		m(&cfg)
	}
	if cfg.GuestDir == "" {
		if _, fake := l.(*fakeLauncher); fake {
			// The fake VMMs' templates name fakeKernel's file.
			cfg.GuestDir = guestDir(t, nil)
		} else {
			// The real ones boot the build's files (e2ePaths' names).
			cfg.GuestDir = filepath.Join(repoRoot(t), "build")
		}
	}
	audit := &testguest.SyncBuffer{}
	cfg.Audit = audit
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(state, "hostd.sock")
	os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	td := &testDaemon{Daemon: d, state: state, sock: sock, audit: audit, done: make(chan struct{})}
	var spec conformance
	h := spec.wrap(t, d.Handler(HeaderAuth))
	go func() { d.ServeHandler(ln, h); close(td.done) }()
	t.Cleanup(func() {
		d.Close()
		spec.report(t)
	})
	return td
}

// aliceDaemon starts a test daemon with a fake launcher on a new state
// directory, and returns it, its launcher and tenant alice's client.
func aliceDaemon(t testing.TB, mod ...func(*Config)) (*testDaemon, *fakeLauncher, *client) {
	t.Helper()
	f := newFakeLauncher(t)
	td := startDaemon(t, t.TempDir(), f, mod...)
	return td, f, td.client(t, "alice")
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// client is an API client over the daemon's unix socket.
type client struct {
	t      testing.TB
	sock   string
	tenant string
	hc     *http.Client
}

func (td *testDaemon) client(t testing.TB, tenant string) *client {
	return newClient(t, td.sock, tenant)
}

func newClient(t testing.TB, sock, tenant string) *client {
	return &client{t: t, sock: sock, tenant: tenant, hc: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}}}
}

// do sends a request and returns the status and body.
func (c *client) do(method, path string, body any, hdr ...string) (int, []byte) {
	c.t.Helper()
	st, b, err := c.try(method, path, body, hdr...)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	return st, b
}

// try is do returning the transport's error instead of failing the test
// (for goroutines, and for requests to a daemon that is being killed).
func (c *client) try(method, path string, body any, hdr ...string) (int, []byte, error) {
	return c.tryContext(context.Background(), method, path, body, hdr...)
}

// tryContext is try bounded by ctx.
func (c *client) tryContext(ctx context.Context, method, path string, body any, hdr ...string) (int, []byte, error) {
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		r = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		r = bytes.NewReader(j)
	}
	req, _ := http.NewRequestWithContext(ctx, method, "http://hostd"+path, r)
	if c.tenant != "" {
		req.Header.Set(TenantHeader, c.tenant)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, b, err
}

// ok is do expecting status want, decoding the answer into out.
func (c *client) ok(want int, method, path string, body, out any) {
	c.t.Helper()
	st, b := c.do(method, path, body)
	if st != want {
		c.t.Fatalf("%s %s: status %d, want %d: %s", method, path, st, want, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			c.t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
}

func (c *client) template(kernel string) store.Template {
	var tp store.Template
	c.ok(201, "POST", "/v1/templates", map[string]any{"kernel": kernel, "mem_mib": 128, "cpus": 1}, &tp)
	if tp.Status != store.TemplateReady {
		c.t.Fatalf("template %+v", tp)
	}
	return tp
}

// create creates a sandbox of template tpl and checks that it runs.
func (c *client) create(tpl string) store.Sandbox {
	return c.createWith(map[string]any{"template": tpl})
}

// createWith creates a sandbox from req (POST /v1/sandboxes's body) and
// checks that it runs.
func (c *client) createWith(req map[string]any) store.Sandbox {
	c.t.Helper()
	var sb store.Sandbox
	c.ok(201, "POST", "/v1/sandboxes", req, &sb)
	if sb.Status != store.Running {
		c.t.Fatalf("sandbox %+v", sb)
	}
	return sb
}

// fork forks sandbox id into n children and checks that the answer
// names n (failed ones included).
func (c *client) fork(id string, n int) wire.ForkResult {
	c.t.Helper()
	var fr wire.ForkResult
	c.ok(201, "POST", "/v1/sandboxes/"+id+"/fork", map[string]any{"n": n}, &fr)
	if len(fr.Children) != n {
		c.t.Fatalf("fork of %s: %+v", id, fr)
	}
	return fr
}

// suspendResume pauses sandbox id to disk and resumes it, and returns
// its record with the new VMM.
func (c *client) suspendResume(id string) store.Sandbox {
	c.t.Helper()
	var sb store.Sandbox
	c.ok(200, "POST", "/v1/sandboxes/"+id+"/pause?to_disk=true", nil, nil)
	c.ok(200, "POST", "/v1/sandboxes/"+id+"/resume", nil, &sb)
	return sb
}

func (c *client) get(id string) store.Sandbox {
	var sb store.Sandbox
	c.ok(200, "GET", "/v1/sandboxes/"+id, nil, &sb)
	return sb
}

// exec runs argv and returns stdout, stderr and the exit code.
func (c *client) exec(id string, argv ...string) (string, string, int) {
	c.t.Helper()
	out, errOut, code, err := c.tryExec(id, argv...)
	if err != nil {
		c.t.Fatal(err)
	}
	return out, errOut, code
}

// tryExec is exec returning an error instead of failing the test.
func (c *client) tryExec(id string, argv ...string) (string, string, int, error) {
	// The tests' commands take seconds; one that has not answered in
	// execLimit hung in the guest (an agent or device that stopped
	// answering): a failure to report, not a test to wait out until the
	// package's timeout.
	ctx, cancel := context.WithTimeout(context.Background(), execLimit)
	defer cancel()
	st, b, err := c.tryContext(ctx, "POST", "/v1/sandboxes/"+id+"/exec", map[string]any{"argv": argv})
	if err != nil {
		return "", "", -1, fmt.Errorf("exec %v in %s: %w%s%s", argv, id, err, c.vmmTails(id), c.describeGuest(id))
	}
	if st != 200 {
		return "", "", -1, fmt.Errorf("exec %v in %s: %d %s", argv, id, st, b)
	}
	out, errOut, code, err := parseExec(b)
	if err != nil {
		return "", "", -1, fmt.Errorf("exec in %s: %w", id, err)
	}
	return out, errOut, code, nil
}

// record reads sandbox id's record from the daemon's state directory (the
// one holding the client's socket) and returns it and the sandbox's
// directory; ok is false when there is none (or it is sealed).
func (c *client) record(id string) (rec store.Sandbox, dir string, ok bool) {
	recs, _ := filepath.Glob(filepath.Join(filepath.Dir(c.sock), "tenants", "*", "sandboxes", id, "sandbox.json"))
	if len(recs) == 0 {
		return rec, "", false
	}
	b, err := os.ReadFile(recs[0])
	if err != nil || json.Unmarshal(b, &rec) != nil {
		return rec, "", false
	}
	return rec, filepath.Dir(recs[0]), true
}

// vmmTails returns the ends of sandbox id's VMM log and console, read
// through its record in the daemon's state directory (the one holding the
// client's socket), for a failure's message: what the VMM and the guest
// said last. "" when there is no such record.
func (c *client) vmmTails(id string) string {
	rec, _, ok := c.record(id)
	if !ok {
		return ""
	}
	var out strings.Builder
	for _, f := range []struct{ what, path string }{{"VMM log", rec.Log}, {"console", rec.Console}} {
		b, err := os.ReadFile(f.path)
		if err != nil {
			continue
		}
		if len(b) > 3000 {
			b = b[len(b)-3000:]
		}
		fmt.Fprintf(&out, "\n--- %s's %s (end) ---\n%s", id, f.what, b)
	}
	return out.String()
}

// describeGuest describes sandbox id's guest for a failure's message
// (vmmctl's DescribeGuest through its VMM's control socket, into a
// directory of the sandbox's given to the VMM's uid, removed after): its
// vCPUs, irqchip and virtqueues, where a hung guest or device shows. ""
// when there is no record or VMM.
func (c *client) describeGuest(id string) string {
	rec, sbDir, ok := c.record(id)
	if !ok || rec.API == "" || rec.PID == 0 {
		return ""
	}
	dir := filepath.Join(sbDir, "describe")
	os.RemoveAll(dir)
	defer os.RemoveAll(dir)
	var st syscall.Stat_t
	if os.Mkdir(dir, 0o700) != nil || syscall.Stat(fmt.Sprintf("/proc/%d", rec.PID), &st) != nil || os.Chown(dir, int(st.Uid), int(st.Gid)) != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := (vmmctl.Client{Socket: rec.API}).DescribeGuest(ctx, dir)
	if err != nil && strings.Contains(err.Error(), vmm.ErrPagingOutsideRAM.Error()) {
		// The nested host's emulator leaked L1's state into the vCPU
		// (.ci/kvmhost/README.md); the VMM's log above has its registers.
		return fmt.Sprintf("\n--- %s's guest: L2 vCPU holds the emulated host's state: %v", id, err)
	}
	if err != nil {
		return fmt.Sprintf("\n--- %s's guest: %v", id, err)
	}
	return fmt.Sprintf("\n--- %s's guest (a snapshot of it) ---\n%s", id, d)
}

// execLimit bounds one exec of the tests (tryExec).
const execLimit = 4 * time.Minute

// parseExec reads an exec answer's NDJSON frames: stdout, stderr and the
// exit code (-1 without one); an error frame is an error.
func parseExec(b []byte) (string, string, int, error) {
	var out, errb strings.Builder
	code := -1
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var f wire.ExecFrame
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			return "", "", -1, fmt.Errorf("frame %q: %v", sc.Text(), err)
		}
		out.Write(f.Stdout)
		errb.Write(f.Stderr)
		if f.Exit != nil {
			code = *f.Exit
		}
		if f.Error != "" {
			return "", "", -1, fmt.Errorf("error frame: %s", f.Error)
		}
	}
	return out.String(), errb.String(), code, nil
}

// fakeKernel is the name of the kernel file in every fake-launcher test
// daemon's guest directory (guestDir).
func fakeKernel(t testing.TB) string { return "vmlinux" }

// guestDir makes a guest directory for a test daemon: a fake kernel,
// "vmlinux", and files with the given names and contents (a value that
// starts with '@' is a file to hard-link, or copy, from that path).
func guestDir(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "guest")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	all := map[string]string{"vmlinux": "not a kernel"}
	for k, v := range files {
		all[k] = v
	}
	for name, v := range all {
		p := filepath.Join(dir, name)
		if src, ok := strings.CutPrefix(v, "@"); ok {
			if err := os.Link(src, p); err == nil {
				continue
			}
			b, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			v = string(b)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

type osCmd = exec.Cmd

func newCmd(name string, args ...string) *exec.Cmd { return exec.Command(name, args...) }

func sprintf(format string, a ...any) string { return fmt.Sprintf(format, a...) }

// settleDiskGC waits until no sweep of tenant's disk layers runs
// (collectDisksLater: one started by a request has begun before its
// answer).
func (td *testDaemon) settleDiskGC(t testing.TB, tenant string) {
	t.Helper()
	g := &td.disks.gc
	kvmtest.WaitFor(t, 3*time.Minute, "the disk sweep of "+tenant, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return !g.running[tenant]
	})
}
