package disk

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// forkName is the name Fork gives files forked from a disk with stem
// "disk".
var forkName = regexp.MustCompile(`^disk\.[0-9a-f]{1,16}-[0-9a-f]{8}\.wcow$`)

// openWrite opens the top of a chain writable, checks its view against
// model and writes to it (and the model); the caller closes it.
func openWrite(t *testing.T, path string, model []byte, seed uint64) *Overlay {
	t.Helper()
	o, err := OpenChain(path, false)
	if err != nil {
		t.Fatalf("OpenChain(%s): %v", filepath.Base(path), err)
	}
	checkView(t, o, model, false)
	writeRandom(t, o, model, o.BlockSize(), 30, seed)
	return o
}

func checkForkFiles(t *testing.T, dir string, base string, paths ...string) {
	t.Helper()
	seen := map[string]bool{}
	for _, p := range paths {
		if filepath.Dir(p) != dir || !forkName.MatchString(filepath.Base(p)) || seen[p] {
			t.Errorf("fork file %s: not a fresh disk.<unique>.wcow in %s", p, dir)
		}
		seen[p] = true
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		h, err := readHeader(f)
		f.Close()
		if err != nil || h.BasePath != base {
			t.Errorf("%s: base path %q (%v), want %q", filepath.Base(p), h.BasePath, err, base)
		}
	}
}

