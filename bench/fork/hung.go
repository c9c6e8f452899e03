package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/warrenvm/warren/vmmctl"
)

// hungState describes a live child whose agent never answered
// (vmmctl's DescribeGuest: a snapshot of it into a directory under dir,
// removed afterwards): where its guest is stuck, whether it halted with
// interrupts on, what its local APIC still owes it, and its virtqueues
// against their rings (issue 18's fork hang: a child whose VMM lives while
// its guest is silent).
func hungState(ch vmmctl.ForkChild, dir string) string {
	snapDir, err := os.MkdirTemp(dir, "hung-")
	if err != nil {
		return fmt.Sprintf("no state: %v", err)
	}
	defer os.RemoveAll(snapDir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := (vmmctl.Client{Socket: ch.API}).DescribeGuest(ctx, snapDir)
	if err != nil {
		return "no state: " + err.Error()
	}
	return d
}
