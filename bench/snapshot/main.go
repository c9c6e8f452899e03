// Command snapshot measures Warren's VM snapshots against QEMU's nearest
// equivalents, on the same kernel and initramfs, with the same guest agent:
//
//  1. Incremental snapshot against dirty memory. A guest program,
//     memtouch (guestinit/cmd/memtouch), holds --touch-mib MiB filled with
//     pseudo-random bytes and, on command, writes one byte in each page of
//     the first K MiB. Each repetition takes a full base snapshot of
//     Warren's VM, has memtouch dirty K MiB and takes an incremental one,
//     recording its pause (vmsnap Report.Pause), its whole time and its
//     layer's bytes. QEMU has no incremental snapshot to a file: its column
//     is a full migration to a file each time (QMP migrate to
//     "exec:cat > FILE", live, QEMU's default downtime limit, bandwidth
//     unlimited), with query-migrate's downtime as the pause, its
//     total-time and the file's size. The source VM is then continued.
//
//  2. Restore latency. A full snapshot of each idle VM (taken before
//     memtouch starts) is restored --restore-runs times per variant: Warren
//     eager, lazy (`--lazy`: mmap of a flattened image), uffd
//     (`--lazy=uffd`) and uffd-prefetch (`--lazy=uffd --prefetch`, of a
//     working set recorded first by one unrecorded uffd restore with
//     --record-working-set, saved through the control API once its agent
//     answered), every one with --api; QEMU with -incoming "exec:cat FILE"
//     and the source's command line. It records process start to vCPU 0's
//     first KVM_RUN (Warren only: `warren restore --timing`) and process
//     start to the guest agent's first answer to GET /health (for QEMU
//     over AF_VSOCK, after the vhost-vsock transport reset), and, right
//     after that answer, what the VMM had brought in of guest memory: its
//     process's page faults, Warren's resident guest RAM pages, the bytes
//     read of the snapshot, and the uffd fault server's counters
//     (GET /v1/working-set); see printRestores' footer. Each variant runs warm (snapshot files
//     in --warm-dir, by default the temporary directory, which in the
//     nested KVM host is a tmpfs: the files are in memory) and cold
//     (files in --cold-dir, `sync; echo 3 > /proc/sys/vm/drop_caches`
//     before each run). All warm runs come first, then all cold ones
//     (drop_caches evicts the VMM binaries too); within each, the variants
//     take turns, one run each per round, after one unrecorded run each
//     (which also makes the lazy restore's flattened image).
//
//     go run ./bench/snapshot --kernel build/vmlinux --initramfs build/initramfs.cpio [--reps 5] [--restore-runs 50]
//
// It prints one table per measurement with p50/p90/p99 of Warren and QEMU
// side by side and their ratio (warren/qemu), with --json writes the
// samples, and with --png draws measurement 2 (per variant: the agent's
// answer, bytes read, faults and resident pages); --replot draws that
// PNG from earlier runs' JSON files without running anything:
//
//	go run ./bench/snapshot --replot restore.json --png restore.png
//
// Needs root, /dev/kvm, /dev/vhost-vsock and qemu-system-x86.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/warrenvm/warren/bench/rig"
	"github.com/warrenvm/warren/bench/stats"
	"github.com/warrenvm/warren/bench/vsockpeer"
)

// config is the command line.
type config struct {
	rig.Files
	memMiB, touchMiB             int
	dirty                        []int
	reps, restoreRuns            int
	qemuCID                      int
	warmDir, coldDir             string
	timeout, restoreTimeout      time.Duration
	bootTimeout                  time.Duration
	bootTries                    int
	jsonOut                      string
	skipIncremental, skipRestore bool
	variants                     map[string]bool // restore variants: eager, lazy (mmap), uffd, uffd-prefetch, qemu
	caches                       map[string]bool // restore cache states: warm, cold
	// png is where measurement 2 is drawn ("": not drawn).
	png string
}

