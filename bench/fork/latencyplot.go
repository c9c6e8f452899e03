package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/warrenvm/warren/bench/benchplot"
	"github.com/warrenvm/warren/bench/stats"
)

// latencyRun is measurement 1 of one run, as writeLatencyPlot draws it:
// its sizes in increasing order, each with the samples the run recorded
// (QEMU's nil where it had no peer: --skip-qemu, or a size too large
// for a second guest).
type latencyRun struct {
	// Label names the run in the legend (--replot LABEL=FILE); "" for a
	// live run or a file given without one.
	Label string
	Sizes []*sizeResult
}

// latencyRunOf is the live run's measurement 1: the sizes of results,
// in increasing order.
func latencyRunOf(results map[int]*sizeResult) latencyRun {
	var r latencyRun
	for _, size := range slices.Sorted(maps.Keys(results)) {
		r.Sizes = append(r.Sizes, results[size])
	}
	return r
}

// latencyPanelW and latencyPanelH are one panel's size in pixels; the
// picture is three panels side by side.
const latencyPanelW, latencyPanelH = 480, 420

// latencyPercentiles are the percentiles drawn, each in its own line
// style (latencyStyles).
var latencyPercentiles = []float64{50, 90, 99}

// latencyMetric is one panel: a figure of Warren's fork and, where it
// has one, QEMU's counterpart.
type latencyMetric struct {
	title  string
	warren func(*sizeResult) []time.Duration
	// qemuName names QEMU's counterpart in the legend; qemu returns its
	// samples, nil where the size had no QEMU figure. A nil qemu: QEMU
	// has no counterpart.
	qemuName string
	qemu     func(*sizeResult) []time.Duration
}

// latencyMetrics are the panels, left to right.
var latencyMetrics = []latencyMetric{
	{
		title:  "parent pause",
		warren: func(r *sizeResult) []time.Duration { return r.Warren.Pause },
		// One migration per size: one value, drawn once.
		qemuName: "migration downtime",
		qemu: func(r *sizeResult) []time.Duration {
			if r.QEMU == nil {
				return nil
			}
			return []time.Duration{r.QEMU.Downtime}
		},
	},
	{
		title:  "child's first KVM_RUN, from the pause's end",
		warren: func(r *sizeResult) []time.Duration { return r.Warren.Ready },
	},
	{
		title:    "fork request to the child's agent answer",
		warren:   func(r *sizeResult) []time.Duration { return r.Warren.Agent },
		qemuName: "-incoming restore to agent",
		qemu: func(r *sizeResult) []time.Duration {
			if r.QEMU == nil {
				return nil
			}
			return r.QEMU.Agent
		},
	},
}

// latencyStyle is a percentile's line: width and dashes.
type latencyStyle struct {
	width  vg.Length
	dashes []vg.Length
	name   string
}

// latencyStyles are the percentiles' line styles, by latencyPercentiles.
var latencyStyles = []latencyStyle{
	{vg.Points(2), nil, "p50 (solid, with points)"},
	{vg.Points(1.2), []vg.Length{vg.Points(6), vg.Points(3)}, "p90 (dashed)"},
	{vg.Points(1), []vg.Length{vg.Points(1.5), vg.Points(2.5)}, "p99 (dotted)"},
}

// latencyPalette colours the lines, one colour per system of a run in
// order.
var latencyPalette = []color.RGBA{
	{31, 90, 200, 255},  // blue
	{230, 120, 10, 255}, // orange
	{20, 150, 60, 255},  // green
	{200, 30, 30, 255},  // red
	{150, 50, 170, 255}, // purple
	{0, 160, 170, 255},  // teal
	{120, 80, 40, 255},  // brown
	{90, 90, 90, 255},   // grey
}

// latencySeries is one system of one run in a panel: its points at each
// size with samples, by percentile.
type latencySeries struct {
	name   string
	colour color.RGBA
	glyph  draw.GlyphDrawer
	// single: one value per size (QEMU's migration downtime), drawn as
	// the p50 line alone.
	single bool
	pts    [3]plotter.XYs // by latencyPercentiles, y in ms
}

