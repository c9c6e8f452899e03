package vmmctl

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/warrenvm/warren/memsnap/vmsnap"
)

// DescribeGuest takes a full snapshot of the VM into dir (which the VMM
// must be able to write; the caller removes it) and returns vmsnap's
// Describe of it: the vCPUs, irqchip and virtqueues of a guest that went
// silent. The snapshot pauses the vCPUs out of KVM_RUN, so it answers
// while the guest takes no interrupts; a VMM that is itself stuck does
// not answer before ctx ends.
func (c Client) DescribeGuest(ctx context.Context, dir string) (string, error) {
	path := filepath.Join(dir, "describe")
	if _, err := c.Snapshot(ctx, SnapshotRequest{Path: path, Kind: vmsnap.Full}); err != nil {
		return "", fmt.Errorf("describe the guest: %w", err)
	}
	s, err := vmsnap.Load(path, nil)
	if err != nil {
		return "", fmt.Errorf("describe the guest: %w", err)
	}
	defer s.Close()
	return s.Describe(), nil
}
