package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/warrenvm/warren/bench/benchplot"
	"github.com/warrenvm/warren/bench/stats"
)

// box is one box of a panel: its label and samples.
type box struct {
	label   string
	samples []time.Duration
}

// panel is one box plot.
type panel struct {
	title string
	boxes []box
}

// runPanels are one run's plots: per operation, the round trip and the
// VMM's CPU per call, Warren's beside QEMU's.
func runPanels(results map[string]map[string]*series) []panel {
	var out []panel
	for _, op := range operations {
		w, q := results[op.name]["warren"], results[op.name]["qemu"]
		for _, m := range []struct {
			name string
			get  func(*series) []time.Duration
		}{{"round trip", func(s *series) []time.Duration { return s.Total }}, {"VMM CPU per call", func(s *series) []time.Duration { return s.VMMCPU }}} {
			a, b := m.get(w), m.get(q)
			out = append(out, panel{
				title: fmt.Sprintf("%s %s (p50 warren/qemu %.3g)", op.name, m.name, stats.Ratio(stats.Percentile(a, 50), stats.Percentile(b, 50))),
				boxes: []box{{"warren", a}, {"qemu", b}},
			})
		}
	}
	return out
}

// replotPanels reads runs written by --json and draws, per operation, the
// VMM's CPU per call of each run's Warren and QEMU side by side, labelled
// by the files' base names (without .json).
func replotPanels(files []string) ([]panel, error) {
	type run map[string]map[string]map[string]stats.Summary // op → system → metric
	var out []panel
	runs := make([]run, len(files))
	for i, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal(b, &raw); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		runs[i] = run{}
		for _, op := range operations {
			var sys map[string]map[string]stats.Summary
			if err := json.Unmarshal(raw[op.name], &sys); err != nil || sys["warren"] == nil || sys["qemu"] == nil {
				return nil, fmt.Errorf("%s: no %s results of warren and qemu", f, op.name)
			}
			runs[i][op.name] = sys
		}
	}
	for _, op := range operations {
		p := panel{title: op.name + ": VMM CPU per call (p50 warren/qemu per run)"}
		var ratios []string
		for i, f := range files {
			name := strings.TrimSuffix(filepath.Base(f), ".json")
			w, q := runs[i][op.name]["warren"]["vmm cpu"], runs[i][op.name]["qemu"]["vmm cpu"]
			p.boxes = append(p.boxes, box{name + " w", w.Samples}, box{name + " q", q.Samples})
			ratios = append(ratios, fmt.Sprintf("%.2g", stats.Ratio(w.P50, q.P50)))
		}
		p.title += " " + strings.Join(ratios, ", ")
		out = append(out, p)
	}
	return out, nil
}

// writePlot draws the panels in a grid (one column for --replot's wide
// ones), as a PNG; each y axis stops at twice its largest p90.
func writePlot(path string, panels []panel) error {
	if len(panels) == 0 {
		return fmt.Errorf("plot: nothing to draw")
	}
	cols := 2
	if len(panels[0].boxes) > 4 {
		cols = 1 // wide panels (--replot)
	}
	rows := (len(panels) + cols - 1) / cols
	width := 480
	if cols == 1 {
		width = 120 * len(panels[0].boxes)
	}
	plots := make([][]*plot.Plot, rows)
	for r := range plots {
		plots[r] = make([]*plot.Plot, cols)
	}
	for i, pn := range panels {
		p := plot.New()
		p.Title.Text = pn.title
		p.Y.Label.Text = "ms"
		var names []string
		var top time.Duration // the y axis ends at twice the largest p90: outliers would flatten the boxes
		for _, b := range pn.boxes {
			top = max(top, stats.Percentile(b.samples, 90))
		}
		for j, b := range pn.boxes {
			vals := make(plotter.Values, len(b.samples))
			for k, d := range b.samples {
				vals[k] = float64(d) / float64(time.Millisecond)
			}
			bp, err := plotter.NewBoxPlot(vg.Points(24), float64(j), vals)
			if err != nil {
				return fmt.Errorf("plot %s: %w", pn.title, err)
			}
			p.Add(bp)
			names = append(names, b.label)
		}
		p.NominalX(names...)
		p.Y.Min = 0
		p.Y.Max = 2 * float64(top) / float64(time.Millisecond)
		plots[i/cols][i%cols] = p
	}
	return benchplot.SaveGrid(path, plots, width, 320)
}
