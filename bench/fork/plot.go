package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/warrenvm/warren/bench/benchplot"
)

// densityGoal is issue 20's goal for the marginal host memory of an idle
// forked child, MiB (the figure Mitos publishes for its Firecracker forks).
const densityGoal = 3.0

// writeDensityPlot draws measurement 2 as a PNG: MemAvailable's drop since
// before the first child against the number of children, one line per
// variant (with and without the balloon), beside the goal's slope; and
// the drop per child at each point.
func writeDensityPlot(path string, all []*densityResult) error {
	drop := plot.New()
	drop.Title.Text = "host memory taken by idle fork children"
	drop.X.Label.Text = "children running"
	drop.Y.Label.Text = "MemAvailable drop, MiB"
	per := plot.New()
	per.Title.Text = "per child"
	per.X.Label.Text = "children running"
	per.Y.Label.Text = "MiB per child"
	var lines, points []any
	maxN := 0
	for _, d := range all {
		name := map[bool]string{false: "no balloon", true: "balloon"}[d.Balloon]
		if d.Label != "" {
			name = d.Label + ", " + name
		}
		xy := make(plotter.XYs, len(d.Avail))
		for i, a := range d.Avail {
			xy[i] = plotter.XY{X: float64(i + 1), Y: mib(float64(d.AvailBefore) - float64(a))}
		}
		maxN = max(maxN, len(d.Avail))
		lines = append(lines, name, xy)
		pp := make(plotter.XYs, len(d.Points))
		for i, p := range d.Points {
			pp[i] = plotter.XY{X: float64(p.Children), Y: mib(p.DropPerChild)}
		}
		points = append(points, name, pp)
	}
	if len(lines) == 0 {
		return fmt.Errorf("density plot: no measurement")
	}
	lines = append(lines, fmt.Sprintf("goal: %.0f MiB a child", densityGoal),
		plotter.XYs{{X: 0, Y: 0}, {X: float64(maxN), Y: densityGoal * float64(maxN)}})
	if err := plotutil.AddLines(drop, lines...); err != nil {
		return err
	}
	points = append(points, "goal", plotter.XYs{{X: 1, Y: densityGoal}, {X: float64(maxN), Y: densityGoal}})
	if err := plotutil.AddLinePoints(per, points...); err != nil {
		return err
	}
	drop.Legend.Top, per.Legend.Top = true, true
	split, err := splitPlot(all)
	if err != nil {
		return err
	}
	return benchplot.SaveGrid(path, [][]*plot.Plot{{drop, per, split}}, 480, 336)
}

// splitPlot draws each run's children's mean private memory at its last
// point, guest RAM and the rest of the VMM process, as bars side by side.
func splitPlot(all []*densityResult) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "a child's private memory (mean, last point)"
	p.Y.Label.Text = "MiB"
	var guest, vmm plotter.Values
	var names []string
	for i, d := range all {
		if len(d.Points) == 0 {
			continue
		}
		last := d.Points[len(d.Points)-1]
		guest = append(guest, mib(float64(last.Split.GuestPrivate)))
		vmm = append(vmm, mib(float64(last.Split.VMMPrivate)))
		name := fmt.Sprint(i + 1)
		if d.Label != "" {
			name = d.Label
		}
		names = append(names, fmt.Sprintf("%s (%d)", name, last.Children))
	}
	if len(names) == 0 {
		return p, nil
	}
	w := vg.Points(12)
	gb, err := plotter.NewBarChart(guest, w)
	if err != nil {
		return nil, err
	}
	vb, err := plotter.NewBarChart(vmm, w)
	if err != nil {
		return nil, err
	}
	gb.Color, vb.Color = plotutil.Color(0), plotutil.Color(1)
	gb.Offset, vb.Offset = -w/2, w/2
	p.Add(gb, vb)
	p.Legend.Add("guest RAM", gb)
	p.Legend.Add("VMM process", vb)
	p.Legend.Top = true
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = 0.5
	p.X.Tick.Label.XAlign, p.X.Tick.Label.YAlign = draw.XRight, draw.YCenter
	return p, nil
}

// replotDensity reads the JSON files earlier runs wrote (--json) and
// draws their density measurements (both variants) into path. A file
// given as LABEL=PATH names its lines LABEL.
func replotDensity(path string, files []string) error {
	var all []*densityResult
	for _, arg := range files {
		label, f := replotArg(arg)
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var out struct {
			Density        *densityResult `json:"density"`
			DensityBalloon *densityResult `json:"density_balloon"`
		}
		if err := json.Unmarshal(b, &out); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		for _, d := range []*densityResult{out.Density, out.DensityBalloon} {
			if d != nil {
				d.Label = label
				all = append(all, d)
			}
		}
	}
	return writeDensityPlot(path, all)
}

// replotArg splits a --replot argument, LABEL=PATH or PATH, into its
// label ("" when none) and path.
func replotArg(arg string) (label, path string) {
	if l, p, ok := strings.Cut(arg, "="); ok {
		return l, p
	}
	return "", arg
}
