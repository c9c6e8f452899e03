package vmsnap

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/warrenvm/warren/devices/virtio"
	"github.com/warrenvm/warren/vmm"
)

// TestDescribeState: the hung child's report reads the right LAPIC
// registers and MSRs.
func TestDescribeState(t *testing.T) {
	page := make([]byte, 0x400)
	put := func(off int, v uint32) { binary.LittleEndian.PutUint32(page[off:], v) }
	put(apicSVR, 0x1ff)
	put(apicLVTTimer, 2<<17|0xec)
	put(apicISR+16*7, 1<<12) // vector 0xec in service
	put(apicIRR+16*1, 1<<1)  // vector 0x21 pending
	c := vmm.VCPUState{ID: 0, MPState: 3, LAPIC: page,
		MSRs: []vmm.MSR{{Index: msrTSC, Data: 1000}, {Index: msrTSCDeadline, Data: 400}}}
	c.Regs.RIP, c.Regs.RFLAGS = 0xffffffff81000000, 0x246
	pic := make([]byte, 16)
	pic[1], pic[2], pic[14] = 0x20, 0xdf, 0x20
	ioapic := make([]byte, 24+24*8)
	binary.LittleEndian.PutUint32(ioapic[16:], 1<<5)
	for pin := range 24 {
		binary.LittleEndian.PutUint64(ioapic[24+8*pin:], 1<<16) // masked
	}
	binary.LittleEndian.PutUint64(ioapic[24+8*5:], 1<<15|1<<14|0x25)
	got := describeState(&vmm.State{VCPUs: []vmm.VCPUState{c}, PICMaster: pic, IOAPIC: ioapic}, nil)
	for _, want := range []string{"pic master: irr 0x20 imr 0xdf isr 0x00 elcr 0x20", "ioapic: irr 0x20; pin 5 vector 0x25 level remote-irr 1 pending 0\n", "rip 0xffffffff81000000", "IF true", "(halted)", "isr 0xec", "irr 0x21",
		"vector 0xec, tsc-deadline, masked false", "(enabled true)", "deadline - tsc -600"} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
}

// TestDescribeQueues: each ready queue's saved indices are printed beside
// the ring indices read from guest memory.
func TestDescribeQueues(t *testing.T) {
	mem := make([]byte, 0x3000)
	binary.LittleEndian.PutUint16(mem[0x1000+2:], 7) // avail idx
	binary.LittleEndian.PutUint16(mem[0x2000+2:], 5) // used idx
	devs := []DeviceState{{Name: "vsock", State: virtio.TransportState{Status: 0xf, IntStatus: 1,
		Queues: []virtio.QueueState{{Ready: true, Avail: 0x1000, Used: 0x2000, NextAvail: 5, NextUsed: 5, Signalled: 4}, {Ready: false}}}}}
	got := describeQueues(devs, bytes.NewReader(mem))
	for _, want := range []string{"device vsock: status 0xf interrupt status 0x1",
		"queue 0: device next avail 5 next used 5 signalled 4 event-idx false; ring avail idx 7 used idx 5"} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "queue 1") {
		t.Errorf("a queue that is not ready is printed:\n%s", got)
	}
}

// TestWalk: the page-table walk follows present entries to the page, and
// stops at one not present or mapping a large page.
func TestWalk(t *testing.T) {
	mem := make([]byte, 0x6000)
	va := uint64(0xffffffffc035120c)
	put := func(table, level uint64, e uint64) {
		idx := va >> (39 - 9*level) & 511
		binary.LittleEndian.PutUint64(mem[table+idx*8:], e)
	}
	put(0x1000, 0, 0x2000|1)
	put(0x2000, 1, 0x3000|1)
	put(0x3000, 2, 0x4000|1)
	put(0x4000, 3, 0x5000|3)
	r := bytes.NewReader(mem)
	if got := walk(r, 0x1000, 0, va); !strings.HasSuffix(got, "pte 0x5003 (present)") {
		t.Errorf("walk: %s", got)
	}
	put(0x3000, 2, 0x4000|1|1<<7)
	if got := walk(r, 0x1000, 0, va); !strings.HasSuffix(got, "pde 0x4081 (large page)") {
		t.Errorf("walk over a large page: %s", got)
	}
	put(0x2000, 1, 0)
	if got := walk(r, 0x1000, 0, va); !strings.HasSuffix(got, "pdpte 0x0 (not present)") {
		t.Errorf("walk to a hole: %s", got)
	}
	if got := walk(r, 0x1000, 1<<12, va); !strings.Contains(got, "5-level") {
		t.Errorf("walk under LA57: %s", got)
	}
}