func main() {
	var c config
	c.Flags("initramfs (with the agent and memtouch)")
	flag.IntVar(&c.memMiB, "mem", 512, "guest memory, MiB")
	flag.IntVar(&c.touchMiB, "touch-mib", 128, "memory memtouch holds, MiB")
	dirty := flag.String("dirty", "1,16,128", "MiB memtouch dirties before each incremental snapshot, comma-separated")
	flag.IntVar(&c.reps, "reps", 5, "repetitions per dirty size and system")
	flag.IntVar(&c.restoreRuns, "restore-runs", 50, "recorded restores per variant")
	flag.IntVar(&c.qemuCID, "qemu-cid", 42, "the QEMU guest's vsock CID")
	flag.StringVar(&c.warmDir, "warm-dir", os.TempDir(), "directory for snapshots read warm (and for the incremental part)")
	flag.StringVar(&c.coldDir, "cold-dir", "build/bench-snapshot-cold", "directory for snapshots read with dropped caches (on a file system whose pages drop_caches evicts: not a tmpfs)")
	flag.DurationVar(&c.timeout, "timeout", 5*time.Minute, "limit for a boot, a snapshot or a restore")
	flag.DurationVar(&c.bootTimeout, "boot-timeout", 5*time.Minute, "limit for one boot of a source VM to its agent's answer")
	flag.IntVar(&c.bootTries, "boot-tries", 1, "boots of a source VM before giving up (in the nested KVM host an L2 boot sometimes hangs; a hung boot is no sample)")
	flag.DurationVar(&c.restoreTimeout, "restore-timeout", 30*time.Second, "limit for one restore to the agent's answer; a run past it counts as failed")
	stats.JSONFlag(&c.jsonOut)
	flag.BoolVar(&c.skipIncremental, "skip-incremental", false, "skip measurement 1")
	flag.BoolVar(&c.skipRestore, "skip-restore", false, "skip measurement 2")
	variants := flag.String("variants", "eager,lazy,uffd,uffd-prefetch,qemu", "restore variants to run: warren eager, lazy (or mmap: --lazy), uffd (--lazy=uffd), uffd-prefetch (--lazy=uffd --prefetch of a working set recorded by one uffd restore), qemu")
	caches := flag.String("caches", "warm,cold", "restore cache states to run: warm, cold")
	merge := flag.String("merge", "", "print one restore table from these --json files of earlier invocations (comma-separated) and exit")
	flag.StringVar(&c.png, "png", "", "also draw measurement 2 into this PNG: per restore variant, the agent's answer p50/p90, the bytes read, and the faults and resident pages at the answer")
	replot := flag.String("replot", "", "draw --png from these --json files of earlier invocations (comma-separated, joined as --merge does), run nothing")
	flag.Parse()
	if *replot != "" {
		if c.png == "" {
			fmt.Fprintln(os.Stderr, "bench/snapshot: --replot needs --png")
			os.Exit(2)
		}
		if err := replotRestores(c.png, strings.Split(*replot, ",")); err != nil {
			fmt.Fprintln(os.Stderr, "bench/snapshot:", err)
			os.Exit(1)
		}
		return
	}
	if c.png != "" && c.skipRestore {
		fmt.Fprintln(os.Stderr, "bench/snapshot: --png draws measurement 2, which --skip-restore skips")
		os.Exit(2)
	}
	if *merge != "" {
		if err := mergeRestores(strings.Split(*merge, ","), c.jsonOut); err != nil {
			fmt.Fprintln(os.Stderr, "bench/snapshot:", err)
			os.Exit(1)
		}
		return
	}
	c.caches = map[string]bool{}
	for _, v := range strings.Split(*caches, ",") {
		c.caches[strings.TrimSpace(v)] = true
	}
	var err error
	if c.variants, err = parseVariants(*variants); err != nil {
		fmt.Fprintln(os.Stderr, "bench/snapshot:", err)
		os.Exit(2)
	}
	for _, f := range strings.Split(*dirty, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || k < 0 {
			fmt.Fprintf(os.Stderr, "bench/snapshot: bad --dirty entry %q\n", f)
			os.Exit(2)
		}
		c.dirty = append(c.dirty, k)
	}
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "bench/snapshot:", err)
		os.Exit(1)
	}
}

// needsQEMU reports whether the run has QEMU's VM boot: for measurement
// 1, or for measurement 2's qemu variant. Without it only Warren's VM
// boots, and QEMU (and /dev/vhost-vsock) need not be installed.
func (c config) needsQEMU() bool {
	return !c.skipIncremental || (!c.skipRestore && c.variants["qemu"])
}

