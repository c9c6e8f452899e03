package vmsnap

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/warrenvm/warren/memsnap/statefile"
)

// FuzzLoadState feeds Load arbitrary state files beside a valid memory
// chain: the checksums are recomputed over the fuzzed sections, so the
// section decoders (meta, machine, devices, memory) see hostile content.
// Load must refuse or accept without panicking.
func FuzzLoadState(f *testing.F) {
	src, _, _ := writePair(f)
	st, err := statefile.Read(filepath.Join(src, "inc"+StateExt))
	if err != nil {
		f.Fatal(err)
	}
	sec := func(name string) []byte { b, _ := st.Section(name); return b }
	f.Add(sec(secMeta), sec(secMachine), sec(secDevices), sec(secMemory))
	f.Add([]byte(`{"version":1,"kind":"full"}`), []byte(`{}`), []byte(`[]`), []byte(`{"layer":"..","size":1}`))
	f.Fuzz(func(t *testing.T, meta, machine, devices, memory []byte) {
		dir := copyDir(t, src)
		file := &statefile.File{Fingerprint: testFP, Sections: []statefile.Section{
			{Name: secMeta, Data: meta}, {Name: secMachine, Data: machine},
			{Name: secDevices, Data: devices}, {Name: secMemory, Data: memory}}}
		if err := statefile.Write(filepath.Join(dir, "x"+StateExt), file); err != nil {
			return
		}
		if s, err := Load(filepath.Join(dir, "x"), hostIs(testFP)); err == nil {
			s.Close()
		}
		os.RemoveAll(dir)
	})
}

// FuzzDisks feeds the "disks" section parser arbitrary bytes: it must not
// panic, and what it accepts must pass the checks Write applies (clean
// absolute paths, chains from their layers, bounded, unique indices).
func FuzzDisks(f *testing.F) {
	f.Add([]byte(`[]`))
	f.Add([]byte(`[{"index":0,"layer":"/s/disk0.a.wcow","chain":["/s/disk0.a.wcow","/t/disk0.base"]}]`))
	f.Add([]byte(`[{"index":0,"layer":"/a","chain":["/a","/a"]}]`))
	f.Add([]byte(`[{"index":-1,"layer":"/a","chain":["/a"]}]`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ds, err := parseDisks(b)
		if err != nil {
			return
		}
		if err := checkDisks(ds); err != nil {
			t.Fatalf("accepted disks that Write refuses: %v", err)
		}
		for _, d := range ds {
			if d.Chain[0] != d.Layer || !cleanAbs(d.Layer) {
				t.Fatalf("accepted %+v", d)
			}
		}
	})
}
