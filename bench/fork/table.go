package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/warrenvm/warren/bench/stats"
)

// metric is one row group of a table: p50, p90 and p99 of a and, when b
// is not nil, of the peer's b and the ratio a/b.
type metric struct {
	name string
	a, b []time.Duration
}

var percentiles = []float64{50, 90, 99}

// printMetrics prints metrics under a header naming the two systems.
func printMetrics(w io.Writer, ours, peer string, ms []metric) {
	fmt.Fprintf(w, "%-22s %-4s %12s %12s %8s\n", "", "", ours, peer, "ratio")
	for _, m := range ms {
		for i, p := range percentiles {
			name := ""
			if i == 0 {
				name = m.name
			}
			a := stats.Percentile(m.a, p)
			if m.b == nil {
				fmt.Fprintf(w, "%-22s p%-3.0f %12s %12s %8s\n", name, p, stats.Significant(a), "-", "-")
				continue
			}
			b := stats.Percentile(m.b, p)
			fmt.Fprintf(w, "%-22s p%-3.0f %12s %12s %8.3f\n", name, p, stats.Significant(a), stats.Significant(b), stats.Ratio(a, b))
		}
	}
}

// printLatency prints measurement 1's table for one size.
func printLatency(w io.Writer, c config, r *sizeResult) {
	fmt.Fprintf(w, "fork latency, guest %d MiB, %d runs each (after one unrecorded):\n", r.MemMiB, c.runs)
	var downtime, restore []time.Duration
	if r.QEMU != nil {
		downtime, restore = []time.Duration{r.QEMU.Downtime}, r.QEMU.Agent
		if restore == nil {
			restore = []time.Duration{}
		}
	}
	ws := r.Warren
	printMetrics(w, "warren", "qemu", []metric{
		{"to agent answer", ws.Agent, restore},
		{"parent pause", ws.Pause, downtime},
		{"fork call", ws.Call, nil},
		{"child first KVM_RUN", ws.Ready, nil},
	})
	if r.QEMU != nil {
		fmt.Fprintf(w, "qemu migration file %.1f MiB, migration total %s\n", mib(r.QEMU.FileBytes), r.QEMU.MigrationTotal)
	}
	if n := len(ws.Layers); n > 0 {
		fl, co := flattens(ws.Layers)
		fmt.Fprintf(w, "warren parent's memory layers: %d after the first recorded fork, %d after the last; %d compactions (upper layers merged), %d flattens (an O(memory) fork)\n",
			ws.Layers[0], ws.Layers[n-1], co, fl)
	}
	for _, f := range []struct {
		name string
		list []string
	}{{"warren", ws.Failures}, {"qemu", qemuFailures(r.QEMU)}} {
		if len(f.list) > 0 {
			fmt.Fprintf(w, "FAILED %s: %d of %d runs (not in the figures); first: %s\n", f.name, len(f.list), c.runs, f.list[0])
		}
	}
	fmt.Fprintln(w, "to agent answer: warren from sending POST /v1/fork n=1, qemu from starting `qemu -incoming \"exec:cat FILE\"`,")
	fmt.Fprintln(w, "to the guest agent answering GET /health. parent pause: warren pause_ms, qemu the downtime of its one")
	fmt.Fprintln(w, "migration to the file (ms resolution). fork call: the POST's round trip (it returns once the child")
	fmt.Fprintln(w, "runs); child first KVM_RUN: ready_ms, from the parent's pause end. Ratios are warren/qemu.")
}

// flattens counts the forks after which the parent had fewer memory
// layers than before: down to one, guestmem flattened its layers, copying
// its memory; down to more, it compacted them (merged its upper layers,
// copying only their pages).
func flattens(layers []int) (flat, compacted int) {
	for i := 1; i < len(layers); i++ {
		switch {
		case layers[i] >= layers[i-1]:
		case layers[i] == 1:
			flat++
		default:
			compacted++
		}
	}
	return flat, compacted
}

func qemuFailures(q *qemuSeries) []string {
	if q == nil {
		return nil
	}
	return q.Failures
}

