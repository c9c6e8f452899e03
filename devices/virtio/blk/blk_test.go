package blk

import (
	"bytes"
	"encoding/binary"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenvm/warren/devices/virtio"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
)

const features = virtio.FeatureVersion1 | virtio.FeatureEventIdx | FeatureFlush

// newImage writes an image of n sectors, sector i filled with byte i+1.
func newImage(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n*SectorSize)
	for i := range b {
		b[i] = byte(i/SectorSize + 1)
	}
	p := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// env is a disk behind a transport with a fake guest driver.
type env struct {
	dev *Device
	tr  *virtio.MMIO
	drv *vt.Driver
	mem vt.Memory
}

func newEnv(t *testing.T, path string, opts Options) *env {
	t.Helper()
	dev, err := New(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	return newDevEnv(t, dev)
}

// newDevEnv puts dev behind a transport with a fake guest driver; the
// test's cleanup shuts it down and closes dev.
func newDevEnv(t *testing.T, dev *Device) *env {
	t.Helper()
	mem := make(vt.Memory, vt.MemSize)
	e := &env{dev: dev, tr: virtio.NewMMIO("blk", dev, mem, vt.NewSignals(), nil), drv: vt.NewDriver(mem, 0, 64), mem: mem}
	t.Cleanup(func() {
		e.tr.Shutdown()
		e.dev.Close()
	})
	if st := vt.Bring(e.tr, features, e.drv); st&virtio.StatusDriverOK == 0 || st&virtio.StatusNeedsReset != 0 {
		t.Fatalf("status %#x", st)
	}
	return e
}

func hdr(typ uint32, sector uint64) []byte {
	b := make([]byte, headerLen)
	binary.LittleEndian.PutUint32(b, typ)
	binary.LittleEndian.PutUint64(b[8:], sector)
	return b
}

// in is a writable buffer of n bytes prefilled with 0xee, so that a status
// the device did not write is visible.
func in(n int) vt.Buf {
	return vt.Buf{Data: bytes.Repeat([]byte{0xee}, n), Len: n, Writable: true}
}

func out(b []byte) vt.Buf { return vt.Buf{Data: b} }

func waitUsed(t *testing.T, d *vt.Driver, n int) [][2]uint32 { return vt.WaitUsed(t, d, n) }

// do offers one chain, kicks, and returns the used length, the status
// byte (the last byte of the chain's last buffer) and the buffers'
// addresses.
func (e *env) do(t *testing.T, bufs ...vt.Buf) (used uint32, status byte, addrs []uint64) {
	t.Helper()
	head, addrs := e.drv.Offer(bufs...)
	e.tr.Notify(0)
	u := waitUsed(t, e.drv, 1)
	if u[0][0] != uint32(head) {
		t.Fatalf("used head %d, want %d", u[0][0], head)
	}
	last := bufs[len(bufs)-1]
	end := addrs[len(addrs)-1] + uint64(max(last.Len, len(last.Data)))
	return u[0][1], e.mem[end-1], addrs
}

func (e *env) healthy(t *testing.T) {
	t.Helper()
	if st := e.tr.Status(); st&virtio.StatusNeedsReset != 0 {
		t.Fatalf("device needs reset: status %#x", st)
	}
}

// splitRoundTrip writes three sectors at sector 5 (the header split 5+11,
// the data at unaligned points, the status alone), checks that image()
// then holds them and its neighbouring sectors (each filled with its
// number) are untouched, and reads them back with the status byte sharing
// the last data buffer. It returns the data.
func splitRoundTrip(t *testing.T, e *env, image func() []byte) []byte {
	t.Helper()
	data := make([]byte, 3*SectorSize)
	for i := range data {
		data[i] = byte(i*7 + 3)
	}
	h := hdr(TypeOut, 5)
	used, st, _ := e.do(t, out(h[:5]), out(h[5:]), out(data[:100]), out(data[100:800]), out(data[800:]), in(1))
	if st != StatusOK || used != 1 {
		t.Fatalf("write: status %d used %d", st, used)
	}
	img := image()
	if !bytes.Equal(img[5*SectorSize:8*SectorSize], data) {
		t.Fatal("the image does not hold the written data")
	}
	if img[5*SectorSize-1] != 5 || img[8*SectorSize] != 9 {
		t.Fatal("write spilled over neighbouring sectors")
	}
	used, st, addrs := e.do(t, out(hdr(TypeIn, 5)), in(1), in(511), in(1000), in(24+1))
	if st != StatusOK || used != uint32(len(data))+1 {
		t.Fatalf("read: status %d used %d", st, used)
	}
	var got []byte
	for i, n := range []int{1, 511, 1000, 24} {
		got = append(got, e.mem[addrs[i+1]:addrs[i+1]+uint64(n)]...)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("split read differs from written data")
	}
	return data
}

func TestReadWriteRoundTrip(t *testing.T) {
	path := newImage(t, 64)
	e := newEnv(t, path, Options{})
	data := splitRoundTrip(t, e, func() []byte {
		img, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return img
	})
	if r, w := e.dev.Metrics.Reads.Load(), e.dev.Metrics.Writes.Load(); r != 1 || w != 1 {
		t.Errorf("metrics reads %d writes %d", r, w)
	}
	if b := e.dev.Metrics.ReadBytes.Load(); b != uint64(len(data)) {
		t.Errorf("metrics read bytes %d", b)
	}
	e.healthy(t)
}

func TestManyRequestsEventIdx(t *testing.T) {
	e := newEnv(t, newImage(t, 64), Options{})
	for i := range 100 {
		used, st, addrs := e.do(t, out(hdr(TypeIn, uint64(i%64))), in(SectorSize), in(1))
		if st != StatusOK || used != SectorSize+1 || e.mem[addrs[1]] != byte(i%64+1) {
			t.Fatalf("request %d: status %d used %d byte %d", i, st, used, e.mem[addrs[1]])
		}
	}
	// With event-idx the device must ask for the next kick by writing
	// avail_event after the used ring; a stale one silences the driver. (Read
	// once the worker has stopped: it writes the field after publishing the
	// used entry.)
	e.tr.Shutdown()
	q := e.drv.Q
	if ev := binary.LittleEndian.Uint16(e.mem[q.Used+4+8*uint64(q.Size):]); ev != 100 {
		t.Fatalf("avail_event %d, want 100", ev)
	}
}

func TestFlushAndGetID(t *testing.T) {
	e := newEnv(t, newImage(t, 8), Options{ID: "warren-vda"})
	if used, st, _ := e.do(t, out(hdr(TypeFlush, 0)), in(1)); st != StatusOK || used != 1 {
		t.Fatalf("flush: status %d used %d", st, used)
	}
	if e.dev.Metrics.Flushes.Load() != 1 {
		t.Error("flush not counted")
	}
	used, st, addrs := e.do(t, out(hdr(TypeGetID, 0)), in(IDLen), in(1))
	if st != StatusOK || used != IDLen+1 {
		t.Fatalf("get-id: status %d used %d", st, used)
	}
	want := append([]byte("warren-vda"), make([]byte, IDLen-len("warren-vda"))...)
	if got := e.mem[addrs[1] : addrs[1]+IDLen]; !bytes.Equal(got, want) {
		t.Errorf("id %q", got)
	}
	// A shorter buffer gets what fits.
	used, st, addrs = e.do(t, out(hdr(TypeGetID, 0)), in(6+1))
	if st != StatusOK || used != 7 || string(e.mem[addrs[1]:addrs[1]+6]) != "warren" {
		t.Errorf("short get-id: status %d used %d", st, used)
	}
}

func TestReadOnly(t *testing.T) {
	path := newImage(t, 8)
	e := newEnv(t, path, Options{ReadOnly: true})
	if e.dev.Features()&FeatureRO == 0 || e.dev.Features()&FeatureDiscard != 0 {
		t.Errorf("features %#x", e.dev.Features())
	}
	if _, st, _ := e.do(t, out(hdr(TypeOut, 0)), out(make([]byte, SectorSize)), in(1)); st != StatusIOErr {
		t.Errorf("write on read-only disk: status %d", st)
	}
	if _, st, _ := e.do(t, out(hdr(TypeDiscard, 0)), out(make([]byte, discardSegLen)), in(1)); st != StatusUnsupp {
		t.Errorf("discard on read-only disk: status %d", st)
	}
	if _, st, _ := e.do(t, out(hdr(TypeIn, 7)), in(SectorSize+1)); st != StatusOK {
		t.Errorf("read on read-only disk: status %d", st)
	}
	if _, st, _ := e.do(t, out(hdr(TypeFlush, 0)), in(1)); st != StatusOK {
		t.Errorf("flush on read-only disk: status %d", st)
	}
	if img, _ := os.ReadFile(path); img[0] != 1 {
		t.Error("read-only image changed")
	}
	if e.dev.Metrics.Errors.Load() != 2 {
		t.Errorf("errors %d, want 2", e.dev.Metrics.Errors.Load())
	}
}

func TestBadRequests(t *testing.T) {
	const capacity = 16
	e := newEnv(t, newImage(t, capacity), Options{})
	sector := make([]byte, SectorSize)
	tests := []struct {
		name string
		bufs []vt.Buf
		st   byte
	}{
		{"read past the end", []vt.Buf{out(hdr(TypeIn, capacity-1)), in(2*SectorSize + 1)}, StatusIOErr},
		{"read at the end", []vt.Buf{out(hdr(TypeIn, capacity)), in(SectorSize + 1)}, StatusIOErr},
		{"read far away", []vt.Buf{out(hdr(TypeIn, 1<<40)), in(SectorSize + 1)}, StatusIOErr},
		{"read sector 2^64-1", []vt.Buf{out(hdr(TypeIn, ^uint64(0))), in(SectorSize + 1)}, StatusIOErr},
		{"write sector wraps", []vt.Buf{out(hdr(TypeOut, ^uint64(0)-1)), out(sector), out(sector), out(sector), in(1)}, StatusIOErr},
		{"write past the end", []vt.Buf{out(hdr(TypeOut, capacity)), out(sector), in(1)}, StatusIOErr},
		{"read not whole sectors", []vt.Buf{out(hdr(TypeIn, 0)), in(100 + 1)}, StatusIOErr},
		{"write not whole sectors", []vt.Buf{out(hdr(TypeOut, 0)), out(sector[:511]), in(1)}, StatusIOErr},
		{"read with readable data", []vt.Buf{out(hdr(TypeIn, 0)), out(sector), in(SectorSize + 1)}, StatusIOErr},
		{"write with writable data", []vt.Buf{out(hdr(TypeOut, 0)), out(sector), in(SectorSize + 1)}, StatusIOErr},
		{"flush with data", []vt.Buf{out(hdr(TypeFlush, 0)), out(sector), in(1)}, StatusIOErr},
		{"get-id without room", []vt.Buf{out(hdr(TypeGetID, 0)), in(1)}, StatusIOErr},
		{"short header", []vt.Buf{out(hdr(TypeIn, 0)[:10]), in(1)}, StatusIOErr},
		{"no header", []vt.Buf{in(SectorSize + 1)}, StatusIOErr},
		{"unsupported type", []vt.Buf{out(hdr(99, 0)), in(1)}, StatusUnsupp},
		{"get lifetime", []vt.Buf{out(hdr(10, 0)), in(16 + 1)}, StatusUnsupp},
		{"discard without segments", []vt.Buf{out(hdr(TypeDiscard, 0)), in(1)}, StatusIOErr},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			used, st, _ := e.do(t, tt.bufs...)
			if st != tt.st || used != 1 {
				t.Errorf("status %d used %d, want status %d used 1", st, used, tt.st)
			}
			e.healthy(t)
		})
	}
	img, _ := os.ReadFile(e.dev.path)
	if !bytes.Equal(img, func() []byte { b, _ := os.ReadFile(newImage(t, capacity)); return b }()) {
		t.Error("a rejected request changed the image")
	}
}

