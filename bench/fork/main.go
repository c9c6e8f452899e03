// Command fork measures Warren's VM fork (POST /v1/fork on `warren run
// --api`: copy-on-write children, each a detached process of its own)
// against QEMU's nearest equivalent, cloning a VM by migrating it to a file
// and starting a new QEMU from that file. Both run the same kernel and
// initramfs with the same guest agent (as in bench/snapshot).
//
//  1. Fork latency, for each guest size in --sizes (MiB). One Warren
//     guest of that size is booted and, --runs times (after one
//     unrecorded run), forked with n=1. Recorded: the fork call's round
//     trip, the parent's pause (pause_ms, host side), the child's first
//     KVM_RUN after the pause ends (ready_ms, host side), and the time
//     from sending the request to the child's guest agent answering
//     GET /health over the child's vsock socket. The child is then stopped
//     (SIGTERM, SIGKILL after 10 s) and its files (PREFIX-0.*) removed.
//     QEMU has no fork: a QEMU guest of the same size is booted, migrated
//     to a file once (QMP migrate to "exec:cat > FILE", unlimited
//     bandwidth; query-migrate's downtime is its "pause") and stopped;
//     then, --runs times, a new QEMU starts from the file with
//     -incoming "exec:cat FILE" and a fresh guest CID, timed from process
//     start to its agent's answer over AF_VSOCK, and is stopped after.
//     Warren and QEMU runs take turns. The figure that should not grow
//     with memory size is Warren's: a summary of p50 against size follows
//     the tables. (The unrecorded first fork is also the one that makes
//     the booted parent's memory a shared base. Each later fork adds a
//     layer of the pages written since; past guestmem's layer or run
//     bound a fork merges the upper layers (compacts), or, past the run
//     bound even merged, flattens them, copying the memory: the table
//     counts both.)
//
//  2. Density. One Warren guest of --density-mem MiB is forked one child
//     at a time; after each child's agent answers (so it is running and
//     idle), /proc/meminfo's MemAvailable is read. It stops when
//     MemAvailable falls below --density-floor percent of MemTotal or at
//     --density-max children. Reported: children running, MemAvailable's
//     drop per child, and the children's mean PSS and private memory
//     (/proc/PID/smaps_rollup: Pss, Private_Clean+Private_Dirty).
//
// `make bench` builds it as bin/bench-fork and runs it after bench-snapshot
// (inside the nested KVM host when this machine has no /dev/kvm, with
// BENCH_FORK_ARGS). By hand:
//
//	go run ./bench/fork --kernel build/vmlinux --initramfs build/initramfs.cpio [--sizes 128,1024,4096] [--runs 50] [--json out.json]
//
// It prints one table per guest size with p50/p90/p99 of Warren and QEMU
// side by side and their ratio (warren/qemu), and with --json writes every
// sample; --latency-png and --density-png draw measurements 1 and 2 as
// PNGs, and --replot draws them from earlier runs' JSON files without
// running anything (several runs in one picture, each named by a label):
//
//	go run ./bench/fork --replot --latency-png fork.png "before=old.json" "after=new.json"
//
// Needs /dev/kvm, and for QEMU /dev/vhost-vsock (usually root) and
// qemu-system-x86. Every VMM it started is killed when it ends, fails or
// is interrupted.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warrenvm/warren/bench/rig"
	"github.com/warrenvm/warren/bench/stats"
	"github.com/warrenvm/warren/bench/vsockpeer"
)

// guestArgs are the kernel arguments both guests get besides the base line
// and the host profile's (as in bench/snapshot).
const guestArgs = "random.trust_cpu=1"

// config is the command line.
type config struct {
	rig.Files
	sizes                  []int
	runs                   int
	qemuCID                int
	densityMem, densityMax int
	densityFloor           float64 // percent of MemTotal
	dir                    string
	timeout, runTimeout    time.Duration
	jsonOut                string
	skipQEMU, skipDensity  bool
	// densityBalloon are the density variants: without the balloon
	// (false), with it (true), or both in turn.
	densityBalloon []bool
	densityPNG     string
	// latencyPNG is where measurement 1 is drawn ("": not drawn).
	latencyPNG string
}

