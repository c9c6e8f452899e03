package cli

import (
	"encoding/json"
	"flag"
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
	"github.com/warrenvm/warren/vmm/hostprofile"
	"github.com/warrenvm/warren/vmmctl"
)

// runOptions are the `warren run` options a snapshot records (opaquely, as
// vmsnap Meta.Options) so that `warren restore` rebuilds the same devices.
type runOptions struct {
	MemMiB int          `json:"mem_mib"`
	CPUs   int          `json:"cpus"`
	Disks  []diskOption `json:"disks,omitempty"`
	Tap    string       `json:"tap,omitempty"`
	MAC    string       `json:"mac,omitempty"`
	RNG    bool         `json:"rng"`
	Vsock  string       `json:"vsock,omitempty"`
	CID    uint64       `json:"cid,omitempty"`
	// Egress is the VM's egress settings, when it has an egress policy.
	Egress *egressOptions `json:"egress,omitempty"`
	// PrivateNet: the tap and its egress services live in a network
	// namespace of the VMM's own (warren run --private-net).
	PrivateNet bool `json:"private_net,omitempty"`
}

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
	r := runOptions{MemMiB: o.memMiB, CPUs: o.cpus, Tap: o.tap, RNG: o.rng, Vsock: o.vsock, Egress: o.egress, PrivateNet: o.privateNet}
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
	var r runOptions
	if err := json.Unmarshal(raw, &r); err != nil {
		return fmt.Errorf("the snapshot's run options: %w", err)
	}
	o.memMiB, o.cpus, o.tap, o.rng, o.vsock, o.cid, o.egress = r.MemMiB, r.CPUs, r.Tap, r.RNG, r.Vsock, r.CID, r.Egress
	o.privateNet = r.PrivateNet
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

// diskPaths is `warren restore --disk-path I=PATH` (repeatable): disk I
// (0-based, in the snapshot's run options) is opened at PATH instead.
type diskPaths map[int]string

func (d diskPaths) String() string {
	var s []string
	for _, i := range slices.Sorted(maps.Keys(d)) {
		s = append(s, fmt.Sprintf("%d=%s", i, d[i]))
	}
	return strings.Join(s, " ")
}

// Set parses I=PATH.
func (d diskPaths) Set(v string) error {
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
func restoreDisks(o *vmOptions, snap *vmsnap.Snapshot, given diskPaths) (undo func(), err error) {
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
		egress: b.devs.egress, sync: b.devs.sync}
	if a.egress != nil {
		s.Options = a.liveOptions
	}
	return serveAPI(sock, a)
}

// rollbackCmd is `warren rollback API DIR/NAME`.
func rollbackCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren rollback", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 2 {
		fmt.Fprint(stderr, "usage: warren rollback API DIR/NAME\n\nputs the running VM whose control socket is API back to the snapshot DIR/NAME,\nin place: same process, sockets and identity; only pages that changed are rewritten.\n")
		return 2
	}
	path, err := filepath.Abs(fs.Arg(1))
	if err == nil {
		_, _, _, err = vmsnap.Paths(path)
	}
	if err != nil {
		fmt.Fprintf(stderr, "warren rollback: %v\n", err)
		return 2
	}
	ctx, stop := interruptContext()
	defer stop()
	var r vmmctl.RollbackReply
	if err := apiCall(ctx, fs.Arg(0), "rollback", vmmctl.RollbackRequest{Path: path}, &r); err != nil {
		fmt.Fprintf(stderr, "warren rollback: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, r.Line)
	return 0
}

// pauseCmd is `warren pause API` and `warren resume API`.
func pauseCmd(verb string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintf(stderr, "usage: warren %s API\n\nAPI is the VM's control socket (warren run --api PATH).\n", verb)
		return 2
	}
	ctx, stop := interruptContext()
	defer stop()
	var r vmmctl.PauseReply
	if err := apiCall(ctx, fs.Arg(0), verb, struct{}{}, &r); err != nil {
		fmt.Fprintf(stderr, "warren %s: %v\n", verb, err)
		return 1
	}
	fmt.Fprintf(stdout, "paused=%v\n", r.Paused)
	return 0
}

