package rig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	if _, err := os.Stat("/dev/kvm"); err != nil {
		if err := (Files{}).Check(Needs{}); err == nil || !strings.Contains(err.Error(), "/dev/kvm") {
			t.Fatalf("no /dev/kvm: %v", err)
		}
		t.Skip("skipped past the /dev/kvm check: /dev/kvm is absent")
	}
	dir := t.TempDir()
	var f Files
	for _, p := range []*string{&f.Kernel, &f.Initramfs, &f.Warren} {
		*p = filepath.Join(dir, "file")
	}
	f.QEMU = filepath.Join(dir, "no-qemu")
	if err := f.Check(Needs{}); err != nil {
		t.Errorf("nothing needed: %v", err)
	}
	if err := f.Check(Needs{Files: true}); !os.IsNotExist(err) {
		t.Errorf("absent files: %v", err)
	}
	if err := f.Check(Needs{QEMU: true, Otherwise: ", or --skip-qemu"}); err == nil || !strings.HasSuffix(err.Error(), ", or --skip-qemu") {
		t.Errorf("absent QEMU: %v", err)
	}
	os.WriteFile(f.Kernel, nil, 0o644)
	if err := f.Check(Needs{Files: true}); err != nil {
		t.Errorf("present files: %v", err)
	}
}

func TestWarrenArgv(t *testing.T) {
	f := Files{Kernel: "k", Initramfs: "i", Warren: "w"}
	if got, want := strings.Join(f.WarrenArgv(256, "v.sock", "", "quiet"), " "),
		"w run --kernel k --initramfs i --mem 256 --cpus 1 --vsock v.sock --cid 3 --cmdline quiet"; got != want {
		t.Errorf("without --api: %q, want %q", got, want)
	}
	if got, want := strings.Join(f.WarrenArgv(512, "v.sock", "a.sock", "quiet"), " "),
		"w run --kernel k --initramfs i --mem 512 --cpus 1 --vsock v.sock --cid 3 --api a.sock --cmdline quiet"; got != want {
		t.Errorf("with --api: %q, want %q", got, want)
	}
}
