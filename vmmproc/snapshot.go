package vmmproc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warrenvm/warren/cow"
	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/internal/logcap"
	"github.com/warrenvm/warren/memsnap/vmsnap"
)

// runOptions are the `warren run` options a snapshot records (opaquely, as
// vmsnap Meta.Options) so that `warren restore` rebuilds the same devices.
//
// They are versioned (Version, runOptionsVersion): a snapshot's are read
// strictly (an unknown field is refused, not dropped), those of a newer
// version are refused with a message naming both versions, and those
// written before versions (no "version": version 1, the same fields) are
// read as that warren read them, ignoring fields it no longer knew
// (TestRunOptionsVersions, on options recorded by that warren).
type runOptions struct {
	// Version is the options' format (runOptionsVersion when written).
	Version int          `json:"version,omitempty"`
	MemMiB  int          `json:"mem_mib"`
	CPUs    int          `json:"cpus"`
	Disks   []diskOption `json:"disks,omitempty"`
	Tap     string       `json:"tap,omitempty"`
	MAC     string       `json:"mac,omitempty"`
	RNG     bool         `json:"rng"`
	Vsock   string       `json:"vsock,omitempty"`
	CID     uint64       `json:"cid,omitempty"`
	// Egress is the VM's egress settings, when it has an egress policy.
	Egress *EgressOptions `json:"egress,omitempty"`
	// PrivateNet: the tap and its egress services live in a network
	// namespace of the VMM's own (warren run --private-net).
	PrivateNet bool `json:"private_net,omitempty"`
	// Balloon: the VM has a virtio-balloon (warren run --balloon), its
	// last device; its target and statistics are in the device state.
	Balloon bool `json:"balloon,omitempty"`
}

// runOptionsVersion is the version of the runOptions this warren writes;
// it reads every version up to it. Version 1 (written without a
// "version" field, before 2026-12-04) has the same fields as 2.
const runOptionsVersion = 2

// diskOption is one --disk in runOptions (an absolute path).
type diskOption struct {
	Path     string `json:"path"`
	ReadOnly bool   `json:"ro,omitempty"`
	// Name, when set, is the name the disk's device goes by (its saved
	// state names it): a fork child's overlay keeps its parent disk's.
	Name string `json:"name,omitempty"`
}

// recordOptions returns o's device options as runOptions JSON.
func recordOptions(o vmOptions) (json.RawMessage, error) {
	r := runOptions{Version: runOptionsVersion, MemMiB: o.memMiB, CPUs: o.cpus, Tap: o.tap, RNG: o.rng, Vsock: o.vsock, Egress: o.egress, PrivateNet: o.privateNet, Balloon: o.balloon}
	if o.vsock != "" {
		r.CID = o.cid
	}
	if o.tap != "" {
		r.MAC = o.mac.String()
	}
	for _, d := range o.disks {
		p, err := filepath.Abs(d.path)
		if err != nil {
			return nil, err
		}
		r.Disks = append(r.Disks, diskOption{Path: p, ReadOnly: d.readOnly, Name: d.name})
	}
	if r.Vsock != "" {
		p, err := filepath.Abs(r.Vsock)
		if err != nil {
			return nil, err
		}
		r.Vsock = p
	}
	return json.Marshal(r)
}

// applyOptions fills o's device options from a snapshot's runOptions.
func applyOptions(o *vmOptions, raw json.RawMessage) error {
	var v struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return fmt.Errorf("the snapshot's run options: %w", err)
	}
	if v.Version > runOptionsVersion || v.Version < 0 {
		return fmt.Errorf("the snapshot's run options are version %d; this warren reads versions 1 to %d: restore it with the warren that took it, or a newer one", v.Version, runOptionsVersion)
	}
	var r runOptions
	d := json.NewDecoder(bytes.NewReader(raw))
	if v.Version >= 2 {
		// (Version 1 is read as the warren that wrote it read it,
		// ignoring what it did not know: fields since dropped.)
		d.DisallowUnknownFields()
	}
	if err := d.Decode(&r); err != nil {
		return fmt.Errorf("the snapshot's run options (version %d): %w", max(v.Version, 1), err)
	}
	o.memMiB, o.cpus, o.tap, o.rng, o.vsock, o.cid, o.egress = r.MemMiB, r.CPUs, r.Tap, r.RNG, r.Vsock, r.CID, r.Egress
	o.privateNet, o.balloon = r.PrivateNet, r.Balloon
	if r.MAC != "" {
		mac, err := net.ParseMAC(r.MAC)
		if err != nil {
			return fmt.Errorf("the snapshot's MAC %q: %w", r.MAC, err)
		}
		o.mac = mac
	}
	for _, d := range r.Disks {
		o.disks = append(o.disks, diskSpec{path: d.Path, readOnly: d.ReadOnly, name: d.Name})
	}
	return nil
}

