//go:build linux

package guestinit

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/guestinit/imageconfig"
)

func TestRootDiskFromCmdline(t *testing.T) {
	for _, tc := range []struct {
		cmdline string
		want    RootDisk
		err     string
	}{
		{"console=ttyS0", RootDisk{}, ""},
		{"warren.root=", RootDisk{}, ""},
		{"warren.root=/dev/vda", RootDisk{Device: "/dev/vda"}, ""},
		{"warren.root=/dev/vdb warren.root_ro=1", RootDisk{Device: "/dev/vdb", ReadOnly: true}, ""},
		{"warren.root=/dev/vda warren.root_ro", RootDisk{Device: "/dev/vda", ReadOnly: true}, ""},
		{"warren.root=/dev/vdaa", RootDisk{Device: "/dev/vdaa"}, ""},
		{"warren.root=/dev/vda1", RootDisk{}, "not a virtio-blk disk"},
		{"warren.root=/dev/sda", RootDisk{}, "not a virtio-blk disk"},
		{"warren.root=vda", RootDisk{}, "not a virtio-blk disk"},
		{"warren.root=/dev/vd", RootDisk{}, "not a virtio-blk disk"},
		{"warren.root=/dev/vdA", RootDisk{}, "not a virtio-blk disk"},
		{"warren.root=/dev/vdabcd", RootDisk{}, "not a virtio-blk disk"},
		{"warren.root=/dev/../dev/vda", RootDisk{}, "not a virtio-blk disk"},
		{"warren.root_ro=1", RootDisk{}, ""},
	} {
		got, err := RootDiskFromCmdline(ParseCmdline(tc.cmdline))
		if got != tc.want {
			t.Errorf("%q: %+v, want %+v", tc.cmdline, got, tc.want)
		}
		if (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%q: error %v, want %q", tc.cmdline, err, tc.err)
		}
	}
}

func TestAgentOptions(t *testing.T) {
	for _, tc := range []struct {
		name      string
		img       imageRoot
		env       []string
		dir, user string
		logDir    string
	}{
		{"no config", imageRoot{}, []string{"PATH=" + DefaultPath}, "/", "0", ""},
		{"read-only", imageRoot{readOnly: true}, []string{"PATH=" + DefaultPath}, "/", "0", logDirReadOnly},
		{"image", imageRoot{config: imageconfig.Config{Env: []string{"PATH=/opt/bin:/usr/bin", "LANG=C.UTF-8"}, WorkingDir: "/app", User: "app:staff"}},
			[]string{"PATH=/opt/bin:/usr/bin", "LANG=C.UTF-8"}, "/app", "app:staff", ""},
		{"env without PATH", imageRoot{config: imageconfig.Config{Env: []string{"HOME=/srv"}}},
			[]string{"HOME=/srv", "PATH=" + DefaultPath}, "/", "0", ""},
	} {
		env, dir, user, logDir := tc.img.agentOptions()
		if !reflect.DeepEqual(env, tc.env) || dir != tc.dir || user != tc.user || logDir != tc.logDir {
			t.Errorf("%s: env %q dir %q user %q logDir %q", tc.name, env, dir, user, logDir)
		}
	}
	if o := agentOptions(nil); !reflect.DeepEqual(o.Env, agentEnv) || o.Dir != "" || o.User != "" {
		t.Errorf("initramfs options %+v", o)
	}
}

