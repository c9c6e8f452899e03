package vmsnap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/warrenvm/warren/devices/virtio"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmm/guestmem"
)

// Transport is a virtio transport whose state a snapshot carries
// (devices/virtio.MMIO).
type Transport interface {
	Save() (virtio.TransportState, error)
	Restore(virtio.TransportState) error
}

// Device is one virtio device of a VM, by the name it has in the VM's
// Config.Virtio.
type Device struct {
	Name      string
	Transport Transport
	// AfterRestore, when set, runs once the transport's state is restored
	// (RestoreDevices), before the guest runs: the vsock device's
	// TransportReset goes here.
	AfterRestore func()
}

// Snapshotter takes snapshots of one running VM. Build it beside the VM,
// with the VM's virtio devices in order; the device quiesce hooks must be
// registered with the VM (vmm AddPauseHook) by whoever built it. Take may be
// called from any goroutine; calls are serialised.
type Snapshotter struct {
	vm          *vmm.VM
	devices     []Device
	options     json.RawMessage
	fingerprint []byte

	// Options, when set, is called at the start of each Take for the run
	// options to record, instead of those NewSnapshotter was given (a VM
	// whose recorded settings change while it runs: its egress policy).
	Options func() (json.RawMessage, error)

	// OnPaused, when set, runs while the VM is paused, after the memory
	// has been captured (tests copy guest RAM there to compare); its time
	// is left out of Report.Pause.
	OnPaused func(vm *vmm.VM)

	// Disks, when set, are the VM's writable disks: every snapshot
	// freezes them in its pause and records their layers, and a rollback
	// puts them back to the snapshot's layers in its pause (see disks.go).
	// Without it a snapshot records no disk layer, and a rollback leaves
	// the disks alone. Set it before the first Take.
	Disks Disks

	// mu serialises Take and protects parentLayer and parentName.
	mu sync.Mutex
	// parentLayer is the memory layer of the last snapshot of this VM,
	// whose pause cleared the dirty records; "" when there is none (or a
	// snapshot failed after clearing them), so an incremental one is
	// refused.
	parentLayer, parentName string
}

// NewSnapshotter returns a Snapshotter for vm with its devices (in the
// VM's device order), the caller's run options (stored opaquely) and this
// host's fingerprint.
func NewSnapshotter(vm *vmm.VM, devices []Device, options json.RawMessage, fingerprint []byte) *Snapshotter {
	return &Snapshotter{vm: vm, devices: devices, options: options, fingerprint: fingerprint}
}

// SetParent makes the snapshot whose memory layer is layer (named name)
// the parent of the next incremental one: right after a restore from it,
// before the VM first runs, the VM's memory equals it and its dirty records
// are empty.
func (s *Snapshotter) SetParent(layer, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.parentLayer, s.parentName = layer, name
}

// Report describes a snapshot taken.
type Report struct {
	Path string // DIR/NAME
	Kind Kind
	Result
	// Pause is how long the guest was paused; Total the whole Take.
	Pause, Total time.Duration
	// Captured is the number of non-zero pages copied during the pause;
	// PreCopied those copied before it (a full snapshot's pre-copy).
	Captured, PreCopied uint64
	// Disks are the writable disks' layers the snapshot records; Freeze
	// is the part of the pause spent freezing them, Settle the time
	// merging them after it (full snapshots); DiskWarning says what went
	// wrong in a merge, whose snapshot then records the unmerged layers.
	Disks          []DiskLayer
	Freeze, Settle time.Duration
	DiskWarning    string
}

// String is the one-line summary the CLI prints.
func (r *Report) String() string {
	line := fmt.Sprintf("%s %s: pause %.1f ms (%d pages copied; %d before it), total %.1f ms, %d pages, layer %d bytes (%s)",
		r.Kind, r.Path, float64(r.Pause.Microseconds())/1000, r.Captured, r.PreCopied, float64(r.Total.Microseconds())/1000,
		r.Pages, r.LayerBytes, filepath.Base(r.LayerPath))
	if len(r.Disks) > 0 {
		line += fmt.Sprintf("; %d disks frozen in %.1f ms of the pause, settled in %.1f ms", len(r.Disks),
			float64(r.Freeze.Microseconds())/1000, float64(r.Settle.Microseconds())/1000)
	}
	if r.DiskWarning != "" {
		line += " (" + r.DiskWarning + ")"
	}
	return line
}