// DiskPaths is `warren restore --disk-path I=PATH` (repeatable): disk I
// (0-based, in the snapshot's run options) is opened at PATH instead.
type DiskPaths map[int]string

func (d DiskPaths) String() string {
	var s []string
	for _, i := range slices.Sorted(maps.Keys(d)) {
		s = append(s, fmt.Sprintf("%d=%s", i, d[i]))
	}
	return strings.Join(s, " ")
}

// Set parses I=PATH.
func (d DiskPaths) Set(v string) error {
	is, p, ok := strings.Cut(v, "=")
	i, err := strconv.Atoi(is)
	if !ok || p == "" || err != nil || i < 0 {
		return fmt.Errorf("%q is not I=PATH (I: the disk's index in the snapshot, from 0)", v)
	}
	if _, dup := d[i]; dup {
		return fmt.Errorf("disk %d given twice", i)
	}
	d[i] = p
	return nil
}

// replaceDisks opens disk i of disks at paths[i] instead (typically a
// cow/disk overlay over the disk's image): the device keeps the name its
// saved state knows it by (the disk's name, else its path; as a fork
// child's overlay does) and its read-only flag. Only a writable disk can
// be replaced, and only by an existing regular file.
func replaceDisks(disks []diskSpec, paths map[int]string) error {
	for _, i := range slices.Sorted(maps.Keys(paths)) {
		if i >= len(disks) {
			return fmt.Errorf("--disk-path %d=%s: the snapshot has %d disks", i, paths[i], len(disks))
		}
		d := &disks[i]
		if d.readOnly {
			return fmt.Errorf("--disk-path %d=%s: disk %d (%s) is read-only: only a writable disk can be given its own image", i, paths[i], i, d.path)
		}
		p, err := filepath.Abs(paths[i])
		if err != nil {
			return fmt.Errorf("--disk-path %d=%s: %w", i, paths[i], err)
		}
		fi, err := os.Stat(p)
		if err == nil && !fi.Mode().IsRegular() {
			err = fmt.Errorf("%s is not a regular file", p)
		}
		if err != nil {
			return fmt.Errorf("--disk-path %d=%s: %w", i, paths[i], err)
		}
		if d.name == "" {
			d.name = d.path
		}
		d.path = p
	}
	return nil
}

// restoreDisks settles the writable disks of a VM restored from snap
// (after replaceDisks applied the caller's --disk-path images, given).
// A snapshot with disk layers (format version 2) gives each writable disk
// a new overlay over the layer that holds it as it was at the snapshot,
// never the layer itself, so a snapshot restores any number of times: the
// image at --disk-path when the caller made one (the daemon does; its
// chain is checked against the snapshot's record when it is opened), else
// one made here beside the layer. The device keeps its saved name. A
// version 1 snapshot holds no disk state: its disks open as its run
// options (or --disk-path) name them, as before. undo removes the
// overlays made here, for a restore that fails before its VM runs.
func restoreDisks(o *vmOptions, snap *vmsnap.Snapshot, given DiskPaths) (undo func(), err error) {
	var made []string
	undo = func() {
		for _, p := range made {
			os.Remove(p)
		}
	}
	if snap.Disks == nil {
		return undo, nil
	}
	layers := map[int]vmsnap.DiskLayer{}
	for _, l := range snap.Disks {
		if l.Index >= len(o.disks) || o.disks[l.Index].readOnly {
			return nil, fmt.Errorf("snapshot %s holds a layer for disk %d, which its run options have not as a writable disk", snap.Path, l.Index)
		}
		layers[l.Index] = l
	}
	o.diskChains, o.ownDisks = map[int][]string{}, map[int]bool{}
	for i := range o.disks {
		d := &o.disks[i]
		if d.readOnly {
			continue
		}
		l, ok := layers[i]
		if !ok {
			undo()
			return nil, fmt.Errorf("snapshot %s holds no layer for its writable disk %d (%s)", snap.Path, i, d.path)
		}
		o.diskChains[i], o.ownDisks[i] = l.Chain, true
		if _, ok := given[i]; ok {
			continue
		}
		p := disk.NewLayerPath(filepath.Dir(l.Layer), l.Layer)
		if err := disk.CreateOn(p, l.Layer); err != nil {
			undo()
			return nil, fmt.Errorf("disk %d: a new overlay over the snapshot's layer: %w", i, err)
		}
		made = append(made, p)
		if d.name == "" {
			d.name = d.path
		}
		d.path = p
	}
	return undo, nil
}

