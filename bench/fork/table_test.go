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

func TestParseSmapsSplit(t *testing.T) {
	smaps := `00400000-00800000 r-xp 00000000 08:01 123 /usr/bin/warren
Rss:                4096 kB
Pss:                2048 kB
Private_Clean:       100 kB
Private_Dirty:        20 kB
7f0000000000-7f0008000000 rw-p 00000000 00:01 77 /memfd:warren-guest-layer (deleted)
Rss:                 900 kB
Pss:                 500 kB
Private_Clean:         0 kB
Private_Dirty:       300 kB
7f1000000000-7f1000100000 rw-p 00000000 00:00 0 
Pss:                  64 kB
Private_Dirty:        64 kB
VmFlags: rd wr mr mw me ac
`
	m, err := parseSmapsSplit(strings.NewReader(smaps))
	if err != nil {
		t.Fatal(err)
	}
	want := memSplit{GuestPss: 500 << 10, GuestPrivate: 300 << 10, VMMPss: 2112 << 10, VMMPrivate: 184 << 10}
	if m != want {
		t.Errorf("split %+v, want %+v", m, want)
	}
}

func TestParseCPUTimes(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice:
	// guest time is already in user, so it is not counted again.
	got, err := parseCPUTimes(strings.NewReader("cpu  10 1 5 80 4 0 0 0 7 0\ncpu0 1 2 3 4\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got != (cpuTimes{busy: 16, total: 100}) {
		t.Errorf("got %+v, want busy 16 of 100", got)
	}
	if _, err := parseCPUTimes(strings.NewReader("intr 1 2 3\n")); err == nil {
		t.Error("a /proc/stat without its cpu line was accepted")
	}
}

func TestDensityPointDrops(t *testing.T) {
	defer func(d time.Duration) { cpuSample = d }(cpuSample)
	cpuSample = 10 * time.Millisecond
	d := &densityResult{AvailBefore: 1000 << 20}
	for i := 1; i <= 64; i++ {
		per := uint64(10)
		if i > 16 {
			per = 4 // after the 16th child each costs 4 MiB
		}
		prev := d.AvailBefore
		if len(d.Avail) > 0 {
			prev = d.Avail[len(d.Avail)-1]
		}
		d.Avail = append(d.Avail, prev-per<<20)
		d.Children = i
		if i == 16 || i == 64 {
			p, err := d.point(nil)
			if err != nil {
				t.Fatal(err)
			}
			d.Points = append(d.Points, p)
		}
	}
	p16, p64 := d.Points[0], d.Points[1]
	if mib(p16.DropPerChild) != 10 || mib(p16.Marginal) != 10 {
		t.Errorf("at 16: %+v, want 10 and 10 MiB", p16)
	}
	if mib(p64.Marginal) != 4 || mib(p64.DropPerChild) != (16*10+48*4)/64.0 {
		t.Errorf("at 64: %+v, want marginal 4 MiB and %.2f per child", p64, (16*10+48*4)/64.0)
	}
	var b strings.Builder
	printDensityPoints(&b, []*densityResult{d})
	if !strings.Contains(b.String(), "      64       5.50       4.00") {
		t.Errorf("table:\n%s", b.String())
	}
}

func TestParseTopPrivate(t *testing.T) {
	smaps := `00400000-00800000 r-xp 00000000 08:01 123 /usr/bin/warren
Private_Clean:       100 kB
Private_Dirty:        20 kB
c000000000-c004000000 rw-p 00000000 00:00 0 
Private_Dirty:      4096 kB
7f0000000000-7f0008000000 rw-p 00000000 00:01 77 /memfd:warren-guest-layer (deleted)
Private_Dirty:       300 kB
`
	top, err := parseTopPrivate(strings.NewReader(smaps), 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(top) != 2 || top[0].Private != 4096<<10 || !strings.HasPrefix(top[0].Name, "c000000000-c004000000 rw-p") ||
		top[1].Private != 300<<10 || !strings.Contains(top[1].Name, "warren-guest-layer") {
		t.Errorf("top %+v", top)
	}
}

func TestFlattensTellsCompactions(t *testing.T) {
	if fl, co := flattens([]int{2, 3, 64, 2, 3, 1, 2}); fl != 1 || co != 1 {
		t.Errorf("flattens %d, compactions %d; want 1 and 1", fl, co)
	}
}
