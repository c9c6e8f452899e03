package main

import (
	"fmt"
	"image/color"
	"math"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/warrenvm/warren/bench/benchplot"
	"github.com/warrenvm/warren/bench/stats"
)

// restoreCategory is one bar group of the restore plot: a variant in one
// cache state.
type restoreCategory struct {
	label string // the x axis's: the variant, its cache state, its ratio to QEMU
	s     *restoreSeries
}

// restoreCategories are the variants of res with timed restores, in
// table order (warm before cold), each labelled with its p50 agent answer
// over QEMU's in the same cache state where there is one.
func restoreCategories(res map[string]*restoreSeries) []restoreCategory {
	caches := 0
	for _, cache := range []string{"warm", "cold"} {
		for _, v := range restoreVariants {
			if s := res[cache+" "+v.name]; s != nil && len(s.Health) > 0 {
				caches++
				break
			}
		}
	}
	var out []restoreCategory
	for _, cache := range []string{"warm", "cold"} {
		q := res[cache+" qemu"]
		for _, v := range restoreVariants {
			s := res[cache+" "+v.name]
			if s == nil || len(s.Health) == 0 {
				continue
			}
			label := v.display()
			if caches > 1 {
				label += ", " + cache
			}
			if v.system == "warren" && q != nil && len(q.Health) > 0 {
				label += fmt.Sprintf("\n%.2f× qemu", stats.Ratio(stats.Percentile(s.Health, 50), stats.Percentile(q.Health, 50)))
			}
			out = append(out, restoreCategory{label, s})
		}
	}
	return out
}

// restoreBar is one bar of each group: its legend name, colour and value
// (ok false: the variant has no such figure, no bar).
type restoreBar struct {
	name   string
	colour color.RGBA
	value  func(*restoreSeries) (v float64, ok bool)
}

// restorePanel is one panel of the restore plot.
type restorePanel struct {
	title, yLabel string
	bars          []restoreBar
	// format writes a bar's value above it.
	format func(float64) string
}

// The bars' colours.
var (
	blue   = color.RGBA{31, 90, 200, 255}
	orange = color.RGBA{230, 120, 10, 255}
	green  = color.RGBA{20, 150, 60, 255}
	// restoreColours are the bars' colours, in the order of each panel's
	// bars.
	restoreColours = []color.RGBA{blue, orange, green}
)

// durationPercentile is a bar of samples' p-th percentile in unit.
func durationPercentile(get func(*restoreSeries) []time.Duration, p float64, unit time.Duration) func(*restoreSeries) (float64, bool) {
	return func(s *restoreSeries) (float64, bool) {
		v := get(s)
		return float64(stats.Percentile(v, p)) / float64(unit), len(v) > 0
	}
}

// countPercentile is a bar of counts' p-th percentile, times scale.
func countPercentile(get func(*restoreSeries) []uint64, p, scale float64) func(*restoreSeries) (float64, bool) {
	return func(s *restoreSeries) (float64, bool) {
		v := get(s)
		return float64(stats.Percentile(counts(v), p)) * scale, len(v) > 0
	}
}

// restorePanels are the plot's panels for cats: the agent's answer (in
// s when a p90 reaches a second, else ms), the bytes read, and the
// faults and resident pages at the answer.
func restorePanels(cats []restoreCategory) []restorePanel {
	unit, unitName := time.Millisecond, "ms"
	for _, c := range cats {
		if stats.Percentile(c.s.Health, 90) >= time.Second {
			unit, unitName = time.Second, "s"
		}
	}
	health := func(s *restoreSeries) []time.Duration { return s.Health }
	return []restorePanel{
		{
			title: "restore to the agent's first answer", yLabel: unitName + " from the VMM's start",
			bars: []restoreBar{
				{name: "p50", value: durationPercentile(health, 50, unit)},
				{name: "p90", value: durationPercentile(health, 90, unit)},
			},
			format: func(v float64) string { return strconv.FormatFloat(v, 'g', 3, 64) },
		},
		{
			title: "snapshot bytes read by the answer", yLabel: "MiB",
			bars: []restoreBar{
				{name: "p50", value: countPercentile(func(s *restoreSeries) []uint64 { return s.Bytes }, 50, 1.0/(1<<20))},
				{name: "p90", value: countPercentile(func(s *restoreSeries) []uint64 { return s.Bytes }, 90, 1.0/(1<<20))},
			},
			format: func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) },
		},
		{
			title: "memory faulted in by the answer, p50", yLabel: "count",
			bars: []restoreBar{
				{name: "VMM process faults", value: countPercentile(func(s *restoreSeries) []uint64 { return s.Faults }, 50, 1)},
				{name: "guest RAM pages resident", value: countPercentile(func(s *restoreSeries) []uint64 { return s.RAMPages }, 50, 1)},
				{name: "uffd demand faults (+ ensured)", value: countPercentile(func(s *restoreSeries) []uint64 { return s.UffdFaults }, 50, 1)},
			},
			format: compactCount,
		},
	}
}

