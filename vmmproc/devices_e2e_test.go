package vmmproc

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/guestinit"
	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/vmmctl"
)

// testDisk returns a fresh copy of an empty ext4 image: the template from
// $WARREN_TESTDISK (made by `make testdisk`; the nested KVM host has no
// mkfs), or one made here with guestinit/mkdisk.sh.
func testDisk(t *testing.T) string {
	t.Helper()
	return testDiskAt(t, filepath.Join(t.TempDir(), "data.img"))
}

// testDiskAt is testDisk writing the copy to dst.
func testDiskAt(t *testing.T, dst string) string {
	t.Helper()
	src := os.Getenv("WARREN_TESTDISK")
	if src == "" {
		_, file, _, _ := runtime.Caller(0)
		src = filepath.Join(t.TempDir(), "template.img")
		script := filepath.Join(filepath.Dir(file), "..", "guestinit", "mkdisk.sh")
		if out, err := exec.Command("bash", script, src, "16").CombinedOutput(); err != nil {
			t.Fatalf("mkdisk.sh: %v\n%s", err, out)
		}
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}

// inNewNetns runs fn on an OS thread moved into a new network namespace.
// Sockets and taps fn creates stay in that namespace and can be used from
// any goroutine afterwards. The thread is discarded when fn returns.
func inNewNetns(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare(CLONE_NEWNET): %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// TestDevicesEndToEnd boots one guest with a data disk, a tap in a network
// namespace this test creates, and virtio-rng, and checks all three: the
// guest's CRNG is ready before its init (RDRAND is not trusted here, so the
// entropy came from virtio-rng), it fetches a file over HTTP from a server in
// the namespace through the tap, and a file it writes to the data disk is in
// the image on the host after it powers off.
func TestDevicesEndToEnd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root for the tap and the network namespace")
	}
	kvmtest.Require(t)
	disk := testDisk(t)
	token := make([]byte, 12)
	rand.Read(token)
	secret := "warren-e2e-" + hex.EncodeToString(token)
	page := "hello from the host, " + secret

	var g *guest
	var srv *http.Server
	dir := t.TempDir()
	sock := filepath.Join(dir, "vm.sock")
	var o vmOptions
	err := inNewNetns(func() error {
		o = vmOptions{memMiB: 256, cpus: 1, rng: true, disks: []diskSpec{{path: disk}}, tap: "wtap0", vsock: sock, cid: 3, trackDirty: true,
			mac: net.HardwareAddr{0x52, 0x54, 0, 0x12, 0x34, 0x56},
			cmdline: "warren.shell=1 warren.hostname=e2e random.trust_cpu=0 random.trust_bootloader=0 " +
				"warren.ip=10.200.0.2/24 warren.gw=10.200.0.1"}
		var err error
		g, err = startGuest(t, o)
		if err != nil {
			return err
		}
		host := guestinit.NetConfig{Addr: netip.MustParsePrefix("10.200.0.1/24")}
		if err := host.Apply("wtap0", filepath.Join(t.TempDir(), "resolv.conf")); err != nil {
			return fmt.Errorf("configure the host end of the tap: %w", err)
		}
		ln, err := net.Listen("tcp", "10.200.0.1:8080")
		if err != nil {
			return err
		}
		srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, page)
		})}
		go srv.Serve(ln)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	g.waitOr(readyLine, bootDeadline, bootStalled)

	t.Run("rng", func(t *testing.T) {
		log := g.con.String()
		crng, ready := strings.Index(log, "crng init done"), strings.Index(log, "warren-init: ready")
		if crng < 0 || crng > ready {
			t.Errorf("'crng init done' at %d, ready line at %d: the CRNG was not seeded before init", crng, ready)
		}
		if n := g.rng.Metrics.Bytes.Load(); n == 0 {
			t.Error("virtio-rng served no entropy")
		}
	})
	t.Run("net", func(t *testing.T) {
		out := g.sh("wget -O - http://10.200.0.1:8080/hello", 2*time.Minute)
		if !strings.Contains(out, page) {
			t.Errorf("guest fetched %q, want %q", out, page)
		}
	})
	// Fork: each child gets its own disk overlay over the frozen image,
	// its own tap and MAC, and the parent moves to an overlay of its own.
	t.Run("fork", func(t *testing.T) {
		api := filepath.Join(dir, "api.sock")
		stopAPI, err := startAPI(api, &built{vm: g.vm, devs: g.dev}, o, NewLogger(os.Stderr, false), "", "")
		if err != nil {
			t.Fatal(err)
		}
		defer stopAPI()
		run := func(args ...string) string {
			t.Helper()
			code, out, errOut := cli(t, nil, args...)
			if code != 0 {
				t.Fatalf("warren %s: exit %d: %s%s", strings.Join(args, " "), code, out, errOut)
			}
			return out
		}
		run("health", "--wait", "3m", sock)
		run("exec", "--timeout", "2m", sock, "--", "sh", "-c", "echo parent-before > /mnt/data/fork.txt && sync")
		var r vmmctl.ForkReply
		if err := json.Unmarshal([]byte(run("fork", "-n", "2", "--json", "--prefix", filepath.Join(dir, "kid"), api)), &r); err != nil {
			t.Fatal(err)
		}
		for _, c := range r.Children {
			t.Cleanup(func() {
				if p, err := os.FindProcess(c.PID); err == nil {
					p.Kill()
				}
				if t.Failed() {
					logb, _ := os.ReadFile(c.Log)
					con, _ := os.ReadFile(c.Console)
					t.Logf("child %d log:\n%s\nconsole:\n%s", c.Index, logb, tail(con))
				}
			})
		}
		for _, c := range r.Children {
			run("health", "--wait", "3m", c.Vsock)
			if got := run("exec", "--timeout", "2m", c.Vsock, "--", "cat", "/mnt/data/fork.txt"); got != "parent-before\n" {
				t.Errorf("child %d reads %q from the disk", c.Index, got)
			}
			run("exec", "--timeout", "2m", c.Vsock, "--", "sh", "-c", fmt.Sprintf("echo child-%d > /mnt/data/fork.txt && sync", c.Index))
			ifc, err := net.InterfaceByName(c.Tap)
			if err != nil {
				t.Errorf("child %d's tap %s: %v", c.Index, c.Tap, err)
			} else if ifc.Name == "wtap0" {
				t.Errorf("child %d shares the parent's tap", c.Index)
			}
		}
		for _, c := range r.Children {
			if got := run("exec", "--timeout", "2m", c.Vsock, "--", "cat", "/mnt/data/fork.txt"); got != fmt.Sprintf("child-%d\n", c.Index) {
				t.Errorf("child %d reads back %q", c.Index, got)
			}
		}
		run("exec", "--timeout", "2m", sock, "--", "sh", "-c", "echo parent-after > /mnt/data/fork.txt && sync")
		// On the host: the frozen image holds the fork-time data; each
		// child's writes are in its own overlay only.
		img, err := os.ReadFile(disk)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(img, []byte("parent-before\n")) || bytes.Contains(img, []byte("child-")) || bytes.Contains(img, []byte("parent-after")) {
			t.Errorf("the frozen image was written after the fork")
		}
		// A child in a network namespace of its own: its tap is there,
		// not in ours, and it answers.
		var rn vmmctl.ForkReply
		if err := json.Unmarshal([]byte(run("fork", "-n", "1", "--netns", "--json", "--prefix", filepath.Join(dir, "nskid"), api)), &rn); err != nil {
			t.Fatal(err)
		}
		cn := rn.Children[0]
		t.Cleanup(func() {
			if p, err := os.FindProcess(cn.PID); err == nil {
				p.Kill()
			}
		})
		run("health", "--wait", "3m", cn.Vsock)
		ours, _ := os.Readlink("/proc/self/ns/net")
		if theirs, err := os.Readlink(cn.NetNS); err != nil || theirs == ours || cn.NetNS == "" {
			t.Errorf("child netns %q (%s, %v), ours %s", cn.NetNS, theirs, err, ours)
		}
		if _, err := net.InterfaceByName(cn.Tap); err == nil {
			t.Errorf("the --netns child's tap %s is in the test's namespace", cn.Tap)
		}
		ovs, _ := filepath.Glob(filepath.Join(filepath.Dir(disk), "*.wcow"))
		if len(ovs) != 5 { // parent before and after the second fork, 2 + 1 children
			t.Errorf("overlays beside the image: %v, want 5 (the parent's two and three children's)", ovs)
		}
		for _, c := range r.Children {
			found := 0
			for _, ov := range ovs {
				b, _ := os.ReadFile(ov)
				if bytes.Contains(b, []byte(fmt.Sprintf("child-%d\n", c.Index))) {
					found++
				}
			}
			if found != 1 {
				t.Errorf("child %d's data is in %d overlays, want 1", c.Index, found)
			}
		}
	})
	t.Run("disk", func(t *testing.T) {
		g.sh(fmt.Sprintf("echo %s > /mnt/data/hello.txt", secret), time.Minute)
		if out := g.sh("cat /mnt/data/hello.txt", time.Minute); !strings.Contains(out, secret) {
			t.Fatalf("read back %q", out)
		}
		g.vm.SerialInput([]byte("sync; shutdown reboot\n"))
		if err := g.stopped(5 * time.Minute); err != nil {
			t.Fatalf("guest power-off: %v", err)
		}
		// After the fork the parent writes to its overlay: read the disk
		// as the guest sees it, through the device's backend (the image,
		// or the overlay chain over it).
		be := g.dev.disks[0].Dev.Backend()
		img := make([]byte, be.Size())
		if _, err := be.ReadAt(img, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(img, []byte(secret+"\n")) {
			t.Errorf("the bytes the guest wrote are not in the disk image")
		}
	})
}