// startAPI serves the control API of a VM built from o on sock; layer and
// name, when set, are the snapshot the VM was restored from (the parent
// of its first incremental snapshot).
func startAPI(sock string, b *built, o vmOptions, log *slog.Logger, layer, name string) (func(), error) {
	opts, err := recordOptions(o)
	if err != nil {
		return nil, err
	}
	fp, err := vmsnap.HostFingerprint(o.kvmPath, b.devs.profile)
	if err != nil {
		return nil, err
	}
	s := vmsnap.NewSnapshotter(b.vm, b.devs.snap, opts, fp)
	if layer != "" {
		s.SetParent(layer, name)
	}
	var ro runOptions
	if err := json.Unmarshal(opts, &ro); err != nil {
		return nil, err
	}
	s.Disks = b.devs.diskSet
	a := &apiServer{vm: b.vm, snap: s, log: log, host: func() ([]byte, error) { return fp, nil },
		apiPath: sock, opts: ro, kvmPath: o.kvmPath, disks: b.devs.diskSet,
		forker: &cow.Forker{VM: b.vm, Devices: b.devs.snap, Disks: b.devs.diskSet},
		egress: b.devs.egress, sync: b.devs.sync, proc: o.proc,
		memMode: b.devs.memMode, uffd: b.devs.uffd, workingSet: o.recordWorkingSet}
	if a.egress != nil {
		s.Options = a.liveOptions
	}
	return serveAPI(sock, a)
}

// firstRunTimer returns a vmm.Config.OnFirstRun that notes the time and
// writes it to file (Unix ns, one decimal line) off the vCPU's thread.
// Together with the time a caller started the process (bench/snapshot)
// it gives process start to the guest's first instruction.
func firstRunTimer(file string, log *slog.Logger) func() {
	return func() {
		t := time.Now().UnixNano()
		go func() {
			if err := os.WriteFile(file, []byte(strconv.FormatInt(t, 10)+"\n"), 0o644); err != nil {
				log.Warn("--timing", "err", err)
			}
		}()
	}
}

// OpenConsole returns the console writer: FILE when set, else stdout.
// The guest writes its console at will, so FILE is capped: at
// logcap.DefaultConsoleMax bytes it rotates to FILE.1 (one older
// generation kept), on descriptors opened now (the jail may take path
// lookups away later).
func OpenConsole(file string, stdout io.Writer) (io.Writer, func(), error) {
	if file == "" {
		return stdout, func() {}, nil
	}
	f, err := logcap.Create(file, logcap.DefaultConsoleMax)
	if err != nil {
		return nil, nil, fmt.Errorf("console: %w", err)
	}
	return f, func() { f.Close() }, nil
}

// vmmLogMax bounds what one VMM process logs (verbose: vmmVerboseLogMax):
// guest-triggered events (driver faults, device resets) log lines, and a
// guest must not fill the host's disk with them.
const (
	vmmLogMax        = 16 << 20
	vmmVerboseLogMax = 256 << 20
)

// NewLogger logs warnings (everything with verbose) to w, at most
// vmmLogMax bytes (logcap.Budget; a log file already that long is
// truncated first).
func NewLogger(w io.Writer, verbose bool) *slog.Logger {
	level := slog.LevelWarn
	limit := int64(vmmLogMax)
	if verbose {
		level, limit = slog.LevelDebug, vmmVerboseLogMax
	}
	return slog.New(slog.NewTextHandler(logcap.NewBudget(w, limit), &slog.HandlerOptions{Level: level}))
}