func TestNoStatusByte(t *testing.T) {
	e := newEnv(t, newImage(t, 8), Options{})
	// Only readable buffers: the chain is returned with used length 0.
	head, _ := e.drv.Offer(out(hdr(TypeIn, 0)))
	e.tr.Notify(0)
	if u := waitUsed(t, e.drv, 1); u[0] != [2]uint32{uint32(head), 0} {
		t.Errorf("used %v", u)
	}
	// A zero-length writable buffer is no status byte either.
	head, _ = e.drv.Offer(out(hdr(TypeFlush, 0)), vt.Buf{Writable: true})
	e.tr.Notify(0)
	if u := waitUsed(t, e.drv, 1); u[0] != [2]uint32{uint32(head), 0} {
		t.Errorf("used %v", u)
	}
	e.healthy(t)
	// The queue still works.
	head, addrs := e.drv.Offer(out(hdr(TypeFlush, 0)), in(1), vt.Buf{Writable: true})
	e.tr.Notify(0)
	if u := waitUsed(t, e.drv, 1); u[0] != [2]uint32{uint32(head), 1} || e.mem[addrs[1]] != StatusOK {
		t.Errorf("status in the last non-empty writable buffer: used %v status %#x", u, e.mem[addrs[1]])
	}
	if e.dev.Metrics.Errors.Load() != 2 {
		t.Errorf("errors %d", e.dev.Metrics.Errors.Load())
	}
}

