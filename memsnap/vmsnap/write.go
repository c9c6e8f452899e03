package vmsnap

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/warrenvm/warren/devices/virtio"
	"github.com/warrenvm/warren/memsnap"
	"github.com/warrenvm/warren/memsnap/statefile"
	"github.com/warrenvm/warren/vmm"
)

// File name extensions; see the package documentation.
const (
	StateExt = ".wstate"
	RawExt   = ".wraw"
)

// MetaVersion is the version of the "meta" section (and of the layout of
// the other sections) that this package writes. Load also reads version 1
// snapshots, which have no "disks" section: their disks reopen as their
// run options name them.
const MetaVersion = 2

// Section names in the state file.
const (
	secMeta    = "meta"
	secMachine = "machine"
	secDevices = "devices"
	secMemory  = "memory"
	secDisks   = "disks"
)

// Kind says whether a snapshot's memory layer stands alone.
type Kind string

// Snapshot kinds.
const (
	Full        Kind = "full"
	Incremental Kind = "incremental"
)

// Meta is the "meta" section: what a snapshot is, beyond the machine.
type Meta struct {
	Version int  `json:"version"`
	Kind    Kind `json:"kind"`
	// Name is the snapshot's name (its state file's base name).
	Name string `json:"name"`
	// Parent is the name of the snapshot an incremental one was taken on
	// top of (for people; the memory chain follows layer hashes).
	Parent  string    `json:"parent,omitempty"`
	Created time.Time `json:"created"`
	// Options are the caller's run options, opaque here: what rebuilds
	// the devices on restore.
	Options json.RawMessage `json:"options,omitempty"`
}

// DeviceState is one virtio transport's saved state.
type DeviceState struct {
	Name  string                `json:"name"`
	State virtio.TransportState `json:"state"`
}

// memoryRef is the "memory" section.
type memoryRef struct {
	Layer string `json:"layer"` // base name, in the state file's directory
	Hash  string `json:"hash"`  // the layer's content hash, hex
	Size  uint64 `json:"size"`  // guest RAM bytes
}

// Capture is a snapshot's content before it is written: from a paused VM
// (Snapshotter.Take) or made up (tests, tools).
type Capture struct {
	Kind    Kind
	State   *vmm.State
	Devices []DeviceState
	// Options are the caller's run options (Meta.Options).
	Options json.RawMessage
	// Fingerprint is the host's (Fingerprint.Encode).
	Fingerprint []byte
	// Memory is the flat guest RAM image, State.Machine.MemBytes bytes.
	// A full snapshot stores its non-zero pages; an incremental one the
	// pages set in Dirty.
	Memory io.ReaderAt
	// Dirty has one bit per page (bit p%64 of word p/64); incremental only.
	Dirty []uint64
	// ParentLayer is the parent's memory layer file and ParentName its
	// snapshot name; incremental only. The new layer goes into the same
	// directory.
	ParentLayer, ParentName string
	// Disks are the writable disks' frozen layers (DiskLayer), recorded
	// in the "disks" section (an empty list when there are none).
	Disks []DiskLayer
	// Created is the creation time; zero means now.
	Created time.Time
}

// Result describes a written snapshot.
type Result struct {
	StatePath string
	LayerPath string
	Hash      memsnap.Hash
	// Pages is the number of pages the layer records (stored and zero).
	Pages uint64
	// LayerBytes and StateBytes are the files' sizes.
	LayerBytes, StateBytes int64
}

// Paths splits a snapshot path DIR/NAME (a trailing .wstate is allowed)
// into its directory and name, and returns the state file's path.
func Paths(path string) (dir, name, state string, err error) {
	path = strings.TrimSuffix(path, StateExt)
	dir, name = filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	dir = filepath.Clean(dir)
	if name == "" || name == "." || name == ".." || strings.HasPrefix(name, ".") {
		return "", "", "", fmt.Errorf("vmsnap: %q is not DIR/NAME (a name not starting with a dot)", path)
	}
	return dir, name, filepath.Join(dir, name+StateExt), nil
}

