//go:build linux

package guestinit

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/guestinit/etc"
	"github.com/warrenvm/warren/guestinit/imageconfig"
)

// imageRoot is what PID 1 knows about the image root it moved into.
type imageRoot struct {
	// readOnly says the root is mounted read-only: PID 1 writes nothing
	// to it (no /etc/hostname, /etc/hosts or /tmp changes).
	readOnly bool
	// config is the image's configuration (imageconfig.Path), zero when
	// the root has none.
	config imageconfig.Config
}

// imageMounts are what a Debian userland expects beyond /dev, /proc and
// /sys (which moved in from the initramfs), mounted after the move, in
// order. /tmp is not among them: see setUpTmp.
var imageMounts = []mount{
	// Pseudo-terminals: a private devpts instance; /dev/ptmx (devtmpfs's
	// node) opens the pts next to it (Linux 4.7 and later). gid 5 is
	// Debian's tty group.
	{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5", 0o755, true},
	// POSIX shared memory and semaphores (shm_open, sem_open: Python's
	// multiprocessing).
	{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", 0o1777, false},
	// POSIX message queues.
	{"mqueue", "/dev/mqueue", "mqueue", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", 0o755, true},
	// Runtime state (pid files, sockets), empty at every boot as Debian
	// has it.
	{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755", 0o755, false},
	// cgroup v2, the unified hierarchy.
	{"cgroup2", "/sys/fs/cgroup", "cgroup2", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", 0o555, true},
}

// tmpMount is /tmp on a read-only root, where the disk cannot hold it.
var tmpMount = mount{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", 0o1777, false}

// setUpImageRoot mounts imageMounts, makes /run/lock and /tmp, and reads
// the image configuration. Failures are reported; the boot goes on.
func setUpImageRoot(readOnly bool) imageRoot {
	for _, m := range imageMounts {
		if err := m.do(); err != nil {
			report(err)
		}
	}
	// /run/lock (Debian's /var/lock points there): world-writable, sticky.
	if err := mkdirMode("/run/lock", 0o1777); err != nil {
		report(err)
	}
	if err := setUpTmp(readOnly); err != nil {
		report(err)
	}
	img := imageRoot{readOnly: readOnly}
	cfg, err := readImageConfig(imageconfig.Path)
	if err != nil {
		report(err)
	}
	img.config = cfg
	if wd := cfg.WorkingDir; wd != "" && !readOnly {
		// As container runtimes do, a WorkingDir the image lacks is made.
		if _, err := os.Stat(wd); errors.Is(err, os.ErrNotExist) {
			if err := os.MkdirAll(wd, 0o755); err != nil {
				report(fmt.Errorf("image working directory: %w", err))
			}
		}
	}
	return img
}

// setUpTmp makes /tmp a world-writable sticky directory. On a writable
// root it stays on the root disk, as Debian 12 has it: there it is part
// of the sandbox's copy-on-write overlay, so disk snapshots and forks
// carry it like the rest of the disk, and big temporary files (a pip or
// npm build's) go to the page cache, which the guest can write back and
// evict, instead of pinning guest RAM in a tmpfs whose every first-touched
// page is an emulated page fault here. A /tmp that is a symlink is left
// alone. On a read-only root it is a tmpfs.
func setUpTmp(readOnly bool) error {
	if readOnly {
		return tmpMount.do()
	}
	fi, err := os.Lstat("/tmp")
	switch {
	case errors.Is(err, os.ErrNotExist):
		return mkdirMode("/tmp", 0o1777)
	case err != nil:
		return fmt.Errorf("/tmp: %w", err)
	case fi.Mode()&os.ModeSymlink != 0:
		return nil
	case !fi.IsDir():
		return fmt.Errorf("/tmp is not a directory")
	case fi.Mode()&(os.ModePerm|os.ModeSticky) != os.ModePerm|os.ModeSticky:
		return os.Chmod("/tmp", 0o777|os.ModeSticky)
	}
	return nil
}

// mkdirMode makes dir with exactly mode (perm bits and the sticky bit),
// whatever the umask; an existing directory gets mode too.
func mkdirMode(dir string, mode uint32) error {
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if err := unix.Chmod(dir, mode); err != nil {
		return fmt.Errorf("chmod %s: %w", dir, err)
	}
	return nil
}

// readImageConfig reads the image configuration at path (bounded:
// imageconfig.MaxBytes, a regular file). A missing file is no image
// configuration and no error.
func readImageConfig(path string) (imageconfig.Config, error) {
	b, err := etc.ReadFile(path, imageconfig.MaxBytes)
	if errors.Is(err, os.ErrNotExist) {
		return imageconfig.Config{}, nil
	}
	if err != nil {
		return imageconfig.Config{}, fmt.Errorf("image config: %w", err)
	}
	c, err := imageconfig.Parse(b)
	if err != nil {
		return imageconfig.Config{}, fmt.Errorf("image config %s: %w", path, err)
	}
	return c, nil
}

// writeHostFiles writes /etc/hostname and the hostname line of /etc/hosts
// (keeping the image's other lines) on a writable root.
func (img imageRoot) writeHostFiles(hostname string) error {
	if img.readOnly {
		return nil
	}
	if err := os.MkdirAll("/etc", 0o755); err != nil {
		return err
	}
	return etc.WriteHostname("/etc", hostname, true)
}

// DefaultPath is the PATH of processes in an image root whose
// configuration sets none (Docker's default).
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Services' log directories: on the root disk, or in /run when the root
// is read-only.
const (
	logDirReadOnly = "/run/log/warren"
)

// agentOptions are the agent's defaults in an image root: the image's
// environment (with DefaultPath when it has no PATH), working directory
// ("/" when it names none) and user (root when it names none, resolved
// against the image's /etc like any other, so HOME comes from passwd).
func (img imageRoot) agentOptions() (env []string, dir, user, logDir string) {
	env = append([]string(nil), img.config.Env...)
	hasPath := false
	for _, kv := range env {
		if len(kv) >= 5 && kv[:5] == "PATH=" {
			hasPath = true
		}
	}
	if !hasPath {
		env = append(env, "PATH="+DefaultPath)
	}
	dir = img.config.WorkingDir
	if dir == "" {
		dir = "/"
	}
	user = img.config.User
	if user == "" {
		user = "0"
	}
	logDir = ""
	if img.readOnly {
		logDir = logDirReadOnly
	}
	return env, dir, user, logDir
}
