// Package virtiotest is a fake guest for virtio device tests: a flat guest
// memory and a driver that lays out split virtqueues in it, offers
// descriptor chains, and reads back used entries. No KVM is involved.
package virtiotest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/warrenvm/warren/devices/virtio"
	reg "github.com/warrenvm/warren/internal/virtiommio"
)

// Memory is guest RAM as one byte slice starting at guest address 0.
type Memory []byte

// Slice implements virtio.Memory.
func (m Memory) Slice(gpa, n uint64) ([]byte, error) {
	if gpa > uint64(len(m)) || n > uint64(len(m))-gpa {
		return nil, fmt.Errorf("fake memory: [%#x, +%#x) out of range", gpa, n)
	}
	return m[gpa : gpa+n : gpa+n], nil
}

// Layout addresses used by Driver: per queue q, the descriptor table at
// QueueBase+q*QueueStride, the available ring 4 KiB later, the used ring
// 8 KiB later; buffers from BufBase up.
const (
	QueueBase   = 0x10000
	QueueStride = 0x4000
	BufBase     = 0x100000
	MemSize     = 0x400000
	// FuzzMemSize is the guest memory of the fuzzers (FuzzRegisters,
	// FuzzRestore): the queues of up to four devices' worth and as much
	// again for buffers; a descriptor past it is out of range.
	FuzzMemSize = 0x40000
)

// Driver plays the guest driver for one queue.
type Driver struct {
	Mem      Memory
	Q        *virtio.Queue
	next     uint16 // next free descriptor
	avail    uint16
	used     uint16
	bufNext  uint64
	EventIdx bool
}

// NewDriver lays out queue index qi of the given size in mem and returns the
// ready queue (as the transport would configure it) and its driver.
func NewDriver(mem Memory, qi int, size uint16) *Driver {
	base := uint64(QueueBase + qi*QueueStride)
	q := &virtio.Queue{MaxSize: size, Size: size, Ready: true,
		Desc: base, Avail: base + 0x1000, Used: base + 0x2000}
	return &Driver{Mem: mem, Q: q, bufNext: BufBase + uint64(qi)*0x40000}
}

// Clone returns a copy of m, as a snapshot of guest RAM.
func (m Memory) Clone() Memory { return append(Memory(nil), m...) }

// Clone returns a driver that carries on from d's progress over mem, a
// copy of d.Mem taken at a snapshot (Memory.Clone): the guest driver as it
// is restored with the VM. d is not changed.
func (d *Driver) Clone(mem Memory) *Driver {
	c := *d
	q := *d.Q
	c.Mem, c.Q = mem, &q
	return &c
}

// Buf is one buffer of a chain the driver offers.
type Buf struct {
	Data     []byte // contents for a readable buffer
	Len      int    // size for a writable buffer
	Writable bool
}

// Alloc copies b into fresh guest memory and returns its address.
func (d *Driver) Alloc(n int) uint64 {
	a := d.bufNext
	d.bufNext += uint64(n+15) &^ 15
	return a
}

// Offer writes a chain of buffers into the descriptor table and makes it
// available. It returns the head index and the guest addresses.
func (d *Driver) Offer(bufs ...Buf) (uint16, []uint64) {
	head := d.next
	var addrs []uint64
	for i, b := range bufs {
		n := len(b.Data)
		if b.Writable {
			n = b.Len
		}
		a := d.Alloc(n)
		copy(d.Mem[a:], b.Data)
		flags := uint16(0)
		if b.Writable {
			flags |= 2
		}
		next := uint16(0)
		if i < len(bufs)-1 {
			flags |= 1
			next = (d.next + 1) % d.Q.Size
		}
		d.PutDesc(d.next, a, uint32(n), flags, next)
		addrs = append(addrs, a)
		d.next = (d.next + 1) % d.Q.Size
	}
	d.Publish(head)
	return head, addrs
}

// PutDesc writes descriptor i directly (for malformed-chain tests).
func (d *Driver) PutDesc(i uint16, addr uint64, n uint32, flags, next uint16) {
	PutDescAt(d.Mem, d.Q.Desc+16*uint64(i), addr, n, flags, next)
}

// PutDescAt writes a descriptor at an arbitrary guest address.
func PutDescAt(mem Memory, at, addr uint64, n uint32, flags, next uint16) {
	b := mem[at : at+16]
	binary.LittleEndian.PutUint64(b, addr)
	binary.LittleEndian.PutUint32(b[8:], n)
	binary.LittleEndian.PutUint16(b[12:], flags)
	binary.LittleEndian.PutUint16(b[14:], next)
}