// Write stores c as snapshot path (DIR/NAME): first the memory layer under
// a new unique name, then the state file, atomically. See the package
// documentation for why a crash leaves the previous NAME intact.
func Write(path string, c *Capture) (*Result, error) {
	dir, name, statePath, err := Paths(path)
	if err != nil {
		return nil, err
	}
	if c.State == nil {
		return nil, fmt.Errorf("vmsnap: write %s: no machine state", path)
	}
	machine, err := c.State.Marshal()
	if err != nil {
		return nil, fmt.Errorf("vmsnap: write %s: %w", path, err)
	}
	created := c.Created
	if created.IsZero() {
		created = time.Now()
	}
	size := c.State.Machine.MemBytes
	var rnd [4]byte
	rand.Read(rnd[:])
	layerPath := filepath.Join(dir, fmt.Sprintf("%s.%x-%x%s", name, created.UnixNano(), binary.LittleEndian.Uint32(rnd[:]), memsnap.Ext))
	opts := memsnap.Options{Fingerprint: c.Fingerprint, Created: created}
	var layer *memsnap.Layer
	switch c.Kind {
	case Full:
		layer, err = memsnap.WriteBase(layerPath, c.Memory, size, opts)
	case Incremental:
		if c.ParentLayer == "" {
			return nil, fmt.Errorf("vmsnap: write %s: an incremental snapshot needs a parent", path)
		}
		if pd := filepath.Clean(filepath.Dir(c.ParentLayer)); pd != dir {
			return nil, fmt.Errorf("vmsnap: write %s: an incremental snapshot goes into its parent's directory %s", path, pd)
		}
		parent, perr := memsnap.Open(c.ParentLayer)
		if perr != nil {
			return nil, fmt.Errorf("vmsnap: write %s: parent layer: %w", path, perr)
		}
		layer, err = memsnap.WriteIncremental(layerPath, c.Memory, size, c.Dirty, parent, opts)
		parent.Close()
	default:
		return nil, fmt.Errorf("vmsnap: write %s: unknown kind %q", path, c.Kind)
	}
	if err != nil {
		return nil, fmt.Errorf("vmsnap: write %s: %w", path, err)
	}
	defer layer.Close()
	st := layer.Stats()
	res := &Result{StatePath: statePath, LayerPath: layerPath, Hash: layer.Hash(),
		Pages: st.StoredPages + st.ZeroPages, LayerBytes: st.FileBytes}

	meta := Meta{Version: MetaVersion, Kind: c.Kind, Name: name, Created: created.UTC(), Options: c.Options}
	if c.Kind == Incremental {
		meta.Parent = c.ParentName
	}
	devs := c.Devices
	if devs == nil {
		devs = []DeviceState{}
	}
	disks := c.Disks
	if disks == nil {
		disks = []DiskLayer{}
	}
	if err := checkDisks(disks); err != nil {
		return nil, fmt.Errorf("vmsnap: write %s: %w", path, err)
	}
	sections := []statefile.Section{{Name: secMeta}, {Name: secMachine, Data: machine}, {Name: secDevices}, {Name: secMemory}, {Name: secDisks}}
	for i, v := range []any{meta, nil, devs, memoryRef{Layer: filepath.Base(layerPath), Hash: layer.Hash().String(), Size: size}, disks} {
		if v == nil {
			continue
		}
		if sections[i].Data, err = json.Marshal(v); err != nil {
			return nil, fmt.Errorf("vmsnap: write %s: %s: %w", path, sections[i].Name, err)
		}
	}
	f := &statefile.File{Fingerprint: c.Fingerprint, Sections: sections}
	data, err := f.Encode()
	if err != nil {
		return nil, fmt.Errorf("vmsnap: write %s: %w", path, err)
	}
	if err := statefile.WriteAtomic(statePath, data); err != nil {
		return nil, fmt.Errorf("vmsnap: write %s: %w", statePath, err)
	}
	res.StateBytes = int64(len(data))
	return res, nil
}
