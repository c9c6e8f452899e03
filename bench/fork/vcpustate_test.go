package main

import (
	"encoding/binary"
	"strings"
	"testing"

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
	got := describeState(&vmm.State{VCPUs: []vmm.VCPUState{c}})
	for _, want := range []string{"rip 0xffffffff81000000", "IF true", "(halted)", "isr 0xec", "irr 0x21",
		"vector 0xec, tsc-deadline, masked false", "(enabled true)", "deadline - tsc -600"} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
}
