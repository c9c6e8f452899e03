// Command agent measures the round trip of guest agent calls from the
// host: an empty GET /health and POST /exec of a program that exits at once
// (`true` by default), for Warren (its
// userspace virtio-vsock device, reached through the VMM's unix socket)
// and for QEMU's microvm machine with the kernel's vhost-vsock device
// (reached over AF_VSOCK), on the same kernel and initramfs, through the
// same agentclient.Client.
//
//	go run ./bench/agent --kernel build/vmlinux --initramfs build/initramfs.cpio [--calls 200]
//
// Both VMs are booted at once and stay up; their calls are interleaved,
// one call to each in turn (the order swapped every round), after warm-up
// calls that are not recorded. Each call is split three ways:
//
//   - agent: the handler's own time in the guest, as the agent reports it
//     (the X-Warren-Agent-Ns header of /health; ExitStatus.AgentNs of
//     /exec: fork, exec and wait of the program);
//   - transit: total less agent, the rest of the round trip: the host
//     socket, the VMM, virtio notifications and interrupts, the guest
//     kernel's vsock and the agent's HTTP handling around the handler;
//   - VMM CPU: host CPU time (schedstat) of the VMM's threads that are not
//     vCPUs, during the call. For QEMU that includes the vhost-vsock
//     kernel worker (vhost-PID), which does its device work outside QEMU.
//     It also holds whatever background work the VMM did over the call's
//     window (the call and the thread samples around it); the VMM's idle
//     CPU per second is measured first and printed beside it to size that.
//
// It prints one table per operation with p50/p90/p99 of each, Warren's and
// QEMU's side by side with their ratio, with --json writes the samples and
// with --plot draws them (box plots). Needs root, /dev/kvm,
// /dev/vhost-vsock and qemu-system-x86. --replot a.json,b.json --plot F
// boots nothing: it draws the VMM CPU per call of earlier runs side by
// side (before and after a change, say).
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/warrenvm/warren/bench/rig"
	"github.com/warrenvm/warren/bench/stats"
	"github.com/warrenvm/warren/bench/vsockpeer"
)

// config is the command line.
type config struct {
	rig.Files
	calls, warmup, qemuCID int
	timeout                time.Duration
	jsonOut, plotOut       string
	execArgv               []string
}

func main() {
	var c config
	c.Flags("initramfs (with the agent)")
	flag.IntVar(&c.calls, "calls", 200, "recorded calls per operation and system")
	flag.IntVar(&c.warmup, "warmup", 10, "unrecorded calls per operation and system first")
	flag.IntVar(&c.qemuCID, "qemu-cid", 42, "the QEMU guest's vsock CID")
	flag.DurationVar(&c.timeout, "timeout", 10*time.Minute, "limit for a boot to the agent answering")
	stats.JSONFlag(&c.jsonOut)
	execCmd := flag.String("exec", "true", "the program /exec runs, split at spaces")
	flag.StringVar(&c.plotOut, "plot", "", "write box plots of the run (or of --replot's runs) to this PNG file")
	replot := flag.String("replot", "", "no run: plot the VMM CPU per call of these --json files (comma-separated) to --plot")
	flag.Parse()
	if *replot != "" {
		panels, err := replotPanels(strings.Split(*replot, ","))
		if err == nil && c.plotOut == "" {
			err = fmt.Errorf("--replot needs --plot")
		}
		if err == nil {
			err = writePlot(c.plotOut, panels)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench/agent:", err)
			os.Exit(1)
		}
		return
	}
	if c.execArgv = strings.Fields(*execCmd); len(c.execArgv) == 0 {
		fmt.Fprintln(os.Stderr, "bench/agent: --exec is empty")
		os.Exit(2)
	}
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "bench/agent:", err)
		os.Exit(1)
	}
}

// operations are the calls measured, in order.
var operations = []struct{ name, title string }{
	{"health", "GET /health"},
	{"exec", "POST /exec"},
}

// series is one system's samples of one operation.
type series struct {
	Total   []time.Duration `json:"total_ns"`
	Agent   []time.Duration `json:"agent_ns"`
	Transit []time.Duration `json:"transit_ns"`
	VMMCPU  []time.Duration `json:"vmm_cpu_ns"`
	Window  []time.Duration `json:"vmm_cpu_window_ns"`
}

func (s *series) add(m sample) {
	s.Total = append(s.Total, m.total)
	s.Agent = append(s.Agent, m.agent)
	s.Transit = append(s.Transit, m.total-m.agent)
	s.VMMCPU = append(s.VMMCPU, m.vmmCPU)
	s.Window = append(s.Window, m.window)
}

// metrics are the rows of each table: a name and the samples it reads.
var metrics = []struct {
	name string
	get  func(*series) []time.Duration
}{
	{"total", func(s *series) []time.Duration { return s.Total }},
	{"agent", func(s *series) []time.Duration { return s.Agent }},
	{"transit", func(s *series) []time.Duration { return s.Transit }},
	{"vmm cpu", func(s *series) []time.Duration { return s.VMMCPU }},
}