// Take snapshots the VM to path (DIR/NAME): it pauses the VM, saves the
// machine and device states, copies the pages to capture, clears both
// dirty records, resumes the VM, and then writes the layer and the state
// file. A full snapshot of a running VM with Config.TrackDirty copies its
// RAM before the pause and only what changed meanwhile in it (see the
// package documentation). A VM that was already paused (vmm Pause) stays
// paused. An incremental snapshot needs Config.TrackDirty and a previous
// snapshot of this VM (its parent) in the same directory.
func (s *Snapshotter) Take(ctx context.Context, path string, kind Kind) (*Report, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	start := time.Now()
	if _, _, _, err := Paths(path); err != nil {
		return nil, err
	}
	c := &Capture{Kind: kind, Options: s.options, Fingerprint: s.fingerprint}
	if s.Options != nil {
		opts, err := s.Options()
		if err != nil {
			return nil, fmt.Errorf("snapshot %s: run options: %w", path, err)
		}
		c.Options = opts
	}
	switch kind {
	case Full:
	case Incremental:
		if !s.vm.TracksDirty() {
			return nil, fmt.Errorf("vmsnap: take %s: incremental snapshots need dirty-page tracking (vmm Config.TrackDirty)", path)
		}
		if s.parentLayer == "" {
			return nil, fmt.Errorf("vmsnap: take %s: no previous snapshot of this VM to be incremental on (take a full one)", path)
		}
		dir, _, _, _ := Paths(path)
		if pd := filepath.Dir(s.parentLayer); filepath.Clean(pd) != dir {
			return nil, fmt.Errorf("vmsnap: take %s: an incremental snapshot goes into its parent's directory %s", path, pd)
		}
		c.ParentLayer, c.ParentName = s.parentLayer, s.parentName
	default:
		return nil, fmt.Errorf("vmsnap: take %s: unknown kind %q", path, kind)
	}

	if s.Disks != nil {
		s.Disks.Lock()
		defer s.Disks.Unlock()
		if err := s.Disks.Prepare(); err != nil {
			return nil, fmt.Errorf("vmsnap: take %s: disks: %w", path, err)
		}
	}
	// A VM that someone else paused stays paused.
	wasPaused := s.vm.Paused()
	// A full snapshot of a running VM with dirty tracking copies its RAM
	// before the pause (pre-copy); the pause then copies only what changed
	// meanwhile.
	// An incremental one of a running VM likewise copies the pages
	// dirtied so far before the pause (preSet), and in the pause only
	// those dirtied since; the layer holds both sets.
	var pre *pageImage
	var preSet []uint64
	if s.vm.TracksDirty() && !wasPaused {
		var err error
		if kind == Full {
			pre, err = s.precopy()
		} else {
			pre, preSet, err = s.precopyDirty()
		}
		if err != nil {
			return nil, fmt.Errorf("vmsnap: take %s: pre-copy: %w", path, err)
		}
	}
	if err := s.vm.Pause(ctx); err != nil {
		return nil, fmt.Errorf("vmsnap: take %s: %w", path, err)
	}
	paused := time.Now()
	img, dirty, err := s.capture(c, pre)
	var frozen []DiskLayer
	var freeze time.Duration
	if err == nil && s.Disks != nil {
		t := time.Now()
		if frozen, err = s.Disks.Freeze(); err != nil {
			err = fmt.Errorf("disks: %w", err)
		}
		freeze = time.Since(t)
	}
	var hook time.Duration // not counted in the pause
	if err == nil && s.OnPaused != nil {
		t := time.Now()
		s.OnPaused(s.vm)
		hook = time.Since(t)
	}
	var rerr error
	if !wasPaused {
		rerr = s.vm.Resume()
	}
	pause := time.Since(paused) - hook
	err = errors.Join(err, rerr)
	rep := &Report{Path: path, Kind: kind, Freeze: freeze}
	if frozen != nil {
		// The frozen disks' new tops are settled whatever failed: the VM
		// runs on them (no merge for a snapshot that failed).
		t := time.Now()
		var serr error
		if c.Disks, serr = s.Disks.Settle(frozen, kind == Full && err == nil); serr != nil {
			rep.DiskWarning = serr.Error()
		}
		rep.Settle, rep.Disks = time.Since(t), c.Disks
	}
	if err != nil {
		return nil, fmt.Errorf("vmsnap: take %s: %w", path, err)
	}
	rep.Captured = uint64(len(img.pages))
	c.Memory, c.Dirty = img, dirty
	if pre != nil {
		c.Memory = &overlay{base: pre, top: img, set: dirty}
		rep.PreCopied = uint64(len(pre.pages))
		if kind == Incremental {
			c.Dirty = slices.Clone(dirty)
			orBits(c.Dirty, preSet)
		}
	}
	res, err := Write(path, c)
	if err != nil {
		return nil, err
	}
	_, name, _, _ := Paths(path)
	s.parentLayer, s.parentName = res.LayerPath, name
	rep.Result, rep.Pause, rep.Total = *res, pause, time.Since(start)
	return rep, nil
}