func TestDiscard(t *testing.T) {
	path := newImage(t, 64)
	e := newEnv(t, path, Options{})
	seg := func(sector uint64, n, flags uint32) []byte {
		b := make([]byte, discardSegLen)
		binary.LittleEndian.PutUint64(b, sector)
		binary.LittleEndian.PutUint32(b[8:], n)
		binary.LittleEndian.PutUint32(b[12:], flags)
		return b
	}
	if _, st, _ := e.do(t, out(hdr(TypeDiscard, 0)), out(seg(8, 8, 1)), in(1)); st != StatusUnsupp {
		t.Errorf("discard with unmap: status %d", st)
	}
	if _, st, _ := e.do(t, out(hdr(TypeDiscard, 0)), out(seg(0, 8, 0)), out(seg(60, 8, 0)), in(1)); st != StatusIOErr {
		t.Errorf("discard past the end: status %d", st)
	}
	if img, _ := os.ReadFile(path); img[0] != 1 {
		t.Error("a rejected discard punched a hole")
	}
	s := append(seg(8, 8, 0), seg(32, 16, 0)...)
	if _, st, _ := e.do(t, out(hdr(TypeDiscard, 0)), out(s[:20]), out(s[20:]), in(1)); st != StatusOK {
		t.Fatalf("discard: status %d", st)
	}
	img, _ := os.ReadFile(path)
	if len(img) != 64*SectorSize {
		t.Fatalf("image size changed to %d", len(img))
	}
	if img[8*SectorSize-1] != 8 || img[16*SectorSize] != 17 || img[48*SectorSize] != 49 {
		t.Error("discard touched sectors outside its ranges")
	}
	if !bytes.Equal(img[8*SectorSize:16*SectorSize], make([]byte, 8*SectorSize)) {
		t.Log("host file system did not punch the hole (discard is a hint)")
	}
}

