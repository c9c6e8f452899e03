package blk

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/warrenvm/warren/devices/virtio"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
)

func TestSaveRestore(t *testing.T) {
	path := newImage(t, 32)
	e := newEnv(t, path, Options{ID: "snap"})
	data := bytes.Repeat([]byte{0x5a}, SectorSize)
	if _, st, _ := e.do(t, out(hdr(TypeOut, 3)), out(data), in(1)); st != StatusOK {
		t.Fatalf("write: status %d", st)
	}
	e.tr.Shutdown() // quiesce, as a paused VM would be
	st, err := e.tr.Save()
	if err != nil {
		t.Fatal(err)
	}
	var saved state
	if err := json.Unmarshal(st.Device, &saved); err != nil {
		t.Fatal(err)
	}
	if saved.Path != e.dev.Path() || saved.Capacity != 32 || saved.ID != "snap" || saved.Writes.Load() != 1 || saved.WriteBytes.Load() != SectorSize {
		t.Fatalf("saved %+v", saved)
	}
	e.dev.Close() // the image is locked; a restoring VM opens it anew

	dev2, err := New(path, Options{ID: "snap"})
	if err != nil {
		t.Fatal(err)
	}
	tr2 := virtio.NewMMIO("blk", dev2, e.mem, vt.NewSignals(), nil)
	defer func() { tr2.Shutdown(); dev2.Close() }()
	if err := tr2.Restore(st); err != nil {
		t.Fatal(err)
	}
	if dev2.Metrics.Writes.Load() != 1 {
		t.Errorf("restored writes counter %d", dev2.Metrics.Writes.Load())
	}
	// The same guest driver goes on with the restored queue.
	e2 := &env{dev: dev2, tr: tr2, drv: e.drv, mem: e.mem}
	used, status, addrs := e2.do(t, out(hdr(TypeIn, 3)), in(SectorSize), in(1))
	if status != StatusOK || used != SectorSize+1 || !bytes.Equal(e.mem[addrs[1]:addrs[1]+SectorSize], data) {
		t.Fatalf("read after restore: status %d used %d", status, used)
	}
}

func TestRestoreRefusesOtherDisk(t *testing.T) {
	d, err := New(newImage(t, 16), Options{ID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	good, err := d.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.RestoreState(good); err != nil {
		t.Fatalf("own state refused: %v", err)
	}
	edit := func(f func(*state)) json.RawMessage {
		var s state
		json.Unmarshal(good, &s)
		f(&s)
		b, _ := json.Marshal(s)
		return b
	}
	tests := []struct {
		name string
		raw  json.RawMessage
		want string
	}{
		{"version", edit(func(s *state) { s.Version = 2 }), "version"},
		{"path", edit(func(s *state) { s.Path = "/elsewhere.img" }), "image /elsewhere.img"},
		{"capacity", edit(func(s *state) { s.Capacity = 17 }), "17 sectors"},
		{"read-only", edit(func(s *state) { s.ReadOnly = true }), "read-only"},
		{"id", edit(func(s *state) { s.ID = "b" }), "ID"},
		{"garbage", json.RawMessage(`{"version":`), "state"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d.Metrics.Reads.Store(42)
			err := d.RestoreState(tt.raw)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error about %s", err, tt.want)
			}
			if d.Metrics.Reads.Load() != 42 {
				t.Error("refused state changed the counters")
			}
		})
	}
}
