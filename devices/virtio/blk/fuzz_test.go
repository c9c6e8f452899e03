package blk

import (
	"bytes"
	"encoding/binary"
	"log/slog"
	"os"
	"testing"

	"github.com/warrenvm/warren/devices/virtio"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
)

// Fuzzing bounds: a small image and small chains keep each run at a few
// microseconds.
const (
	fuzzSectors  = 64
	fuzzMaxRead  = 8 << 10 // readable bytes (header and data)
	fuzzMaxWrite = 8<<10 + 1
	fuzzMaxBufs  = 64 // per direction; the rest goes into one last buffer
)

// fuzzImage makes an image for the fuzzer, in /dev/shm when there is one
// so that FLUSH does not wait for a disk.
func fuzzImage(f *testing.F, readOnly bool) *Device {
	dir, err := os.MkdirTemp("/dev/shm", "warren-blk-fuzz")
	if err != nil {
		dir = f.TempDir()
	} else {
		f.Cleanup(func() { os.RemoveAll(dir) })
	}
	b := make([]byte, fuzzSectors*SectorSize)
	for i := range b {
		b[i] = byte(i / SectorSize)
	}
	path := dir + "/disk.img"
	if err := os.WriteFile(path, b, 0o600); err != nil {
		f.Fatal(err)
	}
	d, err := New(path, Options{ReadOnly: readOnly, ID: "fuzz-serial", Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { d.Close() })
	return d
}

// cut splits area into buffers whose lengths come from splits (0 gives an
// empty buffer), the remainder forming the last one.
func cut(out [][]byte, area []byte, splits []byte) ([][]byte, []byte) {
	for len(splits) > 0 && len(out) < fuzzMaxBufs-1 && len(area) > 0 {
		n := min(int(splits[0]), len(area))
		splits = splits[1:]
		out = append(out, area[:n:n])
		area = area[n:]
	}
	if len(area) > 0 {
		out = append(out, area)
	}
	return out, splits
}

// FuzzRequest serves arbitrary chains: header bytes, readable data, a
// writable area of any size, all split into buffers at arbitrary points,
// on a writable or a read-only disk. It checks the device's promises: no
// panic, a status byte of 0–2 in the last writable byte, a used length
// within the writable area (0 only when there is none), readable buffers
// untouched, the image never resized, and for successful reads and writes
// the right bytes in the right place.
func FuzzRequest(f *testing.F) {
	devs := [2]*Device{fuzzImage(f, false), fuzzImage(f, true)}
	readArea := make([]byte, fuzzMaxRead)
	writeArea := make([]byte, fuzzMaxWrite)
	check := make([]byte, fuzzMaxWrite)
	var rbufs, wbufs [][]byte
	f.Fuzz(func(t *testing.T, header, data []byte, writable uint16, splits []byte, readOnly bool) {
		d := devs[0]
		if readOnly {
			d = devs[1]
		}
		w := &scratch{dev: d}
		req := readArea[:copy(readArea, header)]
		req = readArea[:len(req)+copy(readArea[len(req):], data)]
		input := append([]byte(nil), req...)
		wl := int(writable) % (fuzzMaxWrite + 1)
		wr := writeArea[:wl]
		for i := range wr {
			wr[i] = 0xee
		}
		rbufs, splits = cut(rbufs[:0], req, splits)
		wbufs, _ = cut(wbufs[:0], wr, splits)

		used := w.serve(&virtio.Chain{Readable: rbufs, Writable: wbufs})

		if !bytes.Equal(req, input) {
			t.Fatal("device wrote into readable buffers")
		}
		if fi, err := os.Stat(d.path); err != nil || fi.Size() != fuzzSectors*SectorSize {
			t.Fatalf("image resized: %v", err)
		}
		if wl == 0 {
			if used != 0 {
				t.Fatalf("used %d without writable buffers", used)
			}
			return
		}
		if used == 0 || int(used) > wl {
			t.Fatalf("used %d of %d writable bytes", used, wl)
		}
		status := wr[wl-1]
		if status > StatusUnsupp {
			t.Fatalf("status byte %#x", status)
		}
		if status != StatusOK || len(req) < headerLen {
			return
		}
		sector := binary.LittleEndian.Uint64(req[8:])
		body := req[headerLen:]
		switch binary.LittleEndian.Uint32(req) {
		case TypeIn:
			if int(used) != wl || len(body) != 0 {
				t.Fatalf("read: used %d of %d, %d readable data bytes", used, wl, len(body))
			}
			if _, err := d.Backend().ReadAt(check[:wl-1], int64(sector)*SectorSize); err != nil {
				t.Fatalf("read ok at sector %d of %d: %v", sector, fuzzSectors, err)
			}
			if !bytes.Equal(check[:wl-1], wr[:wl-1]) {
				t.Fatal("read returned other bytes than the image holds")
			}
		case TypeOut:
			if readOnly || used != 1 || wl != 1 {
				t.Fatalf("write ok: read-only %v, used %d, writable %d", readOnly, used, wl)
			}
			if _, err := d.Backend().ReadAt(check[:len(body)], int64(sector)*SectorSize); err != nil {
				t.Fatalf("write ok at sector %d: %v", sector, err)
			}
			if !bytes.Equal(check[:len(body)], body) {
				t.Fatal("image does not hold the written bytes")
			}
		case TypeFlush, TypeGetID, TypeDiscard:
		default:
			t.Fatalf("unknown type %d completed OK", binary.LittleEndian.Uint32(req))
		}
	})
}

// newFuzzDevice opens a 64-sector image made once per fuzzing run (in
// /dev/shm when there is one).
func newFuzzDevice(f *testing.F) vt.NewDevice {
	d := fuzzImage(f, false)
	path := d.path
	d.Close() // (one device at a time holds the image's lock)
	return func(t testing.TB) (virtio.Device, func()) {
		d, err := New(path, Options{ID: "fuzz-serial", Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return d, func() { d.Close() }
	}
}

// FuzzMMIO: a hostile driver's register writes and queue contents never
// crash the device or its transport (virtiotest.Hostile).
func FuzzMMIO(f *testing.F) { vt.FuzzRegisters(f, newFuzzDevice(f)) }

// FuzzRestore: no state blob crashes a restore.
func FuzzRestore(f *testing.F) { vt.FuzzRestore(f, newFuzzDevice(f)) }
