package vmsnap

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/warrenvm/warren/memsnap"
	"github.com/warrenvm/warren/memsnap/statefile"
	"github.com/warrenvm/warren/vmm/hostprofile"
)

const testMem = 16 << 20

// writePair writes a full snapshot "base" and an incremental "inc" on top
// of it into a new directory and returns the directory and inc's memory.
func writePair(t testing.TB) (dir string, baseMem, incMem []byte) {
	t.Helper()
	dir = t.TempDir()
	basePages := []uint64{0, 1, 2, 100, 1000, 4095}
	baseMem = randomImage(testMem, 1, basePages)
	st := fakeState(testMem, "blk0", "vsock")
	opts := json.RawMessage(`{"vsock":"/tmp/x.sock","cid":3}`)
	base, err := Write(filepath.Join(dir, "base"), &Capture{Kind: Full, State: st, Devices: fakeDevices("blk0", "vsock"),
		Options: opts, Fingerprint: testFP, Memory: bytes.NewReader(baseMem)})
	if err != nil {
		t.Fatal(err)
	}
	incMem = bytes.Clone(baseMem)
	changed := randomImage(testMem, 2, []uint64{1, 2000})
	for _, p := range []uint64{1, 2000} {
		copy(incMem[p*pageSize:(p+1)*pageSize], changed[p*pageSize:])
	}
	clear(incMem[100*pageSize : 101*pageSize])
	st.VCPUs[0].Regs.RAX = 43
	inc, err := Write(filepath.Join(dir, "inc"), &Capture{Kind: Incremental, State: st, Devices: fakeDevices("blk0", "vsock"),
		Options: opts, Fingerprint: testFP, Memory: bytes.NewReader(incMem), Dirty: bitmap(testMem, []uint64{1, 100, 2000}),
		ParentLayer: base.LayerPath, ParentName: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if inc.Pages != 3 {
		t.Errorf("incremental layer records %d pages, want 3", inc.Pages)
	}
	return dir, baseMem, incMem
}

func TestWriteLoad(t *testing.T) {
	dir, baseMem, incMem := writePair(t)
	for _, c := range []struct {
		name string
		kind Kind
		mem  []byte
		rax  uint64
	}{{"base", Full, baseMem, 42}, {"inc", Incremental, incMem, 43}} {
		s, err := Load(filepath.Join(dir, c.name), hostIs(testFP))
		if err != nil {
			t.Fatal(err)
		}
		if s.Meta.Kind != c.kind || s.Name() != c.name || s.State.VCPUs[0].Regs.RAX != c.rax || len(s.Devices) != 2 || s.Devices[1].Name != "vsock" {
			t.Errorf("%s: loaded meta %+v, RAX %d, devices %+v", c.name, s.Meta, s.State.VCPUs[0].Regs.RAX, s.Devices)
		}
		if string(s.Meta.Options) != `{"vsock":"/tmp/x.sock","cid":3}` {
			t.Errorf("%s: options %s", c.name, s.Meta.Options)
		}
		if !bytes.Equal(readAll(t, s), c.mem) {
			t.Errorf("%s: memory differs", c.name)
		}
		raw, err := s.Flattened()
		if err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(raw); err != nil || !bytes.Equal(b, c.mem) {
			t.Errorf("%s: flattened image differs (%v)", c.name, err)
		}
		s.Close()
	}
	// Compact the chain into a new full snapshot equal to inc.
	res, err := Compact(filepath.Join(dir, "inc"), filepath.Join(dir, "flat"), hostIs(testFP))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Load(filepath.Join(dir, "flat.wstate"), hostIs(testFP))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Meta.Kind != Full || len(s.Chain.Layers()) != 1 || s.State.VCPUs[0].Regs.RAX != 43 || !bytes.Equal(readAll(t, s), incMem) {
		t.Errorf("compacted snapshot: kind %s, %d layers, RAX %d", s.Meta.Kind, len(s.Chain.Layers()), s.State.VCPUs[0].Regs.RAX)
	}
	t.Logf("compacted: %d pages, layer %d bytes", res.Pages, res.LayerBytes)
}

// TestRetakeKeepsChildren retakes the parent's name: the incremental
// snapshot taken on the old parent still loads (its parent layer is found
// by hash and was not replaced).
func TestRetakeKeepsChildren(t *testing.T) {
	dir, _, incMem := writePair(t)
	if _, err := Write(filepath.Join(dir, "base"), &Capture{Kind: Full, State: fakeState(testMem, "blk0", "vsock"),
		Devices: fakeDevices("blk0", "vsock"), Fingerprint: testFP, Memory: bytes.NewReader(make([]byte, testMem))}); err != nil {
		t.Fatal(err)
	}
	s, err := Load(filepath.Join(dir, "inc"), hostIs(testFP))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !bytes.Equal(readAll(t, s), incMem) {
		t.Error("memory differs after the parent's name was retaken")
	}
}

// layerOf returns the memory layer file the snapshot's state file names.
func layerOf(t *testing.T, dir, name string) string {
	t.Helper()
	f, err := statefile.Read(filepath.Join(dir, name+StateExt))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := f.Section(secMemory)
	var ref memoryRef
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, ref.Layer)
}

// rewriteState re-encodes name's state file after mod changed it.
func rewriteState(t *testing.T, dir, name string, mod func(*statefile.File)) {
	t.Helper()
	p := filepath.Join(dir, name+StateExt)
	f, err := statefile.Read(p)
	if err != nil {
		t.Fatal(err)
	}
	mod(f)
	if err := statefile.Write(p, f); err != nil {
		t.Fatal(err)
	}
}

func setSection(f *statefile.File, name string, data []byte) {
	for i := range f.Sections {
		if f.Sections[i].Name == name {
			f.Sections[i].Data = data
		}
	}
}

func flipByte(t *testing.T, path string, off func(size int) int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[off(len(b))] ^= 0x40
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestLoadRefuses damages a base + incremental pair in every way the
// snapshot issue lists and checks that Load refuses each with a clear
// error before anything is built: the host fingerprint source is asked at
// most once and no VM exists in this package's Load at all; Restore is only
// reachable through a loaded Snapshot.
func TestLoadRefuses(t *testing.T) {
	otherCPU := Fingerprint{Profile: hostprofile.Hardware, CPUID: CPUIDHash(nil)}.Encode()
	otherKind := Fingerprint{Profile: hostprofile.PVMNative, CPUID: "x"}.Encode()
	cases := []struct {
		name   string
		load   string // snapshot to load
		damage func(t *testing.T, dir string)
		host   []byte
		is     error
		want   string
	}{
		{"truncated state file", "inc", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "inc.wstate")
			fi, _ := os.Stat(p)
			os.Truncate(p, fi.Size()/2)
		}, testFP, statefile.ErrCorrupt, "corrupt"},
		{"state file cut by one byte", "base", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "base.wstate")
			fi, _ := os.Stat(p)
			os.Truncate(p, fi.Size()-1)
		}, testFP, statefile.ErrCorrupt, "corrupt"},
		{"flipped byte in state header", "inc", func(t *testing.T, dir string) {
			flipByte(t, filepath.Join(dir, "inc.wstate"), func(int) int { return 20 })
		}, testFP, statefile.ErrCorrupt, "checksum"},
		{"flipped byte in state section", "inc", func(t *testing.T, dir string) {
			flipByte(t, filepath.Join(dir, "inc.wstate"), func(n int) int { return n - 100 })
		}, testFP, statefile.ErrCorrupt, "checksum"},
		{"flipped byte in parent layer data", "inc", func(t *testing.T, dir string) {
			flipByte(t, layerOf(t, dir, "base"), func(n int) int { return 300 })
		}, testFP, memsnap.ErrCorrupt, "corrupt"},
		{"flipped byte in top layer index", "inc", func(t *testing.T, dir string) {
			flipByte(t, layerOf(t, dir, "inc"), func(n int) int { return n - 40 })
		}, testFP, memsnap.ErrCorrupt, "corrupt"},
		{"truncated layer", "base", func(t *testing.T, dir string) {
			p := layerOf(t, dir, "base")
			fi, _ := os.Stat(p)
			os.Truncate(p, fi.Size()-10)
		}, testFP, memsnap.ErrCorrupt, "corrupt"},
		{"missing parent layer", "inc", func(t *testing.T, dir string) {
			os.Remove(layerOf(t, dir, "base"))
		}, testFP, memsnap.ErrMissingParent, "parent"},
		{"missing layer", "base", func(t *testing.T, dir string) {
			os.Remove(layerOf(t, dir, "base"))
		}, testFP, os.ErrNotExist, "no such file"},
		{"layer swapped for another", "inc", func(t *testing.T, dir string) {
			b, _ := os.ReadFile(layerOf(t, dir, "base"))
			os.WriteFile(layerOf(t, dir, "inc"), b, 0o600)
		}, testFP, memsnap.ErrCorrupt, "hash"},
		{"state file format version", "inc", func(t *testing.T, dir string) {
			flipByte(t, filepath.Join(dir, "inc.wstate"), func(int) int { return 8 })
		}, testFP, statefile.ErrVersion, "version"},
		{"snapshot meta version", "inc", func(t *testing.T, dir string) {
			rewriteState(t, dir, "inc", func(f *statefile.File) {
				b, _ := f.Section(secMeta)
				setSection(f, secMeta, bytes.Replace(b, []byte(`"version":2`), []byte(`"version":3`), 1))
			})
		}, testFP, statefile.ErrVersion, "version 3"},
		{"no disks section", "inc", func(t *testing.T, dir string) {
			rewriteState(t, dir, "inc", func(f *statefile.File) {
				f.Sections = slices.DeleteFunc(f.Sections, func(s statefile.Section) bool { return s.Name == secDisks })
			})
		}, testFP, statefile.ErrCorrupt, `no "disks" section`},
		{"disk layer not absolute", "inc", func(t *testing.T, dir string) {
			rewriteState(t, dir, "inc", func(f *statefile.File) {
				setSection(f, secDisks, []byte(`[{"index":0,"layer":"disk0.wcow","chain":["disk0.wcow"]}]`))
			})
		}, testFP, statefile.ErrCorrupt, "not a clean absolute path"},
		{"disk chain not from its layer", "inc", func(t *testing.T, dir string) {
			rewriteState(t, dir, "inc", func(f *statefile.File) {
				setSection(f, secDisks, []byte(`[{"index":0,"layer":"/d/a.wcow","chain":["/d/b.wcow"]}]`))
			})
		}, testFP, statefile.ErrCorrupt, "not at its layer"},
		{"disk index repeated", "inc", func(t *testing.T, dir string) {
			rewriteState(t, dir, "inc", func(f *statefile.File) {
				setSection(f, secDisks, []byte(`[{"index":1,"layer":"/d/a","chain":["/d/a"]},{"index":1,"layer":"/d/b","chain":["/d/b"]}]`))
			})
		}, testFP, statefile.ErrCorrupt, "repeated"},
		{"machine state version", "inc", func(t *testing.T, dir string) {
			rewriteState(t, dir, "inc", func(f *statefile.File) {
				b, _ := f.Section(secMachine)
				setSection(f, secMachine, bytes.Replace(b, []byte(`"Version":1`), []byte(`"Version":9`), 1))
			})
		}, testFP, nil, "version 9"},
		{"layer format version", "base", func(t *testing.T, dir string) {
			flipByte(t, layerOf(t, dir, "base"), func(int) int { return 8 })
		}, testFP, memsnap.ErrVersion, "version"},
		{"device states do not match", "inc", func(t *testing.T, dir string) {
			rewriteState(t, dir, "inc", func(f *statefile.File) {
				setSection(f, secDevices, []byte(`[]`))
			})
		}, testFP, statefile.ErrCorrupt, "device"},
		{"layer name is a path", "inc", func(t *testing.T, dir string) {
			rewriteState(t, dir, "inc", func(f *statefile.File) {
				b, _ := f.Section(secMemory)
				setSection(f, secMemory, bytes.Replace(b, []byte(`"layer":"`), []byte(`"layer":"../`), 1))
			})
		}, testFP, statefile.ErrCorrupt, "not a file name"},
		{"incompatible CPU", "inc", nil, otherCPU, ErrIncompatibleCPU, "incompatible CPU: KVM's supported CPUID differs"},
		{"other host kind", "base", nil, otherKind, ErrIncompatibleCPU, "incompatible CPU: the snapshot was taken on a hardware host, this one is pvm-native"},
	}
	src, _, _ := writePair(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := copyDir(t, src)
			if c.damage != nil {
				c.damage(t, dir)
			}
			asked := 0
			s, err := Load(filepath.Join(dir, c.load), func() ([]byte, error) { asked++; return c.host, nil })
			if err == nil {
				s.Close()
				t.Fatal("accepted")
			}
			if c.is != nil && !errors.Is(err, c.is) {
				t.Errorf("error %q does not wrap %v", err, c.is)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not say %q", err, c.want)
			}
			// Once, or four times when it does not match (Load reads a
			// mismatch again before it counts).
			if asked != 0 && asked != 1 && asked != 4 {
				t.Errorf("host fingerprint asked %d times", asked)
			}
			t.Logf("%v", err)
		})
	}
}