// Publish puts head in the available ring and bumps its index.
func (d *Driver) Publish(head uint16) {
	binary.LittleEndian.PutUint16(d.Mem[d.Q.Avail+4+2*uint64(d.avail%d.Q.Size):], head)
	d.avail++
	d.SetAvailIdx(d.avail)
}

// header returns the ring's (flags, idx) word for atomic access.
func (d *Driver) header(ring uint64) *uint32 { return (*uint32)(unsafe.Pointer(&d.Mem[ring])) }

// SetAvailIdx overwrites the available index (for hostile-driver tests).
func (d *Driver) SetAvailIdx(v uint16) {
	h := d.header(d.Q.Avail)
	atomic.StoreUint32(h, atomic.LoadUint32(h)&0xffff|uint32(v)<<16)
}

// UsedIdx is the used ring's index as the device last published it.
func (d *Driver) UsedIdx() uint16 { return uint16(atomic.LoadUint32(d.header(d.Q.Used)) >> 16) }

// Used returns the used entries the device added since the last call.
func (d *Driver) Used() (out [][2]uint32) {
	idx := uint16(atomic.LoadUint32(d.header(d.Q.Used)) >> 16)
	for d.used != idx {
		e := d.Mem[d.Q.Used+4+8*uint64(d.used%d.Q.Size):]
		out = append(out, [2]uint32{binary.LittleEndian.Uint32(e), binary.LittleEndian.Uint32(e[4:])})
		d.used++
	}
	return out
}

// Registers is the register window of a transport (virtio.MMIO).
type Registers interface {
	Read(off uint64, data []byte)
	Write(off uint64, data []byte)
}

// Write32 writes a 32-bit register.
func Write32(r Registers, off uint64, v uint32) {
	b := make([]byte, 4)
	binary.LittleEndian.PutUint32(b, v)
	r.Write(off, b)
}

// Read32 reads a 32-bit register.
func Read32(r Registers, off uint64) uint32 {
	b := make([]byte, 4)
	r.Read(off, b)
	return binary.LittleEndian.Uint32(b)
}

// Bring walks the driver side of device initialisation through the MMIO
// registers, as Linux's virtio_mmio does: reset, ACKNOWLEDGE, DRIVER,
// features, FEATURES_OK, each queue's size and rings, DRIVER_OK. It returns
// the final status register.
func Bring(r Registers, features uint64, drivers ...*Driver) uint32 {
	Write32(r, reg.Status, 0)
	Write32(r, reg.Status, reg.StatusAcknowledge|reg.StatusDriver)
	Write32(r, reg.DriverFeaturesSel, 0)
	Write32(r, reg.DriverFeatures, uint32(features))
	Write32(r, reg.DriverFeaturesSel, 1)
	Write32(r, reg.DriverFeatures, uint32(features>>32))
	Write32(r, reg.Status, reg.StatusAcknowledge|reg.StatusDriver|reg.StatusFeaturesOK)
	if Read32(r, reg.Status)&reg.StatusFeaturesOK == 0 {
		return Read32(r, reg.Status)
	}
	for i, d := range drivers {
		Write32(r, reg.QueueSel, uint32(i))
		Write32(r, reg.QueueNum, uint32(d.Q.Size))
		Write32(r, reg.QueueDescLow, uint32(d.Q.Desc))
		Write32(r, reg.QueueDescHigh, uint32(d.Q.Desc>>32))
		Write32(r, reg.QueueDriverLow, uint32(d.Q.Avail))
		Write32(r, reg.QueueDriverHigh, uint32(d.Q.Avail>>32))
		Write32(r, reg.QueueDeviceLow, uint32(d.Q.Used))
		Write32(r, reg.QueueDeviceHigh, uint32(d.Q.Used>>32))
		Write32(r, reg.QueueReady, 1)
	}
	Write32(r, reg.Status, reg.StatusAcknowledge|reg.StatusDriver|reg.StatusFeaturesOK|reg.StatusDriverOK)
	return Read32(r, reg.Status)
}

// Signals counts interrupts (a virtio.Signaller).
type Signals struct{ C chan struct{} }

// NewSignals returns a Signals with room for many pending interrupts.
func NewSignals() *Signals { return &Signals{C: make(chan struct{}, 1024)} }

// Signal implements virtio.Signaller.
func (s *Signals) Signal() error {
	select {
	case s.C <- struct{}{}:
	default:
	}
	return nil
}

