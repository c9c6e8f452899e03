package disk

import (
	"bytes"
	"math/rand/v2"
	"path/filepath"
	"testing"
)

// writeRandom makes count random writes to d and mirrors them in model.
func writeRandom(t *testing.T, d interface {
	WriteAt([]byte, int64) (int, error)
}, model []byte, bs int64, count int, seed uint64) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	for range count {
		off, n := randSpan(r, int64(len(model)), bs)
		p := bytes.Repeat([]byte{byte(seed)}, int(n))
		p[0] = byte(r.Uint32())
		if _, err := d.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
		copy(model[off:], p)
	}
}

// TestStack builds raw <- l1 <- l2 <- l3, plus a sibling l2b over l1 (two
// forks of one parent), checks each view, that a layer holds only the
// blocks written through it, and that OpenChain reopens every stack from
// its top file.
func TestStack(t *testing.T) {
	const size = 2<<20 + 4096
	const bs = 16 << 10
	dir := t.TempDir()
	m0 := pattern(size, 21)
	writeBase(t, dir, "base.img", m0)
	models := map[string][]byte{"base.img": m0}

	// fork creates name over the chain topped by parent (opened
	// read-only), writes to it, and closes both.
	fork := func(parent, name string, seed uint64) {
		t.Helper()
		var base Backing
		var closeBase func() error
		if parent == "base.img" {
			r, err := OpenRaw(filepath.Join(dir, parent), false)
			if err != nil {
				t.Fatal(err)
			}
			base, closeBase = r, r.Close
		} else {
			o, err := OpenChain(filepath.Join(dir, parent), true)
			if err != nil {
				t.Fatal(err)
			}
			base, closeBase = o, o.Close
		}
		defer closeBase()
		o, err := Create(filepath.Join(dir, name), base, CreateOptions{BlockSize: bs, BasePath: parent})
		if err != nil {
			t.Fatal(err)
		}
		m := bytes.Clone(models[parent])
		checkView(t, o, m, false)
		writeRandom(t, o, m, bs, 40, seed)
		checkView(t, o, m, true)
		if o.Allocated() > 40*4 {
			t.Errorf("%s: %d blocks allocated for 40 writes of at most 3 blocks", name, o.Allocated())
		}
		if err := o.Close(); err != nil {
			t.Fatal(err)
		}
		models[name] = m
	}
	fork("base.img", "l1.ovl", 1)
	fork("l1.ovl", "l2.ovl", 2)
	fork("l1.ovl", "l2b.ovl", 3) // sibling fork
	fork("l2.ovl", "l3.ovl", 4)

	for _, name := range []string{"l1.ovl", "l2.ovl", "l2b.ovl", "l3.ovl"} {
		o, err := OpenChain(filepath.Join(dir, name), false)
		if err != nil {
			t.Fatalf("OpenChain(%s): %v", name, err)
		}
		checkView(t, o, models[name], false)
		if err := o.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// The top of a chain can be written after reopening; its bases cannot
	// be opened for writing while it is open (flock).
	o, err := OpenChain(filepath.Join(dir, "l3.ovl"), false)
	if err != nil {
		t.Fatal(err)
	}
	writeRandom(t, o, models["l3.ovl"], bs, 10, 5)
	checkView(t, o, models["l3.ovl"], false)
	if l2, err := OpenChain(filepath.Join(dir, "l2.ovl"), false); err == nil {
		l2.Close()
		t.Error("opened a base for writing under an open chain")
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	o, err = OpenChain(filepath.Join(dir, "l3.ovl"), true)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	checkView(t, o, models["l3.ovl"], false)
}
