package main

import (
	"fmt"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/warrenvm/warren/bench/benchplot"
	"github.com/warrenvm/warren/bench/stats"
)

// panel is one comparison of the run: the samples of ours and the peer's.
type panel struct {
	title      string
	ours, peer stats.Summary
}

// writePlot draws one box plot per comparison the run made, ours beside
// the peer's, in a grid, as a PNG.
func writePlot(path string, res *results) error {
	var panels []panel
	add := func(title string, p *pair) {
		if p != nil && len(p.Ours.Samples) > 0 && len(p.Peer.Samples) > 0 {
			panels = append(panels, panel{title, p.Ours, p.Peer})
		}
	}
	add("image base build", res.Base)
	if b := res.Build; b != nil {
		add("template build (image)", &pair{Ours: b.Cached, Peer: b.Cold})
		add("template build", &pair{Ours: b.Cached, Peer: b.Initramfs})
	}
	add("create from template", res.Create)
	add("time to interactive", res.TTI)
	if res.Snap != nil {
		add("snapshot pause", &res.Snap.Pause)
	}
	if res.Python != nil {
		add("python3 -c pass in the guest", &res.Python.Warm)
	}
	if len(panels) == 0 {
		return fmt.Errorf("plot: no results to draw")
	}
	const cols = 3
	rows := (len(panels) + cols - 1) / cols
	plots := make([][]*plot.Plot, rows)
	for r := range plots {
		plots[r] = make([]*plot.Plot, cols)
	}
	for i, pn := range panels {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s (p50 %s/%s %.3g)", pn.title, pn.ours.Name, pn.peer.Name, stats.Ratio(pn.ours.P50, pn.peer.P50))
		unit, name := unitOf(max(stats.Percentile(pn.ours.Samples, 99), stats.Percentile(pn.peer.Samples, 99)))
		p.Y.Label.Text = name
		for j, s := range []stats.Summary{pn.ours, pn.peer} {
			vals := make(plotter.Values, len(s.Samples))
			for k, d := range s.Samples {
				vals[k] = float64(d) / float64(unit)
			}
			b, err := plotter.NewBoxPlot(vg.Points(30), float64(j), vals)
			if err != nil {
				return err
			}
			p.Add(b)
		}
		p.NominalX(pn.ours.Name, pn.peer.Name)
		p.Y.Min = 0
		plots[i/cols][i%cols] = p
	}
	return benchplot.SaveGrid(path, plots, 384, 288 /* 4×3 inches a panel */)
}

// unitOf picks a unit for durations up to d.
func unitOf(d time.Duration) (time.Duration, string) {
	switch {
	case d >= 10*time.Second:
		return time.Second, "s"
	case d >= 10*time.Millisecond:
		return time.Millisecond, "ms"
	}
	return time.Microsecond, "µs"
}