// TestLoadVersion1 loads a snapshot as the previous format wrote it (meta
// version 1, no "disks" section): it loads, with no disk layers (nil, as
// opposed to a version 2 snapshot's empty list), so that its disks reopen
// as its run options name them. A version 2 snapshot round-trips its disk
// layers.
func TestLoadVersion1(t *testing.T) {
	dir, _, _ := writePair(t)
	s, err := Load(filepath.Join(dir, "inc"), hostIs(testFP))
	if err != nil {
		t.Fatal(err)
	}
	if s.Meta.Version != MetaVersion || s.Disks == nil || len(s.Disks) != 0 {
		t.Errorf("version %d snapshot has disks %#v, want an empty list", s.Meta.Version, s.Disks)
	}
	s.Close()
	rewriteState(t, dir, "inc", func(f *statefile.File) {
		b, _ := f.Section(secMeta)
		setSection(f, secMeta, bytes.Replace(b, []byte(`"version":2`), []byte(`"version":1`), 1))
		f.Sections = slices.DeleteFunc(f.Sections, func(s statefile.Section) bool { return s.Name == secDisks })
	})
	s, err = Load(filepath.Join(dir, "inc"), hostIs(testFP))
	if err != nil {
		t.Fatalf("a version 1 snapshot does not load: %v", err)
	}
	if s.Meta.Version != 1 || s.Disks != nil {
		t.Errorf("version 1 snapshot: version %d, disks %#v", s.Meta.Version, s.Disks)
	}
	s.Close()

	want := []DiskLayer{{Index: 0, Layer: "/s/disk0.b.wcow", Chain: []string{"/s/disk0.b.wcow", "/s/disk0.overlay", "/t/disk0.base"}},
		{Index: 2, Layer: "/t/raw.img", Chain: []string{"/t/raw.img"}}}
	st := fakeState(testMem, "blk0", "vsock")
	if _, err := Write(filepath.Join(dir, "disks"), &Capture{Kind: Full, State: st, Devices: fakeDevices("blk0", "vsock"),
		Fingerprint: testFP, Memory: bytes.NewReader(make([]byte, testMem)), Disks: want}); err != nil {
		t.Fatal(err)
	}
	s, err = Load(filepath.Join(dir, "disks"), hostIs(testFP))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !reflect.DeepEqual(s.Disks, want) {
		t.Errorf("disks %+v, want %+v", s.Disks, want)
	}
	// Write checks what it records too.
	bad := []DiskLayer{{Index: 0, Layer: "rel.wcow", Chain: []string{"rel.wcow"}}}
	if _, err := Write(filepath.Join(dir, "bad"), &Capture{Kind: Full, State: st, Devices: fakeDevices("blk0", "vsock"),
		Fingerprint: testFP, Memory: bytes.NewReader(make([]byte, testMem)), Disks: bad}); err == nil {
		t.Error("Write recorded a relative disk layer")
	}
}

