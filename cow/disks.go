package cow

import (
	"fmt"
	"os"

	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/devices/virtio/blk"
)

// Disk is one virtio-blk disk of a VM that forks. A writable disk must
// have been made with blk.NewWithBackend over a writable cow/disk Raw or
// Overlay (OpenDisk does that), so that its image can be frozen.
type Disk struct {
	Dev      *blk.Device
	ReadOnly bool
}

// OpenDisk opens the image at path as a disk backend that can fork: a
// cow/disk overlay (with its chain) when the file is one, else a raw
// image. Writable images are locked exclusively, read-only ones shared.
func OpenDisk(path string, readOnly bool) (blk.Backend, error) {
	ov, err := disk.IsOverlay(path)
	if err != nil {
		return nil, err
	}
	if ov {
		return disk.OpenChain(path, readOnly)
	}
	return disk.OpenRaw(path, !readOnly)
}

// forkDisks freezes every writable disk under new overlays, one swapped in
// for the parent and one per child (cow/disk Fork), and returns, per disk,
// the image each child opens: its overlay, or for a read-only disk the
// shared image. The VM is paused and its transports quiesced. On an error
// the disks already forked stay forked (the parent runs on its new
// overlays, which is as good as before) and the children's overlay files
// are removed.
func forkDisks(disks []Disk, n int, dir string) (_ [][]string, err error) {
	out := make([][]string, len(disks))
	defer func() {
		if err != nil {
			for _, paths := range out {
				for _, p := range paths {
					if ok, _ := disk.IsOverlay(p); ok {
						os.Remove(p)
					}
				}
			}
		}
	}()
	for i, d := range disks {
		if d.ReadOnly {
			for range n {
				out[i] = append(out[i], d.Dev.Path())
			}
			continue
		}
		cur, ok := d.Dev.Backend().(disk.Backing)
		if !ok {
			return nil, fmt.Errorf("disk %s: its backend (%T) cannot be frozen for a fork", d.Dev.Path(), d.Dev.Backend())
		}
		parent, children, err := disk.Fork(cur, n, dir)
		if err != nil {
			return nil, fmt.Errorf("disk %s: %w", d.Dev.Path(), err)
		}
		if _, err := d.Dev.SwapBackend(parent); err != nil {
			// The parent overlay owns cur now; closing it would close
			// the disk under the device. Leave both; the fork fails.
			return nil, fmt.Errorf("disk %s: %w", d.Dev.Path(), err)
		}
		out[i] = children
	}
	return out, nil
}
