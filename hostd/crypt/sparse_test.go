package crypt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// allocated is the number of bytes the file system holds for path.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// sparseFixture writes a 64 MiB file with data in three places (one at
// the very end) and returns its path and content regions.
func sparseFixture(t *testing.T, dir string) (string, map[int64][]byte) {
	t.Helper()
	path := filepath.Join(dir, "disk0.overlay")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o400)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const size = 64 << 20
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	parts := map[int64][]byte{
		0:              randBytes(1, 4096),
		20<<20 + 512:   randBytes(2, 300<<10),
		size - 8192:    randBytes(3, 8192),
		40 << 20:       bytes.Repeat([]byte("needle-in-the-disk "), 100),
		40<<20 + 65536: make([]byte, 4096), // zeros written as data
	}
	for off, b := range parts {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	return path, parts
}

func TestSparseRoundTrip(t *testing.T) {
	p, key, _ := provider(t)
	dir := t.TempDir()
	path, parts := sparseFixture(t, dir)
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// A confined VMM's layer: its uid's, its family's group (as root,
	// the daemon keeps both across sealing and unsealing).
	const uid, gid = 1234567, 1234568
	asRoot := os.Geteuid() == 0
	if asRoot {
		if err := os.Chown(path, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	owned := func(when string) {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); asRoot && (st.Uid != uid || st.Gid != gid) {
			t.Errorf("owner %d:%d after %s, want %d:%d", st.Uid, st.Gid, when, uid, gid)
		}
	}
	if err := EncryptSparseFile(path, path, key); err != nil {
		t.Fatal(err)
	}
	sealed, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(sealed, []byte(Magic)) {
		t.Fatal("not sealed in place")
	}
	if len(sealed) > 2<<20 {
		t.Errorf("sealed file is %d bytes: the holes were encrypted", len(sealed))
	}
	if bytes.Contains(sealed, []byte("needle-in-the-disk")) {
		t.Error("plaintext in the sealed file")
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o400 {
		t.Errorf("mode %v after sealing, want 0400", fi.Mode().Perm())
	}
	owned("sealing")
	// The wrong tenant's key and a revoked key are refused; path is intact.
	if err := DecryptSparseFile(path, path, p, "other"); !errors.Is(err, ErrWrongKey) {
		t.Errorf("other tenant: %v, want ErrWrongKey", err)
	}
	p.revoked["acme"] = true
	if err := DecryptSparseFile(path, path, p, "acme"); !errors.Is(err, ErrRevoked) {
		t.Errorf("revoked: %v, want ErrRevoked", err)
	}
	p.revoked["acme"] = false
	if err := DecryptSparseFile(path, path, p, "acme"); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("content differs after the round trip")
	}
	for off, b := range parts {
		if !bytes.Equal(got[off:off+int64(len(b))], b) {
			t.Errorf("region at %d differs", off)
		}
	}
	if a := allocated(t, path); a > 4<<20 {
		t.Errorf("%d bytes allocated after unsealing a file with <1 MiB of data: holes were filled", a)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o400 {
		t.Errorf("mode %v after unsealing, want 0400", fi.Mode().Perm())
	}
	owned("unsealing")
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("stray files: %v", ents)
	}
}

func TestSparseEmptyAndHoleOnly(t *testing.T) {
	p, key, _ := provider(t)
	for _, size := range []int64{0, 1 << 20} {
		path := filepath.Join(t.TempDir(), "d")
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(path, size); err != nil {
			t.Fatal(err)
		}
		if err := EncryptSparseFile(path, path, key); err != nil {
			t.Fatal(err)
		}
		if err := DecryptSparseFile(path, path, p, "acme"); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(path)
		if int64(len(b)) != size || !bytes.Equal(b, make([]byte, size)) {
			t.Errorf("size %d: got %d bytes back", size, len(b))
		}
	}
}

// TestSparseTamper: a flipped byte anywhere in a sealed file, or a file
// sealed whole (not packed), is refused and leaves the destination alone.
func TestSparseTamper(t *testing.T) {
	p, key, _ := provider(t)
	dir := t.TempDir()
	path, _ := sparseFixture(t, dir)
	if err := EncryptSparseFile(path, path, key); err != nil {
		t.Fatal(err)
	}
	sealed, _ := os.ReadFile(path)
	for _, off := range []int{10, HeaderSize + 3, HeaderSize + 70000, len(sealed) - 1} {
		bad := bytes.Clone(sealed)
		bad[off] ^= 0x40
		src := filepath.Join(dir, "bad")
		dst := filepath.Join(dir, "out")
		os.WriteFile(src, bad, 0o600)
		os.WriteFile(dst, []byte("previous"), 0o600)
		if err := DecryptSparseFile(dst, src, p, "acme"); err == nil {
			t.Errorf("flip at %d: accepted", off)
		}
		if b, _ := os.ReadFile(dst); string(b) != "previous" {
			t.Errorf("flip at %d: destination changed", off)
		}
	}
	// Sealed whole, not packed.
	plain := filepath.Join(dir, "plain")
	os.WriteFile(plain, []byte("just some bytes, not a packed sparse file"), 0o600)
	if err := EncryptFile(plain, plain, key); err != nil {
		t.Fatal(err)
	}
	if err := DecryptSparseFile(plain, plain, p, "acme"); !errors.Is(err, ErrSparseFormat) {
		t.Errorf("whole-sealed file: %v, want ErrSparseFormat", err)
	}
}

// TestUnpackSparseChecks feeds unpackSparse packed forms that authenticate
// but lie about their extents.
func TestUnpackSparseChecks(t *testing.T) {
	pack := func(size uint64, exts [][2]uint64, data int) []byte {
		b := []byte(SparseMagic)
		b = binary.BigEndian.AppendUint64(b, size)
		b = binary.BigEndian.AppendUint64(b, uint64(len(exts)))
		for _, e := range exts {
			b = binary.BigEndian.AppendUint64(b, e[0])
			b = binary.BigEndian.AppendUint64(b, e[1])
		}
		return append(b, make([]byte, data)...)
	}
	for name, c := range map[string][]byte{
		"overlap":      pack(100, [][2]uint64{{0, 10}, {5, 10}}, 20),
		"empty":        pack(100, [][2]uint64{{0, 0}}, 0),
		"past size":    pack(100, [][2]uint64{{95, 10}}, 10),
		"short data":   pack(100, [][2]uint64{{0, 10}}, 9),
		"extra data":   pack(100, [][2]uint64{{0, 10}}, 11),
		"many extents": pack(100, make([][2]uint64, 0), 0)[:16],
		"huge count":   append(pack(100, nil, 0)[:16], 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0),
		"wrap":         pack(100, [][2]uint64{{10, 1<<64 - 5}}, 0),
	} {
		f, err := os.Create(filepath.Join(t.TempDir(), "x"))
		if err != nil {
			t.Fatal(err)
		}
		err = unpackSparse(f, bytes.NewReader(c), int64(len(c)))
		f.Close()
		if !errors.Is(err, ErrSparseFormat) {
			t.Errorf("%s: %v, want ErrSparseFormat", name, err)
		} else if !strings.Contains(err.Error(), "packed sparse") {
			t.Errorf("%s: unclear error %q", name, err)
		}
	}
}
