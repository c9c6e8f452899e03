package memsnap

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// smallChain writes a small base and one incremental layer with several
// chunks and zero runs, and returns their paths.
func smallChain(t *testing.T, dir string) (base, incr string) {
	t.Helper()
	s := newSim(128, 7)
	for p := range 128 {
		copy(s.mem[p*testPS:], fmt.Sprintf("page %d", p))
	}
	o := testOpts()
	o.ChunkPages = 16
	bl, err := WriteBase(filepath.Join(dir, "base"+Ext), s.reader(), uint64(len(s.mem)), o)
	if err != nil {
		t.Fatal(err)
	}
	defer bl.Close()
	s.resetDirty()
	for _, p := range []int{3, 4, 40, 41, 42, 90, 127} {
		copy(s.mem[p*testPS:], fmt.Sprintf("changed page %d", p))
		s.dirty[p/64] |= 1 << (p % 64)
	}
	for _, p := range []int{10, 11, 60} {
		clear(s.mem[p*testPS : (p+1)*testPS])
		s.dirty[p/64] |= 1 << (p % 64)
	}
	o.ChunkPages = 2
	il, err := WriteIncremental(filepath.Join(dir, "incr"+Ext), s.reader(), uint64(len(s.mem)), s.dirty, bl, o)
	if err != nil {
		t.Fatal(err)
	}
	defer il.Close()
	if len(il.ix.zeros) == 0 || len(il.ix.chunks) < 2 {
		t.Fatalf("test layer lacks zero runs or chunks: %+v", il.Stats())
	}
	return bl.Path(), il.Path()
}

// openVerify opens path and verifies it, returning the first error.
func openVerify(path string) error {
	l, err := Open(path)
	if err != nil {
		return err
	}
	defer l.Close()
	return l.Verify()
}

// eachLayer calls fn with the bytes of each layer of a small chain
// (smallChain: the base, then the incremental layer) and the path, beside
// them, that refused writes corrupt copies to.
func eachLayer(t *testing.T, fn func(name string, orig []byte, bad string)) {
	t.Helper()
	dir := t.TempDir()
	base, incr := smallChain(t, dir)
	for _, src := range []string{base, incr} {
		orig, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		fn(filepath.Base(src), orig, filepath.Join(dir, "bad"+Ext))
	}
}

// refused writes b to bad and checks that opening and verifying it fails
// with want, naming the file; what says which corruption b is.
func refused(t *testing.T, bad string, b []byte, want error, what string) {
	t.Helper()
	if err := os.WriteFile(bad, b, 0o600); err != nil {
		t.Fatal(err)
	}
	err := openVerify(bad)
	if !errors.Is(err, want) {
		t.Fatalf("%s: got %v, want %v", what, err, want)
	}
	if !strings.Contains(err.Error(), bad) {
		t.Fatalf("%s: error %q does not name the file", what, err)
	}
}

func TestCorruptTruncate(t *testing.T) {
	eachLayer(t, func(name string, orig []byte, bad string) {
		for n := range len(orig) {
			refused(t, bad, orig[:n], ErrCorrupt, fmt.Sprintf("%s truncated to %d of %d bytes", name, n, len(orig)))
		}
		// Appended garbage is refused too.
		refused(t, bad, append(bytes.Clone(orig), 0), ErrCorrupt, name+" with a byte appended")
	})
}

func TestCorruptFlip(t *testing.T) {
	eachLayer(t, func(name string, orig []byte, bad string) {
		for off := range len(orig) {
			for _, mask := range []byte{0x01, 0x80} {
				b := bytes.Clone(orig)
				b[off] ^= mask
				want := ErrCorrupt
				if off == 8 || off == 9 {
					want = ErrVersion
				}
				refused(t, bad, b, want, fmt.Sprintf("%s byte %d ^ %#x", name, off, mask))
			}
		}
	})
}

