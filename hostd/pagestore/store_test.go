package pagestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenvm/warren/hostd/crypt"
	"github.com/warrenvm/warren/memsnap"
)

const (
	testPages      = 1024 // 4 MiB of memory: 4 blocks of 256 pages
	testChunkPages = 64   // 16 blocks: small chunks, many of them
)

// testMem returns memory with compressible, seed-dependent pages and some
// zero pages.
func testMem(seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	mem := make([]byte, testPages*4096)
	for p := range testPages {
		if p%5 == 4 {
			continue
		}
		pg := mem[p*4096 : (p+1)*4096]
		v := byte(r.Uint32())
		for i := range pg {
			if i%64 == 0 {
				v = byte(r.Uint32())
			}
			pg[i] = v
		}
	}
	return mem
}

// touch rewrites the pages of blocks (testChunkPages pages each) in mem
// and returns the dirty bitmap.
func touch(mem []byte, seed uint64, blocks ...int) []uint64 {
	r := rand.New(rand.NewPCG(seed, 2))
	dirty := make([]uint64, testPages/64)
	for _, b := range blocks {
		for p := b * testChunkPages; p < (b+1)*testChunkPages; p++ {
			dirty[p/64] |= 1 << (p % 64)
			pg := mem[p*4096 : (p+1)*4096]
			for i := 0; i < len(pg); i += 512 {
				pg[i] = byte(r.Uint32()) | 1
			}
		}
	}
	return dirty
}