func main() {
	var c config
	c.Flags("initramfs (with the agent)")
	sizes := flag.String("sizes", "128,1024,4096", "guest sizes for the fork latency, MiB, comma-separated ('' for none)")
	flag.IntVar(&c.runs, "runs", 50, "recorded forks (and QEMU restores) per size")
	flag.IntVar(&c.qemuCID, "qemu-cid", 42, "the QEMU source guest's vsock CID; restores use the next ones")
	flag.IntVar(&c.densityMem, "density-mem", 128, "guest memory for the density measurement, MiB")
	flag.IntVar(&c.densityMax, "density-max", 256, "most children the density measurement forks")
	flag.Float64Var(&c.densityFloor, "density-floor", 10, "the density measurement stops when MemAvailable is below this percentage of MemTotal")
	flag.StringVar(&c.dir, "dir", os.TempDir(), "directory for sockets, consoles and the QEMU migration file")
	flag.DurationVar(&c.timeout, "timeout", 5*time.Minute, "limit for a boot or a migration")
	flag.DurationVar(&c.runTimeout, "run-timeout", time.Minute, "limit for one fork or restore to the agent's answer; a run past it counts as failed")
	stats.JSONFlag(&c.jsonOut)
	flag.BoolVar(&c.skipQEMU, "skip-qemu", false, "measure Warren only")
	flag.BoolVar(&c.skipDensity, "skip-density", false, "skip measurement 2")
	points := flag.String("density-points", "16,64,256", "child counts at which measurement 2 stops to measure memory per child, its split between guest RAM and the VMM process, and the host's CPU use")
	flag.StringVar(&c.densityPNG, "density-png", "", "also draw measurement 2 into this PNG")
	flag.StringVar(&c.latencyPNG, "latency-png", "", "also draw measurement 1 into this PNG: parent pause, child's first KVM_RUN and fork to agent answer, p50/p90/p99 against guest size")
	replotFlag := flag.Bool("replot", false, "draw --density-png and/or --latency-png from the JSON files given as arguments (earlier runs' --json, each PATH or LABEL=PATH), run nothing")
	balloon := flag.String("density-balloon", "off", "measurement 2 with the parent's (and so its children's) virtio-balloon reporting free pages: off, on, or both (one after the other)")
	flag.Parse()
	if *replotFlag {
		if (c.densityPNG == "" && c.latencyPNG == "") || flag.NArg() == 0 {
			fmt.Fprintln(os.Stderr, "bench/fork: --replot needs --density-png or --latency-png (or both) and JSON files")
			os.Exit(2)
		}
		if err := replot(c, flag.Args()); err != nil {
			fmt.Fprintln(os.Stderr, "bench/fork:", err)
			os.Exit(1)
		}
		return
	}
	var err error
	if c.sizes, err = parseSizes(*sizes); err != nil {
		fmt.Fprintln(os.Stderr, "bench/fork:", err)
		os.Exit(2)
	}
	if densityPoints, err = parseSizes(*points); err != nil {
		fmt.Fprintln(os.Stderr, "bench/fork: --density-points:", err)
		os.Exit(2)
	}
	slices.Sort(densityPoints)
	switch *balloon {
	case "off":
		c.densityBalloon = []bool{false}
	case "on":
		c.densityBalloon = []bool{true}
	case "both":
		c.densityBalloon = []bool{false, true}
	default:
		fmt.Fprintf(os.Stderr, "bench/fork: --density-balloon %q: want off, on or both\n", *balloon)
		os.Exit(2)
	}
	if c.runs < 1 || c.densityMax < 1 || c.densityFloor < 0 || c.densityFloor >= 100 {
		fmt.Fprintln(os.Stderr, "bench/fork: --runs and --density-max must be at least 1, --density-floor in [0, 100)")
		os.Exit(2)
	}

	reg := newRegistry()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sig
		fmt.Fprintf(os.Stderr, "bench/fork: %v: stopping every VMM started\n", s)
		reg.killAll()
		os.Exit(130)
	}()
	err = run(c, reg)
	reg.killAll()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/fork:", err)
		os.Exit(1)
	}
}

// replot draws c's PNGs (--density-png, --latency-png: those set) from
// the JSON files earlier runs wrote.
func replot(c config, files []string) error {
	if c.densityPNG != "" {
		if err := replotDensity(c.densityPNG, files); err != nil {
			return err
		}
	}
	if c.latencyPNG != "" {
		return replotLatency(c.latencyPNG, files)
	}
	return nil
}

// parseSizes reads a comma-separated list of positive MiB counts.
func parseSizes(s string) ([]int, error) {
	var sizes []int
	if strings.TrimSpace(s) == "" {
		return nil, nil // --sizes '': density only
	}
	for _, f := range strings.Split(s, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || k <= 0 {
			return nil, fmt.Errorf("bad --sizes entry %q", f)
		}
		sizes = append(sizes, k)
	}
	return sizes, nil
}

func run(c config, reg *registry) error {
	needs := rig.Needs{Files: true, QEMU: !c.skipQEMU, VhostVsock: !c.skipQEMU, Otherwise: ", or --skip-qemu"}
	if err := c.Check(needs); err != nil {
		return err
	}
	dir, err := filepath.Abs(c.dir) // fork prefixes must be absolute
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp(dir, "warren-bench-fork")
	if err != nil {
		return err
	}
	reg.work = work
	defer os.RemoveAll(work)
	if !c.skipQEMU {
		// The QEMU guests' clock and RNG re-sync after each restore.
		sync, err := vsockpeer.ServeSync()
		if err != nil {
			return err
		}
		defer sync.Close()
	}

	out := map[string]any{
		"benchmark": "fork",
		"sizes_mib": c.sizes, "runs": c.runs,
		"host_note": "inside the nested KVM host everything is emulated: compare ratios",
	}
	lat := map[string]any{}
	results := map[int]*sizeResult{}
	for _, size := range c.sizes {
		r, err := latency(c, reg, work, size)
		if err != nil {
			return fmt.Errorf("%d MiB: %w", size, err)
		}
		results[size] = r
		fmt.Println()
		printLatency(os.Stdout, c, r)
		fmt.Println()
		lat[strconv.Itoa(size)] = r.json()
	}
	if len(c.sizes) > 0 {
		printSizeSummary(os.Stdout, c.sizes, results)
	}
	out["latency"] = lat
	if !c.skipDensity {
		var all []*densityResult
		for _, b := range c.densityBalloon {
			d, err := density(c, reg, work, b)
			if err != nil {
				return err
			}
			fmt.Println()
			printDensity(os.Stdout, c, d)
			all = append(all, d)
		}
		fmt.Println()
		printDensityPoints(os.Stdout, all)
		if c.densityPNG != "" {
			if err := writeDensityPlot(c.densityPNG, all); err != nil {
				return err
			}
		}
		out["density"] = all[0]
		if len(all) > 1 {
			out["density_balloon"] = all[1]
		}
	}
	if c.jsonOut != "" {
		if err := stats.WriteJSON(c.jsonOut, out); err != nil {
			return err
		}
	}
	if c.latencyPNG != "" && len(c.sizes) > 0 { // after the JSON: a plot that fails loses no sample
		return writeLatencyPlot(c.latencyPNG, []latencyRun{latencyRunOf(results)})
	}
	return nil
}