// writeLatencyPlot draws measurement 1 of runs as a PNG of three panels
// (parent pause, child's first KVM_RUN, fork to the agent's answer),
// each with p50, p90 and p99 against guest size per run and system.
func writeLatencyPlot(path string, runs []latencyRun) error {
	sizes := map[int]bool{}
	for _, r := range runs {
		for _, s := range r.Sizes {
			if len(s.Warren.Agent)+len(s.Warren.Pause)+len(s.Warren.Ready) > 0 || (s.QEMU != nil && len(s.QEMU.Agent) > 0) {
				sizes[s.MemMiB] = true
			}
		}
	}
	if len(sizes) == 0 {
		return fmt.Errorf("latency plot: no fork latency samples to draw (the runs had no --sizes, or every fork failed)")
	}
	var row []*plot.Plot
	for _, m := range latencyMetrics {
		p, err := latencyPanel(m, runs, slices.Sorted(maps.Keys(sizes)))
		if err != nil {
			return err
		}
		row = append(row, p)
	}
	return benchplot.SaveGrid(path, [][]*plot.Plot{row}, latencyPanelW, latencyPanelH)
}

// latencySeriesOf collects metric m's series of runs, colours assigned
// in order (run by run, Warren before QEMU) so that a system of a run
// has the same colour in every panel.
func latencySeriesOf(m latencyMetric, runs []latencyRun) []latencySeries {
	var out []latencySeries
	colour := 0
	for _, r := range runs {
		hasQEMU := false
		for _, s := range r.Sizes {
			hasQEMU = hasQEMU || s.QEMU != nil
		}
		warrenName, qemuName := "warren", "qemu"
		if r.Label != "" {
			warrenName, qemuName = r.Label, r.Label+", qemu"
			if hasQEMU {
				warrenName += ", warren"
			}
		}
		w := latencySeries{name: warrenName, colour: latencyPalette[colour%len(latencyPalette)], glyph: draw.CircleGlyph{}}
		q := latencySeries{name: qemuName + " " + m.qemuName, colour: latencyPalette[(colour+1)%len(latencyPalette)], glyph: draw.TriangleGlyph{}, single: m.qemuName == "migration downtime"}
		colour++
		if hasQEMU {
			colour++
		}
		for _, s := range r.Sizes {
			x := float64(s.MemMiB)
			add := func(ls *latencySeries, samples []time.Duration) {
				if len(samples) == 0 {
					return
				}
				for i, pc := range latencyPercentiles {
					ls.pts[i] = append(ls.pts[i], plotter.XY{X: x, Y: msOf(stats.Percentile(samples, pc))})
				}
			}
			add(&w, m.warren(s))
			if m.qemu != nil {
				add(&q, m.qemu(s))
			}
		}
		if len(w.pts[0]) > 0 {
			out = append(out, w)
		}
		if len(q.pts[0]) > 0 {
			out = append(out, q)
		}
	}
	return out
}

