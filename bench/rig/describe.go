package rig

import (
	"context"
	"os"
	"time"

	"github.com/warrenvm/warren/vmmctl"
)

// DescribeGuest describes the live guest of the Warren VMM whose API
// socket is api (vmmctl's DescribeGuest: a full snapshot into a temporary
// directory under dir, removed afterwards, within 30 s): where a guest
// that went silent is stuck, for a benchmark's failure output.
func DescribeGuest(api, dir string) (string, error) {
	snap, err := os.MkdirTemp(dir, "describe-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(snap)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return (vmmctl.Client{Socket: api}).DescribeGuest(ctx, snap)
}
