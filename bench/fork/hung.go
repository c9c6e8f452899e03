package main

import (
	"github.com/warrenvm/warren/bench/rig"
	"github.com/warrenvm/warren/vmmctl"
)

// hungState describes a live child whose agent never answered
// (vmmctl's DescribeGuest: a snapshot of it into a directory under dir,
// removed afterwards): where its guest is stuck, whether it halted with
// interrupts on, what its local APIC still owes it, and its virtqueues
// against their rings (issue 18's fork hang: a child whose VMM lives while
// its guest is silent).
func hungState(ch vmmctl.ForkChild, dir string) string {
	d, err := rig.DescribeGuest(ch.API, dir)
	if err != nil {
		return "no state: " + err.Error()
	}
	return d
}