// Drain empties the pending interrupts and returns how many there were.
func (s *Signals) Drain() int {
	n := 0
	for {
		select {
		case <-s.C:
			n++
		default:
			return n
		}
	}
}

// WaitUsed collects n used entries from d's queue, failing t after five
// seconds without them.
func WaitUsed(t testing.TB, d *Driver, n int) [][2]uint32 {
	t.Helper()
	var got [][2]uint32
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < n && time.Now().Before(deadline) {
		got = append(got, d.Used()...)
		time.Sleep(100 * time.Microsecond)
	}
	if len(got) < n {
		t.Fatalf("%d used entries, want %d", len(got), n)
	}
	return got
}

// Quiet checks that a quiesced device uses nothing on any of drivers'
// queues and raises no interrupt on irq (when given) for a while.
func Quiet(t testing.TB, irq *Signals, drivers ...*Driver) {
	t.Helper()
	time.Sleep(30 * time.Millisecond)
	for i, d := range drivers {
		if u := d.Used(); len(u) != 0 {
			t.Fatalf("quiesced device used %v on queue %d", u, i)
		}
	}
	if irq == nil {
		return
	}
	if n := irq.Drain(); n != 0 {
		t.Fatalf("quiesced device raised %d interrupts", n)
	}
}

// SaveQuiesced kicks queue kick of the quiesced transport tr (a chain the
// driver offered meanwhile: the device must not take it), saves tr, and
// fails t unless every saved queue's NextAvail and NextUsed are n (what
// the device served before the quiesce).
func SaveQuiesced(t testing.TB, tr *virtio.MMIO, kick uint32, n uint16) virtio.TransportState {
	t.Helper()
	tr.Notify(kick)
	st, err := tr.Save()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range st.Queues {
		if q.NextAvail != n || q.NextUsed != n {
			t.Fatalf("saved queues %+v, want each at %d", st.Queues, n)
		}
	}
	return st
}

// QuiesceDuringPass checks Quiesce on tr while one of its device's service
// passes is in progress, held until a value is sent on release: a Quiesce
// whose context ends first fails and leaves the device running; one
// without a deadline returns nil, and not before the pass ends.
func QuiesceDuringPass(t testing.TB, tr *virtio.MMIO, release chan<- struct{}) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := tr.Quiesce(ctx); !errors.Is(err, context.DeadlineExceeded) || tr.Quiesced() {
		t.Fatalf("quiesce past its deadline: %v, quiesced %v", err, tr.Quiesced())
	}
	done := make(chan error, 1)
	go func() { done <- tr.Quiesce(context.Background()) }()
	select {
	case err := <-done:
		t.Fatalf("Quiesce returned (%v) with a request in progress", err)
	case <-time.After(30 * time.Millisecond):
	}
	release <- struct{}{}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// HostileOpSize is the most bytes Hostile takes for one operation.
const HostileOpSize = 12

// Hostile plays a hostile guest driver, for fuzzing a device behind its
// transport r over the fake memory mem: data is a sequence of
// operations, each a first byte whose low two bits choose it and
// up to HostileOpSize-1 bytes after it:
//
//   - 0: read a register (width 1, 2, 4 or 8 bytes from bits 2-3,
//     offset from the next two bytes, anywhere in the 512-byte window
//     with the device's configuration space);
//   - 1: write one (the same, and the value from the next eight bytes);
//   - 2: write eight bytes of the next ones into the queues' area (their
//     descriptor tables and rings as Driver lays them out, offset from
//     the next two bytes): descriptors pointing anywhere, any flags,
//     chains that loop, ring indexes far ahead;
//   - 3: bring the device up as a driver would, with the features from
//     the next eight bytes and its queues (maxSizes: each one's maximum)
//     at Driver's layout (a size from bits 2-7, at most the maximum and
//     256), and kick every queue: the rest then works on an activated
//     device.
//
// Whatever happens, the transport must not panic; the caller shuts it
// down after, which must return.
func Hostile(r Registers, mem Memory, maxSizes []uint16, data []byte) {
	nqueues := len(maxSizes)
	u16 := func(b []byte) uint64 {
		if len(b) < 2 {
			return 0
		}
		return uint64(binary.LittleEndian.Uint16(b))
	}
	u64 := func(b []byte) uint64 {
		var v [8]byte
		copy(v[:], b)
		return binary.LittleEndian.Uint64(v[:])
	}
	for len(data) > 0 {
		op, args := data[0], data[1:]
		n := min(len(args), HostileOpSize-1)
		data = args[n:]
		args = args[:n]
		width := 1 << ((op >> 2) & 3)
		switch op & 3 {
		case 0:
			buf := make([]byte, width)
			r.Read(u16(args)%0x200, buf)
		case 1:
			buf := make([]byte, 8)
			binary.LittleEndian.PutUint64(buf, u64(args[min(2, len(args)):]))
			r.Write(u16(args)%0x200, buf[:width])
		case 2:
			at := QueueBase + u16(args)%uint64(max(nqueues, 1)*QueueStride)
			if len(args) > 2 {
				copy(mem[at:min(at+8, uint64(len(mem)))], args[2:])
			}
		case 3:
			size := uint16(1) << ((op >> 2) % 16)
			drivers := make([]*Driver, nqueues)
			for i := range drivers {
				drivers[i] = NewDriver(mem, i, min(size, maxSizes[i], 256))
			}
			Bring(r, u64(args), drivers...)
			for i := range nqueues {
				Write32(r, reg.QueueNotify, uint32(i))
			}
		}
	}
}