// latencyPanel draws metric m of runs: x the guest size (log scale, a
// tick at each of sizes), y ms from 0, with room above the lines for
// the legend.
func latencyPanel(m latencyMetric, runs []latencyRun, sizes []int) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = m.title
	p.Title.TextStyle.Font.Size = vg.Points(12)
	p.X.Label.Text = "guest memory, MiB (log scale)"
	p.Y.Label.Text = "ms"
	p.Y.Tick.Marker = benchplot.StepTicks{}
	p.X.Scale = plot.LogScale{}
	p.X.Min, p.X.Max = float64(sizes[0])/1.5, float64(sizes[len(sizes)-1])*1.5
	var ticks []plot.Tick
	for _, s := range sizes {
		ticks = append(ticks, plot.Tick{Value: float64(s), Label: strconv.Itoa(s)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	grid := plotter.NewGrid()
	grid.Vertical.Color, grid.Horizontal.Color = color.RGBA{220, 220, 220, 255}, color.RGBA{220, 220, 220, 255}
	p.Add(grid)
	series := latencySeriesOf(m, runs)
	top := 0.0
	for _, s := range series {
		for i, st := range latencyStyles {
			if s.single && i > 0 {
				break
			}
			l, err := plotter.NewLine(s.pts[i])
			if err != nil {
				return nil, fmt.Errorf("latency plot: %s: %w", s.name, err)
			}
			l.LineStyle = draw.LineStyle{Color: s.colour, Width: st.width, Dashes: st.dashes}
			p.Add(l)
			for _, pt := range s.pts[i] {
				top = math.Max(top, pt.Y)
			}
			if i == 0 {
				sc, err := plotter.NewScatter(s.pts[0])
				if err != nil {
					return nil, err
				}
				sc.GlyphStyle = draw.GlyphStyle{Color: s.colour, Radius: vg.Points(3), Shape: s.glyph}
				p.Add(sc)
				name := s.name
				if s.single {
					name += " (one value)"
				}
				p.Legend.Add(name, l, sc)
			}
		}
	}
	if len(series) == 0 {
		// Nothing of this metric in any run (JSON of an older version):
		// an empty panel says so rather than leaving the tile blank.
		p.Title.Text += " (not recorded)"
		p.Y.Min, p.Y.Max = 0, 1
		return p, nil
	}
	for _, st := range latencyStyles {
		l, err := plotter.NewLine(plotter.XYs{{X: float64(sizes[0]), Y: 0}})
		if err != nil {
			return nil, err
		}
		l.LineStyle = draw.LineStyle{Color: color.RGBA{80, 80, 80, 255}, Width: st.width, Dashes: st.dashes}
		p.Legend.Add(st.name, l)
	}
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.ThumbnailWidth = vg.Points(28)
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	// The legend sits in the top of the area: keep the lines below it.
	entries := len(series) + len(latencyStyles)
	p.Y.Min, p.Y.Max = 0, top*(1.15+0.09*float64(entries))
	return p, nil
}

// msOf is d in milliseconds.
func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// readLatencyRun reads measurement 1 from a JSON file an earlier run
// wrote (--json), its series named label. A file of another benchmark,
// or one without fork latency samples, is an error.
func readLatencyRun(label, path string) (latencyRun, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return latencyRun{}, err
	}
	var doc struct {
		Benchmark string `json:"benchmark"`
		Latency   map[string]struct {
			Warren *struct {
				Call     stats.Summary `json:"fork_call"`
				Pause    stats.Summary `json:"pause"`
				Ready    stats.Summary `json:"child_running"`
				Agent    stats.Summary `json:"fork_to_agent"`
				Layers   []int         `json:"memory_layers"`
				Failures []string      `json:"failures"`
			} `json:"warren"`
			QEMU *struct {
				Downtime  time.Duration `json:"migration_downtime_ns"`
				Total     time.Duration `json:"migration_total_ns"`
				FileBytes int64         `json:"migration_file_bytes"`
				Agent     stats.Summary `json:"restore_to_agent"`
				Failures  []string      `json:"failures"`
			} `json:"qemu"`
		} `json:"latency"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return latencyRun{}, fmt.Errorf("%s: %w", path, err)
	}
	if doc.Benchmark != "fork" {
		return latencyRun{}, fmt.Errorf("%s: not a bench/fork --json file (benchmark %q)", path, doc.Benchmark)
	}
	run := latencyRun{Label: label}
	for key, l := range doc.Latency {
		size, err := strconv.Atoi(key)
		if err != nil || size <= 0 || l.Warren == nil {
			return latencyRun{}, fmt.Errorf("%s: latency entry %q is not a guest size's results", path, key)
		}
		w := l.Warren
		r := &sizeResult{MemMiB: size, Warren: warrenSeries{Call: w.Call.Samples, Pause: w.Pause.Samples, Ready: w.Ready.Samples,
			Agent: w.Agent.Samples, Layers: w.Layers, Failures: w.Failures}}
		if q := l.QEMU; q != nil {
			r.QEMU = &qemuSeries{Downtime: q.Downtime, MigrationTotal: q.Total, FileBytes: q.FileBytes, Agent: q.Agent.Samples, Failures: q.Failures}
		}
		run.Sizes = append(run.Sizes, r)
	}
	if len(run.Sizes) == 0 {
		return latencyRun{}, fmt.Errorf("%s: no fork latency measurement (the run had --sizes '')", path)
	}
	slices.SortFunc(run.Sizes, func(a, b *sizeResult) int { return a.MemMiB - b.MemMiB })
	return run, nil
}

// replotLatency draws measurement 1 of the JSON files earlier runs wrote
// (--json) into path, one set of lines per file; a file given as
// LABEL=PATH names its lines LABEL.
func replotLatency(path string, files []string) error {
	var runs []latencyRun
	for _, f := range files {
		label, file := replotArg(f)
		r, err := readLatencyRun(label, file)
		if err != nil {
			return err
		}
		runs = append(runs, r)
	}
	return writeLatencyPlot(path, runs)
}
