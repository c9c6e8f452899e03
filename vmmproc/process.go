package vmmproc

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/warrenvm/warren/memsnap/uffd"
	"github.com/warrenvm/warren/memsnap/vmsnap"
	"github.com/warrenvm/warren/vmm/hostprofile"
	"github.com/warrenvm/warren/vmmproc/jail"
)

// The entry points of the VMM process: Run (`warren run`), Restore
// (`warren restore`), ForkChild (`warren fork-child`, fork.go) and
// JailInit (`warren jail-init`). The CLI parses their flags into the
// specs below and prints what they return; everything they do is here.

// UsageError is an error in what the caller asked for rather than in
// running it (the CLI exits 2 for it, 1 for any other error).
type UsageError struct{ Err error }

// Error is the wrapped error's text.
func (e *UsageError) Error() string { return e.Err.Error() }

// Unwrap returns the wrapped error.
func (e *UsageError) Unwrap() error { return e.Err }

// Spec is what Run boots: the VM, its devices and the process's
// settings, as `warren run`'s flags give them. Console and Log are the
// caller's (Run does not close them).
type Spec struct {
	MemMiB, CPUs int
	// Kernel is the guest kernel (ELF vmlinux with a PVH note, or a
	// bzImage); Initramfs, when set, its initramfs; Cmdline the extra
	// kernel command-line arguments.
	Kernel, Initramfs []byte
	Cmdline           string
	Console           io.Writer
	KVMPath           string
	Log               *slog.Logger
	// Balloon attaches a virtio-balloon device with free page reporting.
	Balloon bool
	// RNG attaches a virtio-rng device.
	RNG   bool
	Disks []Disk
	// Tap, when set, attaches virtio-net on this tap device with MAC;
	// PrivateNet puts it and its egress services (Egress, when set) in a
	// network namespace of the process's own.
	Tap        string
	MAC        net.HardwareAddr
	PrivateNet bool
	Egress     *EgressOptions
	// Vsock, when set, attaches virtio-vsock with its host unix socket
	// there, the guest at CID.
	Vsock string
	CID   uint64
	// API, when set, serves the control API (vmmctl) on this unix socket
	// and turns on dirty-page tracking.
	API string
	// Jail is how the process hardens itself once set up.
	Jail JailSpec
}

// Run builds the VM of s, serves its control API when asked, enters the
// jail and runs the VM in the foreground, stdin feeding its console,
// until it powers off (nil), fails, or the process is interrupted.
func Run(s Spec, stdin io.Reader) error {
	p, err := newProcess()
	if err != nil {
		return err
	}
	o := vmOptions{proc: p,
		memMiB: s.MemMiB, cpus: s.CPUs, kernel: s.Kernel, initramfs: s.Initramfs, cmdline: s.Cmdline, egress: s.Egress,
		console: s.Console, kvmPath: s.KVMPath, log: s.Log, rng: s.RNG, balloon: s.Balloon,
		tap: s.Tap, mac: s.MAC, vsock: s.Vsock, cid: s.CID,
		trackDirty: s.API != "", privateNet: s.PrivateNet,
	}
	for _, d := range s.Disks {
		o.disks = append(o.disks, diskSpec{path: d.Path, readOnly: d.ReadOnly})
	}
	b, err := build(o)
	if err != nil {
		return err
	}
	defer b.close()
	if s.API != "" {
		stopAPI, err := startAPI(s.API, b, o, s.Log, "", "")
		if err != nil {
			return err
		}
		defer stopAPI()
	}
	if err := enterJail(s.Jail, &o, s.Log); err != nil {
		return err
	}
	return runForeground(b.vm, stdin)
}

// RestoreSpec is what Restore runs: a snapshot and what `warren restore`'s
// flags change about the VM it held.
type RestoreSpec struct {
	// Snapshot is the snapshot's DIR/NAME; Memory how its memory is
	// restored (vmsnap.Eager when empty; vmsnap.Uffd falls back to Mmap,
	// with one log line, where the host cannot serve it).
	Snapshot string
	Memory   vmsnap.MemoryMode
	// RecordWorkingSet (Uffd only) is the file POST /v1/working-set/save
	// writes the pages the guest touched first to; Prefetch (Uffd only)
	// a working set to prefetch while the guest runs (a missing, stale or
	// corrupt one is logged and ignored).
	RecordWorkingSet, Prefetch string
	// API, when set, serves the control API on this unix socket.
	API string
	// Vsock, when set, replaces the snapshotted VM's vsock socket path.
	Vsock string
	// ConsoleFile, when set, is where the guest console goes (capped,
	// OpenConsole), else to Stdout.
	ConsoleFile string
	Stdout      io.Writer
	KVMPath     string
	Log         *slog.Logger
	// Timing, when set, is a file the first KVM_RUN's wall-clock time
	// is written to (firstRunTimer).
	Timing string
	// Egress changes the snapshot's egress options; DiskPaths opens its
	// writable disks at other paths.
	Egress    EgressOverrides
	DiskPaths DiskPaths
	Jail      JailSpec
}

