package vmmproc

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/image"
	"github.com/warrenvm/warren/internal/kvmtest"
	"github.com/warrenvm/warren/internal/product"
)

// busyboxStatic is where Debian's busybox-static puts its binary.
const busyboxStatic = "/bin/busybox"

// imageRootDisk makes a small image root file system: Debian's static
// busybox with its applet links, an /etc with a non-root user (app, uid
// 1000, in the supplementary group staff), an /etc/hosts with a line of
// the image's own, and an image configuration (env, working directory,
// user), in an ext4 made by package image. /dev, /proc, /sys, /run
// and /tmp are left out: PID 1 must make them.
func imageRootDisk(t *testing.T) string {
	t.Helper()
	f, err := elf.Open(busyboxStatic)
	if err != nil {
		product.Missing(t, fmt.Sprintf("a static busybox at %s (%v)", busyboxStatic, err), "apt-get install busybox-static")
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			f.Close()
			product.Missing(t, busyboxStatic+" is dynamically linked: a static busybox", "apt-get install busybox-static")
		}
	}
	f.Close()
	tree := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	bb, err := os.ReadFile(busyboxStatic)
	must(err)
	must(os.MkdirAll(filepath.Join(tree, "bin"), 0o755))
	must(os.WriteFile(filepath.Join(tree, "bin", "busybox"), bb, 0o755))
	list, err := exec.Command(busyboxStatic, "--list-full").Output()
	must(err)
	for _, applet := range strings.Fields(string(list)) {
		p := filepath.Join(tree, filepath.Clean("/"+applet))
		if p == filepath.Join(tree, "bin", "busybox") {
			continue
		}
		must(os.MkdirAll(filepath.Dir(p), 0o755))
		must(os.Symlink("/bin/busybox", p))
	}
	files := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:App:/home/app:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":  "root:x:0:\ntty:x:5:\nstaff:x:50:app\napp:x:1000:\nnogroup:x:65534:\n",
		"etc/hosts":  "127.0.0.1\tlocalhost\n10.9.8.7\timage-own-host\n",
	}
	for name, content := range files {
		must(os.MkdirAll(filepath.Join(tree, filepath.Dir(name)), 0o755))
		must(os.WriteFile(filepath.Join(tree, name), []byte(content), 0o644))
	}
	// The app's working directory is world-writable so that app can
	// write there (the tree is root's).
	for _, d := range []string{"srv/app", "home/app", "root"} {
		must(os.MkdirAll(filepath.Join(tree, d), 0o755))
	}
	must(os.Chmod(filepath.Join(tree, "srv/app"), 0o1777))

	// The product's path: the tree as an image with a config, made an
	// ext4 base by package image (e2fsprogs, no bash: it runs in the
	// nested KVM host too), copied to a disk of the test's own.
	img, err := image.FromRootfs(tree)
	must(err)
	img, err = mutate.Config(img, v1.Config{
		Env:        []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "GREETING=hello-from-the-image"},
		WorkingDir: "/srv/app",
		User:       "app",
		Cmd:        []string{"sh"},
	})
	must(err)
	st := &image.Store{Dir: t.TempDir()}
	base, err := st.Build(t.Context(), img, image.BuildOptions{DiskBytes: 64 << 20, Ref: "warren-test/busybox"})
	must(err)
	if base.Config.User != "app" || base.Config.WorkingDir != "/srv/app" {
		t.Fatalf("the base's image config: %+v", base.Config)
	}
	out := filepath.Join(t.TempDir(), "root.img")
	src, err := os.Open(base.Path)
	must(err)
	defer src.Close()
	dst, err := os.OpenFile(out, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	must(err)
	_, err = io.Copy(dst, src)
	must(err)
	must(dst.Close())
	return out
}

