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
