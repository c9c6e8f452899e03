//go:build linux

package etc

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := os.WriteFile(p, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadFile(p, 5); err != nil || string(b) != "hello" {
		t.Errorf("ReadFile: %q, %v", b, err)
	}
	if _, err := ReadFile(p, 4); !errors.Is(err, ErrTooLarge) {
		t.Errorf("over the bound: %v", err)
	}
	if _, err := ReadFile(filepath.Join(dir, "missing"), 5); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
	if _, err := ReadFile(dir, 5); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("directory: %v", err)
	}
	// A FIFO must be refused, not block the reader (nobody writes it).
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(fifo, 5); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("FIFO: %v", err)
	}
	if _, err := ReadFile("/dev/zero", 5); err == nil {
		t.Error("/dev/zero read")
	}
}

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "hosts")
	if err := WriteFile(p, []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A symlink at the path is replaced, not written through.
	target := filepath.Join(dir, "target")
	link := filepath.Join(dir, "resolv.conf")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(link, []byte("nameserver 10.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(target); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the symlink's target was written: %v", err)
	}
	fi, err := os.Lstat(link)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
		t.Errorf("replaced symlink: %v, %v", fi.Mode(), err)
	}
	if err := WriteFile(p, []byte("two\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "two\n" {
		t.Errorf("content %q", b)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", fi.Mode())
	}
	// The same bytes and mode again: the file is left alone (same inode).
	before, _ := os.Stat(p)
	if err := WriteFile(p, []byte("two\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(p); !os.SameFile(before, after) {
		t.Error("an unchanged file was rewritten")
	}
	if err := WriteFile(p, []byte("two\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.Stat(p); os.SameFile(before, after) || after.Mode().Perm() != 0o644 {
		t.Error("a mode change was not written")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Errorf("temporary files left: %v", ents)
	}
	if err := WriteFile(filepath.Join(dir, "nodir", "f"), nil, 0o644); err == nil {
		t.Error("write into a missing directory succeeded")
	}
}

func TestLookupUser(t *testing.T) {
	dir := t.TempDir()
	if c, err := LookupUser(dir, "0"); err != nil || c.UID != 0 || c.Home != "/" {
		t.Errorf("no files: %+v, %v", c, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "passwd"), []byte(testPasswd), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "group"), []byte(testGroup), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := LookupUser(dir, "app")
	if err != nil || c.UID != 1000 || len(c.Groups) != 2 || c.Home != "/home/app" {
		t.Errorf("app: %+v, %v", c, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "group"), []byte("bad\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LookupUser(dir, "app"); err == nil {
		t.Error("a malformed group file was accepted")
	}
}

func TestWriteHostname(t *testing.T) {
	dir := t.TempDir()
	// Nothing there and create false: nothing made.
	if err := WriteHostname(dir, "box", false); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("files made without create: %v", ents)
	}
	if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte("10.0.0.1 db\n127.0.1.1 old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteHostname(dir, "box", true); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "hostname")); string(b) != "box\n" {
		t.Errorf("hostname file %q", b)
	}
	want := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n10.0.0.1 db\n127.0.1.1\tbox\n"
	if b, _ := os.ReadFile(filepath.Join(dir, "hosts")); string(b) != want {
		t.Errorf("hosts %q, want %q", b, want)
	}
	// An update (a fork's new name) edits what is there.
	if err := WriteHostname(dir, "fork-2", false); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "hostname")); string(b) != "fork-2\n" {
		t.Errorf("hostname file %q after the update", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "hosts")); !strings.Contains(string(b), "127.0.1.1\tfork-2\n") || strings.Contains(string(b), "box") {
		t.Errorf("hosts after the update: %q", b)
	}
}