func run(c config) error {
	if err := c.Check(rig.Needs{Files: true, QEMU: true, VhostVsock: true}); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "warren-bench-agent")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sync, err := vsockpeer.ServeSync()
	if err != nil {
		return err
	}
	defer sync.Close()

	systems := []*system{newWarren(c, dir), newQEMU(c)}
	defer func() {
		for _, s := range systems {
			s.stop()
		}
	}()
	for _, s := range systems { // both boot at once
		if err := s.Start(); err != nil {
			return err
		}
	}
	for _, s := range systems {
		if err := s.waitAgent(c.timeout); err != nil {
			return err
		}
	}
	var threadInfo []string
	for _, s := range systems {
		d, err := s.describe()
		if err != nil {
			return err
		}
		fmt.Println(d)
		threadInfo = append(threadInfo, d)
	}
	if len(systems[1].outside) == 0 {
		fmt.Println("qemu: no vhost-PID kernel thread found outside the process; VMM CPU is QEMU's own threads only")
	}

	idle := map[string]time.Duration{} // ns of VMM CPU per second idle
	for _, s := range systems {
		d, err := s.idleCPU(3 * time.Second)
		if err != nil {
			return err
		}
		idle[s.Name] = d
	}

	results := map[string]map[string]*series{}
	for _, op := range operations {
		results[op.name] = map[string]*series{}
		for _, s := range systems {
			results[op.name][s.Name] = &series{}
		}
		for i := range c.warmup + c.calls {
			order := systems
			if i%2 == 1 { // swap who goes first, so neither always follows the other
				order = []*system{systems[1], systems[0]}
			}
			for _, s := range order {
				m, err := s.call(op.name, c.execArgv, time.Minute)
				if err != nil {
					return fmt.Errorf("call %d: %w", i+1, err)
				}
				if i >= c.warmup {
					results[op.name][s.Name].add(m)
				}
			}
		}
	}

	fmt.Println()
	for _, op := range operations {
		title := op.title
		if op.name == "exec" {
			title += " " + strings.Join(c.execArgv, " ")
		}
		table(os.Stdout, fmt.Sprintf("%s: round trip from the host, %d calls each after %d warm-up, interleaved, both VMs up", title, c.calls, c.warmup),
			results[op.name]["warren"], results[op.name]["qemu"])
		fmt.Println()
	}
	fmt.Println("agent: the handler's own time in the guest; transit: total - agent (host socket, VMM, virtio notifications and")
	fmt.Println("interrupts, guest vsock, HTTP); vmm cpu: host CPU (schedstat) of the VMM's non-vCPU threads during the call,")
	fmt.Println("for QEMU with its vhost-vsock kernel worker. Ratios are warren/qemu.")
	fmt.Println("\nbackground in vmm cpu: idle VMM CPU per second times the median window a call's vmm cpu covers")
	for _, s := range systems {
		fmt.Printf("%-6s idle %7s/s;", s.Name, stats.Significant(idle[s.Name]))
		for _, op := range operations {
			w := stats.Median(results[op.name][s.Name].Window)
			fmt.Printf("  %s window %s, background ~%s", op.name, stats.Significant(w), stats.Significant(time.Duration(float64(idle[s.Name])*w.Seconds())))
		}
		fmt.Println()
	}

	if c.jsonOut != "" {
		out := map[string]any{
			"benchmark":             "agent-round-trip",
			"calls":                 c.calls,
			"warmup":                c.warmup,
			"order":                 "both VMs up at once; one call to each in turn, first system swapped every round",
			"threads":               threadInfo,
			"exec_argv":             c.execArgv,
			"idle_vmm_cpu_ns_per_s": idle,
		}
		for _, op := range operations {
			o := map[string]any{}
			for name, s := range results[op.name] {
				sum := map[string]stats.Summary{}
				for _, m := range metrics {
					sum[m.name] = stats.Summarise(name, m.get(s))
				}
				sum["vmm cpu window"] = stats.Summarise(name, s.Window)
				o[name] = sum
			}
			out[op.name] = o
		}
		if err := stats.WriteJSON(c.jsonOut, out); err != nil {
			return err
		}
	}
	if c.plotOut != "" {
		return writePlot(c.plotOut, runPanels(results))
	}
	return nil
}

// table prints one operation: per metric, p50/p90/p99 of both systems and
// their ratio.
func table(w io.Writer, title string, ours, peer *series) {
	fmt.Fprintln(w, title)
	fmt.Fprintf(w, "%-8s %-4s %12s %12s %8s\n", "", "", "warren", "qemu", "ratio")
	for _, m := range metrics {
		for _, r := range stats.PercentileRows(m.name, stats.Summarise("warren", m.get(ours)), stats.Summarise("qemu", m.get(peer))) {
			a, b := r.Values[0], r.Values[1]
			fmt.Fprintf(w, "%-8s %-4s %12s %12s %8.2f\n", r.Name, r.Label, stats.Significant(a), stats.Significant(b), stats.Ratio(a, b))
		}
	}
}
