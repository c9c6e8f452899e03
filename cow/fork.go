package cow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmm/guestmem"
)

// Point is a running VM frozen at a fork: everything a child needs to run
// on from where the parent was, without copying the parent's memory.
//
// Ownership: Memory's files belong to the Point; Close releases this
// process's references to them (children that mapped or inherited them
// keep theirs). The disk overlay files named in Disks belong to the
// children they are for.
type Point struct {
	// State is the parent's machine state at the fork.
	State *vmm.State
	// Devices are the parent's virtio transport states, in device order.
	Devices []vmsnap.DeviceState
	// Memory is the parent's RAM at the fork, immutable from then on.
	Memory *guestmem.Base
	// Disks[i][k] is the image child k opens for the parent's disk i: a
	// new copy-on-write overlay for a writable disk, the shared image
	// itself for a read-only one.
	Disks [][]string
	// DiskBases[i], with Forker.ChildrenMakeDisks, is the frozen image
	// each child's overlay Disks[i][k] is to go on (the child makes it:
	// cow/disk CreateChild); "" for a read-only disk, and nil otherwise.
	DiskBases []string
	// Pause is how long the parent was paused.
	Pause time.Duration
}

// Close releases the Point's memory files.
func (p *Point) Close() error {
	if p.Memory == nil {
		return nil
	}
	err := p.Memory.Close()
	p.Memory = nil
	return err
}

// Forker forks one running VM. The VM's device quiesce hooks must be
// registered (vmm AddPauseHook) by whoever built it.
type Forker struct {
	VM *vmm.VM
	// Devices are the VM's virtio transports, in its device order.
	Devices []vmsnap.Device
	// Disks are the VM's disks, in the VM's order of blk devices (see
	// DiskSet); nil for a VM without disks. Its lock is held while the
	// disks are forked, so a fork never runs inside a snapshot's or a
	// rollback's disk work.
	Disks *DiskSet
	// ChildrenMakeDisks is for children that run as other uids, members
	// of the parent's group (hostd/daemon's grants): each makes its own
	// overlays (cow/disk CreateChild over Point.DiskBases) in a directory
	// the parent may not write, and the disk files of the parent's it
	// reads (its frozen layers, its read-only images) are made readable
	// by the parent's group at the fork.
	ChildrenMakeDisks bool
}

// Fork pauses the VM, saves its machine and device states, makes its
// memory an immutable base that the VM itself continues on copy-on-write
// (guestmem Fork: no copy of the memory, only of the pages it wrote since
// an earlier fork), freezes each writable disk under a new overlay per
// child and one for the parent, and resumes the VM (unless it was paused
// before). The pause is milliseconds, independent of memory size. n is the
// number of children the disks get overlays for (memory is shared by any
// number); child k's overlays go into childDirs[k] when childDirs is
// given (one per child: its own directory, so that the layers its later
// snapshots make are its own), else beside the parent's disks, where the
// parent's new overlays always go.
func (f *Forker) Fork(ctx context.Context, n int, childDirs []string) (_ *Point, err error) {
	if n < 1 {
		return nil, fmt.Errorf("cow: fork: %d children", n)
	}
	if childDirs == nil {
		childDirs = make([]string, n)
	}
	if len(childDirs) != n {
		return nil, fmt.Errorf("cow: fork: %d children, %d disk directories", n, len(childDirs))
	}
	if f.Disks != nil {
		f.Disks.Lock()
		defer f.Disks.Unlock()
	}
	wasPaused := f.VM.Paused()
	if err := f.VM.Pause(ctx); err != nil {
		return nil, fmt.Errorf("cow: fork: %w", err)
	}
	paused := time.Now()
	p := &Point{}
	defer func() {
		if !wasPaused {
			if rerr := f.VM.Resume(); rerr != nil {
				err = errors.Join(err, fmt.Errorf("cow: fork: resume the parent: %w", rerr))
			}
		}
		p.Pause = time.Since(paused)
		if err != nil {
			p.Close()
		}
	}()
	if p.State, err = f.VM.SaveState(); err != nil {
		return nil, fmt.Errorf("cow: fork: %w", err)
	}
	for _, d := range f.Devices {
		ts, err := d.Transport.Save()
		if err != nil {
			return nil, fmt.Errorf("cow: fork: device %s: %w", d.Name, err)
		}
		p.Devices = append(p.Devices, vmsnap.DeviceState{Name: d.Name, State: ts})
	}
	// Disks before memory: a disk fork can fail (file system full), and
	// it leaves the parent's disks as they were when it does.
	if f.Disks != nil {
		if p.Disks, p.DiskBases, err = f.Disks.forkDisks(childDirs, f.ChildrenMakeDisks); err != nil {
			return nil, fmt.Errorf("cow: fork: %w", err)
		}
	}
	// The pages written since the previous fork, from the records that are
	// kept anyway (KVM's dirty log and the VMM's own writes), so that
	// nothing in this pause walks guest memory; without dirty logging,
	// guestmem scans pagemap instead.
	var written []uint64
	mem := f.VM.Memory()
	if f.VM.TracksDirty() {
		if written, err = f.VM.TakeDirty(guestmem.ForForks); err != nil {
			return nil, fmt.Errorf("cow: fork: %w", err)
		}
		for w, bits := range mem.TakeWritten(guestmem.ForForks) {
			written[w] |= bits
		}
	}
	if p.Memory, err = mem.Fork(written); err != nil {
		return nil, fmt.Errorf("cow: fork: %w", err)
	}
	return p, nil
}
