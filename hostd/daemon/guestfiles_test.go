package daemon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/vmmctl"
)

// watchOpens reports every open (IN_OPEN) of a file in dirs from now on;
// an O_PATH descriptor is no open.
func watchOpens(t *testing.T, dirs ...string) func() []string {
	t.Helper()
	ifd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(ifd) })
	wds := map[int]string{}
	for _, d := range dirs {
		wd, err := unix.InotifyAddWatch(ifd, d, unix.IN_OPEN)
		if err != nil {
			t.Fatal(err)
		}
		wds[wd] = d
	}
	return func() []string {
		var opened []string
		buf := make([]byte, 64<<10)
		for {
			n, err := unix.Read(ifd, buf)
			if err != nil || n <= 0 {
				return opened
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
				opened = append(opened, filepath.Join(wds[int(ev.Wd)], name))
				off += unix.SizeofInotifyEvent + int(ev.Len)
			}
		}
	}
}

// TestTemplateHostPathsRefused tries, as a hostile tenant, to make a
// template read files that are not its own: another tenant's disk base
// and a key file by absolute path, by ../ names, through a symbolic link
// planted in the guest directory, /dev/sda, and a FIFO, a device, a
// directory, an overlay (whose header names a base path) and an oversized
// file in the guest directory, as kernel, initramfs and disks. Every
// request is refused with a 400 quickly (a FIFO opened for reading would
// block), no VMM starts, no template is recorded, and no file of the
// guest directory or outside it is opened.
func TestTemplateHostPathsRefused(t *testing.T) {
	outside := t.TempDir()
	keyFile := filepath.Join(outside, "other.key")
	if err := os.WriteFile(keyFile, []byte("another tenant's key"), 0o600); err != nil {
		t.Fatal(err)
	}
	gd := guestDir(t, map[string]string{"initramfs.cpio": "not an initramfs", "disk.img": strings.Repeat("d", 8192)})
	if err := os.Symlink(keyFile, filepath.Join(gd, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(gd, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	haveDev := unix.Mknod(filepath.Join(gd, "null"), unix.S_IFCHR|0o644, int(unix.Mkdev(1, 3))) == nil
	if err := os.Mkdir(filepath.Join(gd, "subdir"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A cow/disk overlay whose header names the key file as its base.
	raw := filepath.Join(outside, "raw.img")
	os.WriteFile(raw, make([]byte, 4096), 0o600)
	rb, err := disk.OpenRaw(raw, false)
	if err != nil {
		t.Fatal(err)
	}
	ov, err := disk.Create(filepath.Join(gd, "overlay.img"), rb, disk.CreateOptions{BasePath: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	ov.Close()
	rb.Close()
	if hf, err := os.Create(filepath.Join(gd, "huge")); err != nil {
		t.Fatal(err)
	} else if err := hf.Truncate(maxBootFile + 1); err != nil {
		t.Fatal(err)
	} else if err := hf.Close(); err != nil {
		t.Fatal(err)
	}

	f := newFakeLauncher(t)
	state := t.TempDir()
	td := startDaemon(t, state, f, func(c *Config) { c.GuestDir = gd })
	// Another tenant's template with a disk: its base is a host file the
	// attacker knows the path of.
	bob := td.client(t, "bob")
	var btp store.Template
	bob.ok(201, "POST", "/v1/templates", map[string]any{"kernel": "vmlinux", "mem_mib": 128, "disks": []string{"disk.img"}}, &btp)
	bobBase := btp.DiskBases[0]
	rel, err := filepath.Rel(gd, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	relBase, _ := filepath.Rel(gd, bobBase)

	a := td.client(t, "alice")
	a.hc.Timeout = 10 * time.Second // a FIFO opened for reading would hang here
	starts := f.starts.Load()
	opens := watchOpens(t, gd, outside)

	bad := []struct {
		name, why string
		devOnly   bool
	}{
		{bobBase, "host path", false},
		{keyFile, "host path", false},
		{"/dev/sda", "host path", false},
		{"/proc/self/root" + keyFile, "host path", false},
		{rel, "host path", false},
		{relBase, "host path", false},
		{"../" + filepath.Base(outside), "host path", false},
		{"./vmlinux", "host path", false},
		{"..", "not a file name", false},
		{".", "not a file name", false},
		{"", "", false}, // as a disk only: an empty name
		{"vmlinux\x00", "not a file name", false},
		{"escape", "symbolic link", false},
		{"fifo", "a FIFO", false},
		{"null", "a character device", true},
		{"subdir", "a directory", false},
		{"missing", "no such file", false},
	}
	try := func(what string, body map[string]any, why string) {
		t.Helper()
		st, b, err := a.try("POST", "/v1/templates", body)
		if err != nil {
			t.Fatalf("%s %q: %v", what, body, err)
		}
		if st != 400 || !strings.Contains(string(b), why) {
			t.Errorf("%s %q: %d %s; want 400 (%s)", what, body, st, b, why)
		}
	}
	for _, c := range bad {
		if c.devOnly && !haveDev {
			continue
		}
		if c.name != "" {
			try("kernel", map[string]any{"kernel": c.name, "mem_mib": 128}, c.why)
			try("initramfs", map[string]any{"kernel": "vmlinux", "initramfs": c.name, "mem_mib": 128}, c.why)
		}
		why := c.why
		if c.name == "" {
			why = "not a file name"
		}
		try("disk", map[string]any{"kernel": "vmlinux", "mem_mib": 128, "disks": []string{c.name}}, why)
		try("read-only disk", map[string]any{"kernel": "vmlinux", "mem_mib": 128, "disks": []string{c.name + ",ro"}}, why)
		// A good disk first does not let a bad one through.
		try("second disk", map[string]any{"kernel": "vmlinux", "mem_mib": 128, "disks": []string{"disk.img", c.name + ",ro"}}, why)
	}
	try("overlay disk", map[string]any{"kernel": "vmlinux", "mem_mib": 128, "disks": []string{"overlay.img"}}, "overlay, not a raw image")
	try("oversized kernel", map[string]any{"kernel": "huge", "mem_mib": 128}, "more than a kernel may be")
	// An image template's kernel is a name too.
	try("image kernel", map[string]any{"image": "upload:0123456789abcdef", "kernel": keyFile}, "")

	if n := f.starts.Load(); n != starts {
		t.Errorf("%d VMMs started for refused templates", n-starts)
	}
	var l []store.Template
	a.ok(200, "GET", "/v1/templates", nil, &l)
	if len(l) != 0 {
		t.Errorf("refused requests left templates: %+v", l)
	}
	// Only the two names checked once the others were refused may have
	// been opened (disk.img before an overlay, vmlinux before an
	// oversized initramfs...): never the planted ones, never outside.
	seen := opens()
	if !slices.Contains(seen, filepath.Join(gd, "disk.img")) {
		t.Errorf("the watch saw no open of disk.img (opened before a bad second disk): %q", seen)
	}
	for _, p := range seen {
		if base := filepath.Base(p); filepath.Dir(p) != gd || !slices.Contains([]string{"vmlinux", "disk.img", "initramfs.cpio", "overlay.img", "huge"}, base) {
			t.Errorf("a refused request opened %s", p)
		}
	}
	if b, _ := os.ReadFile(keyFile); string(b) != "another tenant's key" {
		t.Error("the key file changed")
	}
}

// TestTemplateGetsDescriptors: a template's build VMM is given its kernel
// and initramfs as inherited descriptors (read-only, the guest
// directory's files' contents), never a path of the guest directory; its
// disks are copies in the template's own directory; and the daemon keeps
// no descriptor of the guest directory's files once the build is done.
func TestTemplateGetsDescriptors(t *testing.T) {
	kernel, initrd := "kernel bytes", "initramfs bytes"
	gd := guestDir(t, map[string]string{"vmlinux": kernel, "initramfs.cpio": initrd, "disk.img": strings.Repeat("w", 8192)})
	f := newFakeLauncher(t)
	state := t.TempDir()
	td := startDaemon(t, state, f, func(c *Config) { c.GuestDir = gd })
	c := td.client(t, "alice")
	var tp store.Template
	c.ok(201, "POST", "/v1/templates", map[string]any{"kernel": "vmlinux", "initramfs": "initramfs.cpio", "mem_mib": 128,
		"disks": []string{"disk.img", "disk.img,ro"}}, &tp)
	f.mu.Lock()
	run, files := f.lastRun, f.lastRunFiles
	f.mu.Unlock()
	if run.KernelFD != FirstExtraFD || run.InitramfsFD != FirstExtraFD+1 || strings.Contains(fmt.Sprintf("%+v", run), gd) {
		t.Errorf("build %+v: want the kernel's and initramfs's descriptors and no path of the guest directory", run)
	}
	if len(files) != 2 || string(files[0].data) != kernel || string(files[1].data) != initrd {
		t.Fatalf("the VMM's descriptors: %+v", files)
	}
	for i, ff := range files {
		if ff.flags&unix.O_ACCMODE != unix.O_RDONLY {
			t.Errorf("descriptor %d open with flags %#x, want read-only", i, ff.flags)
		}
	}
	tdir := filepath.Join(state, "tenants", "alice", "templates", tp.ID)
	for _, d := range run.Disks {
		if !strings.HasPrefix(d.Path, tdir+"/") {
			t.Errorf("build disk %q is not the template's own copy", d.Path)
		}
	}
	if tp.Kernel != "vmlinux" || tp.Initramfs != "initramfs.cpio" {
		t.Errorf("template records kernel %q initramfs %q, want the names", tp.Kernel, tp.Initramfs)
	}
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		if p, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(p, gd+"/") {
			t.Errorf("the daemon still holds %s open (fd %s)", p, e.Name())
		}
	}
}

// TestGuestDirNotTheOperators: a guest directory anyone else can write
// to (where a local user could plant a link to a file of theirs, or of
// another tenant) or owned by another user is refused, at start and per
// request; a daemon without one refuses templates that name files.
func TestGuestDirNotTheOperators(t *testing.T) {
	open := guestDir(t, nil)
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := CheckGuestDir(open); err == nil || !strings.Contains(err.Error(), "writable by group or others") {
		t.Errorf("a world-writable guest directory: %v", err)
	}
	if os.Geteuid() == 0 {
		other := guestDir(t, nil)
		if err := os.Chown(other, 4242, 4242); err != nil {
			t.Fatal(err)
		}
		if err := CheckGuestDir(other); err == nil || !strings.Contains(err.Error(), "owned by uid 4242") {
			t.Errorf("another user's guest directory: %v", err)
		}
	}
	if err := CheckGuestDir(filepath.Join(open, "vmlinux")); err == nil {
		t.Error("a file as the guest directory")
	}
	f := newFakeLauncher(t)
	td := startDaemon(t, t.TempDir(), f, func(c *Config) { c.GuestDir = open })
	if st, b := td.client(t, "alice").do("POST", "/v1/templates", map[string]any{"kernel": "vmlinux"}); st != 500 && st != 400 || !bytes.Contains(b, []byte("writable by group or others")) {
		t.Errorf("a template from a world-writable guest directory: %d %s", st, b)
	}
	// No guest directory at all.
	d2 := startDaemon(t, t.TempDir(), f, func(c *Config) { c.GuestDir = "-" })
	d2.cfg.GuestDir = ""
	st, b := d2.client(t, "alice").do("POST", "/v1/templates", map[string]any{"kernel": "vmlinux"})
	if st != 400 || !bytes.Contains(b, []byte("no guest directory")) {
		t.Errorf("a daemon without a guest directory: %d %s", st, b)
	}
	if f.starts.Load() != 0 {
		t.Error("a VMM started")
	}
}

// TestGuestForgedOverlayHeader: a hostile guest writes, during its
// template's build, an overlay header naming a host file as its base into
// the first block of its writable raw disk; the build fails (the base
// would be opened as an overlay, and the host file read as its base, by
// every sandbox's restore) and no sandbox can be made of it.
func TestGuestForgedOverlayHeader(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "host.secret")
	os.WriteFile(secret, []byte("host secret"), 0o600)
	gd := guestDir(t, map[string]string{"disk.img": strings.Repeat("\x00", 1<<20)})
	f := newFakeLauncher(t)
	f.duringRun = func(run vmmctl.Run) {
		for _, d := range run.Disks {
			if d.ReadOnly {
				continue
			}
			// The guest's write to sector 0 of /dev/vda: an overlay over
			// the secret, as cow/disk writes one.
			forged := filepath.Join(t.TempDir(), "forged")
			rb, err := disk.OpenRaw(secret, false)
			if err != nil {
				t.Error(err)
				return
			}
			o, err := disk.Create(forged, rb, disk.CreateOptions{BasePath: secret})
			rb.Close()
			if err != nil {
				t.Error(err)
				return
			}
			o.Close()
			hdr := make([]byte, disk.HeaderSize)
			ff, _ := os.Open(forged)
			ff.ReadAt(hdr, 0)
			ff.Close()
			w, err := os.OpenFile(d.Path, os.O_WRONLY, 0)
			if err != nil {
				t.Error(err)
				return
			}
			w.WriteAt(hdr, 0)
			w.Close()
		}
	}
	td := startDaemon(t, t.TempDir(), f, func(c *Config) { c.GuestDir = gd })
	c := td.client(t, "mallory")
	st, b := c.do("POST", "/v1/templates", map[string]any{"kernel": "vmlinux", "mem_mib": 128, "disks": []string{"disk.img"}})
	if st == 201 {
		var tp store.Template
		json.Unmarshal(b, &tp)
		if st2, b2 := c.do("POST", "/v1/sandboxes", map[string]any{"template": tp.ID}); st2 == 201 {
			t.Fatalf("a template whose guest forged an overlay header built, and a sandbox of it started: %s", b2)
		}
		t.Fatalf("a template whose guest forged an overlay header built: %s", b)
	}
	if !strings.Contains(string(b), "overlay header") {
		t.Errorf("build: %d %s", st, b)
	}
}
