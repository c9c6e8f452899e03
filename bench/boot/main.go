// Command boot measures time from process start to the guest init's ready
// line, for Warren and for QEMU's microvm machine on the same kernel,
// initramfs and command line, run side by side (alternating) in one run.
//
//	go run ./bench/boot --kernel build/vmlinux --initramfs build/initramfs.cpio [--runs 3]
//
// It prints both systems' median/p50/p90/p99 and the Warren/QEMU ratio, and
// with --json writes the samples for the record. With --keep-going it counts
// failed boots instead of stopping (the nested host's L2 failure rates,
// --skip-qemu for Warren's alone); a Warren guest that is not ready within
// --timeout is described through its API socket (vmmctl's DescribeGuest:
// its vCPUs, interrupt controllers and virtqueues) before it is killed.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/warrenvm/warren/bench/rig"
	"github.com/warrenvm/warren/bench/stats"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmm/boot"
	"github.com/warrenvm/warren/vmm/hostprofile"
)

var readyLine = regexp.MustCompile(`warren-init: ready uptime=([0-9.]+)`)

func main() {
	var f rig.Files
	f.Flags("initramfs")
	runs := flag.Int("runs", 3, "boots per system")
	mem := flag.Int("mem", 256, "guest memory, MiB")
	cpus := flag.Int("cpus", 1, "vCPUs")
	timeout := flag.Duration("timeout", 10*time.Minute, "limit for one boot")
	jsonOut := flag.String("json", "", "also write results as JSON to this file")
	qemuMem := flag.String("qemu-mem", "anon", "QEMU's guest RAM: anon (its default, private anonymous memory) or memfd (a shared memfd, as Warren's guest RAM is): tells the memory's kind from the VMM's code when their L2 fault rates differ in the nested host")
	skipQEMU := flag.Bool("skip-qemu", false, "boot Warren only (with --keep-going: its failure rate in the nested host, each stalled guest described; no ratio is printed)")
	keepGoing := flag.Bool("keep-going", false, "count a failed boot (triple fault, no ready line, timeout) and go on, then report each system's failure rate: the nested host's L2 fault rates, Warren's against QEMU's on the same kernel (issue 18)")
	flag.Parse()
	if *qemuMem != "anon" && *qemuMem != "memfd" {
		fmt.Fprintf(os.Stderr, "bench/boot: --qemu-mem %q: want anon or memfd\n", *qemuMem)
		os.Exit(2)
	}
	if *skipQEMU && !*keepGoing {
		fmt.Fprintln(os.Stderr, "bench/boot: --skip-qemu measures failure rates only: use it with --keep-going")
		os.Exit(2)
	}
	if err := run(f, *runs, *mem, *cpus, *timeout, *jsonOut, *keepGoing, *skipQEMU, *qemuMem == "memfd"); err != nil {
		fmt.Fprintln(os.Stderr, "bench/boot:", err)
		os.Exit(1)
	}
}