func TestPaths(t *testing.T) {
	for in, want := range map[string][3]string{
		"snaps/a":        {"snaps", "a", "snaps/a.wstate"},
		"snaps/a.wstate": {"snaps", "a", "snaps/a.wstate"},
		"a":              {".", "a", "a.wstate"},
	} {
		d, n, s, err := Paths(in)
		if err != nil || d != want[0] || n != want[1] || s != want[2] {
			t.Errorf("Paths(%q) = %q %q %q %v, want %q", in, d, n, s, err, want)
		}
	}
	for _, bad := range []string{"", "dir/", "dir/.hidden", ".."} {
		if _, _, _, err := Paths(bad); err == nil {
			t.Errorf("Paths(%q) accepted", bad)
		}
	}
}

func TestPageImage(t *testing.T) {
	flat := randomImage(1<<20, 3, []uint64{0, 5, 6, 200, 255})
	clear(flat[6*pageSize : 7*pageSize])
	img := capturePages(flat, bitmap(1<<20, []uint64{0, 5, 6, 7, 200, 255}))
	if len(img.pages) != 4 {
		t.Fatalf("captured %d pages, want 4 (a zero page and an unset one left out)", len(img.pages))
	}
	got := make([]byte, len(flat))
	if n, err := img.ReadAt(got, 0); n != len(flat) || err != nil {
		t.Fatal(n, err)
	}
	if !bytes.Equal(got, flat) {
		t.Fatal("image differs")
	}
	part := make([]byte, 3*pageSize)
	img.ReadAt(part, 4*pageSize+100)
	if !bytes.Equal(part, flat[4*pageSize+100:7*pageSize+100]) {
		t.Fatal("unaligned read differs")
	}
}

// TestOverlay checks a pre-copied image under the pages re-copied in the
// pause, a page zeroed meanwhile included.
func TestOverlay(t *testing.T) {
	old := randomImage(1<<20, 4, []uint64{0, 1, 2, 3, 100})
	now := bytes.Clone(old)
	copy(now[pageSize:2*pageSize], randomImage(1<<20, 5, []uint64{1})[pageSize:])
	clear(now[2*pageSize : 3*pageSize])
	copy(now[50*pageSize:51*pageSize], randomImage(1<<20, 6, []uint64{50})[50*pageSize:])
	set := bitmap(1<<20, []uint64{1, 2, 50})
	o := &overlay{base: capturePages(old, bitmap(1<<20, []uint64{0, 1, 2, 3, 100})), top: capturePages(now, set), set: set}
	got := make([]byte, len(now))
	if n, err := o.ReadAt(got, 0); n != len(now) || err != nil {
		t.Fatal(n, err)
	}
	if !bytes.Equal(got, now) {
		t.Fatal("overlay differs from the memory at the pause")
	}
}
