package statefile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func sample() *File {
	return &File{Fingerprint: []byte("hardware|cpu:abcdef"), Sections: []Section{
		{Name: "config", Data: []byte(`{"mem":268435456}`)},
		{Name: "vm", Data: bytes.Repeat([]byte("state"), 100)},
		{Name: "empty", Data: nil},
	}}
}

func TestRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vm.wstate")
	if err := Write(path, sample()); err != nil {
		t.Fatal(err)
	}
	f, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(f.Fingerprint) != "hardware|cpu:abcdef" || len(f.Sections) != 3 {
		t.Fatalf("read back %+v", f)
	}
	for _, want := range sample().Sections {
		got, ok := f.Section(want.Name)
		if !ok || !bytes.Equal(got, want.Data) {
			t.Errorf("section %s = %q, %v", want.Name, got, ok)
		}
	}
	if _, ok := f.Section("missing"); ok {
		t.Error("found a missing section")
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
}

// Every truncation, every extension and every flipped byte is refused.
func TestCorruption(t *testing.T) {
	good, err := sample().Encode()
	if err != nil {
		t.Fatal(err)
	}
	for n := 0; n < len(good); n++ {
		if _, err := Decode(good[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated to %d bytes: %v", n, err)
		}
	}
	if _, err := Decode(append(bytes.Clone(good), 0)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("extended: %v", err)
	}
	for i := range good {
		bad := bytes.Clone(good)
		bad[i] ^= 0x40
		_, err := Decode(bad)
		if i == 8 || i == 9 { // the version field
			if !errors.Is(err, ErrVersion) {
				t.Fatalf("flipped version byte %d: %v", i, err)
			}
			continue
		}
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("flipped byte %d: %v", i, err)
		}
	}
}

func TestWrongVersion(t *testing.T) {
	b, _ := sample().Encode()
	binary.LittleEndian.PutUint16(b[8:], 7)
	_, err := Decode(b)
	if !errors.Is(err, ErrVersion) || !bytes.Contains([]byte(err.Error()), []byte("version 7, this build reads version 1")) {
		t.Fatalf("got %v", err)
	}
}

func TestEncodeRefuses(t *testing.T) {
	for name, f := range map[string]*File{
		"repeated name": {Sections: []Section{{Name: "a"}, {Name: "a"}}},
		"empty name":    {Sections: []Section{{Name: ""}}},
		"long name":     {Sections: []Section{{Name: string(make([]byte, MaxName+1))}}},
		"fingerprint":   {Fingerprint: make([]byte, MaxFingerprint+1)},
	} {
		if _, err := f.Encode(); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
}

// A failed write (here: the target directory is gone) leaves the old file.
func TestWriteKeepsOldOnFailure(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "vm.wstate")
	if err := Write(path, sample()); err != nil {
		t.Fatal(err)
	}
	big := &File{Sections: []Section{{Name: "x", Data: make([]byte, MaxSection+1)}}}
	if err := Write(path, big); err == nil {
		t.Fatal("oversized section written")
	}
	if _, err := Read(path); err != nil {
		t.Fatalf("old file damaged: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	b, _ := sample().Encode()
	f.Add(b)
	f.Add(b[:20])
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Decode(data)
		if err != nil {
			return
		}
		again, err := file.Encode()
		if err != nil || !bytes.Equal(again, data) {
			t.Fatalf("accepted input does not re-encode identically: %v", err)
		}
	})
}