// dirtyPages returns the pages the guest wrote since the snapshots' previous
// look (KVM's dirty log through vmm's ledger, so forks keep their own
// share), as one bitmap over the flat memfd (bit p%64 of word p/64).
func (s *Snapshotter) dirtyPages() ([]uint64, error) {
	mem := s.vm.Memory()
	if !s.vm.TracksDirty() {
		return make([]uint64, (mem.Size()/guestmem.PageSize+63)/64), nil
	}
	return s.vm.TakeDirty(guestmem.ForSnapshots)
}

// precopy copies every populated page of the running VM after clearing
// KVM's dirty log: a page the guest writes during or after the copy is in
// the log at the pause, and capture copies it again. The VMM's own writes
// are not cleared here (a device may have marked a page and not written it
// yet): capture re-copies every page the VMM wrote since the previous
// snapshot. The parent is forgotten, since the log no longer covers it.
func (s *Snapshotter) precopy() (*pageImage, error) {
	s.parentLayer, s.parentName = "", ""
	if _, err := s.dirtyPages(); err != nil {
		return nil, err
	}
	mem := s.vm.Memory()
	want, err := mem.Populated()
	if err != nil {
		return nil, err
	}
	return capturePages(mem.Flat(), want), nil
}

// precopyDirty is an incremental snapshot's pre-copy: it reads and clears
// KVM's dirty log and copies the pages in it while the VM runs. A page the
// guest writes again during or after the copy is in the log at the pause,
// and capture copies it again; the VMM's own writes are left for capture
// (as in precopy). The parent is forgotten here, since the log no longer
// covers it should the snapshot fail (the Capture already names it).
func (s *Snapshotter) precopyDirty() (*pageImage, []uint64, error) {
	s.parentLayer, s.parentName = "", ""
	set, err := s.dirtyPages()
	if err != nil {
		return nil, nil, err
	}
	if err := s.vm.Memory().EnsurePages(set); err != nil {
		return nil, nil, err
	}
	return capturePages(s.vm.Memory().Flat(), set), set, nil
}

// capture reads the paused VM's machine and device states into c and
// copies the memory to store. It clears the dirty records (and with them
// the parent) first thing: whatever fails after, the next incremental
// snapshot must not be taken on an older parent. With pre (a full
// snapshot's pre-copy) it copies only the pages written since, and dirty
// says which pages of the returned image supersede pre's.
func (s *Snapshotter) capture(c *Capture, pre *pageImage) (*pageImage, []uint64, error) {
	mem := s.vm.Memory()
	s.parentLayer, s.parentName = "", ""
	dirty, err := s.dirtyPages()
	if err != nil {
		return nil, nil, err
	}
	orBits(dirty, mem.TakeWritten(guestmem.ForSnapshots))
	st, err := s.vm.SaveState()
	if err != nil {
		return nil, nil, err
	}
	c.State = st
	for _, d := range s.devices {
		ts, err := d.Transport.Save()
		if err != nil {
			return nil, nil, fmt.Errorf("device %s: %w", d.Name, err)
		}
		c.Devices = append(c.Devices, DeviceState{Name: d.Name, State: ts})
	}
	want := dirty
	if c.Kind == Full && pre == nil {
		if want, err = mem.Populated(); err != nil {
			return nil, nil, err
		}
	}
	// A uffd-restored page the guest dirtied may have been discarded
	// since (a balloon): no VMM goroutine may fault on a page its pager
	// has not installed (memsnap/uffd).
	if err := mem.EnsurePages(want); err != nil {
		return nil, nil, err
	}
	return capturePages(mem.Flat(), want), dirty, nil
}