func run(c config) error {
	withQEMU := c.needsQEMU()
	if err := c.Check(rig.Needs{Root: "drop_caches", Files: true, QEMU: withQEMU, VhostVsock: withQEMU,
		Otherwise: " (or run only Warren: --skip-incremental and --variants without qemu)"}); err != nil {
		return err
	}
	for _, k := range c.dirty {
		if k > c.touchMiB && !c.skipIncremental {
			return fmt.Errorf("--dirty %d is more than --touch-mib %d", k, c.touchMiB)
		}
	}
	work, err := os.MkdirTemp(c.warmDir, "warren-bench-snapshot")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if err := os.MkdirAll(c.coldDir, 0o755); err != nil {
		return err
	}
	cold, err := os.MkdirTemp(c.coldDir, "run")
	if err != nil {
		return err
	}
	defer os.RemoveAll(cold)
	if withQEMU {
		sync, err := vsockpeer.ServeSync()
		if err != nil {
			return err
		}
		defer sync.Close()
	}

	vms := []*vm{newWarren(c, work)}
	if withQEMU {
		vms = append(vms, newQEMU(c, work))
	}
	defer func() {
		for _, v := range vms {
			v.stop()
		}
	}()
	t0 := time.Now()
	for _, v := range vms { // all boot at once
		if err := v.Start(); err != nil {
			return err
		}
	}
	for i := range vms {
		for try := 1; ; try++ {
			err := vms[i].waitAgent(c.bootTimeout)
			if err == nil {
				break
			}
			if try >= c.bootTries {
				return err
			}
			// Only the source boots are retried: no timing is taken
			// from them, so a retry biases nothing.
			fmt.Printf("%s: boot %d of %d failed (%v); booting it again\n", vms[i].Name, try, c.bootTries, err)
			vms[i].stop()
			if vms[i].Name == "qemu" {
				vms[i] = newQEMU(c, work)
			} else {
				vms[i] = newWarren(c, work)
			}
			if err := vms[i].Start(); err != nil {
				return err
			}
		}
	}
	w, q := vms[0], (*vm)(nil)
	if withQEMU {
		q = vms[1]
	}
	fmt.Printf("%d guests answering %s after start\n", len(vms), time.Since(t0).Round(time.Millisecond))

	// The restore sources: each idle VM, saved once, copied to the cold dir.
	src := restoreSources{
		warrenWarm: filepath.Join(work, "restore", "base"), warrenCold: filepath.Join(cold, "restore", "base"),
		qemuWarm: filepath.Join(work, "qemu-restore.mig"), qemuCold: filepath.Join(cold, "qemu-restore.mig"),
	}
	var srcInfo map[string]any
	if !c.skipRestore {
		if srcInfo, err = saveRestoreSources(w, q, &src); err != nil {
			return err
		}
	}

	out := map[string]any{
		"benchmark": "snapshot",
		"mem_mib":   c.memMiB, "touch_mib": c.touchMiB,
		"host_note": "inside the nested KVM host everything is emulated: compare ratios",
	}
	if !c.skipIncremental {
		res, err := incremental(c, w, q, work)
		if err != nil {
			return err
		}
		printIncremental(c, res)
		out["incremental"] = incrementalJSON(res)
	}
	for _, v := range vms {
		v.stop()
	}
	var restored map[string]*restoreSeries // measurement 2's results, for --png
	if !c.skipRestore {
		res, err := restores(c, src, work)
		if err != nil {
			return err
		}
		fmt.Println()
		printRestores(os.Stdout, c, res, srcInfo)
		out["restore"] = restoreJSON(c, res)
		out["restore_sources"] = srcInfo
		restored = res
	}
	if c.jsonOut != "" {
		if err := stats.WriteJSON(c.jsonOut, out); err != nil {
			return err
		}
	}
	if c.png != "" && restored != nil { // after the JSON: a plot that fails loses no sample
		return writeRestorePlot(c.png, restorePlotTitle(c), restored)
	}
	return nil
}

// dropCaches writes back dirty pages and drops the page cache, dentries
// and inodes.
func dropCaches() error {
	exec.Command("sync").Run()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0o200)
}
