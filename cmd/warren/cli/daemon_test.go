package cli

import (
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// The shared verbs run the VM-level code for every form the VM-level tests
// use (socket paths), and go to the daemon for sandbox ids and names.
func TestRouting(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "x")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	wd, _ := os.Getwd()
	os.Chdir(dir)
	defer os.Chdir(wd)
	cases := []struct {
		args []string
		vm   bool
	}{
		{[]string{"exec", "/run/box.vsock", "--", "true"}, true},
		{[]string{"exec", "--timeout", "2m", "--env", "A=B", "-i", "box.vsock", "--", "true"}, true},
		{[]string{"exec", "x", "--", "true"}, true}, // an existing socket
		{[]string{"exec", "sb-0123456789ab", "--", "true"}, false},
		{[]string{"exec", "--timeout", "2m", "mybox", "--", "true"}, false},
		{[]string{"exec", "-d", "-t", "mybox", "--", "true"}, false},
		{[]string{"exec", "--user", "u", "-i", "sb-0123456789ab", "--", "true"}, false},
		{[]string{"exec", "-i", "box.vsock", "--", "true"}, true},
		{[]string{"ps", "box"}, false},
		{[]string{"files", "ls", "box", "/"}, false},
		{[]string{"cp", "a", "b"}, true},
		{[]string{"cp", "/v.sock:/etc/hosts", "out"}, true},
		{[]string{"cp", "sb-0123456789ab:/etc/hosts", "out"}, false},
		{[]string{"cp", "in", "box:/tmp/"}, false},
		{[]string{"pause", "api.sock"}, true},
		{[]string{"pause", "--to-disk", "sb-0123456789ab"}, false},
		{[]string{"resume", "/d/api"}, true},
		{[]string{"resume", "box"}, false},
		{[]string{"snapshot", "api.sock"}, true},
		{[]string{"snapshot", "--incremental", "--every", "1s", "--count", "3", "/d/api", "/d/s"}, true},
		{[]string{"snapshot", "sandbox", "name"}, true}, // the old shape: API DIR/NAME
		{[]string{"snapshot", "--every", "60s", "--keep", "4", "box"}, false},
		{[]string{"fork", "-n", "2", "--prefix", "/d/k", "/d/api"}, true},
		{[]string{"fork", "--netns", "--egress", "p.json", "/d/api"}, true},
		{[]string{"fork", "-n", "2", "box"}, false},
		{[]string{"rollback", "/d/api", "/d/snap"}, true},
		{[]string{"rollback", "box", "/d/snap"}, true},
		{[]string{"rollback", "box", "snap-1"}, false},
		{[]string{"health", "box"}, true},
		{[]string{"run", "--kernel", "k"}, true},
		{[]string{"ls"}, false},
		{[]string{"templates", "create", "--kernel", "k"}, false},
		{[]string{"templates", "create", "--network", "--kernel", "k"}, false},
		{[]string{"egress", "/d/api"}, true},
		{[]string{"egress", "--policy", "p.json", "api.sock"}, true},
		{[]string{"egress", "--policy", "p.json", "box"}, false},
		{[]string{"secrets", "set", "NAME", "-"}, false},
		{[]string{"keys", "revoke", "--yes"}, false},
	}
	for _, c := range cases {
		_, ok := routeOnly(c.args)
		if ok == c.vm {
			t.Errorf("warren %s: VM-level %v, want %v", strings.Join(c.args, " "), !ok, c.vm)
		}
	}
	if got := positionals([]string{"-n", "2", "--json", "--x=y", "a", "b", "--", "c"}); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Errorf("positionals: %q", got)
	}
}

// routeOnly reports whether daemonMain would take args, without running them.
func routeOnly(args []string) (string, bool) {
	_, ok := (&app{routeOnly: true}).daemonMain(args)
	return "", ok
}

