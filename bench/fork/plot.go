package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"

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
	return benchplot.SaveGrid(path, [][]*plot.Plot{{drop, per}}, 480, 336)
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
