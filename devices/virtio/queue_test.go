package virtio_test

import (
	"errors"
	"testing"

	"github.com/warrenvm/warren/devices/virtio"
	vt "github.com/warrenvm/warren/devices/virtio/virtiotest"
)

func newDriver(size uint16) *vt.Driver {
	return vt.NewDriver(make(vt.Memory, vt.MemSize), 0, size)
}

func TestPopPush(t *testing.T) {
	d := newDriver(8)
	if c, err := d.Q.Pop(d.Mem); c != nil || err != nil {
		t.Fatalf("empty ring popped %v, %v", c, err)
	}
	head, _ := d.Offer(vt.Buf{Data: []byte("req")}, vt.Buf{Len: 10, Writable: true})
	c, err := d.Q.Pop(d.Mem)
	if err != nil || c == nil {
		t.Fatal(err)
	}
	if c.Head != head || string(c.Readable[0]) != "req" || c.WritableLen() != 10 {
		t.Fatalf("chain %+v", c)
	}
	copy(c.Writable[0], "reply")
	if err := d.Q.Push(d.Mem, c.Head, 5); err != nil {
		t.Fatal(err)
	}
	if u := d.Used(); len(u) != 1 || u[0] != [2]uint32{uint32(head), 5} {
		t.Fatalf("used %v", u)
	}
	if need, _ := d.Q.NeedsInterrupt(d.Mem); !need {
		t.Error("no interrupt wanted")
	}
	if need, _ := d.Q.NeedsInterrupt(d.Mem); need {
		t.Error("second interrupt for the same entries")
	}
}

func TestIndirect(t *testing.T) {
	d := newDriver(4)
	table := d.Alloc(32)
	b1, b2 := d.Alloc(4), d.Alloc(8)
	copy(d.Mem[b1:], "abcd")
	vt.PutDescAt(d.Mem, table, b1, 4, 1, 1)
	vt.PutDescAt(d.Mem, table+16, b2, 8, 2, 0)
	d.PutDesc(0, table, 32, 4, 0)
	d.Publish(0)
	c, err := d.Q.Pop(d.Mem)
	if err != nil {
		t.Fatal(err)
	}
	if string(c.Readable[0]) != "abcd" || c.WritableLen() != 8 {
		t.Fatalf("indirect chain %+v", c)
	}
}

func TestMalformedChains(t *testing.T) {
	cases := map[string]func(d *vt.Driver){
		"head out of range": func(d *vt.Driver) { d.Publish(9) },
		"loop": func(d *vt.Driver) {
			d.PutDesc(0, vt.BufBase, 4, 1, 1)
			d.PutDesc(1, vt.BufBase, 4, 1, 0)
			d.Publish(0)
		},
		"self loop": func(d *vt.Driver) { d.PutDesc(0, vt.BufBase, 4, 1, 0); d.Publish(0) },
		"next out of range": func(d *vt.Driver) {
			d.PutDesc(0, vt.BufBase, 4, 1, 200)
			d.Publish(0)
		},
		"buffer outside RAM": func(d *vt.Driver) { d.PutDesc(0, vt.MemSize-2, 4, 0, 0); d.Publish(0) },
		"address overflow":   func(d *vt.Driver) { d.PutDesc(0, ^uint64(0)-1, 4, 0, 0); d.Publish(0) },
		"readable after writable": func(d *vt.Driver) {
			d.PutDesc(0, vt.BufBase, 4, 1|2, 1)
			d.PutDesc(1, vt.BufBase, 4, 0, 0)
			d.Publish(0)
		},
		"nested indirect": func(d *vt.Driver) {
			table := d.Alloc(16)
			vt.PutDescAt(d.Mem, table, table, 16, 4, 0)
			d.PutDesc(0, table, 16, 4, 0)
			d.Publish(0)
		},
		"indirect with next": func(d *vt.Driver) { d.PutDesc(0, vt.BufBase, 16, 4|1, 1); d.Publish(0) },
		"indirect bad size":  func(d *vt.Driver) { d.PutDesc(0, vt.BufBase, 15, 4, 0); d.Publish(0) },
		"indirect longer than the queue": func(d *vt.Driver) {
			table := d.Alloc(16 * 9)
			for i := uint64(0); i < 9; i++ {
				vt.PutDescAt(d.Mem, table+16*i, vt.BufBase, 1, 1, uint16(i+1))
			}
			d.PutDesc(0, table, 16*9, 4, 0)
			d.Publish(0)
		},
		"indirect loop": func(d *vt.Driver) {
			table := d.Alloc(32)
			vt.PutDescAt(d.Mem, table, vt.BufBase, 4, 1, 1)
			vt.PutDescAt(d.Mem, table+16, vt.BufBase, 4, 1, 0)
			d.PutDesc(0, table, 32, 4, 0)
			d.Publish(0)
		},
		"avail index jump": func(d *vt.Driver) { d.SetAvailIdx(100) },
	}
	for name, setup := range cases {
		d := newDriver(8)
		setup(d)
		c, err := d.Q.Pop(d.Mem)
		if !errors.Is(err, virtio.ErrBroken) || c != nil {
			t.Errorf("%s: Pop = %v, %v; want ErrBroken", name, c, err)
		}
	}
}