// The daemon verbs against a stand-in daemon.
func TestDaemonVerbs(t *testing.T) {
	stub := stubDaemon(t)
	run := func(want int, args ...string) (string, string) { t.Helper(); return expect(t, want, "", args...) }
	if _, errOut := run(1, "create"); !strings.Contains(errOut, "0 ready templates") {
		t.Errorf("create without templates: %q", errOut)
	}
	// A host path is refused: the daemon takes names of its guest directory.
	if _, errOut := run(1, "templates", "create", "--kernel", "build/vmlinux"); !strings.Contains(errOut, "host path") {
		t.Errorf("templates create with a host path: %q", errOut)
	}
	tpl, progress := run(0, "templates", "create", "--kernel", "vmlinux", "--mem", "256")
	tpl = strings.TrimSpace(tpl)
	if !strings.HasPrefix(tpl, "tp-") || !strings.Contains(progress, "template: [ 25%] booting the guest\n") {
		t.Fatalf("templates create: %q, progress %q", tpl, progress)
	}
	if out, _ := run(0, "templates"); !strings.Contains(out, tpl) || !strings.Contains(out, "vmlinux") {
		t.Errorf("templates: %q", out)
	}
	sb, _ := run(0, "create", "--name", "box", "--env", "A=1") // the only template
	sb = strings.TrimSpace(sb)
	if out, errOut := run(3, "exec", "box", "--", "exit", "3"); out != "exit 3\n" || errOut != "err\n" {
		t.Errorf("exec: %q %q", out, errOut)
	}
	run(127, "exec", sb, "--", "no-such-program")
	run(125, "exec", "nobox", "--", "true")
	run(2, "exec", sb, "true")
	host := filepath.Join(t.TempDir(), "f")
	os.WriteFile(host, []byte("data"), 0o600)
	run(0, "cp", host, "box:/tmp/")
	back := filepath.Join(t.TempDir(), "g")
	run(0, "cp", sb+":/tmp/f", back)
	if b, err := os.ReadFile(back); err != nil || string(b) != "data" {
		t.Errorf("cp back: %q %v", b, err)
	}
	if fi, err := os.Stat(back); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("cp back: mode %v %v", fi.Mode(), err)
	}
	if out, _ := run(0, "pause", "box"); out != sb+" paused\n" {
		t.Errorf("pause: %q", out)
	}
	run(125, "exec", "box", "--", "true")
	run(0, "resume", "box")
	if out, errOut := run(0, "pause", "--to-disk", "box"); out != sb+" suspended\n" || !strings.Contains(errOut, "snapshotting") {
		t.Errorf("pause --to-disk: %q %q", out, errOut)
	}
	run(0, "resume", sb)
	if out, _ := run(0, "snapshot", "--name", "s1", "box"); out != "s1\n" {
		t.Errorf("snapshot: %q", out)
	}
	if out, _ := run(0, "snapshot", "--every", "60s", "box"); !strings.Contains(out, "every 1m0s") {
		t.Errorf("rolling: %q", out)
	}
	if out, _ := run(0, "snapshot", "--list", "box"); !strings.Contains(out, "s1") {
		t.Errorf("snapshot --list: %q", out)
	}
	if out, _ := run(0, "rollback", "box", "s1"); out != "rolled back to s1\n" {
		t.Errorf("rollback: %q", out)
	}
	run(1, "rollback", "box", "s2")
	out, _ := run(0, "fork", "-n", "2", "box")
	kids := strings.Fields(out)
	if len(kids) != 2 {
		t.Fatalf("fork: %q", out)
	}
	if out, _ := run(0, "ls"); strings.Count(out, "\nsb-") != 3 || !strings.Contains(out, "box") {
		t.Errorf("ls: %q", out)
	}
	if out, _ := run(0, "ls", "--json"); !strings.Contains(out, `"parent": "`+sb) {
		t.Errorf("ls --json: %q", out)
	}
	if out, _ := run(0, "events"); !strings.Contains(out, "paused") {
		t.Errorf("events: %q", out)
	}
	if out, _ := run(0, "--tenant", "x", "ls"); strings.Contains(out, "sb-") {
		t.Errorf("tenant x sees: %q", out)
	}
	if out, _ := run(0, "--host="+stub.Socket, "--json", "ls"); !strings.Contains(out, `"id": "`+sb) {
		t.Errorf("leading --host, --json: %q", out)
	}
	run(2, "--tenant", "x", "run")
	if out, _ := run(0, "ls", "--tenant", "other"); strings.Contains(out, "sb-") {
		t.Errorf("another tenant sees: %q", out)
	}
	run(0, "rm", sb, kids[0], kids[1])
	run(0, "templates", "rm", tpl)
	if out, _ := run(0, "ls"); strings.Contains(out, "sb-") {
		t.Errorf("ls after rm: %q", out)
	}
	run(2, "vm")
	if _, errOut := run(2, "vm", "pause"); !strings.Contains(errOut, "usage: warren pause API") {
		t.Errorf("vm pause: %q", errOut)
	}
}

