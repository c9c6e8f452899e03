package vmsnap

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

// smallFS mounts a tmpfs of size bytes on a new directory (root only) and
// unmounts it at the end.
func smallFS(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size="+size); err != nil {
		if errors.Is(err, syscall.EPERM) {
			t.Skip("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// TestDiskFullKeepsPreviousSnapshot: a snapshot written to a file system
// that fills up fails with ENOSPC, and the snapshot of the same name
// written before still loads with its memory, nothing half written is
// left behind, and once space is freed the next write succeeds.
func TestDiskFullKeepsPreviousSnapshot(t *testing.T) {
	dir := smallFS(t, "12m")
	small := randomImage(testMem, 1, []uint64{0, 7, 4000})
	write := func(mem []byte) (*Result, error) {
		return Write(filepath.Join(dir, "s"), &Capture{Kind: Full, State: fakeState(uint64(len(mem)), "blk0"),
			Devices: fakeDevices("blk0"), Fingerprint: testFP, Memory: bytes.NewReader(mem)})
	}
	if _, err := write(small); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadDir(dir)

	// 16 MiB of pages that do not compress away: more than is left.
	full := randomImage(testMem, 2, allPages(testMem))
	_, err := write(full)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("write on a full file system: %v, want ENOSPC", err)
	}
	t.Logf("the error: %v", err)

	s, err := Load(filepath.Join(dir, "s"), hostIs(testFP))
	if err != nil {
		t.Fatalf("the previous snapshot no longer loads: %v", err)
	}
	if !bytes.Equal(readAll(t, s), small) {
		t.Error("the previous snapshot's memory changed")
	}
	s.Close()
	after, _ := os.ReadDir(dir)
	if names(before) != names(after) {
		t.Errorf("files before the failed write %s, after %s", names(before), names(after))
	}

	// With room again (a bigger file system), the same write succeeds.
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_REMOUNT, "size=64m"); err != nil {
		t.Fatal(err)
	}
	if _, err := write(full); err != nil {
		t.Fatalf("write with room: %v", err)
	}
	s, err = Load(filepath.Join(dir, "s"), hostIs(testFP))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !bytes.Equal(readAll(t, s), full) {
		t.Error("the new snapshot's memory differs")
	}
}

func allPages(size uint64) []uint64 {
	var p []uint64
	for i := uint64(0); i < size/pageSize; i++ {
		p = append(p, i)
	}
	return p
}

func names(ents []os.DirEntry) string {
	var n []string
	for _, e := range ents {
		n = append(n, e.Name())
	}
	slices.Sort(n)
	return fmtList(n)
}

func fmtList(n []string) string {
	b, _ := json.Marshal(n)
	return string(b)
}
