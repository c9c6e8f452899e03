package main

import (
	"reflect"
	"testing"
)

func TestParseWindows(t *testing.T) {
	got, err := parseWindows("console=ttyS0 virtio_mmio.device=512@0xd0000000:5 quiet virtio_mmio.device=4K@0xd0001000:6:2 virtio_mmio.device=1M@0xd0100000:7\n")
	if err != nil {
		t.Fatal(err)
	}
	want := []window{{0xd0000000, 512}, {0xd0001000, 4096}, {0xd0100000, 4096}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	for _, bad := range []string{"virtio_mmio.device=512", "virtio_mmio.device=x@0xd0000000:5",
		"virtio_mmio.device=0@0xd0000000:5", "virtio_mmio.device=512@zz:5"} {
		if _, err := parseWindows(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestAddressesStayInScratch checks the invariant the program's safety in
// the guest rests on: every address it gives a device, whole or as either
// half of a queue register, is in its scratch pages or beyond guest RAM.
func TestAddressesStayInScratch(t *testing.T) {
	h := &hostile{phys: []uint64{0x123000, 0x4000000, 0x7fff000}}
	h.rng = newRand(1)
	inScratch := func(a uint64) bool {
		for _, p := range h.phys {
			if a >= p && a < p+pageSize {
				return true
			}
		}
		return false
	}
	for range 100000 {
		a := h.addr(1)
		if !inScratch(a) && a < outside {
			t.Fatalf("address %#x: neither scratch nor outside RAM", a)
		}
		if low := a & 0xffffffff; !inScratch(low) {
			t.Fatalf("address %#x: its low half %#x is not scratch", a, low)
		}
	}
}
