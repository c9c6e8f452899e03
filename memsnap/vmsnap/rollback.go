package vmsnap

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/warrenvm/warren/vmm/guestmem"
)

// RollbackReport describes an in-place rollback.
type RollbackReport struct {
	// Path is the snapshot's state file.
	Path string
	// Written is the number of pages rewritten with the snapshot's
	// content, Cleared those zeroed; every other page was already equal
	// and was left alone.
	Written, Cleared uint64
	// Pause is how long the guest was paused, Total the whole rollback
	// (loading and verifying the snapshot not included).
	Pause, Total time.Duration
	// Disks is the number of writable disks put back to the snapshot's
	// layers (each on a new overlay over its layer); DiskWarning says
	// what failed in removing the previous tops after the rollback.
	Disks       int
	DiskWarning string
}

// String is the one-line summary the CLI prints.
func (r *RollbackReport) String() string {
	line := fmt.Sprintf("rolled back to %s: pause %.1f ms, %d pages rewritten, %d cleared, the rest reused",
		r.Path, float64(r.Pause.Microseconds())/1000, r.Written, r.Cleared)
	if r.Disks > 0 {
		line += fmt.Sprintf(", %d disks on new overlays over the snapshot's layers", r.Disks)
	}
	return line
}

// Rollback puts the running VM back to snap, one of its own snapshots (or
// any snapshot of a machine with the same vCPUs, memory, devices and
// command line), in place: the process, the KVM VM, guest memory, the
// devices' host sides (sockets, tap, disk files) and the VM's identity are
// kept. The VM is paused; guest memory is rewritten where it differs
// from the snapshot (pages that did not change since stay as they are:
// no copy, no fault); the machine state is loaded (vmm LoadState); each
// transport is reset and loaded with its saved state, and AfterRestore
// runs (the vsock transport reset, so the agent resyncs its clock); the
// VM resumes (unless it was paused before). snap must have been loaded
// with Load, which verified it; its chain stays open.
//
// The next incremental snapshot is taken on snap: the VM's memory equals
// it and the dirty records are cleared. With Disks set, the writable
// disks go back too, in the same pause: each gets a new overlay over the
// snapshot's layer (made before the pause, swapped in while the
// transports are quiesced), so the guest's page cache, restored with the
// memory, matches its disks exactly; the previous live tops are removed
// after the resume. A snapshot without disk layers (the previous format)
// is refused for a VM with writable disks before anything is touched.
//
// On an error after the VM's state was touched, the VM is left paused in
// an undefined state: stop it (the error says so).
func (s *Snapshotter) Rollback(ctx context.Context, snap *Snapshot) (*RollbackReport, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	start := time.Now()
	if len(s.devices) != len(snap.Devices) {
		return nil, fmt.Errorf("vmsnap: rollback to %s: %d devices for %d saved device states", snap.Path, len(s.devices), len(snap.Devices))
	}
	for i, d := range s.devices {
		if d.Name != snap.Devices[i].Name {
			return nil, fmt.Errorf("vmsnap: rollback to %s: device %d is %q, the saved one %q", snap.Path, i, d.Name, snap.Devices[i].Name)
		}
	}
	if snap.Chain.MemSize() != s.vm.Memory().Size() {
		return nil, fmt.Errorf("vmsnap: rollback to %s: snapshot memory is %d bytes, the VM's %d", snap.Path, snap.Chain.MemSize(), s.vm.Memory().Size())
	}
	var disks DiskRollback
	if s.Disks != nil {
		s.Disks.Lock()
		defer s.Disks.Unlock()
		var err error
		if disks, err = s.Disks.PrepareRollback(snap); err != nil {
			return nil, fmt.Errorf("vmsnap: rollback to %s: %w", snap.Path, err)
		}
	}
	swapped := false
	defer func() {
		if disks != nil && !swapped {
			disks.Abort()
		}
	}()
	wasPaused := s.vm.Paused()
	if err := s.vm.Pause(ctx); err != nil {
		return nil, fmt.Errorf("vmsnap: rollback to %s: %w", snap.Path, err)
	}
	paused := time.Now()
	rep := &RollbackReport{Path: snap.Path}
	if disks != nil {
		rep.Disks = len(snap.Disks)
	}
	broken := func(err error) (*RollbackReport, error) {
		s.parentLayer, s.parentName = "", ""
		return nil, fmt.Errorf("vmsnap: rollback to %s: %w (the VM is left paused in an undefined state: stop it)", snap.Path, err)
	}
	err := s.vm.LoadState(snap.State, func(m *guestmem.Memory) error {
		cand, err := m.Populated()
		if err != nil {
			return err
		}
		// The pages rewritten are the VMM's writes, in no dirty log: the
		// next fork must copy them (the snapshots' record is reset below).
		rep.Written, rep.Cleared, err = snap.Chain.RestoreOver(m.Flat(), cand, m.MarkPageWritten)
		return err
	})
	if err != nil {
		return broken(err)
	}
	if disks != nil {
		// Quiesced: no request is in flight on the old tops.
		swapped = true
		if err := disks.Swap(); err != nil {
			return broken(fmt.Errorf("disks: %w", err))
		}
	}
	for i, d := range s.devices {
		if err := d.Transport.Restore(snap.Devices[i].State); err != nil {
			return broken(fmt.Errorf("device %s: %w", d.Name, err))
		}
	}
	for _, d := range s.devices {
		if d.AfterRestore != nil {
			d.AfterRestore()
		}
	}
	// Memory now equals snap: forget what was dirtied before.
	if _, err := s.dirtyPages(); err != nil {
		return broken(err)
	}
	s.vm.Memory().TakeWritten(guestmem.ForSnapshots)
	s.parentLayer, s.parentName = snap.Layer(), snap.Name()
	s.vm.RaisePending()
	var rerr error
	if !wasPaused {
		rerr = s.vm.Resume()
	}
	rep.Pause = time.Since(paused)
	var derr error
	if disks != nil {
		derr = disks.Done()
	}
	rep.Total = time.Since(start)
	if rerr != nil {
		return nil, errors.Join(fmt.Errorf("vmsnap: rollback to %s: resume", snap.Path), rerr, derr)
	}
	if derr != nil {
		rep.DiskWarning = fmt.Sprintf("the previous disk tops were not all removed: %v", derr)
	}
	return rep, nil
}