// Restore rebuilds the VM of a snapshot, with the devices of the
// `warren run` that took it, and runs it in the foreground like Run.
// Everything is checked before a VM is created; a *UsageError is an
// override that does not fit the snapshot.
func Restore(s RestoreSpec, stdin io.Reader) error {
	log := s.Log
	start := time.Now()
	snap, err := vmsnap.Load(s.Snapshot, vmsnap.HostFingerprintSource(s.KVMPath, hostprofile.Detect("/sys/module")))
	if err != nil {
		return err
	}
	defer snap.Close()
	p, err := newProcess()
	if err != nil {
		return err
	}
	o := vmOptions{proc: p, kvmPath: s.KVMPath, log: log, trackDirty: s.API != "", restore: snap,
		memMode: s.Memory, recordWorkingSet: s.RecordWorkingSet}
	if o.memMode == vmsnap.Uffd {
		o.uffd.Record = s.RecordWorkingSet != ""
		if s.Prefetch != "" {
			ws, err := uffd.ReadWorkingSet(s.Prefetch, snap.Chain)
			if err != nil {
				log.Warn("--prefetch: ignored", "err", err)
			} else {
				o.uffd.Prefetch = ws.Runs
			}
		}
	} else if s.RecordWorkingSet != "" || s.Prefetch != "" {
		return &UsageError{errors.New("--record-working-set and --prefetch need --lazy=uffd")}
	}
	if s.Timing != "" {
		o.onFirstRun = firstRunTimer(s.Timing, log)
	}
	if err := applyOptions(&o, snap.Meta.Options); err != nil {
		return err
	}
	if err := s.Egress.apply(o.egress); err != nil {
		return &UsageError{err}
	}
	if err := replaceDisks(o.disks, s.DiskPaths); err != nil {
		return &UsageError{err}
	}
	undoDisks, err := restoreDisks(&o, snap, s.DiskPaths)
	if err != nil {
		return err
	}
	if s.Vsock != "" {
		if o.vsock == "" {
			return errors.New("--vsock: the snapshotted VM had no vsock device")
		}
		o.vsock = s.Vsock
	}
	out, closeOut, err := OpenConsole(s.ConsoleFile, s.Stdout)
	if err != nil {
		return err
	}
	defer closeOut()
	o.console = out
	b, err := build(o)
	if err != nil {
		undoDisks()
		return err
	}
	defer b.close()
	layer, name := snap.Layer(), snap.Name()
	snap.Close() // the VM holds its memory now
	log.Debug("restored", "snapshot", s.Snapshot, "memory", b.devs.memMode, "ms", time.Since(start).Milliseconds())
	if s.API != "" {
		stopAPI, err := startAPI(s.API, b, o, log, layer, name)
		if err != nil {
			return err
		}
		defer stopAPI()
	}
	if err := enterJail(s.Jail, &o, log); err != nil {
		return err
	}
	err = runForeground(b.vm, stdin)
	if srv := b.devs.uffd; srv != nil {
		st := srv.Stats()
		log.Info("uffd: memory served", "faults", st.Faults, "pages_copied", st.PagesCopied, "zero_pages", st.ZeroPages,
			"prefetched_pages", st.PrefetchedPages, "completed_pages", st.CompletedPages, "bytes_decompressed", st.BytesDecompressed,
			"chunks_decoded", st.ChunksDecoded, "errors", st.Errors, "completed", st.Completed)
	}
	return err
}

// InitSpec is what JailInit runs: `warren jail-init`'s flags, after the
// caller has joined the cgroups it was given (which is the daemon's
// business, hostd/cgroup).
type InitSpec struct {
	// ReportFD is the unix socket the command's pid is reported on
	// (-1: none); PassFDs the descriptors passed on to the command.
	ReportFD int
	PassFDs  []int
	// NetHelper serves the family's private networks (nethelper.go).
	NetHelper bool
	// Spawn starts the family's fork children under warren-hostd's
	// grants (jail.Spawner), their cgroups under CgroupRoots; the grants'
	// key comes first on the report socket.
	Spawn       bool
	CgroupRoots []string
	// Command is the VMM's command line.
	Command []string
}

// JailInit is pid 1 of a jailed VMM's pid namespace: jail.RunInitWith
// with the family's helper (familyhelper.go) when s asks for one. It
// returns the exit status, or an error before anything ran.
func JailInit(s InitSpec) (int, error) {
	o := jail.InitOptions{ReportFD: s.ReportFD, PassFDs: s.PassFDs}
	devNet := -1
	if s.NetHelper {
		var err error
		if devNet, err = openDevNet(); err != nil {
			return 1, err
		}
	}
	if s.Spawn {
		key, err := jail.ReceiveGrantKey(s.ReportFD, 2*time.Minute)
		if err == nil {
			o.Spawner, err = jail.NewSpawner(key, s.CgroupRoots)
		}
		if err != nil {
			return 1, err
		}
	}
	if devNet >= 0 || o.Spawner != nil {
		o.Helper = newFamilyHelper(devNet, o.Spawner)
	}
	return jail.RunInitWith(s.Command, o), nil
}