func TestConfigSpace(t *testing.T) {
	e := newEnv(t, newImage(t, 24), Options{})
	b := make([]byte, 8)
	e.tr.Read(0x100, b)
	if binary.LittleEndian.Uint64(b) != 24 {
		t.Errorf("capacity %d", binary.LittleEndian.Uint64(b))
	}
	if v := vt.Read32(e.tr, 0x100+12); v != segMax {
		t.Errorf("seg_max %d", v)
	}
	if v := vt.Read32(e.tr, 0x100+40); v != maxDiscardSeg {
		t.Errorf("max_discard_seg %d", v)
	}
	vt.Write32(e.tr, 0x100, 0xffff)
	for _, off := range []uint64{0x100 + 46, 0x100 + 48, 0x100 + 200, 0xfff} {
		b := []byte{1, 2, 3, 4}
		e.tr.Read(off, b[:min(4, int(0x1000-off))])
		if off >= 0x100+48 && !bytes.Equal(b[:min(4, int(0x1000-off))], make([]byte, min(4, int(0x1000-off)))) {
			t.Errorf("config at %#x reads %v", off, b)
		}
	}
	if vt.Read32(e.tr, 0x100) != 24 {
		t.Error("config write was not ignored")
	}
	if ro := newEnv(t, newImage(t, 8), Options{ReadOnly: true}); vt.Read32(ro.tr, 0x100+36) != 0 {
		t.Error("read-only disk announces discard limits")
	}
}

