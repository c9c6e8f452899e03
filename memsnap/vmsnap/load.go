package vmsnap

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/internal/strictjson"
	"github.com/warrenvm/warren/memsnap"
	"github.com/warrenvm/warren/memsnap/statefile"
	"github.com/warrenvm/warren/memsnap/uffd"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmm/guestmem"
)

// Snapshot is a loaded and verified snapshot, ready to restore. It owns
// its memory chain; Close it after use (a restored VM does not need it).
type Snapshot struct {
	// Path is the state file.
	Path        string
	Dir         string
	Meta        Meta
	State       *vmm.State
	Devices     []DeviceState
	Fingerprint []byte
	// Chain is the memory: the layer the state file names and its parents.
	Chain *memsnap.Chain
	// Disks are the writable disks' layers (the "disks" section): non-nil
	// from MetaVersion 2 on (empty for a VM without writable disks), nil
	// for a version 1 snapshot, which holds no disk state.
	Disks []DiskLayer

	name  string // from the path (Meta.Name is the name it was taken as)
	layer string // the top memory layer's path (Layer)
}

// Load reads the snapshot at path (DIR/NAME or DIR/NAME.wstate) and
// checks all of it before anything is built from it: the state file's
// checksums and versions, that its fingerprint is host's (ErrIncompatibleCPU
// otherwise), the memory chain (each layer opened and verified, parents
// found by hash, the top the layer recorded), and the machine state. The
// errors name the file and wrap statefile.ErrCorrupt, statefile.ErrVersion,
// ErrIncompatibleCPU or memsnap's sentinels. A nil host skips the host
// check (for tools that only read snapshots, such as Compact); the layers
// must still carry the state file's fingerprint.
func Load(path string, host FingerprintSource) (_ *Snapshot, err error) {
	dir, name, statePath, err := Paths(path)
	if err != nil {
		return nil, err
	}
	f, err := statefile.Read(statePath)
	if err != nil {
		return nil, fmt.Errorf("vmsnap: load: %w", err)
	}
	hostFP := f.Fingerprint
	if host != nil {
		// A mismatch is read again a few times before it counts: in the
		// nested KVM host, KVM's supported CPUID has been seen to differ
		// from one call to the next beyond the per-CPU fields
		// CPUIDHash clears; a truly different host differs every time.
		for attempt := 0; ; attempt++ {
			if hostFP, err = host(); err != nil {
				return nil, fmt.Errorf("vmsnap: load %s: %w", statePath, err)
			}
			err = checkFingerprint(statePath, f.Fingerprint, hostFP)
			if err == nil {
				break
			}
			if attempt == 3 {
				return nil, err
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	s := &Snapshot{Path: statePath, Dir: dir, name: name, Fingerprint: f.Fingerprint}
	section := func(name string, v any) error {
		b, ok := f.Section(name)
		if !ok {
			return fmt.Errorf("vmsnap: load %s: no %q section: %w", statePath, name, statefile.ErrCorrupt)
		}
		if err := strictjson.Unmarshal(b, v); err != nil {
			return fmt.Errorf("vmsnap: load %s: section %q: %v: %w", statePath, name, err, statefile.ErrCorrupt)
		}
		return nil
	}
	if err := section(secMeta, &s.Meta); err != nil {
		return nil, err
	}
	if s.Meta.Version != 1 && s.Meta.Version != MetaVersion {
		return nil, fmt.Errorf("vmsnap: load %s: snapshot version %d, this Warren reads versions 1 and %d: %w", statePath, s.Meta.Version, MetaVersion, statefile.ErrVersion)
	}
	if s.Meta.Version >= 2 {
		b, ok := f.Section(secDisks)
		if !ok {
			return nil, fmt.Errorf("vmsnap: load %s: no %q section: %w", statePath, secDisks, statefile.ErrCorrupt)
		}
		if s.Disks, err = parseDisks(b); err != nil {
			return nil, fmt.Errorf("vmsnap: load %s: %w", statePath, err)
		}
	}
	if s.Meta.Kind != Full && s.Meta.Kind != Incremental {
		return nil, fmt.Errorf("vmsnap: load %s: unknown kind %q: %w", statePath, s.Meta.Kind, statefile.ErrCorrupt)
	}
	machine, ok := f.Section(secMachine)
	if !ok {
		return nil, fmt.Errorf("vmsnap: load %s: no %q section: %w", statePath, secMachine, statefile.ErrCorrupt)
	}
	if s.State, err = vmm.UnmarshalState(machine); err != nil {
		return nil, fmt.Errorf("vmsnap: load %s: %w", statePath, err)
	}
	if err := section(secDevices, &s.Devices); err != nil {
		return nil, err
	}
	if len(s.Devices) != len(s.State.Machine.Virtio) {
		return nil, fmt.Errorf("vmsnap: load %s: %d device states for %d virtio devices: %w", statePath, len(s.Devices), len(s.State.Machine.Virtio), statefile.ErrCorrupt)
	}
	for i, d := range s.Devices {
		if d.Name != s.State.Machine.Virtio[i] {
			return nil, fmt.Errorf("vmsnap: load %s: device state %d is %q, the machine's device %q: %w", statePath, i, d.Name, s.State.Machine.Virtio[i], statefile.ErrCorrupt)
		}
	}
	var ref memoryRef
	if err := section(secMemory, &ref); err != nil {
		return nil, err
	}
	if ref.Layer == "" || ref.Layer != filepath.Base(ref.Layer) || ref.Layer == "." || ref.Layer == ".." {
		return nil, fmt.Errorf("vmsnap: load %s: memory layer %q is not a file name: %w", statePath, ref.Layer, statefile.ErrCorrupt)
	}
	if ref.Size != s.State.Machine.MemBytes {
		return nil, fmt.Errorf("vmsnap: load %s: memory of %d bytes for a machine of %d: %w", statePath, ref.Size, s.State.Machine.MemBytes, statefile.ErrCorrupt)
	}
	chain, err := memsnap.OpenChain(filepath.Join(dir, ref.Layer), memsnap.Dir(dir))
	if err != nil {
		return nil, fmt.Errorf("vmsnap: load %s: memory: %w", statePath, err)
	}
	defer func() {
		if err != nil {
			chain.Close()
		}
	}()
	if got := chain.Top().Hash().String(); got != ref.Hash {
		return nil, fmt.Errorf("vmsnap: load %s: memory layer %s has hash %s, the state file names %s: %w", statePath, ref.Layer, got, ref.Hash, memsnap.ErrCorrupt)
	}
	if err := chain.CheckFingerprint(hostFP); err != nil {
		return nil, fmt.Errorf("vmsnap: load %s: %w: %w", statePath, ErrIncompatibleCPU, err)
	}
	if chain.MemSize() != ref.Size || chain.PageSize() != pageSize {
		return nil, fmt.Errorf("vmsnap: load %s: memory chain of %d bytes in pages of %d: %w", statePath, chain.MemSize(), chain.PageSize(), memsnap.ErrIncompatible)
	}
	if err := chain.Verify(); err != nil {
		return nil, fmt.Errorf("vmsnap: load %s: memory: %w", statePath, err)
	}
	s.Chain, s.layer = chain, chain.Top().Path()
	return s, nil
}

// Close closes the memory chain.
func (s *Snapshot) Close() error {
	if s.Chain == nil {
		return nil
	}
	err := s.Chain.Close()
	s.Chain = nil
	return err
}

// Name is the snapshot's name: its state file's base name.
func (s *Snapshot) Name() string { return s.name }

// Layer is the path of the snapshot's own (top) memory layer.
// It answers after Close too.
func (s *Snapshot) Layer() string { return s.layer }

// MemoryMode is how a restore gives the new VM its memory.
type MemoryMode string

const (
	// Eager decodes the whole chain into the new VM's memfd before it
	// runs.
	Eager MemoryMode = "eager"
	// Mmap flattens the chain once into DIR/NAME.<hash>.wraw (reused
	// while it exists) and maps that copy-on-write as guest RAM, so pages
	// are read when the guest first touches them.
	Mmap MemoryMode = "mmap"
	// Uffd gives the VM a fresh memfd (as Eager) registered with
	// userfaultfd, whose pages a memsnap/uffd Server fills from the chain
	// when first touched. Forks, full snapshots and rollbacks of the VM
	// need the Server's Complete first (vmmproc calls it).
	Uffd MemoryMode = "uffd"
)

// ParseMemoryMode reads a MemoryMode: "eager", "mmap" or "uffd".
func ParseMemoryMode(s string) (MemoryMode, error) {
	switch m := MemoryMode(s); m {
	case Eager, Mmap, Uffd:
		return m, nil
	}
	return "", fmt.Errorf("memory mode %q: want eager, mmap or uffd", s)
}

// Restore creates a VM from the snapshot eagerly (lazy false) or by Mmap
// (lazy true): RestoreWith without a fault server.
func (s *Snapshot) Restore(cfg vmm.Config, lazy bool) (*vmm.VM, error) {
	mode := Eager
	if lazy {
		mode = Mmap
	}
	vm, _, err := s.RestoreWith(cfg, RestoreOptions{Mode: mode})
	return vm, err
}

// RestoreOptions say how RestoreWith restores memory.
type RestoreOptions struct {
	// Mode is the memory mode (Eager when empty).
	Mode MemoryMode
	// Uffd configures the fault server of the Uffd mode (a prefetched
	// working set, recording one, the cache, error reports).
	Uffd uffd.Options
}

// RestoreWith creates a VM from the snapshot (vmm.Restore): cfg supplies
// what the snapshot does not hold (devices, console, KVM device, profile,
// log; its MemBytes and CPUs must be the snapshot's, and its Virtio the
// same devices in the same order), and o.Mode how its memory is made (see
// MemoryMode). Restore the device states with RestoreDevices before
// running the VM.
//
// In Uffd mode the memfd is registered and the server started before the
// VM exists, so nothing can touch a page the server does not fill, and
// the server is the memory's guestmem.Pager (the VMM's own accesses
// install their pages instead of faulting on them); the
// server then owns the snapshot's chain (Close no longer closes it, Layer
// still answers) and the caller owns the server: Close it after the VM's
// vCPUs have stopped, before or after the VM. Where the host cannot serve
// memory by userfaultfd, RestoreWith fails with an error wrapping
// uffd.ErrUnsupported before creating anything, and the snapshot is
// unchanged (restore it another way).
func (s *Snapshot) RestoreWith(cfg vmm.Config, o RestoreOptions) (*vmm.VM, *uffd.Server, error) {
	switch o.Mode {
	case Eager, "":
		vm, err := vmm.Restore(cfg, s.State, func(m *guestmem.Memory) error {
			return s.Chain.Restore(m.Flat())
		})
		return vm, nil, err
	case Mmap:
		raw, err := s.Flattened()
		if err != nil {
			return nil, nil, err
		}
		mem, err := guestmem.NewPrivateFile(raw, s.Chain.MemSize())
		if err != nil {
			return nil, nil, fmt.Errorf("vmsnap: restore %s: %w", s.Path, err)
		}
		vm, err := vmm.RestoreMemory(cfg, s.State, mem)
		return vm, nil, err
	case Uffd:
	default:
		return nil, nil, fmt.Errorf("vmsnap: restore %s: unknown memory mode %q", s.Path, o.Mode)
	}
	if s.Chain == nil {
		return nil, nil, fmt.Errorf("vmsnap: restore %s: the memory chain is closed or served already", s.Path)
	}
	mem, err := guestmem.New(s.Chain.MemSize())
	if err != nil {
		return nil, nil, fmt.Errorf("vmsnap: restore %s: %w", s.Path, err)
	}
	srv, err := uffd.Start(s.Chain, mem.Flat(), o.Uffd)
	if err != nil {
		mem.Close()
		return nil, nil, fmt.Errorf("vmsnap: restore %s: %w", s.Path, err)
	}
	s.Chain = nil // the server's now
	// Every device reaches guest memory through mem's accessors, which
	// have the server install a page before handing it out: no VMM
	// goroutine faults on a page not served yet (memsnap/uffd's package
	// documentation). Set before any device exists.
	mem.SetPager(srv)
	vm, err := vmm.RestoreMemory(cfg, s.State, mem)
	if err != nil {
		srv.Close()
		return nil, nil, err
	}
	return vm, srv, nil
}

// Flattened returns the raw image of the snapshot's memory beside the
// snapshot (DIR/NAME.<top hash>.wraw), flattening the chain the first time.
// The file is named by the top layer's content hash, so it always matches
// the chain; it is written under a temporary name and renamed into place.
func (s *Snapshot) Flattened() (string, error) {
	raw := filepath.Join(s.Dir, fmt.Sprintf("%s.%.16s%s", s.name, s.Chain.Top().Hash().String(), RawExt))
	if fi, err := os.Stat(raw); err == nil && fi.Mode().IsRegular() && uint64(fi.Size()) == s.Chain.MemSize() {
		return raw, nil
	}
	if err := s.Chain.Flatten(raw); err != nil {
		return "", fmt.Errorf("vmsnap: restore %s: %w", s.Path, err)
	}
	return raw, nil
}

// RestoreDevices loads each saved transport state into the device of the
// same name (devices must be the restored VM's, in its order), then calls
// every device's AfterRestore. Call it after Restore and before Run.
func (s *Snapshot) RestoreDevices(devices []Device) error {
	if len(devices) != len(s.Devices) {
		return fmt.Errorf("vmsnap: restore %s: %d devices for %d saved device states", s.Path, len(devices), len(s.Devices))
	}
	for i, d := range devices {
		if d.Name != s.Devices[i].Name {
			return fmt.Errorf("vmsnap: restore %s: device %d is %q, the saved one %q", s.Path, i, d.Name, s.Devices[i].Name)
		}
		if err := d.Transport.Restore(s.Devices[i].State); err != nil {
			return fmt.Errorf("vmsnap: restore %s: %w", s.Path, err)
		}
	}
	for _, d := range devices {
		if d.AfterRestore != nil {
			d.AfterRestore()
		}
	}
	return nil
}

// Compact writes a new full snapshot to out (DIR/NEW) whose memory is the
// effective memory of top's chain and whose state is top's, so the chain's
// files can be retired. top is loaded and verified first (Load, with host;
// nil: any host). Its disk layers are compacted too: the layers each one
// and those under it hold in its own directory (cow/disk Owned: the VM's
// own, not a template's base or a fork parent's) are merged into one new
// overlay beside it (MergeOwned), which NEW records; a disk whose run is
// one layer long is recorded as it is.
func Compact(top, out string, host FingerprintSource) (_ *Result, err error) {
	s, err := Load(top, host)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	var made []string
	defer func() {
		if err != nil {
			for _, p := range made {
				os.Remove(p)
			}
		}
	}()
	var disks []DiskLayer
	if s.Disks != nil {
		disks = []DiskLayer{}
	}
	for _, dl := range s.Disks {
		m, chain, err := compactDisk(dl.Layer)
		if err != nil {
			return nil, fmt.Errorf("vmsnap: compact %s: disk %d: %w", s.Path, dl.Index, err)
		}
		if m != "" {
			made = append(made, m)
			dl = DiskLayer{Index: dl.Index, Layer: m, Chain: chain}
		}
		disks = append(disks, dl)
	}
	return Write(out, &Capture{Kind: Full, State: s.State, Devices: s.Devices, Options: s.Meta.Options,
		Fingerprint: s.Fingerprint, Memory: s.Chain.Reader(), Disks: disks})
}

// compactDisk merges the run of layers a frozen disk layer holds in its
// directory (disk.MergeOwned); "" when there is nothing to merge (a raw
// image, or a run of one).
func compactDisk(layer string) (string, []string, error) {
	ov, err := disk.IsOverlay(layer)
	if err != nil || !ov {
		return "", nil, err
	}
	o, err := disk.OpenChain(layer, true)
	if err != nil {
		return "", nil, err
	}
	defer o.Close()
	m, chain, _, err := disk.MergeOwned(o)
	return m, chain, err
}
