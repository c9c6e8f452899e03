package disk

import (
	"bytes"
	"testing"
)

// marshalV1 encodes h as a version 1 header region, the format earlier
// builds wrote (this build only reads it): tests make old files with it.
func marshalV1(h Header) []byte {
	b := make([]byte, HeaderSize)
	h.putCommon(b, 1)
	h.putBasePath(b, fixedLenV1)
	return b
}

// FuzzParseHeader feeds arbitrary bytes to the header parser: it must not
// panic, and whatever it accepts must encode back to the same bytes: a
// version 1 header region whole, a version 2 header's slot in force (the
// parser accepts exactly one encoding of each header), whose generation
// is above the other slot's when that one is valid too.
func FuzzParseHeader(f *testing.F) {
	h := Header{BlockSize: DefaultBlockSize, VirtualSize: 1 << 30, BaseSize: 1 << 30, BasePath: "base.img"}
	good, err := h.Marshal()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:100])
	f.Add(marshalV1(h))
	// Both slots in use (a rebased overlay), and slot 1 torn.
	h2 := h
	h2.BasePath, h2.Generation = "merged.wcow", 2
	s1, err := h2.marshalSlot()
	if err != nil {
		f.Fatal(err)
	}
	two := bytes.Clone(good)
	copy(two[SlotSize:], s1)
	f.Add(two)
	torn := bytes.Clone(two)
	copy(torn[SlotSize+512:], make([]byte, 512))
	f.Add(torn)
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHeader(b)
		if err != nil {
			return
		}
		if h.Version == 1 {
			if !bytes.Equal(marshalV1(*h), b[:HeaderSize]) {
				t.Fatalf("parsed version 1 header re-encodes differently")
			}
		} else {
			again, err := h.marshalSlot()
			if err != nil {
				t.Fatalf("Marshal of a parsed header: %v", err)
			}
			if !bytes.Equal(again, b[h.slot*SlotSize:(h.slot+1)*SlotSize]) {
				t.Fatalf("parsed header re-encodes differently")
			}
			if other, err := parseSlot(b[(1-h.slot)*SlotSize : (2-h.slot)*SlotSize]); err == nil && other.Generation >= h.Generation {
				t.Fatalf("slot %d in force with generation %d, the other slot valid with %d", h.slot, h.Generation, other.Generation)
			}
		}
		if h.DataOffset()%uint64(h.BlockSize) != 0 || h.FileSize() < h.VirtualSize {
			t.Fatalf("bad layout: %+v", h)
		}
	})
}
