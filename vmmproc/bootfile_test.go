package vmmproc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReadBootFile: `warren run --kernel-fd N` reads the kernel from an
// inherited descriptor (all of it, whatever its offset) and closes it;
// a descriptor that is not a regular file (a FIFO, a directory), one of
// stdin/stdout/stderr, or both a path and a descriptor are refused.
func TestReadBootFile(t *testing.T) {
	dir := t.TempDir()
	k := filepath.Join(dir, "vmlinux")
	os.WriteFile(k, []byte("kernel bytes"), 0o600)
	f, err := os.Open(k)
	if err != nil {
		t.Fatal(err)
	}
	f.Seek(3, 0) // the daemon's offset does not matter
	fd, err := unix.Dup(int(f.Fd()))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	b, err := readBootFile("kernel", "", fd)
	if err != nil || string(b) != "kernel bytes" {
		t.Fatalf("from a descriptor: %q, %v", b, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil {
		t.Error("the descriptor is still open after it was read")
	}
	if b, err := readBootFile("initramfs", k, -1); err != nil || string(b) != "kernel bytes" {
		t.Errorf("from a path: %q, %v", b, err)
	}
	if b, err := readBootFile("initramfs", "", -1); err != nil || b != nil {
		t.Errorf("neither: %q, %v", b, err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	pfd, err := unix.Open(fifo, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		fd   int
		want string
	}{
		{"", pfd, "not a regular file"},
		{"", dfd, "not a regular file"},
		{"", 0, "not an inherited descriptor"},
		{"", 2, "not an inherited descriptor"},
		{k, 7, "give one"},
	} {
		if _, err := readBootFile("kernel", c.path, c.fd); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("path %q fd %d: %v, want %q", c.path, c.fd, err, c.want)
		}
	}
}