func TestValidate(t *testing.T) {
	mem := make(vt.Memory, vt.MemSize)
	good := virtio.Queue{MaxSize: 16, Size: 16, Desc: 0x1000, Avail: 0x2000, Used: 0x3000}
	if err := good.Validate(mem); err != nil {
		t.Fatal(err)
	}
	bad := map[string]func(q *virtio.Queue){
		"size 0":         func(q *virtio.Queue) { q.Size = 0 },
		"size not pow2":  func(q *virtio.Queue) { q.Size = 12 },
		"size over max":  func(q *virtio.Queue) { q.Size = 32 },
		"desc unaligned": func(q *virtio.Queue) { q.Desc = 0x1008 },
		"used unaligned": func(q *virtio.Queue) { q.Used = 0x3002 },
		"avail outside":  func(q *virtio.Queue) { q.Avail = vt.MemSize - 4 },
	}
	for name, mod := range bad {
		q := good
		mod(&q)
		if err := q.Validate(mem); !errors.Is(err, virtio.ErrBroken) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestEventIdx(t *testing.T) {
	d := newDriver(8)
	d.Q.EventIdx = true
	// used_event = 1: the driver wants an interrupt once entry 1 is used.
	put := func(v uint16) { d.Mem[d.Q.Avail+4+16] = byte(v); d.Mem[d.Q.Avail+4+17] = byte(v >> 8) }
	put(1)
	for i := 0; i < 2; i++ {
		d.Offer(vt.Buf{Data: []byte("x")})
		c, _ := d.Q.Pop(d.Mem)
		d.Q.Push(d.Mem, c.Head, 0)
		need, _ := d.Q.NeedsInterrupt(d.Mem)
		if need != (i == 1) {
			t.Errorf("after %d used: interrupt=%v", i+1, need)
		}
	}
}

// FuzzQueuePop treats the fuzz input as the guest's rings and descriptors:
// popping must terminate without panicking, whatever they hold.
func FuzzQueuePop(f *testing.F) {
	seed := newDriver(8)
	seed.Offer(vt.Buf{Data: []byte("hello")}, vt.Buf{Len: 4, Writable: true})
	f.Add(uint8(3), []byte(seed.Mem[vt.QueueBase:vt.QueueBase+0x3000]))
	mem := make(vt.Memory, vt.MemSize) // reused: allocating 4 MiB per input would dominate
	f.Fuzz(func(t *testing.T, sizeLog uint8, rings []byte) {
		size := uint16(1) << (sizeLog % 9)
		ringArea := mem[vt.QueueBase : vt.QueueBase+0x3000]
		clear(ringArea)
		copy(ringArea, rings)
		d := vt.NewDriver(mem, 0, size)
		for i := 0; i < 2*int(size)+2; i++ {
			c, err := d.Q.Pop(d.Mem)
			if err != nil || c == nil {
				return
			}
			if c.ReadableLen()+c.WritableLen() > 1<<30 {
				t.Fatal("chain exceeds the byte bound")
			}
			d.Q.Push(d.Mem, c.Head, uint32(c.WritableLen()))
		}
	})
}

// With event-idx, an empty ring asks the driver to notify on its next buffer.
func TestEventIdxRequestsNotification(t *testing.T) {
	d := newDriver(8)
	d.Q.EventIdx = true
	for i := 0; i < 3; i++ {
		d.Offer(vt.Buf{Data: []byte("x")})
		if c, err := d.Q.Pop(d.Mem); c == nil || err != nil {
			t.Fatal(c, err)
		}
	}
	if c, err := d.Q.Pop(d.Mem); c != nil || err != nil {
		t.Fatal(c, err)
	}
	at := d.Q.Used + 4 + 8*uint64(d.Q.Size)
	if ev := uint16(d.Mem[at]) | uint16(d.Mem[at+1])<<8; ev != 3 {
		t.Errorf("avail_event = %d, want 3", ev)
	}
}

func TestWorkersStartStop(t *testing.T) {
	var w virtio.Workers
	stopped := make(chan struct{}, 3)
	run := func(stop <-chan struct{}) { <-stop; stopped <- struct{}{} }
	if err := w.Start(run, run); err != nil {
		t.Fatal(err)
	}
	if err := w.Start(run); err == nil {
		t.Error("second Start while running accepted")
	}
	w.Stop()
	if len(stopped) != 2 {
		t.Fatalf("%d workers returned before Stop did", len(stopped))
	}
	w.Stop() // idempotent
	if err := w.Start(run); err != nil {
		t.Fatalf("restart: %v", err)
	}
	w.Stop()
}

// trackedMemory records MarkWritten calls.
type trackedMemory struct {
	vt.Memory
	written [][2]uint64
}

func (m *trackedMemory) MarkWritten(gpa, n uint64) { m.written = append(m.written, [2]uint64{gpa, n}) }

// covered reports whether [gpa, gpa+n) lies inside one recorded range.
func (m *trackedMemory) covered(gpa, n uint64) bool {
	for _, w := range m.written {
		if gpa >= w[0] && gpa+n <= w[0]+w[1] {
			return true
		}
	}
	return false
}

// Every byte a device may write through a queue is reported to a
// WriteTracker: the writable buffers, the used entry and index; readable
// buffers are not.
func TestWritesAreTracked(t *testing.T) {
	d := newDriver(8)
	d.Q.EventIdx = true
	mem := &trackedMemory{Memory: d.Mem}
	_, addrs := d.Offer(vt.Buf{Data: []byte("req")}, vt.Buf{Len: 10, Writable: true})
	c, err := d.Q.Pop(mem)
	if err != nil || c == nil {
		t.Fatal(err)
	}
	if err := d.Q.Push(mem, c.Head, 5); err != nil {
		t.Fatal(err)
	}
	if c, err := d.Q.Pop(mem); c != nil || err != nil { // empty: writes avail_event
		t.Fatal(c, err)
	}
	slot := d.Q.Used + 4
	for _, r := range []struct {
		name   string
		gpa, n uint64
	}{
		{"writable buffer", addrs[1], 10},
		{"used entry", slot, 8},
		{"used index", d.Q.Used, 4},
		{"avail_event", d.Q.Used + 4 + 8*uint64(d.Q.Size), 2},
	} {
		if !mem.covered(r.gpa, r.n) {
			t.Errorf("%s [%#x, +%d) not tracked; tracked %v", r.name, r.gpa, r.n, mem.written)
		}
	}
	if mem.covered(addrs[0], 1) {
		t.Errorf("readable buffer at %#x tracked as written", addrs[0])
	}
}