func writeBase(t *testing.T, path string, mem []byte) *memsnap.Layer {
	t.Helper()
	l, err := memsnap.WriteBase(path, bytes.NewReader(mem), uint64(len(mem)), memsnap.Options{ChunkPages: testChunkPages})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func writeInc(t *testing.T, path string, mem []byte, dirty []uint64, parent *memsnap.Layer) *memsnap.Layer {
	t.Helper()
	l, err := memsnap.WriteIncremental(path, bytes.NewReader(mem), uint64(len(mem)), dirty, parent, memsnap.Options{ChunkPages: testChunkPages})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func ingest(t *testing.T, ns *Namespace, path string) IngestReport {
	t.Helper()
	rep, err := ns.Ingest(path)
	if err != nil {
		t.Fatal(err)
	}
	if !IsRefFile(path) {
		t.Fatalf("%s is not a reference file after Ingest", path)
	}
	return rep
}

func chunkFiles(t *testing.T, ns *Namespace) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	if err := ns.walkChunks(func(p string, _ Name, _ int64, _ bool) error {
		b, err := os.ReadFile(p)
		out[filepath.Base(p)] = b
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// testProvider hands out fixed keys.
type testProvider map[string]crypt.Key

func (p testProvider) Key(_ context.Context, tenant string) (crypt.Key, error) {
	if k, ok := p[tenant]; ok {
		return k, nil
	}
	return crypt.Key{}, crypt.ErrNoKey
}

func newKey(t *testing.T, seed byte) crypt.Key {
	t.Helper()
	k, err := crypt.NewKey("", bytes.Repeat([]byte{seed}, crypt.KeySize))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestRoundTrip ingests a base and an incremental layer and materializes
// them back: the same bytes, a chain that restores the same memory.
func TestRoundTrip(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		t.Run(fmt.Sprintf("keyed=%v", keyed), func(t *testing.T) {
			st, err := Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			ns, err := st.Plain("acme")
			if keyed {
				ns, err = st.Keyed(context.Background(), "acme", testProvider{"acme": newKey(t, 1)})
			}
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			mem := testMem(1)
			base := writeBase(t, filepath.Join(dir, "a.1.wsnap"), mem)
			dirty := touch(mem, 3, 2, 7)
			inc := writeInc(t, filepath.Join(dir, "b.1.wsnap"), mem, dirty, base)
			base.Close()
			inc.Close()
			orig := map[string][]byte{}
			for _, n := range []string{"a.1.wsnap", "b.1.wsnap"} {
				orig[n], _ = os.ReadFile(filepath.Join(dir, n))
			}
			r1 := ingest(t, ns, filepath.Join(dir, "a.1.wsnap"))
			r2 := ingest(t, ns, filepath.Join(dir, "b.1.wsnap"))
			if r1.NewChunks != r1.Chunks || r2.NewChunks != 2 || r2.Chunks != 2 {
				t.Errorf("ingest reports %+v, %+v: want all of the base's chunks new, then the 2 touched blocks", r1, r2)
			}
			if r1.RefSize*20 > r1.LayerSize {
				t.Errorf("reference file is %d bytes for a %d-byte layer", r1.RefSize, r1.LayerSize)
			}
			if _, err := memsnap.OpenChain(filepath.Join(dir, "b.1.wsnap"), nil); err == nil {
				t.Fatal("a chain of reference files opened as layers")
			}
			out := t.TempDir()
			for n, want := range orig {
				if err := ns.Materialize(filepath.Join(dir, n), filepath.Join(out, n), -1); err != nil {
					t.Fatal(err)
				}
				if got, _ := os.ReadFile(filepath.Join(out, n)); !bytes.Equal(got, want) {
					t.Errorf("%s materialized differs from the layer ingested", n)
				}
			}
			c, err := memsnap.OpenChain(filepath.Join(out, "b.1.wsnap"), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			got := make([]byte, len(mem))
			if err := c.Restore(got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, mem) {
				t.Error("restored memory differs")
			}
			// In place, as the daemon does before sealing a plain tenant's.
			if err := ns.Materialize(filepath.Join(dir, "a.1.wsnap"), filepath.Join(dir, "a.1.wsnap"), -1); err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(filepath.Join(dir, "a.1.wsnap")); !bytes.Equal(got, orig["a.1.wsnap"]) {
				t.Error("materialized in place differs")
			}
		})
	}
}

// TestDedup: layers of the same tenant share chunks (16 full snapshots of
// nearly the same memory cost little more than one); layers of two
// tenants, or of one tenant under two keys, share nothing, and a keyed
// namespace's files reveal neither the content nor its SHA-256.
func TestDedup(t *testing.T) {
	root := t.TempDir()
	st, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	prov := testProvider{"a": newKey(t, 1), "b": newKey(t, 2)}
	mem := testMem(7)
	dir := t.TempDir()
	var first IngestReport
	for i := -1; i < 16; i++ {
		m := bytes.Clone(mem)
		if i >= 0 {
			touch(m, uint64(i), i%16) // block i changed, the rest as the first
		}
		p := filepath.Join(dir, fmt.Sprintf("full%d.1.wsnap", i+1))
		writeBase(t, p, m).Close()
		ns, _ := st.Plain("a")
		rep := ingest(t, ns, p)
		if i < 0 {
			first = rep
			continue
		}
		if rep.NewChunks != 1 {
			t.Errorf("full snapshot %d of the same tenant added %d chunks, want 1 (its touched block)", i, rep.NewChunks)
		}
	}
	if first.NewChunks != first.Chunks || first.Chunks < 10 {
		t.Fatalf("first ingest %+v", first)
	}

	// The same memory for tenants a and b, keyed, and for plain tenant c.
	var names [3]map[string][]byte
	var nss [3]*Namespace
	for i, tenant := range []string{"a", "b", "c"} {
		var ns *Namespace
		if tenant == "c" {
			ns, err = st.Plain(tenant)
		} else {
			ns, err = st.Keyed(context.Background(), tenant, prov)
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "same-"+tenant+".1.wsnap")
		writeBase(t, p, mem).Close()
		rep := ingest(t, ns, p)
		if rep.NewChunks != rep.Chunks {
			t.Errorf("tenant %s: %d of %d chunks deduplicated against another namespace", tenant, rep.Chunks-rep.NewChunks, rep.Chunks)
		}
		names[i], nss[i] = chunkFiles(t, ns), ns
	}
	l := writeBase(t, filepath.Join(dir, "plain.wsnap"), mem)
	defer l.Close()
	sums := map[string]bool{}
	for _, c := range l.ChunkRefs() {
		sums[fmt.Sprintf("%x", c.Sum)] = true
	}
	for i := range 2 {
		for n, b := range names[i] {
			if names[1-i][n] != nil {
				t.Errorf("keyed tenants %d and %d share chunk name %s", i, 1-i, n)
			}
			if sums[n] {
				t.Errorf("keyed namespace %s names a chunk by its plain SHA-256", nss[i].name)
			}
			if !bytes.HasPrefix(b, []byte(crypt.Magic)) {
				t.Errorf("keyed chunk %s is not sealed", n)
			}
		}
	}
	for n := range names[2] {
		if !sums[n] {
			t.Errorf("plain chunk %s is not named by its SHA-256", n)
		}
	}
	// The same tenant under a new key: a new namespace, nothing shared.
	prov["a"] = newKey(t, 9)
	ns2, err := st.Keyed(context.Background(), "a", prov)
	if err != nil {
		t.Fatal(err)
	}
	if ns2.dir == nss[0].dir {
		t.Fatal("a new key has the old key's namespace")
	}
}

// TestSweep deletes snapshots and checks that a sweep frees exactly the
// chunks only they held, and that what is left still materializes.
func TestSweep(t *testing.T) {
	st, _ := Open(t.TempDir())
	ns, err := st.Keyed(context.Background(), "acme", testProvider{"acme": newKey(t, 4)})
	if err != nil {
		t.Fatal(err)
	}
	snaps := t.TempDir()
	mem := testMem(2)
	var paths []string
	base := writeBase(t, filepath.Join(snaps, "s0.1.wsnap"), mem)
	paths = append(paths, base.Path())
	parent := base
	for i := 1; i <= 4; i++ {
		d := touch(mem, uint64(10+i), i, 12)
		l := writeInc(t, filepath.Join(snaps, fmt.Sprintf("s%d.1.wsnap", i)), mem, d, parent)
		parent.Close()
		parent = l
		paths = append(paths, l.Path())
	}
	parent.Close()
	full := writeBase(t, filepath.Join(snaps, "s5.1.wsnap"), mem)
	full.Close()
	paths = append(paths, full.Path())
	for _, p := range paths {
		ingest(t, ns, p)
		// Sealed like the daemon seals a keyed tenant's snapshot files.
		if err := crypt.EncryptFile(p, p, ns.key); err != nil {
			t.Fatal(err)
		}
	}
	if n, _, err := ns.Sweep(snaps); err != nil || n != 0 {
		t.Fatalf("sweep with every snapshot live removed %d chunks (%v)", n, err)
	}
	before := chunkFiles(t, ns)
	refNames := func(ps ...string) map[string]bool {
		m := map[string]bool{}
		for _, p := range ps {
			r, err := ns.ReadRef(p)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range r.Names {
				m[n.String()] = true
			}
			r.Close()
		}
		return m
	}
	// Rolling: the old chain (s0..s4) goes, the new full one stays.
	keep := refNames(paths[5])
	for _, p := range paths[:5] {
		os.Remove(p)
	}
	removed, _, err := ns.Sweep(snaps)
	if err != nil {
		t.Fatal(err)
	}
	after := chunkFiles(t, ns)
	if len(after) != len(keep) || removed != len(before)-len(keep) {
		t.Errorf("after the sweep %d chunks (removed %d), want the %d the live snapshot names (of %d)", len(after), removed, len(keep), len(before))
	}
	for n := range keep {
		if after[n] == nil {
			t.Errorf("live chunk %s removed", n)
		}
	}
	if err := ns.Materialize(paths[5], filepath.Join(t.TempDir(), "x.wsnap"), -1); err != nil {
		t.Fatal(err)
	}
	st2, err := ns.Stats(snaps)
	if err != nil || st2.Refs != 1 || st2.Chunks != int64(len(keep)) || st2.Unreferenced != 0 || st2.LogicalBytes <= st2.ChunkBytes/2 {
		t.Errorf("stats %+v, %v", st2, err)
	}
	// A reference file that cannot be read (another key's, corrupt)
	// stops the sweep before it removes anything.
	os.WriteFile(filepath.Join(snaps, "bad.1.wsnap"), append([]byte(crypt.Magic), make([]byte, 300)...), 0o600)
	os.Remove(paths[5])
	if n, _, err := ns.Sweep(snaps); err == nil || n != 0 {
		t.Errorf("sweep with an unreadable file removed %d, err %v", n, err)
	}
	if len(chunkFiles(t, ns)) != len(keep) {
		t.Error("chunks removed by a failed sweep")
	}
}

// TestCrash stops Ingest after each step, as a crash there would, and
// checks that the layer stays whole, that a sweep then removes only
// garbage, and that ingesting again completes.
func TestCrash(t *testing.T) {
	for _, stop := range []string{"chunks written", "chunks renamed"} {
		t.Run(strings.ReplaceAll(stop, " ", "_"), func(t *testing.T) {
			st, _ := Open(t.TempDir())
			ns, _ := st.Plain("acme")
			snaps := t.TempDir()
			mem := testMem(5)
			// One snapshot already in the store, sharing most chunks.
			writeBase(t, filepath.Join(snaps, "old.1.wsnap"), mem).Close()
			ingest(t, ns, filepath.Join(snaps, "old.1.wsnap"))
			touch(mem, 1, 3)
			p := filepath.Join(snaps, "new.1.wsnap")
			writeBase(t, p, mem).Close()
			orig, _ := os.ReadFile(p)
			ns.stopAfter = func(s string) error {
				if s == stop {
					return errStop
				}
				return nil
			}
			if _, err := ns.Ingest(p); !errors.Is(err, errStop) {
				t.Fatalf("ingest: %v", err)
			}
			ns.stopAfter = nil
			if got, _ := os.ReadFile(p); !bytes.Equal(got, orig) {
				t.Fatal("the layer changed before its chunks were in the store")
			}
			garbage := 0
			ns.walkChunks(func(_ string, n Name, _ int64, temp bool) error {
				if temp || stop == "chunks renamed" {
					garbage++
				}
				return nil
			})
			if garbage == 0 {
				t.Fatal("the simulated crash left nothing behind: the test tests nothing")
			}
			removed, _, err := ns.Sweep(snaps)
			if err != nil || removed != 1 {
				t.Errorf("sweep after the crash removed %d (%v), want the 1 chunk of the touched block", removed, err)
			}
			if err := ns.Materialize(filepath.Join(snaps, "old.1.wsnap"), filepath.Join(t.TempDir(), "o.wsnap"), -1); err != nil {
				t.Errorf("the snapshot in the store was damaged by the sweep: %v", err)
			}
			rep := ingest(t, ns, p)
			if rep.NewChunks != 1 {
				t.Errorf("ingest again: %+v", rep)
			}
			out := filepath.Join(t.TempDir(), "n.wsnap")
			if err := ns.Materialize(p, out, -1); err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(out); !bytes.Equal(got, orig) {
				t.Error("materialized differs")
			}
		})
	}
}

// TestCorruptChunk: a chunk changed, truncated, swapped or missing fails
// Materialize with a clear error and leaves the destination alone.
func TestCorruptChunk(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		for _, damage := range []string{"flip", "truncate", "swap", "remove"} {
			t.Run(fmt.Sprintf("keyed=%v/%s", keyed, damage), func(t *testing.T) {
				st, _ := Open(t.TempDir())
				ns, _ := st.Plain("acme")
				if keyed {
					ns, _ = st.Keyed(context.Background(), "acme", testProvider{"acme": newKey(t, 3)})
				}
				snaps := t.TempDir()
				p := filepath.Join(snaps, "s.1.wsnap")
				writeBase(t, p, testMem(9)).Close()
				ingest(t, ns, p)
				r, err := ns.ReadRef(p)
				if err != nil {
					t.Fatal(err)
				}
				victim, other := ns.chunkPath(r.Names[1]), ns.chunkPath(r.Names[2])
				r.Close()
				b, _ := os.ReadFile(victim)
				switch damage {
				case "flip":
					b[len(b)/2] ^= 1
					os.WriteFile(victim, b, 0o600)
				case "truncate":
					os.WriteFile(victim, b[:len(b)-1], 0o600)
				case "swap":
					o, _ := os.ReadFile(other)
					os.WriteFile(victim, o, 0o600)
				case "remove":
					os.Remove(victim)
				}
				dst := filepath.Join(t.TempDir(), "out.wsnap")
				err = ns.Materialize(p, dst, -1)
				want := ErrCorrupt
				if damage == "remove" {
					want = ErrMissing
				}
				if !errors.Is(err, want) && !(keyed && errors.Is(err, crypt.ErrAuth)) {
					t.Errorf("materialize: %v, want %v", err, want)
				}
				if _, serr := os.Stat(dst); serr == nil {
					t.Error("a failed materialize left its destination")
				}
			})
		}
	}
}

// TestRefCorrupt: any changed byte of a reference file is refused.
func TestRefCorrupt(t *testing.T) {
	st, _ := Open(t.TempDir())
	ns, _ := st.Plain("acme")
	p := filepath.Join(t.TempDir(), "s.1.wsnap")
	writeBase(t, p, testMem(4)).Close()
	ingest(t, ns, p)
	b, _ := os.ReadFile(p)
	for i := 8; i < len(b); i += 7 {
		c := bytes.Clone(b)
		c[i] ^= 0x10
		if r, err := ParseRef("x", c); err == nil {
			r.Close()
			t.Fatalf("byte %d changed: parsed", i)
		}
	}
	if r, err := ParseRef("x", b[:len(b)-32]); err == nil {
		r.Close()
		t.Fatal("truncated: parsed")
	}
}

// writeBaseF writes a small base layer for the fuzz seed.
func writeBaseF(path string) (*memsnap.Layer, error) {
	mem := testMem(11)[:64*4096]
	return memsnap.WriteBase(path, bytes.NewReader(mem), uint64(len(mem)), memsnap.Options{ChunkPages: 16})
}