// HostileSeeds are inputs for a fuzzer over Hostile: a bring-up with the
// given features and queue size, then a kick with garbage descriptors.
func HostileSeeds(features uint64) [][]byte {
	up := func(sizeShift byte) []byte {
		b := []byte{3 | sizeShift<<2}
		return binary.LittleEndian.AppendUint64(b, features)
	}
	junk := []byte{2, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0} // descriptor 0: address far out
	loop := []byte{2, 0x0c, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}                      // descriptor 0: NEXT to itself
	kick := []byte{1 | 2<<2, 0x50, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	avail := []byte{2, 0, 0x10, 0, 0, 0x40, 0, 0, 0, 0, 0, 0} // the avail index 64 ahead
	var seeds [][]byte
	for _, s := range []byte{3, 4, 8} {
		seeds = append(seeds, up(s), concat(up(s), junk, avail, kick), concat(up(s), loop, avail, kick))
	}
	return append(seeds, []byte{0, 0x70, 0}, []byte{1 | 2<<2, 0x70, 0, 0xff, 0xff, 0xff, 0xff})
}

func concat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// NewDevice makes a device for a fuzzer (FuzzRegisters, FuzzRestore) and
// returns it with the function that closes it.
type NewDevice func(testing.TB) (virtio.Device, func())

// FuzzRegisters fuzzes the device newDev makes (one per input) behind a
// virtio-mmio transport, driven by Hostile.
func FuzzRegisters(f *testing.F, newDev NewDevice) {
	d, done := newDev(f)
	feats, sizes := d.Features()|virtio.FeatureVersion1, d.QueueSizes()
	done()
	for _, s := range HostileSeeds(feats) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d, done := newDev(t)
		defer done()
		mem := make(Memory, FuzzMemSize)
		tr := virtio.NewMMIO("fuzz", d, mem, NewSignals(), nil)
		Hostile(tr, mem, sizes, data)
		tr.Shutdown()
	})
}

// FuzzRestore fuzzes Restore of a fresh transport of the device newDev
// makes with a state blob (TransportState's JSON, with the device's own
// state in it): a blob that decodes is restored (refused or not), every
// queue is kicked, and the transport shut down; nothing may panic. The
// seeds are the states of the device brought up with each queue size.
func FuzzRestore(f *testing.F, newDev NewDevice) {
	for _, size := range []uint16{2, 16, 256} {
		d, done := newDev(f)
		mem := make(Memory, MemSize)
		tr := virtio.NewMMIO("fuzz", d, mem, NewSignals(), nil)
		var drivers []*Driver
		for i, m := range d.QueueSizes() {
			drivers = append(drivers, NewDriver(mem, i, min(size, m)))
		}
		Bring(tr, d.Features()|virtio.FeatureVersion1, drivers...)
		st, err := tr.Save()
		tr.Shutdown()
		done()
		if err != nil {
			f.Fatal(err)
		}
		b, err := json.Marshal(st)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{"version":1,"queues":[{"max_size":65535,"size":65535,"ready":true,"desc":18446744073709551615}],"device":{}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var st virtio.TransportState
		if json.Unmarshal(data, &st) != nil {
			return
		}
		d, done := newDev(t)
		defer done()
		mem := make(Memory, FuzzMemSize)
		tr := virtio.NewMMIO("fuzz", d, mem, NewSignals(), nil)
		tr.Restore(st)
		for i := range d.QueueSizes() {
			tr.Notify(uint32(i))
		}
		tr.Shutdown()
	})
}