// TestImageRoot boots the guest with warren.root on a busybox image root
// (one boot) and checks, through the agent as the CLI and the daemon use
// it: the ext4 root and the mounts PID 1 adds, the image's user, working
// directory and environment, the hostname files, root on request, a file
// written to the disk, and a supervised service that restarts after it is
// killed.
func TestImageRoot(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped in -short: boots a Linux guest")
	}
	kvmtest.Require(t)
	if _, err := exec.LookPath("debugfs"); err != nil {
		t.Skip("skipped: needs e2fsprogs (mkfs.ext4, debugfs)")
	}
	disk := imageRootDisk(t)
	sock := filepath.Join(t.TempDir(), "vm.sock")
	bootStart := time.Now()
	g := bootGuest(t, vmOptions{memMiB: 256, cpus: 1, rng: true, disks: []diskSpec{{path: disk}}, vsock: sock, cid: 3,
		cmdline: "warren.root=/dev/vda warren.hostname=imgbox"})
	t.Logf("boot to the ready line: %.1f s wall", time.Since(bootStart).Seconds())
	if errs := regexp.MustCompile(`warren-init: error: .*`).FindAllString(g.con.String(), -1); len(errs) > 0 {
		t.Errorf("PID 1 reported errors: %q", errs)
	}
	run := func(args ...string) string {
		t.Helper()
		code, out, errOut := cli(t, nil, append([]string{"exec", "--timeout", "3m", sock, "--"}, args...)...)
		if code != 0 {
			t.Fatalf("warren exec %s: exit %d: %s%s", strings.Join(args, " "), code, out, errOut)
		}
		return out
	}
	if code, out, errOut := cli(t, nil, "health", "--wait", "3m", sock); code != 0 {
		t.Fatalf("the agent did not answer: %s%s", out, errOut)
	}

	// One exec for most checks: each process start is expensive here.
	out := run("sh", "-c", `id; echo "pwd=$(pwd)"; echo ---env; env | sort; echo ---hostname; hostname; cat /etc/hostname; `+
		`echo ---hosts; cat /etc/hosts; echo ---modes; stat -c "%a %n" /tmp /run/lock /dev/shm; echo ---mountinfo; cat /proc/self/mountinfo`)
	section := func(name string) string {
		_, rest, _ := strings.Cut(out, "---"+name+"\n")
		if before, _, ok := strings.Cut(rest, "\n---"); ok {
			return before + "\n"
		}
		return rest
	}
	t.Run("user", func(t *testing.T) {
		if !strings.Contains(out, "uid=1000(app) gid=1000(app) groups=50(staff)") {
			t.Errorf("id: %q", strings.SplitN(out, "\n", 2)[0])
		}
		if !strings.Contains(out, "pwd=/srv/app\n") {
			t.Errorf("working directory: %q", out)
		}
	})
	t.Run("env", func(t *testing.T) {
		env := section("env")
		for _, want := range []string{"GREETING=hello-from-the-image\n", "HOME=/home/app\n", "PATH=/usr/sbin:/usr/bin:/sbin:/bin\n"} {
			if !strings.Contains(env, want) {
				t.Errorf("env lacks %q: %q", want, env)
			}
		}
	})
	t.Run("hostname", func(t *testing.T) {
		if got := section("hostname"); got != "imgbox\nimgbox\n" {
			t.Errorf("hostname and /etc/hostname: %q", got)
		}
		hosts := section("hosts")
		for _, want := range []string{"127.0.0.1\tlocalhost\n", "127.0.1.1\timgbox\n", "10.9.8.7\timage-own-host\n", "::1\tlocalhost"} {
			if !strings.Contains(hosts, want) {
				t.Errorf("/etc/hosts lacks %q: %q", want, hosts)
			}
		}
	})
	t.Run("mounts", func(t *testing.T) {
		if got := section("modes"); got != "1777 /tmp\n1777 /run/lock\n1777 /dev/shm\n" {
			t.Errorf("modes: %q", got)
		}
		// mountinfo: ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS ... - FSTYPE SOURCE SUPER
		types := map[string]string{}
		var rootLine string
		for _, l := range strings.Split(section("mountinfo"), "\n") {
			f := strings.Fields(l)
			pre, post, ok := strings.Cut(l, " - ")
			if len(f) < 5 || !ok {
				continue
			}
			types[strings.Fields(pre)[4]] = strings.Fields(post)[0]
			if f[4] == "/" {
				rootLine = l
			}
		}
		if !strings.Contains(rootLine, " - ext4 /dev/vda rw") || !strings.Contains(rootLine, "noatime") {
			t.Errorf("root: %q", rootLine)
		}
		for mp, fs := range map[string]string{"/dev": "devtmpfs", "/proc": "proc", "/sys": "sysfs", "/dev/pts": "devpts",
			"/dev/shm": "tmpfs", "/dev/mqueue": "mqueue", "/run": "tmpfs", "/sys/fs/cgroup": "cgroup2"} {
			if types[mp] != fs {
				t.Errorf("%s: %q, want %s", mp, types[mp], fs)
			}
		}
		if _, ok := types["/tmp"]; ok {
			t.Errorf("/tmp is a mount (%s), not a directory of the root disk", types["/tmp"])
		}
		if _, ok := types["/mnt/data"]; ok {
			t.Error("the root disk is also mounted as the data disk")
		}
	})

	ac := agentclient.New(sock)
	defer ac.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	t.Run("root on request", func(t *testing.T) {
		var o bytes.Buffer
		code, err := ac.Exec(ctx, agentwire.ExecRequest{Argv: []string{"id", "-u"}, User: "root"}, &o, nil)
		if err != nil || code != 0 || o.String() != "0\n" {
			t.Errorf("id -u as root: %q, code %d, %v", o.String(), code, err)
		}
	})

	// A file written persists on the disk (checked on the host after the
	// guest stops).
	token := fmt.Sprintf("persisted-%d", time.Now().UnixNano())
	run("sh", "-c", "echo "+token+" > /srv/app/persist.txt && sync")

	t.Run("service", func(t *testing.T) {
		st, err := ac.StartService(ctx, agentwire.ServiceSpec{Name: "ticker", Argv: []string{"sh", "-c", "echo tick $(id -un); exec sleep 100000"}})
		if err != nil {
			t.Fatal(err)
		}
		if st.State != agentwire.ServiceRunning || st.Pid == 0 || st.Log != "/var/log/warren/ticker.log" {
			t.Fatalf("started: %+v", st)
		}
		// The log is root's (0640).
		ready := agentwire.ExecRequest{Argv: []string{"grep", "-q", "tick app", st.Log}, User: "root"}
		if _, err := ac.PollExec(ctx, ready, time.Second); err != nil {
			t.Fatal(err)
		}
		run("kill", "-9", fmt.Sprint(st.Pid))
		var now agentwire.ServiceStatus
		for {
			if now, err = ac.Service(ctx, "ticker"); err != nil {
				t.Fatal(err)
			}
			if now.Starts >= 2 && now.State == agentwire.ServiceRunning || ctx.Err() != nil {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		if now.Starts != 2 || now.Pid == st.Pid || now.LastExit == nil || now.LastExit.Signal != "SIGKILL" {
			t.Errorf("after kill: %+v (last exit %+v)", now, now.LastExit)
		}
		twice := agentwire.ExecRequest{Argv: []string{"sh", "-c", `[ "$(grep -c 'tick app' ` + st.Log + `)" = 2 ]`}, User: "root"}
		if _, err := ac.PollExec(ctx, twice, time.Second); err != nil {
			t.Error(err)
		}
	})

	g.stop()
	// The guest's sync committed the file to ext4's journal; e2fsck on a
	// copy replays it, then debugfs reads the file.
	b, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(t.TempDir(), "copy.img")
	if err := os.WriteFile(cp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("e2fsck", "-fy", cp).CombinedOutput(); err != nil {
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() > 1 { // 1: errors corrected (the replay)
			t.Fatalf("e2fsck: %v\n%s", err, out)
		}
	}
	cat, err := exec.Command("debugfs", "-R", "cat /srv/app/persist.txt", cp).Output()
	if err != nil || string(cat) != token+"\n" {
		t.Errorf("/srv/app/persist.txt on the disk: %q, %v", cat, err)
	}
}

// TestImageRootFallback: a warren.root disk that does not mount (no ext4
// on it) leaves the guest on the initramfs, saying so, with its agent up
// and the disk not mounted as data either.
func TestImageRootFallback(t *testing.T) {
	if testing.Short() {
		t.Skip("skipped in -short: boots a Linux guest")
	}
	kvmtest.Require(t)
	disk := filepath.Join(t.TempDir(), "garbage.img")
	if err := os.WriteFile(disk, bytes.Repeat([]byte("not ext4"), 2<<20/8), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "vm.sock")
	g := bootGuest(t, vmOptions{memMiB: 256, cpus: 1, rng: true, disks: []diskSpec{{path: disk}}, vsock: sock, cid: 3,
		cmdline: "warren.root=/dev/vda"})
	con := g.con.String()
	if !regexp.MustCompile(`warren-init: error: root: mount /dev/vda on /newroot \(ext4\): .*; staying on the initramfs`).MatchString(con) {
		t.Errorf("no error line for the failed root in the console:\n%s", tail([]byte(con)))
	}
	if code, out, errOut := cli(t, nil, "health", "--wait", "3m", sock); code != 0 {
		t.Fatalf("the agent did not answer: %s%s", out, errOut)
	}
	code, out, errOut := cli(t, nil, "exec", "--timeout", "3m", sock, "--", "cat", "/proc/self/mounts")
	if code != 0 {
		t.Fatalf("exec: %d %s%s", code, out, errOut)
	}
	if strings.Contains(out, "/dev/vda") || !strings.Contains(out, "tmpfs /tmp tmpfs") {
		t.Errorf("mounts on the initramfs: %q", out)
	}
}