func run(f rig.Files, runs, mem, cpus int, timeout time.Duration, jsonOut string, keepGoing, skipQEMU, qemuMemfd bool) error {
	if err := f.Check(rig.Needs{Files: true, QEMU: !skipQEMU}); err != nil {
		return err
	}
	profile := hostprofile.Detect("/sys/module")
	const userArgs = "warren.poweroff=1"
	var full boot.Cmdline // exactly what warren boots with
	full.Add(vmm.BaseCmdline)
	full.Add(profile.KernelArgs()...)
	full.Add(userArgs)

	m, c := strconv.Itoa(mem), strconv.Itoa(cpus)
	machine, ram := "microvm,acpi=off", []string(nil)
	if qemuMemfd {
		machine += ",memory-backend=ram"
		ram = []string{"-object", "memory-backend-memfd,id=ram,size=" + m + "M,share=on"}
	}
	// Warren's API socket, through which a guest that never gets ready is
	// described before it is stopped (where its vCPU is: issue 18's
	// stalls).
	dir, err := os.MkdirTemp("", "bench-boot-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	api := filepath.Join(dir, "api.sock")
	systems := []struct {
		name string
		argv []string
	}{
		{"warren", []string{f.Warren, "run", "--kernel", f.Kernel, "--initramfs", f.Initramfs, "--mem", m, "--cpus", c, "--api", api, "--cmdline", userArgs}},
		{"qemu", append([]string{f.QEMU, "-M", machine, "-accel", "kvm", "-cpu", "host,-arch-capabilities", "-m", m, "-smp", c,
			"-nodefaults", "-no-user-config", "-nographic", "-no-reboot", "-serial", "stdio",
			"-kernel", f.Kernel, "-initrd", f.Initramfs, "-append", full.String()}, ram...)},
	}
	fmt.Printf("host profile: %s\nkernel: %s\ninitramfs: %s\ncmdline: %s\n\n", profile, f.Kernel, f.Initramfs, full.String())
	samples := make([][]time.Duration, len(systems))
	guest := make([][]float64, len(systems))
	failures := make([]map[string]int, len(systems))
	for i := range failures {
		failures[i] = map[string]int{}
	}
	for r := 0; r < runs; r++ {
		for i, s := range systems { // alternate, so drift hits both alike
			if skipQEMU && s.name == "qemu" {
				continue
			}
			var describe func() string
			if s.name == "warren" {
				os.Remove(api)
				describe = func() string { return describeGuest(api, dir) }
			}
			d, up, err := timeToReady(s.argv, timeout, describe)
			if err != nil && keepGoing {
				kind := failureKind(err)
				failures[i][kind]++
				fmt.Printf("run %d %-6s FAILED (%s): %v\n", r+1, s.name, kind, err)
				continue
			}
			if err != nil {
				return fmt.Errorf("%s run %d: %w", s.name, r+1, err)
			}
			fmt.Printf("run %d %-6s ready after %8s (guest uptime %.2fs)\n", r+1, s.name, d.Round(time.Millisecond), up)
			samples[i] = append(samples[i], d)
			guest[i] = append(guest[i], up)
		}
	}
	if keepGoing {
		fmt.Println()
		for i, s := range systems {
			if skipQEMU && s.name == "qemu" {
				continue
			}
			n := 0
			for _, c := range failures[i] {
				n += c
			}
			fmt.Printf("%-6s %d of %d boots failed (%.2f%%): %v\n", s.name, n, runs, 100*float64(n)/float64(max(runs, 1)), failures[i])
		}
		if skipQEMU {
			return writeJSON(jsonOut, map[string]any{"benchmark": "boot-failures", "host_profile": profile.String(),
				"cmdline": full.String(), "runs": runs, "failures": map[string]map[string]int{"warren": failures[0]},
				"warren": stats.Summarise("warren", samples[0]), "guest_uptime_s": map[string][]float64{"warren": guest[0]}})
		}
		if len(samples[0]) == 0 || len(samples[1]) == 0 {
			return errors.New("a system never reached ready")
		}
	}
	ours, peer := stats.Summarise("warren", samples[0]), stats.Summarise("qemu", samples[1])
	fmt.Println()
	stats.Table(os.Stdout, "time from process start to 'warren-init: ready'", ours, peer)
	fmt.Printf("\nmedian warren %s, median qemu %s, ratio warren/qemu %.2f\n",
		ours.Median.Round(time.Millisecond), peer.Median.Round(time.Millisecond), stats.Ratio(ours.Median, peer.Median))
	return writeJSON(jsonOut, map[string]any{
		"benchmark": "boot-to-ready", "host_profile": profile.String(), "cmdline": full.String(),
		"warren": ours, "qemu": peer, "guest_uptime_s": map[string][]float64{"warren": guest[0], "qemu": guest[1]},
		"ratio_median": stats.Ratio(ours.Median, peer.Median),
		"runs":         runs, "failures": map[string]map[string]int{"warren": failures[0], "qemu": failures[1]},
	})
}

// writeJSON writes v to path (stats.WriteJSON); an empty path writes
// nothing.
func writeJSON(path string, v any) error {
	if path == "" {
		return nil
	}
	return stats.WriteJSON(path, v)
}

// timeToReady starts argv and returns the time until its output shows the
// ready line, and the guest uptime the line reports. It then waits briefly
// for the guest to power off and kills it otherwise. A guest not ready
// within timeout is described by describe (when not nil) before it is
// killed, and the description ends the error.
func timeToReady(argv []string, timeout time.Duration, describe func() string) (time.Duration, float64, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		timedOut  atomic.Bool
		described string
	)
	timer := time.AfterFunc(timeout, func() {
		if describe != nil {
			described = describe()
		}
		timedOut.Store(true)
		cancel()
	})
	defer timer.Stop()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, err
	}
	var errTail tailBuffer
	cmd.Stderr = io.MultiWriter(os.Stderr, &errTail)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	var (
		d     time.Duration
		up    float64
		found bool
		tail  []string
	)
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		if m := readyLine.FindStringSubmatch(line); m != nil && !found && timer.Stop() {
			d, found = time.Since(start), true
			up, _ = strconv.ParseFloat(m[1], 64)
			// Only the time to ready is measured. Warren then powers off by
			// itself; QEMU's microvm has no i8042 to take the reset and
			// would boot again, so stop whichever is still running soon.
			go func() { time.Sleep(5 * time.Second); cancel() }()
		}
		if tail = append(tail, line); len(tail) > 20 {
			tail = tail[1:]
		}
	}
	io.Copy(io.Discard, out)
	cmd.Wait()
	if !found {
		if timedOut.Load() {
			return 0, 0, fmt.Errorf("timed out after %v with no ready line (last output: %q; stderr: %q)%s", timeout, tail, errTail.String(), described)
		}
		return 0, 0, fmt.Errorf("no ready line (last output: %q; stderr: %q)", tail, errTail.String())
	}
	return d, up, nil
}

// describeGuest describes the guest of the Warren VMM whose API socket is
// api (vmmctl's DescribeGuest, its snapshot in a directory under dir),
// as the end of a stalled boot's error.
func describeGuest(api, dir string) string {
	d, err := rig.DescribeGuest(api, dir)
	if err != nil {
		return "; no description: " + err.Error()
	}
	return "; the guest:\n" + d
}

// failureKind names how a boot failed, from timeToReady's error: a
// triple fault (Warren says so; QEMU, with -no-reboot, exits at the reset
// a triple fault causes, before the ready line), a timeout, or an exit
// with no ready line.
func failureKind(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "triple fault"):
		return "triple-fault"
	case strings.HasPrefix(msg, "timed out"):
		return "timeout"
	}
	return "no-ready"
}

// tailBuffer keeps the last 2 KiB written to it.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 2048 {
		t.b = t.b[len(t.b)-2048:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.b) }
