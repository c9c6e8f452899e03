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
