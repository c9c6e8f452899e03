package main

import (
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/bench/stats"
)

func TestPrintMetrics(t *testing.T) {
	var b strings.Builder
	printMetrics(&b, "warren", "qemu", []metric{
		{"to agent answer", stats.Millis(10, 20, 30), stats.Millis(100, 200, 300)},
		{"fork call", stats.Millis(5), nil},
	})
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) != 1+3+3 {
		t.Fatalf("%d lines:\n%s", len(lines), b.String())
	}
	for _, c := range []struct {
		line int
		want []string
	}{
		{0, []string{"warren", "qemu", "ratio"}},
		{1, []string{"to agent answer", "p50", "20ms", "200ms", "0.100"}},
		{3, []string{"p99", "30ms", "300ms", "0.100"}},
		{4, []string{"fork call", "p50", "5ms", "-"}},
	} {
		for _, w := range c.want {
			if !strings.Contains(lines[c.line], w) {
				t.Errorf("line %d %q lacks %q", c.line, lines[c.line], w)
			}
		}
	}
}

func TestPrintLatencyAndSummary(t *testing.T) {
	c := config{runs: 3, sizes: []int{128, 1024}}
	res := map[int]*sizeResult{
		128: {MemMiB: 128, Warren: warrenSeries{Agent: stats.Millis(10, 11, 12), Pause: stats.Millis(1, 1, 2), Ready: stats.Millis(3, 3, 3), Call: stats.Millis(4, 4, 4), Layers: []int{2, 3, 1}},
			QEMU: &qemuSeries{Downtime: 50 * time.Millisecond, Agent: stats.Millis(500, 600, 700), Failures: []string{"run 3: boom"}}},
		1024: {MemMiB: 1024, Warren: warrenSeries{Agent: stats.Millis(10, 11, 12), Pause: stats.Millis(1, 1, 2)}},
	}
	var b strings.Builder
	printLatency(&b, c, res[128])
	out := b.String()
	for _, w := range []string{"guest 128 MiB", "parent pause", "50ms", "0.018", "FAILED qemu: 1 of 3", "1 flattens"} {
		if !strings.Contains(out, w) {
			t.Errorf("latency table lacks %q:\n%s", w, out)
		}
	}
	b.Reset()
	printSizeSummary(&b, c.sizes, res)
	out = b.String()
	if !strings.Contains(out, "0.018") || !strings.Contains(out, "1024") {
		t.Errorf("summary:\n%s", out)
	}
	// 1024 has no QEMU figures: dashes.
	last := strings.Split(strings.TrimSpace(out), "\n")
	if row := last[len(last)-2]; !strings.Contains(row, "1024") || !strings.Contains(row, " -") {
		t.Errorf("row without qemu: %q", row)
	}
}

func TestPrintDensity(t *testing.T) {
	d := &densityResult{MemMiB: 128, Children: 2, Stop: "cap", MemTotal: 1000 << 20,
		AvailBefore: 800 << 20, Avail: []uint64{790 << 20, 780 << 20},
		Child: []procMem{{Pss: 3 << 20, Private: 1 << 20}, {Pss: 5 << 20, Private: 3 << 20}}}
	if got := mib(d.dropPerChild()); got != 10 {
		t.Errorf("drop per child %.2f MiB, want 10", got)
	}
	var b strings.Builder
	printDensity(&b, config{densityMax: 2, densityFloor: 10}, d)
	out := b.String()
	for _, w := range []string{"2 (stopped at the cap", "drop/child   10.00 MiB", "PSS, mean           4.00 MiB", "private, mean       2.00 MiB"} {
		if !strings.Contains(out, w) {
			t.Errorf("density lacks %q:\n%s", w, out)
		}
	}
	d.Stop = "floor"
	b.Reset()
	printDensity(&b, config{densityMax: 2, densityFloor: 10}, d)
	if !strings.Contains(b.String(), "stopped at the floor") {
		t.Errorf("floor:\n%s", b.String())
	}
}