func TestNewErrors(t *testing.T) {
	dir := t.TempDir()
	odd := filepath.Join(dir, "odd.img")
	os.WriteFile(odd, make([]byte, 1000), 0o600)
	if _, err := New(odd, Options{}); err == nil || !strings.Contains(err.Error(), "multiple of 512") {
		t.Errorf("odd size: %v", err)
	}
	if _, err := New(dir, Options{ReadOnly: true}); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("directory: %v", err)
	}
	if _, err := New(filepath.Join(dir, "missing"), Options{}); err == nil {
		t.Error("missing file opened")
	}
	path := newImage(t, 8)
	if _, err := New(path, Options{ID: strings.Repeat("x", IDLen+1)}); err == nil {
		t.Error("long ID accepted")
	}
	d, err := New(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(path, Options{ReadOnly: true}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("second open of a locked image: %v", err)
	}
	d.Close()
	r1, err := New(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Close()
	r2, err := New(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("two read-only opens: %v", err)
	}
	r2.Close()
}

func TestHostIOError(t *testing.T) {
	path := newImage(t, 16)
	e := newEnv(t, path, Options{Log: slog.New(slog.DiscardHandler)})
	if err := os.Truncate(path, 4*SectorSize); err != nil { // shrunk behind our back
		t.Fatal(err)
	}
	if _, st, _ := e.do(t, out(hdr(TypeIn, 8)), in(SectorSize+1)); st != StatusIOErr {
		t.Errorf("read past the real end: status %d", st)
	}
	e.healthy(t)
}

func TestVecIOManyBuffers(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "vec")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var bufs [][]byte
	var want []byte
	for i := range 3000 { // more than iovMax
		b := bytes.Repeat([]byte{byte(i)}, i%5+1)
		bufs = append(bufs, b)
		want = append(want, b...)
	}
	if err := vecIO(int(f.Fd()), append([][]byte(nil), bufs...), 7, true); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := f.ReadAt(got, 7); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("pwritev: %v", err)
	}
	for _, b := range bufs {
		clear(b)
	}
	if err := vecIO(int(f.Fd()), append([][]byte(nil), bufs...), 7, false); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(bytes.Join(bufs, nil), want) {
		t.Fatal("preadv")
	}
	if err := vecIO(int(f.Fd()), [][]byte{make([]byte, 10)}, int64(7+len(want)-5), false); err == nil {
		t.Error("read past EOF succeeded")
	}
}

func TestBatchOneKick(t *testing.T) {
	e := newEnv(t, newImage(t, 64), Options{})
	heads := map[uint32]uint64{}
	for i := range 20 { // 60 descriptors of the 64-entry table
		h, addrs := e.drv.Offer(out(hdr(TypeIn, uint64(i))), in(SectorSize), in(1))
		heads[uint32(h)] = addrs[1]
	}
	e.tr.Notify(0)
	for _, u := range waitUsed(t, e.drv, 20) {
		if u[1] != SectorSize+1 {
			t.Fatalf("used %v", u)
		}
		delete(heads, u[0])
	}
	if len(heads) != 0 {
		t.Errorf("heads never completed: %v", heads)
	}
}
