package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenvm/warren/cow/disk"
)

// TestFlattenCmd forks a raw image (as warren fork does), writes through a
// child's overlay, and flattens it: the raw image is the child's disk.
func TestFlattenCmd(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	base := bytes.Repeat([]byte("base"), 64<<10) // 256 KiB
	if err := os.WriteFile(img, base, 0o644); err != nil {
		t.Fatal(err)
	}
	raw, err := disk.OpenRaw(img, true)
	if err != nil {
		t.Fatal(err)
	}
	parent, kids, err := disk.Fork(raw, 1, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	child, err := disk.OpenChain(kids[0], false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := child.WriteAt([]byte("child!"), 4096); err != nil {
		t.Fatal(err)
	}
	if err := child.Close(); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "flat.img")
	code, stdout, stderr := cli(t, nil, "flatten", kids[0], out)
	if code != 0 || !strings.Contains(stdout, "flattened") {
		t.Fatalf("warren flatten: exit %d: %s%s", code, stdout, stderr)
	}
	want := bytes.Clone(base)
	copy(want[4096:], "child!")
	if got, err := os.ReadFile(out); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("flattened image differs from the child's disk (err %v)", err)
	}
	if code, _, _ := cli(t, nil, "flatten", kids[0], out); code == 0 {
		t.Error("flatten over an existing file succeeded")
	}
	if code, _, _ := cli(t, nil, "flatten", img); code != 2 {
		t.Error("flatten with one argument did not fail with usage")
	}
}