// snapshotCmd is `warren snapshot [--incremental] [--every D --max-chain N] API DIR/NAME`.
func snapshotCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren snapshot", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: warren snapshot [--incremental] [--every D [--max-chain N] [--count N]] API DIR/NAME\n\n"+
			"API is the VM's control socket (warren run --api PATH). With --every, snapshots\n"+
			"DIR/NAME-0001, DIR/NAME-0002, ... are taken every D: a full one, then incremental\n"+
			"ones, and a full one again once the chain has --max-chain layers.\n\n")
		fs.PrintDefaults()
	}
	incremental := fs.Bool("incremental", false, "store only the pages written since the VM's previous snapshot (in the same DIR)")
	every := fs.Duration("every", 0, "keep taking snapshots at this interval until interrupted")
	maxChain := fs.Int("max-chain", 8, "with --every: most layers in a chain before a new full snapshot")
	count := fs.Int("count", 0, "with --every: stop after this many snapshots (0: when interrupted)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 2 || *every < 0 || *maxChain < 1 || *count < 0 {
		fs.Usage()
		return 2
	}
	sock := fs.Arg(0)
	path, err := filepath.Abs(fs.Arg(1))
	if err == nil {
		_, _, _, err = vmsnap.Paths(path)
	}
	if err != nil {
		fmt.Fprintf(stderr, "warren snapshot: %v\n", err)
		return 2
	}
	ctx, stop := interruptContext()
	defer stop()
	take := func(p string, kind vmsnap.Kind) error {
		var r vmmctl.SnapshotReply
		if err := apiCall(ctx, sock, "snapshot", vmmctl.SnapshotRequest{Path: p, Kind: kind}, &r); err != nil {
			return err
		}
		fmt.Fprintln(stdout, r.Line)
		return nil
	}
	kind := vmsnap.Full
	if *incremental {
		kind = vmsnap.Incremental
	}
	if *every == 0 {
		if err := take(path, kind); err != nil {
			fmt.Fprintf(stderr, "warren snapshot: %v\n", err)
			return 1
		}
		return 0
	}
	chain := 0 // layers in the current chain; 0 before the first snapshot
	if *incremental {
		chain = 1 // the VM's previous snapshot is the chain's first layer, as far as we know
	}
	for seq := 1; ; seq++ {
		if chain == 0 || chain >= *maxChain {
			kind, chain = vmsnap.Full, 0
		} else {
			kind = vmsnap.Incremental
		}
		if err := take(fmt.Sprintf("%s-%04d", path, seq), kind); err != nil {
			if ctx.Err() != nil {
				return 0
			}
			fmt.Fprintf(stderr, "warren snapshot: %v\n", err)
			return 1
		}
		chain++
		if seq == *count {
			return 0
		}
		select {
		case <-ctx.Done():
			return 0
		case <-time.After(*every):
		}
	}
}