// printSizeSummary prints p50s against guest size: Warren's should hold
// still as memory grows.
func printSizeSummary(w io.Writer, sizes []int, res map[int]*sizeResult) {
	fmt.Fprintln(w, "p50 against guest size (warren fork should not grow with memory):")
	fmt.Fprintf(w, "%9s %12s %12s %12s %12s %12s %8s\n", "size MiB", "pause", "child run", "to agent", "qemu pause", "qemu agent", "ratio")
	for _, size := range sizes {
		r := res[size]
		if r == nil {
			continue
		}
		p50 := func(s []time.Duration) time.Duration { return stats.Percentile(s, 50) }
		qp, qa, ratio := "-", "-", "-"
		if r.QEMU != nil {
			qp, qa = stats.Significant(r.QEMU.Downtime).String(), stats.Significant(p50(r.QEMU.Agent)).String()
			ratio = fmt.Sprintf("%.3f", stats.Ratio(p50(r.Warren.Agent), p50(r.QEMU.Agent)))
		}
		fmt.Fprintf(w, "%9d %12s %12s %12s %12s %12s %8s\n", size,
			stats.Significant(p50(r.Warren.Pause)), stats.Significant(p50(r.Warren.Ready)), stats.Significant(p50(r.Warren.Agent)), qp, qa, ratio)
	}
	fmt.Fprintln(w, "ratio: warren fork to agent / qemu restore to agent, p50.")
}

// printDensity prints measurement 2.
func printDensity(w io.Writer, c config, d *densityResult) {
	fmt.Fprintf(w, "density: children of one %d MiB guest, each running idle after its agent answered\n", d.MemMiB)
	var why string
	switch {
	case d.Stop == "floor":
		why = fmt.Sprintf("stopped at the floor: MemAvailable below %.0f%% of MemTotal (%.0f MiB)", c.densityFloor, mib(d.FloorBytes))
	case d.Stop == "cap":
		why = fmt.Sprintf("stopped at the cap: --density-max %d", c.densityMax)
	default:
		why = "stopped by an error: " + strings.TrimPrefix(d.Stop, "error: ")
	}
	pss, priv := d.childMean()
	last := d.AvailBefore
	if len(d.Avail) > 0 {
		last = d.Avail[len(d.Avail)-1]
	}
	fmt.Fprintf(w, "  children running          %d (%s)\n", d.Children, why)
	fmt.Fprintf(w, "  MemTotal                  %.0f MiB\n", mib(d.MemTotal))
	fmt.Fprintf(w, "  MemAvailable              %.0f MiB before, %.0f MiB after\n", mib(d.AvailBefore), mib(last))
	fmt.Fprintf(w, "  MemAvailable drop/child   %.2f MiB\n", mib(d.dropPerChild()))
	fmt.Fprintf(w, "  child PSS, mean           %.2f MiB\n", mib(pss))
	fmt.Fprintf(w, "  child private, mean       %.2f MiB\n", mib(priv))
	fmt.Fprintf(w, "  parent PSS / private      %.2f / %.2f MiB\n", mib(d.Parent.Pss), mib(d.Parent.Private))
	if len(d.ForkToAgent.Samples) > 0 {
		fmt.Fprintf(w, "  fork to agent             p50 %s p90 %s p99 %s\n", stats.Significant(d.ForkToAgent.P50), stats.Significant(d.ForkToAgent.P90), stats.Significant(d.ForkToAgent.P99))
	}
	fmt.Fprintln(w, "MemAvailable: /proc/meminfo; PSS and private (Private_Clean+Private_Dirty): /proc/PID/smaps_rollup of")
	fmt.Fprintln(w, "each child VMM once all ran. No QEMU figure: QEMU has no fork, and each restored QEMU holds its own copy.")
}

// printDensityPoints prints the density at each of densityPoints reached,
// one row per variant (with and without the balloon) and point.
func printDensityPoints(w io.Writer, all []*densityResult) {
	fmt.Fprintln(w, "density by children running (MiB per child; guest/VMM: the children's mean private memory in their guest RAM mappings and in the rest of the VMM process)")
	fmt.Fprintf(w, "  %-8s %8s %10s %10s %10s %10s %9s\n", "balloon", "children", "drop/child", "marginal", "guest", "VMM", "CPUs busy")
	for _, d := range all {
		if len(d.Points) == 0 {
			fmt.Fprintf(w, "  %-8v %8d (no point reached: %d children, %s)\n", d.Balloon, densityPoints[0], d.Children, d.Stop)
		}
		for _, p := range d.Points {
			fmt.Fprintf(w, "  %-8v %8d %10.2f %10.2f %10.2f %10.2f %8.0f%%\n", d.Balloon, p.Children,
				mib(p.DropPerChild), mib(p.Marginal), mib(p.Split.GuestPrivate), mib(p.Split.VMMPrivate), 100*p.CPUBusy)
		}
	}
}
