package uffd

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/warrenvm/warren/memsnap"
)

func sampleSet() *WorkingSet {
	w := &WorkingSet{PageSize: 4096, MemSize: 1 << 20, Top: memsnap.Hash{1, 2, 3}}
	for _, p := range []uint64{7, 8, 9, 200, 3, 4, 255, 0} {
		w.Runs = AppendPage(w.Runs, p)
	}
	return w
}

// TestWorkingSetRoundTrip: a working set encodes to runs and back.
func TestWorkingSetRoundTrip(t *testing.T) {
	w := sampleSet()
	if want := []Run{{7, 3}, {200, 1}, {3, 2}, {255, 1}, {0, 1}}; !slices.Equal(w.Runs, want) {
		t.Fatalf("runs %v, want %v", w.Runs, want)
	}
	b, err := w.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseWorkingSet(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.PageSize != w.PageSize || got.MemSize != w.MemSize || got.Top != w.Top || !slices.Equal(got.Runs, w.Runs) || got.NumPages() != 8 {
		t.Fatalf("read back %+v, wrote %+v", got, w)
	}
}

// reseal rewrites b's checksum after an edit.
func reseal(b []byte) []byte {
	n := len(b) - 4
	binary.LittleEndian.PutUint32(b[n:], crc32.Checksum(b[:n], castagnoli))
	return b
}

// TestWorkingSetRefused: ParseWorkingSet refuses every kind of malformed
// file, MarshalBinary what it would refuse.
func TestWorkingSetRefused(t *testing.T) {
	good, err := sampleSet().MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	edit := func(f func(b []byte) []byte) []byte { return f(slices.Clone(good)) }
	for name, b := range map[string][]byte{
		"empty":             nil,
		"short":             good[:40],
		"truncated":         good[:len(good)-1],
		"longer":            append(slices.Clone(good), 0),
		"bad magic":         edit(func(b []byte) []byte { b[0] = 'X'; return reseal(b) }),
		"version 2":         edit(func(b []byte) []byte { le.PutUint16(b[8:], 2); return reseal(b) }),
		"reserved":          edit(func(b []byte) []byte { b[10] = 1; return reseal(b) }),
		"reserved 2":        edit(func(b []byte) []byte { b[60] = 1; return reseal(b) }),
		"checksum":          edit(func(b []byte) []byte { b[30] ^= 1; return b }),
		"page size 3000":    edit(func(b []byte) []byte { le.PutUint32(b[12:], 3000); return reseal(b) }),
		"memory 0":          edit(func(b []byte) []byte { le.PutUint64(b[16:], 0); return reseal(b) }),
		"memory 2 TiB":      edit(func(b []byte) []byte { le.PutUint64(b[16:], 2<<40); return reseal(b) }),
		"run count":         edit(func(b []byte) []byte { le.PutUint32(b[56:], 99); return reseal(b) }),
		"huge run count":    edit(func(b []byte) []byte { le.PutUint32(b[56:], 1<<31); return reseal(b) }),
		"empty run":         edit(func(b []byte) []byte { le.PutUint32(b[64+8:], 0); return reseal(b) }),
		"run past memory":   edit(func(b []byte) []byte { le.PutUint64(b[64:], 255); return reseal(b) }),
		"run count past":    edit(func(b []byte) []byte { le.PutUint32(b[64+8:], 1<<30); return reseal(b) }),
		"overlapping runs":  edit(func(b []byte) []byte { le.PutUint64(b[64+12:], 8); return reseal(b) }),
		"page far past end": edit(func(b []byte) []byte { le.PutUint64(b[64:], 1<<62); return reseal(b) }),
	} {
		if _, err := ParseWorkingSet(b); !errors.Is(err, ErrCorruptWorkingSet) {
			t.Errorf("%s: %v, want ErrCorruptWorkingSet", name, err)
		}
	}
	for name, w := range map[string]*WorkingSet{
		"twice":       {PageSize: 4096, MemSize: 1 << 20, Runs: []Run{{1, 2}, {2, 1}}},
		"outside":     {PageSize: 4096, MemSize: 1 << 20, Runs: []Run{{256, 1}}},
		"page size":   {PageSize: 100, MemSize: 1 << 20},
		"memory size": {PageSize: 4096, MemSize: 100},
	} {
		if _, err := w.MarshalBinary(); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
}

// TestReadWorkingSetFile: a missing, corrupt or stale file is an error
// (the caller logs and ignores it); a good one reads back.
func TestReadWorkingSetFile(t *testing.T) {
	dir := t.TempDir()
	c, _ := testChain(t, dir, 12)
	defer c.Close()
	w := &WorkingSet{PageSize: c.PageSize(), MemSize: c.MemSize(), Top: c.Top().Hash(), Runs: []Run{{5, 10}}}
	path := filepath.Join(dir, "ws")
	if err := WriteWorkingSet(path, w); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadWorkingSet(path, c); err != nil || !slices.Equal(got.Runs, w.Runs) {
		t.Fatalf("read %+v, %v", got, err)
	}
	if _, err := ReadWorkingSet(filepath.Join(dir, "missing"), c); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	stale := *w
	stale.Top[0] ^= 1
	if err := WriteWorkingSet(path, &stale); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadWorkingSet(path, c); !errors.Is(err, ErrStale) {
		t.Errorf("stale file: %v", err)
	}
	if err := os.WriteFile(path, []byte("WSNAPWSS garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadWorkingSet(path, c); !errors.Is(err, ErrCorruptWorkingSet) {
		t.Errorf("corrupt file: %v", err)
	}
}

// FuzzWorkingSet: ParseWorkingSet never panics, and what it accepts
// encodes back to the same bytes.
func FuzzWorkingSet(f *testing.F) {
	good, err := sampleSet().MarshalBinary()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:64])
	f.Add([]byte("WSNAPWSS"))
	f.Fuzz(func(t *testing.T, b []byte) {
		w, err := ParseWorkingSet(b)
		if err != nil {
			if !errors.Is(err, ErrCorruptWorkingSet) {
				t.Fatalf("error %v does not wrap ErrCorruptWorkingSet", err)
			}
			return
		}
		out, err := w.MarshalBinary()
		if err != nil {
			t.Fatalf("accepted %x but cannot encode it: %v", b, err)
		}
		if string(out) != string(b) {
			t.Fatalf("accepted %x, encodes back as %x", b, out)
		}
	})
}
