package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenvm/warren/hostd/pagestore"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/memsnap"
)

// TestStoreStatsState: `warren store stats --state DIR` reads a state
// directory in place: two full layers of nearly the same memory in the
// store count twice as logical bytes, once (and a block) as stored.
func TestStoreStatsState(t *testing.T) {
	state := t.TempDir()
	snaps := filepath.Join(state, "tenants", "acme", "sandboxes", "sb-1", "snapshots")
	if err := os.MkdirAll(snaps, 0o700); err != nil {
		t.Fatal(err)
	}
	st, err := pagestore.Open(filepath.Join(state, "pagestore"))
	if err != nil {
		t.Fatal(err)
	}
	ns, _ := st.Plain("acme")
	mem := make([]byte, 4<<20)
	for i := range mem {
		mem[i] = byte(i/4096*7 + i%61)
	}
	var layerBytes int64
	for i, name := range []string{"a.1.wsnap", "b.1.wsnap"} {
		mem[i*(1<<20)] ^= 0xff // one block differs
		l, err := memsnap.WriteBase(filepath.Join(snaps, name), bytes.NewReader(mem), uint64(len(mem)), memsnap.Options{})
		if err != nil {
			t.Fatal(err)
		}
		layerBytes += l.FileSize()
		l.Close()
		if _, err := ns.Ingest(filepath.Join(snaps, name)); err != nil {
			t.Fatal(err)
		}
	}
	out, _ := expect(t, 0, "", "store", "stats", "--state", state, "--json")
	var all []wire.StoreStats
	if err := json.Unmarshal([]byte(out), &all); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(all) != 1 || all[0].Tenant != "acme" || len(all[0].Namespaces) != 1 {
		t.Fatalf("stats %s", out)
	}
	n := all[0].Namespaces[0]
	if n.Refs != 2 || all[0].LogicalBytes != layerBytes || n.ChunkRefs != 2*n.Chunks-2 || all[0].StoredBytes*3 > 2*all[0].LogicalBytes {
		t.Errorf("stats %+v: want 2 layers of %d bytes sharing all chunks but one block each", all[0], layerBytes)
	}
	text, _ := expect(t, 0, "", "store", "stats", "--state", state)
	if !strings.Contains(text, "acme") || !strings.Contains(text, "plain") || !strings.Contains(text, "(total)") {
		t.Errorf("table:\n%s", text)
	}
}