// compactCount writes a count in at most 4 characters or so: 29, 940,
// 9.6k, 10.5k, 120k.
func compactCount(v float64) string {
	switch {
	case v < 1000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v < 100000:
		return strconv.FormatFloat(v/1000, 'f', 1, 64) + "k"
	}
	return strconv.FormatFloat(v/1000, 'f', 0, 64) + "k"
}

// restorePanelH is a panel's height in pixels; its width grows with the
// variants drawn (restorePanelW).
const restorePanelH = 460

// restorePanelW is a panel's width for n bar groups.
func restorePanelW(n int) int { return max(480, 60+90*n) }

// writeRestorePlot draws measurement 2 of res as a PNG: per variant (and
// cache state), the agent's answer p50 and p90, the bytes read, and the
// faults and resident pages at the answer, side by side. title names the
// run (the guest, the runs per variant).
func writeRestorePlot(path, title string, res map[string]*restoreSeries) error {
	cats := restoreCategories(res)
	if len(cats) == 0 {
		return fmt.Errorf("restore plot: no timed restore to draw (the run had --skip-restore, or every restore failed)")
	}
	var row []*plot.Plot
	for i, pn := range restorePanels(cats) {
		t := pn.title
		if i == 0 && title != "" {
			t += "\n" + title
		}
		p, err := restoreBarPanel(t, pn, cats)
		if err != nil {
			return err
		}
		row = append(row, p)
	}
	return benchplot.SaveGrid(path, [][]*plot.Plot{row}, restorePanelW(len(cats)), restorePanelH)
}

// restoreBarPanel draws one panel: a group of bars per category, each
// bar's value written above it, the legend at the top left, with room
// above the bars for it.
func restoreBarPanel(title string, pn restorePanel, cats []restoreCategory) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(12)
	p.Y.Label.Text = pn.yLabel
	p.Y.Tick.Marker = benchplot.StepTicks{}
	names := make([]string, len(cats))
	for i, c := range cats {
		names[i] = c.label
	}
	p.NominalX(names...)
	p.X.Tick.Label.Font.Size = vg.Points(9)
	grid := plotter.NewGrid()
	grid.Vertical.Width = 0
	grid.Horizontal.Color = color.RGBA{220, 220, 220, 255}
	p.Add(grid)
	width := vg.Points(min(18, 54/float64(len(pn.bars))))
	top := 0.0
	drawn := 0
	for b, bar := range pn.bars {
		vals := make(plotter.Values, len(cats))
		var lbl plotter.XYLabels
		for i, c := range cats {
			v, ok := bar.value(c.s)
			if !ok {
				continue
			}
			vals[i] = v
			top = math.Max(top, v)
			lbl.XYs = append(lbl.XYs, plotter.XY{X: float64(i), Y: v})
			lbl.Labels = append(lbl.Labels, pn.format(v))
		}
		if len(lbl.XYs) == 0 {
			continue // no variant has it (JSON of earlier versions, or no uffd variant)
		}
		drawn++
		bc, err := plotter.NewBarChart(vals, width)
		if err != nil {
			return nil, err
		}
		bc.Color = restoreColours[b%len(restoreColours)]
		bc.LineStyle.Width = 0 // a variant without the figure: no bar, not a line at 0
		bc.Offset = (vg.Length(b) - vg.Length(len(pn.bars)-1)/2) * width
		p.Add(bc)
		p.Legend.Add(bar.name, bc)
		labels, err := benchplot.ValueLabels(lbl, draw.XCenter, draw.YBottom, 8)
		if err != nil {
			return nil, err
		}
		labels.Offset = vg.Point{X: bc.Offset, Y: vg.Points(2)}
		p.Add(labels)
	}
	if drawn == 0 {
		p.Title.Text += "\n(not recorded)"
		p.Y.Min, p.Y.Max = 0, 1
		return p, nil
	}
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.Y.Min, p.Y.Max = 0, top*(1.1+0.07*float64(drawn))
	p.X.Min, p.X.Max = -0.6, float64(len(cats))-0.4
	return p, nil
}

// restorePlotTitle names a run in the plot: the guest size and the runs
// per variant.
func restorePlotTitle(c config) string {
	var parts []string
	if c.memMiB > 0 {
		parts = append(parts, fmt.Sprintf("guest %d MiB", c.memMiB))
	}
	if c.restoreRuns > 0 {
		parts = append(parts, fmt.Sprintf("%d runs per variant", c.restoreRuns))
	}
	return strings.Join(parts, ", ")
}

// replotRestores draws --png from the JSON files of earlier runs (several
// are merged as --merge does).
func replotRestores(path string, files []string) error {
	res, c, _, err := readRestores(files)
	if err != nil {
		return err
	}
	return writeRestorePlot(path, restorePlotTitle(c), res)
}