func TestReadImageConfig(t *testing.T) {
	dir := t.TempDir()
	if c, err := readImageConfig(filepath.Join(dir, "missing.json")); err != nil || !reflect.DeepEqual(c, imageconfig.Config{}) {
		t.Errorf("missing file: %+v, %v", c, err)
	}
	good := imageconfig.Config{Env: []string{"A=b"}, WorkingDir: "/w", User: "1000"}
	b, err := good.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "image.json")
	os.WriteFile(p, b, 0o644)
	if c, err := readImageConfig(p); err != nil || c.WorkingDir != "/w" || c.User != "1000" {
		t.Errorf("good file: %+v, %v", c, err)
	}
	os.WriteFile(p, []byte(`{"version":1,"working_dir":"relative"}`), 0o644)
	if _, err := readImageConfig(p); err == nil || !strings.Contains(err.Error(), "working_dir") {
		t.Errorf("bad file: %v", err)
	}
	os.WriteFile(p, make([]byte, imageconfig.MaxBytes+1), 0o644)
	if _, err := readImageConfig(p); err == nil {
		t.Error("oversized file accepted")
	}
	fifo := filepath.Join(dir, "fifo.json")
	unix.Mkfifo(fifo, 0o644)
	if _, err := readImageConfig(fifo); err == nil {
		t.Error("a FIFO accepted") // and, above all, not blocked on
	}
}

func TestEnsureDirAndMkdirMode(t *testing.T) {
	dir := t.TempDir()
	if err := ensureDir(filepath.Join(dir, "proc"), false); err != nil {
		t.Fatal(err)
	}
	if err := ensureDir(filepath.Join(dir, "sys"), true); err == nil {
		t.Error("a missing directory on a read-only root was not an error")
	}
	os.WriteFile(filepath.Join(dir, "file"), nil, 0o644)
	if err := ensureDir(filepath.Join(dir, "file"), false); err == nil {
		t.Error("a file accepted as a mount point")
	}
	old := unix.Umask(0o077)
	defer unix.Umask(old)
	p := filepath.Join(dir, "lock")
	if err := mkdirMode(p, 0o1777); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(p)
	if fi.Mode()&(os.ModePerm|os.ModeSticky) != 0o777|os.ModeSticky {
		t.Errorf("mode %v despite the umask", fi.Mode())
	}
}

// TestFreeInitramfs removes a tmpfs's files (as after a switch_root) and
// refuses to touch any other file system, and mount points.
func TestFreeInitramfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root to mount a tmpfs")
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	for _, d := range []string{"bbin", "bin", "etc/ssl", "mnt"} {
		os.MkdirAll(filepath.Join(dir, d), 0o755)
	}
	os.WriteFile(filepath.Join(dir, "bbin", "bb"), []byte("binary"), 0o755)
	os.Symlink("bb", filepath.Join(dir, "bbin", "init"))
	os.Symlink("../bbin/bb", filepath.Join(dir, "bin", "sh"))
	// Something mounted inside must be left alone.
	if err := unix.Mount("tmpfs", filepath.Join(dir, "mnt"), "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(filepath.Join(dir, "mnt"), unix.MNT_DETACH)
	os.WriteFile(filepath.Join(dir, "mnt", "keep"), []byte("x"), 0o644)

	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if err := freeInitramfs(root); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != "mnt" {
		t.Errorf("left: %v", ents)
	}
	if _, err := os.Stat(filepath.Join(dir, "mnt", "keep")); err != nil {
		t.Errorf("a file of the mount inside was removed: %v", err)
	}

	// Not a ramfs or tmpfs (the test's own temporary directory is on the
	// host's disk here): nothing is removed.
	var fs unix.Statfs_t
	other := t.TempDir()
	if unix.Statfs(other, &fs) != nil || fs.Type == tmpfsMagic || fs.Type == ramfsMagic {
		t.Skip("the temporary directory is itself a tmpfs")
	}
	os.WriteFile(filepath.Join(other, "precious"), []byte("x"), 0o644)
	r2, err := os.OpenRoot(other)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if err := freeInitramfs(r2); err == nil || !strings.Contains(err.Error(), "not a ramfs or tmpfs") {
		t.Errorf("on a disk file system: %v", err)
	}
	if _, err := os.Stat(filepath.Join(other, "precious")); err != nil {
		t.Errorf("a file on a disk file system was removed: %v", err)
	}
}
