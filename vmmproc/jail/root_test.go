//go:build linux && amd64

package jail

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func init() {
	helpers["root"] = func(h *helper) { helperRoot(h, nil) }
	helpers["root-chroot"] = func(h *helper) {
		helperRoot(h, func(string, string) error { return unix.EINVAL })
	}
}

// TestPivotRootConfines is the attacker's view of a confined VMM: after
// Enter with a Root and a User, the host's files (/etc/shadow, the state
// directory's other entries) are not there, a sibling sandbox's directory
// in a shared bind is closed to it, read-only binds refuse writes, its
// own directory and /dev/kvm still work, and nothing leads back out.
func TestPivotRootConfines(t *testing.T) {
	needRoot(t)
	expectHelperOK(t, "root", SysProcAttr(NSOptions{NetNS: true}))
}

// TestChrootConfines is TestPivotRootConfines where pivot_root fails as
// it does on an initramfs root (the nested KVM host's): the jail is moved
// over / and chrooted into, and confines the same.
func TestChrootConfines(t *testing.T) {
	needRoot(t)
	expectHelperOK(t, "root-chroot", SysProcAttr(NSOptions{NetNS: true}))
}

func helperRoot(h *helper, pivot func(string, string) error) {
	tmp := os.Getenv("JAIL_TMP")
	const uid, other = 65534, 65533
	mk := func(p string, mode os.FileMode, owner int) {
		if err := os.MkdirAll(p, mode); err != nil {
			h.failf("mkdir %s: %v", p, err)
		}
		os.Chmod(p, mode)
		os.Chown(p, owner, owner)
	}
	own := filepath.Join(tmp, "sandboxes", "mine")
	theirs := filepath.Join(tmp, "sandboxes", "theirs")
	mk(filepath.Join(tmp, "sandboxes"), 0o711, 0)
	mk(own, 0o700, uid)
	mk(theirs, 0o700, other)
	os.WriteFile(filepath.Join(theirs, "memory"), []byte("their guest's memory"), 0o600)
	os.Chown(filepath.Join(theirs, "memory"), other, other)
	tpl := filepath.Join(tmp, "template")
	mk(tpl, 0o755, 0)
	os.WriteFile(filepath.Join(tpl, "base"), []byte("frozen layer"), 0o444)
	os.WriteFile(filepath.Join(tmp, "keys.key"), []byte("another tenant's key"), 0o600)
	root := filepath.Join(tmp, "jail")
	mk(root, 0o700, 0)
	var devs []Device
	_, kvmErr := os.Stat("/dev/kvm")
	if kvmErr == nil {
		devs = append(devs, DevKVM)
	}
	devs = append(devs, DevNull)
	err := Enter(Config{
		Mounts: &MountOptions{Proc: true},
		Root: &RootOptions{Dir: root, Owner: &User{UID: uid, GID: uid}, Devices: devs, pivot: pivot, Binds: []Bind{
			{Path: filepath.Join(tmp, "sandboxes"), Writable: true},
			{Path: tpl},
		}},
		User:    &User{UID: uid, GID: uid},
		Profile: ProfileStrict,
	})
	if err != nil {
		h.failf("enter: %v", err)
		return
	}
	for _, k := range []string{"Uid", "Gid"} {
		if f := strings.Fields(readStatus(k)); len(f) != 4 || slices.ContainsFunc(f, func(s string) bool { return s != "65534" }) {
			h.failf("%s: %v", k, f)
		}
	}
	for _, k := range []string{"CapEff", "CapPrm", "CapBnd"} {
		if v := readStatus(k); v != "0000000000000000" {
			h.failf("%s = %s", k, v)
		}
	}
	// "/" holds the binds' top directory, /dev and /proc, nothing else.
	top := strings.Split(strings.TrimPrefix(tmp, "/"), "/")[0]
	var rootNames []string
	if ents, err := os.ReadDir("/"); err == nil {
		for _, e := range ents {
			rootNames = append(rootNames, e.Name())
		}
	}
	if want := []string{"dev", "proc", top}; !slices.Equal(rootNames, slices.Sorted(slices.Values(want))) {
		h.failf("/ holds %v, want %v", rootNames, want)
	} else {
		h.logf("ok: / holds only %v", rootNames)
	}
	// Host files are simply not there, whatever the path.
	for _, p := range []string{"/etc/shadow", "/etc/passwd", "/root", "/bin/sh", filepath.Join(tmp, "keys.key"), "/../../etc/shadow",
		"/proc/1/root/etc/shadow", "/proc/self/cwd/../etc/shadow"} {
		_, err := os.Stat(p)
		h.wantErrno("stat "+p, err, unix.ENOENT)
	}
	ents, _ := os.ReadDir(tmp)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"sandboxes", "template"}) {
		h.failf("%s shows %v, want only the binds", tmp, names)
	}
	// Its own directory works; the sibling's is closed.
	h.wantOK("write own dir", os.WriteFile(filepath.Join(own, "snap"), []byte("x"), 0o600))
	_, err = os.ReadFile(filepath.Join(theirs, "memory"))
	h.wantErrno("read the sibling's memory", err, unix.EACCES)
	_, err = os.ReadDir(theirs)
	h.wantErrno("list the sibling's directory", err, unix.EACCES)
	// Read-only binds and the root refuse writes.
	if b, err := os.ReadFile(filepath.Join(tpl, "base")); err != nil || string(b) != "frozen layer" {
		h.failf("read the template: %q %v", b, err)
	}
	h.wantErrno("write the template", os.WriteFile(filepath.Join(tpl, "base"), []byte("x"), 0o644), unix.EROFS)
	h.wantErrno("create in the jail's root", os.WriteFile("/etc-shadow", []byte("x"), 0o644), unix.EROFS)
	h.wantErrno("mkdir in the jail's root", os.Mkdir("/x", 0o755), unix.EROFS)
	if kvmErr == nil {
		f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
		h.wantOK("open /dev/kvm as the VMM's uid", err)
		if f != nil {
			f.Close()
		}
	}
	// No way to make another way out.
	h.wantErrno("mount", unix.Mount("none", own, "tmpfs", 0, ""), unix.EPERM)
	h.wantErrno("chroot", unix.Chroot(own), unix.EPERM)
	h.wantErrno("mknod", unix.Mknod(filepath.Join(own, "sda"), unix.S_IFBLK|0o600, int(unix.Mkdev(8, 0))), unix.EPERM)
}