// TestForkRaw forks a VM running on a raw image: the image freezes and
// stays open, shared-locked, under the parent's overlay, while the
// children open their chains over it.
func TestForkRaw(t *testing.T) {
	const size = 3<<20 + 8192
	dir := t.TempDir()
	base := writeBase(t, dir, "disk.img", pattern(size, 7))
	r, err := OpenRaw(base, true)
	if err != nil {
		t.Fatal(err)
	}
	model := pattern(size, 7)
	writeRandom(t, r, model, DefaultBlockSize, 20, 1) // the parent ran for a while

	parent, kids, err := Fork(r, 2, dir)
	if err != nil {
		t.Fatal(err)
	}
	checkForkFiles(t, dir, "disk.img", append([]string{parent.Path()}, kids...)...)
	if len(kids) != 2 || parent.Base() != Backing(r) {
		t.Fatalf("%d children; parent's base %T", len(kids), parent.Base())
	}
	// The image is frozen: no more writes, and locked shared.
	if _, err := r.WriteAt([]byte{1}, 0); err == nil {
		t.Error("frozen image took a write")
	}
	if err := r.Discard(0, 4096); err == nil {
		t.Error("frozen image took a discard")
	}
	if w, err := OpenRaw(base, true); err == nil {
		w.Close()
		t.Error("frozen image opened for writing")
	}

	// Children open their chains while the parent runs; everyone starts
	// from the fork-time content and writes independently.
	pm, k0m, k1m := bytes.Clone(model), bytes.Clone(model), bytes.Clone(model)
	checkView(t, parent, pm, false)
	writeRandom(t, parent, pm, parent.BlockSize(), 30, 2)
	k0 := openWrite(t, kids[0], k0m, 3)
	k1 := openWrite(t, kids[1], k1m, 4)
	checkView(t, parent, pm, false)
	checkView(t, k0, k0m, true) // and Flatten gives the child's content
	checkView(t, k1, k1m, false)
	checkView(t, r, model, false)
	for _, o := range []*Overlay{k0, k1} {
		if err := o.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// The parent's overlay owns the image: closing it releases the lock.
	if err := parent.Close(); err != nil {
		t.Fatal(err)
	}
	w, err := OpenRaw(base, true)
	if err != nil {
		t.Fatalf("image still locked after the parent's Close: %v", err)
	}
	w.Close()
	// And everything reopens from the files alone.
	for _, c := range []struct {
		path  string
		model []byte
	}{{parent.Path(), pm}, {kids[0], k0m}, {kids[1], k1m}} {
		o, err := OpenChain(c.path, true)
		if err != nil {
			t.Fatal(err)
		}
		checkView(t, o, c.model, false)
		o.Close()
	}
}

// TestForkStack forks an overlay chain twice, from the parent's overlay
// each time: a grandchild's chain has three overlays over the raw base,
// opens while the parent's process holds all of them, and its names do
// not grow.
func TestForkStack(t *testing.T) {
	const size = 2<<20 + 4096
	dir := t.TempDir()
	m0 := pattern(size, 9)
	base := writeBase(t, dir, "base.img", m0)
	r, err := OpenRaw(base, false)
	if err != nil {
		t.Fatal(err)
	}
	top := filepath.Join(dir, "disk.wcow")
	o, err := Create(top, r, CreateOptions{BlockSize: 16 << 10, BasePath: "base.img"})
	if err != nil {
		t.Fatal(err)
	}
	o.Close()
	r.Close()
	cur, err := OpenChain(top, false) // owns its base
	if err != nil {
		t.Fatal(err)
	}
	m1 := bytes.Clone(m0)
	writeRandom(t, cur, m1, cur.BlockSize(), 30, 1)

	p1, kids1, err := Fork(cur, 1, dir)
	if err != nil {
		t.Fatal(err)
	}
	checkForkFiles(t, dir, "disk.wcow", p1.Path(), kids1[0])
	m2 := bytes.Clone(m1)
	writeRandom(t, p1, m2, p1.BlockSize(), 30, 2)

	p2, kids2, err := Fork(p1, 2, dir)
	if err != nil {
		t.Fatal(err)
	}
	checkForkFiles(t, dir, filepath.Base(p1.Path()), append([]string{p2.Path()}, kids2...)...)
	pm := bytes.Clone(m2)
	writeRandom(t, p2, pm, p2.BlockSize(), 30, 3)

	// Every chain opens while the parent holds the stack open.
	c1m, g0m, g1m := bytes.Clone(m1), bytes.Clone(m2), bytes.Clone(m2)
	c1 := openWrite(t, kids1[0], c1m, 4)
	g0 := openWrite(t, kids2[0], g0m, 5)
	g1 := openWrite(t, kids2[1], g1m, 6)
	if b, ok := g0.Base().(*Overlay); !ok || b.Path() != p1.Path() {
		t.Fatalf("grandchild's base %T", g0.Base())
	} else if bb, ok := b.Base().(*Overlay); !ok || bb.Path() != top {
		t.Fatalf("grandchild's base's base %T", b.Base())
	}
	checkView(t, p2, pm, false)
	checkView(t, c1, c1m, false)
	checkView(t, g0, g0m, true)
	checkView(t, g1, g1m, false)
	checkView(t, p1, m2, false)
	checkView(t, cur, m1, false)
	if _, err := p1.WriteAt([]byte{1}, 0); err == nil {
		t.Error("frozen overlay took a write")
	}
	for _, o := range []*Overlay{c1, g0, g1} {
		if err := o.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// Closing the parent's overlay closes the whole stack, releasing every
	// lock.
	if err := p2.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{top, p1.Path()} {
		o, err := OpenChain(p, false)
		if err != nil {
			t.Fatalf("%s still locked after the parent's Close: %v", filepath.Base(p), err)
		}
		o.Close()
	}
	if w, err := OpenRaw(base, true); err != nil {
		t.Fatalf("base still locked: %v", err)
	} else {
		w.Close()
	}
}

// TestForkOtherDir: children in another directory record the absolute
// path of the frozen disk.
func TestForkOtherDir(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	base := writeBase(t, dir, "disk.img", pattern(1<<20, 3))
	r, err := OpenRaw(base, true)
	if err != nil {
		t.Fatal(err)
	}
	parent, kids, err := Fork(r, 1, other)
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	checkForkFiles(t, other, base, parent.Path(), kids[0])
	k, err := OpenChain(kids[0], false)
	if err != nil {
		t.Fatal(err)
	}
	checkView(t, k, pattern(1<<20, 3), false)
	k.Close()
}

// TestForkDeferred: children that make their own overlays (another uid
// each, in directories the parent may not write) get none from the fork,
// only the paths to make them at and the frozen image, which is now
// readable by the group; CreateChild makes an overlay that sees the
// disk as it was at the fork, once.
func TestForkDeferred(t *testing.T) {
	const size = 2<<20 + 4096
	dir, kidDirs := t.TempDir(), []string{t.TempDir(), t.TempDir()}
	base := writeBase(t, dir, "disk.img", pattern(size, 11))
	os.Chmod(base, 0o600)
	r, err := OpenRaw(base, true)
	if err != nil {
		t.Fatal(err)
	}
	model := pattern(size, 11)
	writeRandom(t, r, model, DefaultBlockSize, 10, 1)
	parent, kids, frozen, err := ForkDeferred(r, "", kidDirs)
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	if frozen != base || len(kids) != 2 {
		t.Fatalf("frozen %q, %d children; want %q, 2", frozen, len(kids), base)
	}
	if fi, _ := os.Stat(base); fi.Mode().Perm() != 0o640 {
		t.Errorf("the frozen image's mode %v, want 0640", fi.Mode().Perm())
	}
	for k, p := range kids {
		if filepath.Dir(p) != kidDirs[k] || !forkName.MatchString(filepath.Base(p)) {
			t.Errorf("child %d's overlay path %s", k, p)
		}
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("child %d's overlay was made by the fork (%v)", k, err)
		}
	}
	writeRandom(t, parent, bytes.Clone(model), parent.BlockSize(), 10, 2) // the parent runs on
	if err := CreateChild(kids[0], frozen); err != nil {
		t.Fatal(err)
	}
	checkForkFiles(t, kidDirs[0], base, kids[0])
	k0m := bytes.Clone(model)
	k0 := openWrite(t, kids[0], k0m, 3)
	checkView(t, k0, k0m, false)
	k0.Close()
	if err := CreateChild(kids[0], frozen); err == nil {
		t.Error("CreateChild made an overlay over an existing one")
	}
	if err := CreateChild(kids[1], "disk.img"); err == nil {
		t.Error("CreateChild took a relative base")
	}
}

func TestForkRefuses(t *testing.T) {
	dir := t.TempDir()
	base := writeBase(t, dir, "disk.img", pattern(1<<20, 5))
	ro, err := OpenRaw(base, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := Fork(ro, 1, dir); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Errorf("fork of a read-only image: %v", err)
	}
	ro.Close()
	if _, _, err := Fork(bytes.NewReader(nil), 1, dir); err == nil {
		t.Error("fork of a reader")
	}

	r, err := OpenRaw(base, true)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, _, err := Fork(r, -1, dir); err == nil {
		t.Error("fork with -1 children")
	}
	if _, _, err := Fork(r, 1, filepath.Join(dir, "missing")); err == nil {
		t.Error("fork into a missing directory")
	}
	// A failure after some files were made removes them all and leaves
	// the image as it was.
	calls := 0
	failing := func(path string, base Backing, opts CreateOptions) (*Overlay, error) {
		if calls++; calls == 3 {
			return nil, errors.New("injected")
		}
		return Create(path, base, opts)
	}
	if _, _, _, err := forkInto(r, dir, make([]string, 3), false, failing); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("fork with a failing create: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("files left behind: %v", ents)
	}
	if _, err := r.WriteAt([]byte{1}, 0); err != nil {
		t.Errorf("image not writable after a failed fork: %v", err)
	}
	if o, err := OpenRaw(base, false); err == nil {
		o.Close()
		t.Error("image not exclusively locked after a failed fork")
	}
}

func TestForkStem(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"/a/disk.img", "disk"},
		{"/a/disk", "disk"},
		{"/a/disk.17f0c3a2b4d5e6f7-0a1b2c3d.wcow", "disk"},
		{"/a/root.fs.img", "root.fs"},
		{"/a/v.1-2.wcow", "v.1-2"},
		{"/a/.wcow", "disk"},
	} {
		if got := forkStem(tt.in); got != tt.want {
			t.Errorf("forkStem(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	if s := uniqueSuffix(); !isUniqueSuffix(s) {
		t.Errorf("uniqueSuffix %q does not pass isUniqueSuffix", s)
	}
}