func TestWrongVersion(t *testing.T) {
	dir := t.TempDir()
	base, _ := smallChain(t, dir)
	b, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	// A well-formed header of version 2: fix its checksum too.
	binary.LittleEndian.PutUint16(b[8:], 2)
	nl, fl := int(binary.LittleEndian.Uint16(b[64:])), int(binary.LittleEndian.Uint16(b[66:]))
	hl := headerFixedLen + nl + fl
	binary.LittleEndian.PutUint32(b[hl:], crc(b[:hl]))
	if err := os.WriteFile(base, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Open(base)
	if !errors.Is(err, ErrVersion) {
		t.Fatalf("got %v, want ErrVersion", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "version 2") || !strings.Contains(msg, "version 1") || !strings.Contains(msg, base) {
		t.Fatalf("message %q should name the file and both versions", msg)
	}
	if _, err := OpenChain(filepath.Join(dir, "incr"+Ext), nil); !errors.Is(err, ErrMissingParent) {
		t.Fatalf("chain over a version-2 parent: got %v, want ErrMissingParent", err)
	}
}

func TestMissingParent(t *testing.T) {
	tests := []struct {
		name   string
		break_ func(t *testing.T, dir, base string)
	}{
		{"deleted", func(t *testing.T, dir, base string) { os.Remove(base) }},
		{"replaced by another base", func(t *testing.T, dir, base string) {
			s := newRandomSim(128, 99, 10)
			l, err := WriteBase(base, s.reader(), uint64(len(s.mem)), testOpts())
			if err != nil {
				t.Fatal(err)
			}
			l.Close()
		}},
		{"renamed without extension", func(t *testing.T, dir, base string) { os.Rename(base, base+".old") }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			base, incr := smallChain(t, dir)
			tc.break_(t, dir, base)
			_, err := OpenChain(incr, nil)
			if !errors.Is(err, ErrMissingParent) {
				t.Fatalf("got %v, want ErrMissingParent", err)
			}
			t.Log(err)
		})
	}
	t.Run("renamed, found by hash", func(t *testing.T) {
		dir := t.TempDir()
		base, incr := smallChain(t, dir)
		os.Rename(base, filepath.Join(dir, "moved"+Ext))
		c, err := OpenChain(incr, nil)
		if err != nil {
			t.Fatalf("renamed parent should be found by hash: %v", err)
		}
		c.Close()
	})
}

// craftChild writes an incremental layer naming parent with header fields
// WriteIncremental would refuse.
func craftChild(t *testing.T, path string, parent *Layer, edit func(h *Header)) {
	t.Helper()
	h := parent.Header()
	h.Kind = KindIncremental
	h.Parent = parent.Hash()
	h.ParentName = filepath.Base(parent.Path())
	edit(&h)
	o := testOpts()
	if err := o.fill(); err != nil {
		t.Fatal(err)
	}
	o.PageSize = h.PageSize
	l, err := writeLayer(path, &h, &o, func(b *chunkBuilder) error {
		b.add(1, bytes.Repeat([]byte{1}, int(h.PageSize)))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
}

func TestIncompatible(t *testing.T) {
	dir := t.TempDir()
	basePath, _ := smallChain(t, dir)
	base, err := Open(basePath)
	if err != nil {
		t.Fatal(err)
	}
	defer base.Close()
	s := newRandomSim(128, 8, 3)
	size := uint64(len(s.mem))

	o := testOpts()
	o.Fingerprint = []byte("host=other")
	if _, err := WriteIncremental(filepath.Join(dir, "x"+Ext), s.reader(), size, s.dirty, base, o); !errors.Is(err, ErrIncompatible) {
		t.Fatalf("write with other fingerprint: got %v", err)
	}
	if _, err := WriteIncremental(filepath.Join(dir, "x"+Ext), s.reader(), size*2, append(s.dirty, 0, 0), base, testOpts()); !errors.Is(err, ErrIncompatible) {
		t.Fatalf("write with other memory size: got %v", err)
	}
	if err := base.CheckFingerprint([]byte("host=other")); !errors.Is(err, ErrIncompatible) {
		t.Fatalf("CheckFingerprint: got %v", err)
	}
	if err := base.CheckFingerprint(testFP); err != nil {
		t.Fatalf("CheckFingerprint(own): %v", err)
	}

	for _, tc := range []struct {
		name string
		edit func(h *Header)
	}{
		{"fingerprint", func(h *Header) { h.Fingerprint = []byte("host=other") }},
		{"memory size", func(h *Header) { h.MemSize *= 2 }},
		{"page size", func(h *Header) { h.PageSize *= 2 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, "crafted"+Ext)
			craftChild(t, p, base, tc.edit)
			_, err := OpenChain(p, nil)
			if !errors.Is(err, ErrIncompatible) {
				t.Fatalf("got %v, want ErrIncompatible", err)
			}
			t.Log(err)
		})
	}

	c, err := OpenChain(basePath, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Restore(make([]byte, 4096)); !errors.Is(err, ErrIncompatible) {
		t.Fatalf("Restore into short buffer: got %v", err)
	}
}

// resolverFunc adapts a function to Resolver.
type resolverFunc func(Hash, string) (string, error)

func (f resolverFunc) Resolve(h Hash, hint string) (string, error) { return f(h, hint) }

func TestCycle(t *testing.T) {
	dir := t.TempDir()
	_, incr := smallChain(t, dir)
	_, err := OpenChain(incr, resolverFunc(func(Hash, string) (string, error) { return incr, nil }))
	if !errors.Is(err, ErrCycle) {
		t.Fatalf("got %v, want ErrCycle", err)
	}
	_, err = OpenChain(incr, resolverFunc(func(Hash, string) (string, error) { return "", io.ErrUnexpectedEOF }))
	if !errors.Is(err, ErrMissingParent) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("resolver error: got %v", err)
	}
}

func TestStaleHintIgnoredSafely(t *testing.T) {
	for _, hint := range []string{"../x.wsnap", "/etc/passwd", "..", "a/b"} {
		if _, err := Dir(t.TempDir()).Resolve(Hash{1}, hint); !errors.Is(err, ErrMissingParent) {
			t.Fatalf("hint %q: got %v", hint, err)
		}
	}
}

// failingReader fails after n successful reads.
type failingReader struct {
	r io.ReaderAt
	n atomic.Int32
}

func (f *failingReader) ReadAt(p []byte, off int64) (int, error) {
	if f.n.Add(-1) < 0 {
		return 0, errors.New("injected read failure")
	}
	return f.r.ReadAt(p, off)
}

func TestWriteFailureKeepsOldFile(t *testing.T) {
	dir := t.TempDir()
	s := newRandomSim(1024, 9, 500)
	path := filepath.Join(dir, "snap"+Ext)
	old := mustBase(t, path, s)
	oldBytes, _ := os.ReadFile(path)
	s.writeRandom(500)
	for _, n := range []int32{0, 1, 5, 20} {
		o := testOpts()
		o.ChunkPages = 8
		_, err := WriteBase(path, &failingReader{r: s.reader(), n: func() (a atomic.Int32) { a.Store(n); return }()}, uint64(len(s.mem)), o)
		if err == nil || !strings.Contains(err.Error(), "injected") {
			t.Fatalf("after %d reads: got %v, want injected failure", n, err)
		}
		_, err = WriteIncremental(path, &failingReader{r: s.reader(), n: func() (a atomic.Int32) { a.Store(n); return }()}, uint64(len(s.mem)), s.dirty, old, o)
		if err == nil {
			t.Fatalf("incremental after %d reads: no error", n)
		}
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, oldBytes) {
		t.Fatal("old file changed")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("directory holds %d entries, want only the old layer (temp files removed)", len(ents))
	}
	// Writing into a missing directory fails cleanly.
	if _, err := WriteBase(filepath.Join(dir, "no", "x"+Ext), s.reader(), uint64(len(s.mem)), testOpts()); err == nil {
		t.Fatal("write into missing directory succeeded")
	}
}

// slowReader sleeps on every read so a writer can be killed midway.
type slowReader struct{ r io.ReaderAt }

func (s slowReader) ReadAt(p []byte, off int64) (int, error) {
	time.Sleep(5 * time.Millisecond)
	return s.r.ReadAt(p, off)
}

// TestHelperSlowWriter is the child process of TestKilledWriterKeepsOldFile.
func TestHelperSlowWriter(t *testing.T) {
	path := os.Getenv("MEMSNAP_SLOW_WRITE")
	if path == "" {
		t.Skip("helper process only")
	}
	s := newRandomSim(4096, 10, 4000)
	o := testOpts()
	o.ChunkPages = 1
	WriteBase(path, slowReader{s.reader()}, uint64(len(s.mem)), o)
	t.Fatal("writer finished before being killed")
}

func TestKilledWriterKeepsOldFile(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a process")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "snap"+Ext)
	s := newRandomSim(64, 11, 64)
	old := mustBase(t, path, s)
	oldHash := old.Hash()
	oldBytes, _ := os.ReadFile(path)

	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperSlowWriter$")
	cmd.Env = append(os.Environ(), "MEMSNAP_SLOW_WRITE="+path)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait until the child's temporary file has chunks in it.
	deadline := time.Now().Add(20 * time.Second)
	for {
		tmps, _ := filepath.Glob(filepath.Join(dir, ".snap"+Ext+"[0-9]*"))
		if len(tmps) == 1 {
			if st, err := os.Stat(tmps[0]); err == nil && st.Size() > 64<<10 {
				break
			}
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("child never wrote its temporary file")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()

	if b, _ := os.ReadFile(path); !bytes.Equal(b, oldBytes) {
		t.Fatal("old file changed by a killed writer")
	}
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Hash() != oldHash || l.Verify() != nil {
		t.Fatal("old layer no longer verifies")
	}
	// The partial temporary file is not a valid layer.
	tmps, _ := filepath.Glob(filepath.Join(dir, ".snap"+Ext+"[0-9]*"))
	if len(tmps) != 1 {
		t.Fatalf("temporary files %v", tmps)
	}
	if err := openVerify(tmps[0]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("partial file: got %v, want ErrCorrupt", err)
	}
}