// The network verbs and flags against a stand-in daemon: secrets (values
// from a file or stdin only), create --egress --secret, egress.
func TestDaemonNetworkVerbs(t *testing.T) {
	stub := stubDaemon(t)
	run := func(want int, stdin string, args ...string) string {
		t.Helper()
		out, _ := expect(t, want, stdin, args...)
		return out
	}
	dir := t.TempDir()
	valFile := filepath.Join(dir, "val")
	os.WriteFile(valFile, []byte("from-file\n"), 0o600)
	run(0, "", "secrets", "set", "A", valFile)
	run(0, "from-stdin\n", "secrets", "set", "B")
	run(0, "dash", "secrets", "set", "C", "-")
	run(2, "", "secrets", "set")
	run(2, "", "secrets", "set", "A", "value-on-argv", "extra")
	for name, want := range map[string]string{"A": "from-file", "B": "from-stdin", "C": "dash"} {
		if v, _ := stub.Secret("demo", name); v != want {
			t.Errorf("secret %s = %q, want %q", name, v, want)
		}
	}
	if out := run(0, "", "secrets"); out != "A\nB\nC\n" {
		t.Errorf("secrets: %q", out)
	}
	if out := run(0, "", "secrets", "ls", "--json"); strings.Contains(out, "from-") || !strings.Contains(out, `"names"`) {
		t.Errorf("secrets ls --json: %q", out)
	}
	run(0, "", "secrets", "rm", "C")
	run(1, "", "secrets", "rm", "C")
	if out := run(0, "", "--tenant", "other", "secrets"); out != "" {
		t.Errorf("another tenant's secrets: %q", out)
	}

	tpl := strings.TrimSpace(run(0, "", "templates", "create", "--network", "--kernel", "vmlinux"))
	pol := filepath.Join(dir, "p.json")
	os.WriteFile(pol, []byte(`{"credentials":[{"secret":"A","hosts":["x.example.com"]}]}`), 0o600)
	sb := strings.TrimSpace(run(0, "", "create", "--template", tpl, "--name", "net", "--egress", pol, "--secret", "A", "--secret", "B"))
	out := run(0, "", "ls", "--json")
	if !strings.Contains(out, `"network": true`) || !strings.Contains(out, `"secrets": [`) || !strings.Contains(out, `"x.example.com"`) {
		t.Errorf("the sandbox: %s", out)
	}
	if out := run(0, "", "egress", "net"); !strings.Contains(out, `"x.example.com"`) || !strings.Contains(out, `"stats"`) {
		t.Errorf("egress: %q", out)
	}
	os.WriteFile(pol, []byte(`{"rules":[{"cidr":"192.0.2.0/24"}]}`), 0o600)
	if out := run(0, "", "egress", "--policy", pol, sb); !strings.Contains(out, "192.0.2.0/24") {
		t.Errorf("egress --policy: %q", out)
	}
	// A policy the daemon refuses (here: a sandbox without a network)
	// fails the command, not just prints nothing.
	plainTpl := strings.TrimSpace(run(0, "", "templates", "create", "--kernel", "vmlinux"))
	plain := strings.TrimSpace(run(0, "", "create", "--template", plainTpl))
	if out := run(1, "", "egress", "--policy", pol, plain); out != "" {
		t.Errorf("a refused egress --policy printed %q", out)
	}
	os.WriteFile(pol, []byte(`not json`), 0o600)
	run(1, "", "egress", "--policy", pol, sb)
	run(1, "", "create", "--template", tpl, "--secret", "NOPE")
	run(2, "", "egress")
}

// warren keys against a stand-in daemon: show, create, revoke (only with
// --yes), per tenant.
func TestDaemonKeys(t *testing.T) {
	stubDaemon(t)
	run := func(want int, args ...string) (string, string) { t.Helper(); return expect(t, want, "", args...) }
	if _, errOut := run(1, "keys"); !strings.Contains(errOut, "no encryption key") {
		t.Errorf("keys before create: %q", errOut)
	}
	id, _ := run(0, "keys", "create")
	if !strings.HasPrefix(id, "wk1-") {
		t.Fatalf("keys create: %q", id)
	}
	if out, _ := run(0, "keys"); out != id {
		t.Errorf("keys: %q, want %q", out, id)
	}
	if out, _ := run(0, "keys", "show", "--json"); !strings.Contains(out, `"key_id"`) || !strings.Contains(out, `"tenant": "demo"`) {
		t.Errorf("keys show --json: %q", out)
	}
	run(1, "keys", "create")
	run(1, "--tenant", "other", "keys")
	tpl, _ := run(0, "templates", "create", "--kernel", "vmlinux")
	sb, _ := run(0, "create", "--template", strings.TrimSpace(tpl))
	sb = strings.TrimSpace(sb)
	if _, errOut := run(2, "keys", "revoke"); !strings.Contains(errOut, "--yes") {
		t.Errorf("keys revoke without --yes: %q", errOut)
	}
	if out, _ := run(0, "keys"); out != id {
		t.Errorf("a revoke without --yes revoked: %q", out)
	}
	if out, _ := run(0, "keys", "revoke", "--yes"); out != "revoked; sandboxes stopped: 1 "+sb+"\n" {
		t.Errorf("keys revoke --yes: %q", out)
	}
	if out, _ := run(0, "keys"); out != "revoked\n" {
		t.Errorf("keys after revoke: %q", out)
	}
	run(2, "keys", "rotate")
	run(2, "keys", "show", "extra")
}
