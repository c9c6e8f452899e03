package disk

import (
	"bytes"
	"testing"
)

// FuzzParseHeader feeds arbitrary bytes to the header parser: it must not
// panic, and whatever it accepts must encode back to the same bytes (the
// parser accepts exactly one encoding of each header).
func FuzzParseHeader(f *testing.F) {
	h := Header{BlockSize: DefaultBlockSize, VirtualSize: 1 << 30, BaseSize: 1 << 30, BasePath: "base.img"}
	good, err := h.Marshal()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:100])
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHeader(b)
		if err != nil {
			return
		}
		again, err := h.Marshal()
		if err != nil {
			t.Fatalf("Marshal of a parsed header: %v", err)
		}
		if !bytes.Equal(again, b[:HeaderSize]) {
			t.Fatalf("parsed header re-encodes differently")
		}
		if h.DataOffset()%uint64(h.BlockSize) != 0 || h.FileSize() < h.VirtualSize {
			t.Fatalf("bad layout: %+v", h)
		}
	})
}