// restoreCmd is `warren restore [--lazy] [--api PATH] [--vsock PATH] [--console FILE] DIR/NAME`:
// it rebuilds the VM of a snapshot, with the devices of the `warren run`
// that took it, and runs it in the foreground like `warren run`.
func restoreCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren restore", flag.ContinueOnError)
	fs.SetOutput(stderr)
	lazy := fs.Bool("lazy", false, "map the snapshot's memory copy-on-write (flattened once to DIR/NAME.<hash>.wraw) instead of reading it all first")
	api := fs.String("api", "", "serve the VM's control API (pause, resume, snapshot) on this unix socket")
	vsockPath := fs.String("vsock", "", "the vsock unix socket (default: the snapshotted VM's)")
	console := fs.String("console", "", "write the guest console to FILE instead of stdout")
	kvmPath := fs.String("kvm", "/dev/kvm", "KVM device")
	verbose := fs.Bool("v", false, "log VMM diagnostics to stderr")
	timing := fs.String("timing", "", "write the wall-clock time of the first KVM_RUN (Unix ns, one decimal line) to FILE, for benchmarks")
	jailFlag := fs.String("jail", "", "after setup, harden the VMM process: strict or vmm (seccomp allowlist, capabilities dropped, no_new_privs; see vmmproc/jail); vmm when --api may fork")
	var eo egressOverrides
	eo.policy = fs.String("egress", "", "for a snapshot with egress: the policy in force from the start instead of the snapshot's (JSON; the resolver starts with no allowed addresses)")
	eo.secrets = fs.String("secrets", "", "for a snapshot with egress: the credential proxy's secrets file (JSON name to value, mode 0600) instead of the snapshot's")
	eo.audit = fs.String("audit", "", "for a snapshot with egress: the audit log instead of the snapshot's")
	dp := diskPaths{}
	fs.Var(dp, "disk-path", "open the snapshot's writable disk I (from 0) at PATH, typically a cow/disk overlay over its image; the device keeps its saved name (`I=PATH`, repeatable)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	js, jerr := parseJail(*jailFlag)
	if jerr != nil {
		fmt.Fprintf(stderr, "warren restore: %v\n", jerr)
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprint(stderr, "usage: warren restore [--lazy] [--api PATH] [--vsock PATH] [--console FILE] [--timing FILE] [--egress FILE] [--secrets FILE] [--audit FILE] [--disk-path I=PATH]... DIR/NAME\n")
		return 2
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "warren restore: "+format+"\n", a...)
		return 1
	}
	log := newLogger(stderr, *verbose)
	start := time.Now()
	// Everything is checked before a VM is created.
	snap, err := vmsnap.Load(fs.Arg(0), vmsnap.HostFingerprintSource(*kvmPath, hostprofile.Detect("/sys/module")))
	if err != nil {
		return fail("%v", err)
	}
	defer snap.Close()
	o := vmOptions{kvmPath: *kvmPath, log: log, trackDirty: *api != "", restore: snap, lazy: *lazy}
	if *timing != "" {
		o.onFirstRun = firstRunTimer(*timing, log)
	}
	if err := applyOptions(&o, snap.Meta.Options); err != nil {
		return fail("%v", err)
	}
	if err := eo.apply(o.egress); err != nil {
		fmt.Fprintf(stderr, "warren restore: %v\n", err)
		return 2
	}
	if err := replaceDisks(o.disks, dp); err != nil {
		fmt.Fprintf(stderr, "warren restore: %v\n", err)
		return 2
	}
	undoDisks, err := restoreDisks(&o, snap, dp)
	if err != nil {
		return fail("%v", err)
	}
	if *vsockPath != "" {
		if o.vsock == "" {
			return fail("--vsock: the snapshotted VM had no vsock device")
		}
		o.vsock = *vsockPath
	}
	out, closeOut, err := openConsole(*console, stdout)
	if err != nil {
		return fail("%v", err)
	}
	defer closeOut()
	o.console = out
	b, err := build(o)
	if err != nil {
		undoDisks()
		return fail("%v", err)
	}
	defer b.close()
	layer, name := snap.Layer(), snap.Name()
	snap.Close() // the VM holds its memory now
	log.Debug("restored", "snapshot", fs.Arg(0), "lazy", *lazy, "ms", time.Since(start).Milliseconds())
	if *api != "" {
		stopAPI, err := startAPI(*api, b, o, log, layer, name)
		if err != nil {
			return fail("%v", err)
		}
		defer stopAPI()
	}
	if err := enterJail(js, &o, log); err != nil {
		return fail("%v", err)
	}
	return runForeground(b.vm, stdin, fail)
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

// compactCmd is `warren compact DIR/NAME DIR/NEW`.
func compactCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren compact", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 2 {
		fmt.Fprint(stderr, "usage: warren compact DIR/NAME DIR/NEW\n\nwrites one full snapshot NEW equal to NAME (its memory chain merged, and each disk's own\nlayers merged into one overlay beside them).\n")
		return 2
	}
	res, err := vmsnap.Compact(fs.Arg(0), fs.Arg(1), nil)
	if err != nil {
		fmt.Fprintf(stderr, "warren compact: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "full %s: %d pages, layer %d bytes (%s)\n", res.StatePath, res.Pages, res.LayerBytes, filepath.Base(res.LayerPath))
	if s, err := vmsnap.Load(res.StatePath, nil); err == nil {
		for _, d := range s.Disks {
			fmt.Fprintf(stdout, "disk %d: layer %s (%d images in its chain)\n", d.Index, d.Layer, len(d.Chain))
		}
		s.Close()
	}
	return 0
}

// openConsole returns the console writer: FILE when set, else stdout.
// The guest writes its console at will, so FILE is capped: at
// logcap.DefaultConsoleMax bytes it rotates to FILE.1 (one older
// generation kept), on descriptors opened now (the jail may take path
// lookups away later).
func openConsole(file string, stdout io.Writer) (io.Writer, func(), error) {
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

// newLogger logs warnings (everything with verbose) to w, at most
// vmmLogMax bytes (logcap.Budget; a log file already that long is
// truncated first).
func newLogger(w io.Writer, verbose bool) *slog.Logger {
	level := slog.LevelWarn
	limit := int64(vmmLogMax)
	if verbose {
		level, limit = slog.LevelDebug, vmmVerboseLogMax
	}
	return slog.New(slog.NewTextHandler(logcap.NewBudget(w, limit), &slog.HandlerOptions{Level: level}))
}
