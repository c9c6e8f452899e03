package vmmproc

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmm/hostprofile"
	"github.com/warrenvm/warren/vmmproc/jail/jailtest"
)

// The Linux template: the project's kernel and initramfs booted once per
// test binary (virtio-rng, vsock and an ext4 data disk at /mnt/data, a
// copy of $WARREN_TESTDISK; dirty tracking on, agent answering),
// snapshotted (which freezes the disk: the snapshot's layer), and stopped.
// Each restore gets its own overlay over the template's disk layer. End-to-end tests that need a running Linux
// guest with its agent restore it instead of booting (a boot takes about a
// minute on a PVM host); tests about booting itself, and those needing
// other devices (disk, tap), still boot.
var template struct {
	once sync.Once
	dir  string // removed by TestMain
	path string // DIR/NAME of the snapshot
	err  error
}

func TestMain(m *testing.M) {
	// A fork's children are this binary run as `warren fork-child`.
	// So are the VMMs of tests that need one per process
	// (cliProcess).
	if len(os.Args) > 1 && (os.Args[1] == "fork-child" || os.Getenv(cliProcessEnv) == "1") {
		os.Exit(cliMain(os.Args[1:], nil, os.Stdout, os.Stderr))
	}
	code := m.Run()
	jailtest.Remove()
	if template.dir != "" {
		os.RemoveAll(template.dir)
	}
	os.Exit(code)
}

// linuxTemplate returns the template snapshot, making it on first use.
// The test that makes it fails if the boot or snapshot fails; later ones
// skip with the reason.
func linuxTemplate(t *testing.T) string {
	t.Helper()
	kvmtest.Require(t)
	made := false
	template.once.Do(func() {
		made = true
		template.dir, template.err = os.MkdirTemp("", "warren-template-")
		if template.err != nil {
			return
		}
		sock := filepath.Join(template.dir, "template.sock")
		api := filepath.Join(template.dir, "template.api")
		data := testDiskAt(t, filepath.Join(template.dir, "data.img"))
		o := vmOptions{rng: true, vsock: sock, cid: 3, trackDirty: true, memMiB: 256, cpus: 1,
			cmdline: "warren.hostname=template", disks: []diskSpec{{path: data}}}
		g := bootGuest(t, o)
		defer g.vm.Stop(nil)
		stopAPI, err := startAPI(api, &built{vm: g.vm, devs: g.dev}, o, NewLogger(os.Stderr, false), "", "")
		if err != nil {
			template.err = err
			return
		}
		defer stopAPI()
		if code, out, errOut := cli(t, nil, "health", "--wait", "3m", sock); code != 0 {
			t.Fatalf("template: the agent did not answer: %s%s", out, errOut)
		}
		template.path = filepath.Join(template.dir, "linux")
		if code, out, errOut := cli(t, nil, "snapshot", api, template.path); code != 0 {
			t.Fatalf("template: snapshot: exit %d: %s%s", code, out, errOut)
		}
	})
	if template.path == "" && !made {
		t.Skipf("skipped: making the Linux template failed in an earlier test (%v)", template.err)
	}
	if template.err != nil {
		t.Fatal(template.err)
	}
	return template.path
}

// restoreOptions loads the snapshot at path, checked against this host,
// and returns the options of a VM restored from it (o.restore, which the
// caller closes) with dirty tracking, so it can be snapshotted again.
func restoreOptions(t *testing.T, path string) vmOptions {
	t.Helper()
	snap, err := vmsnap.Load(path, vmsnap.HostFingerprintSource("/dev/kvm", hostprofile.Detect("/sys/module")))
	if err != nil {
		t.Fatal(err)
	}
	o := vmOptions{restore: snap, trackDirty: true}
	if err := applyOptions(&o, snap.Meta.Options); err != nil {
		snap.Close()
		t.Fatal(err)
	}
	return o
}

// restoreTemplate restores the Linux template in this process, with its
// vsock device on sock (and dirty tracking, so the guest can be
// snapshotted again). The guest is stopped when the test ends.
func restoreTemplate(t *testing.T, sock string) *guest {
	t.Helper()
	path := linuxTemplate(t)
	o := restoreOptions(t, path)
	snap := o.restore
	defer snap.Close()
	if _, err := restoreDisks(&o, snap, nil); err != nil {
		t.Fatal(err)
	}
	o.vsock = sock
	g, err := startGuest(t, o)
	if err != nil {
		t.Fatal(err)
	}
	g.snapLayer, g.snapName, g.opts = snap.Layer(), snap.Name(), o
	return g
}

// templateWithAPI restores the Linux template in this process with its
// vsock socket (sock) and control API (api) in a fresh directory dir, and
// returns once the guest's agent answers (warren health --wait); the API
// stops when the test ends.
func templateWithAPI(t *testing.T) (g *guest, dir, sock, api string) {
	t.Helper()
	dir = t.TempDir()
	sock, api = filepath.Join(dir, "vm.sock"), filepath.Join(dir, "api.sock")
	g = restoreTemplate(t, sock)
	o := g.opts
	o.restore = nil
	stopAPI, err := startAPI(api, &built{vm: g.vm, devs: g.dev}, o, NewLogger(os.Stderr, false), g.snapLayer, g.snapName)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopAPI)
	mustRun(t, "health", "--wait", "3m", sock)
	return g, dir, sock, api
}

// mustRun runs the warren command with args in this process and returns
// its stdout; a non-zero exit fails the test.
func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	code, out, errOut := cli(t, nil, args...)
	if code != 0 {
		t.Fatalf("warren %s: exit %d: %s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}
