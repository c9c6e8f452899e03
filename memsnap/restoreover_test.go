package memsnap

import (
	"bytes"
	"path/filepath"
	"testing"
)

// TestRestoreOver rolls a memory that moved on back to a base+incremental
// chain and checks it writes exactly the pages that differ.
func TestRestoreOver(t *testing.T) {
	dir := t.TempDir()
	s := newRandomSim(1024, 11, 700)
	base := mustBase(t, filepath.Join(dir, "b"+Ext), s)
	s.writeRandom(60)
	top := mustIncr(t, filepath.Join(dir, "i"+Ext), s, base)
	want := bytes.Clone(s.mem)

	// The VM goes on: some pages change, some become zero, some
	// zero pages get data.
	cur := bytes.Clone(want)
	changed := map[int]bool{}
	for p := 0; p < 1024; p += 7 {
		pg := cur[p*testPS : (p+1)*testPS]
		if p%21 == 0 {
			clear(pg)
		} else {
			pg[p%testPS] ^= 0x5a
		}
		if !bytes.Equal(pg, want[p*testPS:(p+1)*testPS]) {
			changed[p] = true
		}
	}
	c, err := OpenChain(top.Path(), Dir(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w, z, err := c.RestoreOver(cur, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(cur, want); i >= 0 {
		t.Fatalf("RestoreOver differs at byte %d (page %d)", i, i/testPS)
	}
	if got := w + z; got != uint64(len(changed)) {
		t.Fatalf("wrote %d + cleared %d pages, %d differed", w, z, len(changed))
	}
	// Again: nothing differs now.
	if w, z, err := c.RestoreOver(cur, nil, nil); err != nil || w+z != 0 {
		t.Fatalf("second RestoreOver wrote %d, cleared %d, err %v", w, z, err)
	}

	// Candidates: a non-zero page outside them is taken to be zero and
	// left alone; inside them it is cleared.
	zeroPage := -1
	for p := range 1024 {
		if isZero(want[p*testPS : (p+1)*testPS]) {
			zeroPage = p
			break
		}
	}
	if zeroPage < 0 {
		t.Fatal("no zero page in the test image")
	}
	cur[zeroPage*testPS] = 1
	cand := make([]uint64, 1024/64)
	if _, _, err := c.RestoreOver(cur, cand, nil); err != nil {
		t.Fatal(err)
	}
	if cur[zeroPage*testPS] != 1 {
		t.Fatal("a page outside the candidates was touched")
	}
	cand[zeroPage/64] |= 1 << (zeroPage % 64)
	if _, z, err := c.RestoreOver(cur, cand, nil); err != nil || z != 1 {
		t.Fatalf("cleared %d pages (err %v), want 1", z, err)
	}
	if i := firstDiff(cur, want); i >= 0 {
		t.Fatalf("differs at byte %d", i)
	}
	if _, _, err := c.RestoreOver(cur[:testPS], nil, nil); err == nil {
		t.Fatal("RestoreOver into a short buffer: no error")
	}
}
