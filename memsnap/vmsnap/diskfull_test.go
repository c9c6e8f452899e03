package vmsnap

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenvm/warren/internal/kvmtest"
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
	return strings.Join(n, " ")
}

// fill writes a file in dir until the file system is full.
func fill(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "filler")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return p
			}
			t.Fatal(err)
		}
	}
}

// TestSnapshotDiskFullRunsOn takes snapshots of the running counter guest
// into a file system that fills up: the snapshot fails with ENOSPC, the
// guest is left running (it counts on), the previous snapshot still loads
// with the memory it had, and once there is room again snapshots succeed
// and hold the guest's memory as it was in their pause (an incremental
// one either does, or is refused with a request for a full one).
func TestSnapshotDiskFullRunsOn(t *testing.T) {
	kvmtest.Require(t)
	dir := smallFS(t, "64m")
	c := startSnappedCounter(t, `{"test":"diskfull"}`)
	vm, s, fp := c.vm, c.s, c.fp
	defer c.stop()
	check := func(name string, want []byte) {
		t.Helper()
		sn, err := Load(filepath.Join(dir, name), hostIs(fp))
		if err != nil {
			t.Fatalf("load %s: %v", name, err)
		}
		defer sn.Close()
		if !bytes.Equal(readAll(t, sn), want) {
			t.Errorf("%s: memory differs from the guest's in its pause", name)
		}
	}

	if _, err := s.Take(context.Background(), filepath.Join(dir, "s0"), Full); err != nil {
		t.Fatal(err)
	}
	ram0 := c.ram
	// Pages written as a device would, before the failing snapshot: the
	// next good one must hold them.
	if err := vm.Pause(context.Background()); err != nil {
		t.Fatal(err)
	}
	page := bytes.Repeat([]byte{0x5a}, pageSize)
	for p := range 32 {
		vm.Memory().WriteAt(page, int64(extraGPA+p*pageSize))
	}
	if err := vm.Resume(); err != nil {
		t.Fatal(err)
	}

	filler := fill(t, dir)
	for _, kind := range []Kind{Incremental, Full} {
		_, err := s.Take(context.Background(), filepath.Join(dir, "s1"), kind)
		if !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("%s snapshot on a full file system: %v, want ENOSPC", kind, err)
		}
		before := counter(vm)
		kvmtest.WaitFor(t, 2*time.Minute, "the guest to count on after the failed snapshot", func() bool { return counter(vm) > before+1000 })
	}
	check("s0", ram0)

	os.Remove(filler)
	_, err := s.Take(context.Background(), filepath.Join(dir, "s1"), Incremental)
	switch {
	case err == nil:
		check("s1", c.ram)
	case strings.Contains(err.Error(), "take a full one"):
		t.Logf("incremental after the failure refused: %v", err)
	default:
		t.Fatalf("incremental snapshot with room: %v", err)
	}
	if _, err := s.Take(context.Background(), filepath.Join(dir, "s2"), Full); err != nil {
		t.Fatal(err)
	}
	check("s2", c.ram)
	if !bytes.Contains(c.ram[extraGPA:extraGPA+32*pageSize], page) {
		t.Error("the pages written before the failed snapshot are not in the next one")
	}
	if strings.Contains(c.con.String(), "X") {
		t.Fatalf("the guest failed: %q", c.con.String())
	}
}
