package guestmem

import (
	"bytes"
	"errors"
	"testing"
)

func TestLayout(t *testing.T) {
	if got := Layout(256 << 20); len(got) != 1 || got[0] != (Region{0, 256 << 20, 0}) {
		t.Fatalf("256 MiB layout = %+v", got)
	}
	got := Layout(4 << 30)
	want := []Region{{0, MMIOHoleStart, 0}, {MMIOHoleEnd, 1 << 30, MMIOHoleStart}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("4 GiB layout = %+v, want %+v", got, want)
	}
}

func TestNewRejectsBadSizes(t *testing.T) {
	for _, size := range []uint64{0, 4095, 4097} {
		if _, err := New(size); err == nil {
			t.Errorf("New(%d) succeeded", size)
		}
	}
}

func TestAccessBounds(t *testing.T) {
	m, err := New(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.WriteAt([]byte("hello"), 0xFFFFB); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := m.ReadAt(buf, 0xFFFFB); err != nil || !bytes.Equal(buf, []byte("hello")) {
		t.Fatalf("read back %q, %v", buf, err)
	}
	for _, c := range []struct{ gpa, n uint64 }{{1 << 20, 1}, {0xFFFFC, 5}, {^uint64(0), 2}, {0, 1<<20 + 1}} {
		if _, err := m.Slice(c.gpa, c.n); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("Slice(%#x, %d) err = %v, want ErrOutOfRange", c.gpa, c.n, err)
		}
	}
	if _, err := m.ReadAt(buf, -1); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("negative ReadAt err = %v", err)
	}
}
