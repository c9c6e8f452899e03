package main

import (
	"image"
	"image/color"
	"math"
	"slices"
	"strconv"
	"time"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/warrenvm/warren/bench/benchplot"
)

// series is one curve of the plot: the empirical CDF of samples.
type series struct {
	Label   string
	Samples []time.Duration
	Color   color.RGBA
	Dashed  bool
}

// refLine is a vertical reference line at a latency.
type refLine struct {
	At    time.Duration
	Label string
}

// plot is a latency-distribution chart: one CDF per series, x latency
// (log scale when the samples spread over more than logSpread), y the
// fraction of samples at or below x.
type plot struct {
	Title         string
	XLabel        string
	Series        []series
	Refs          []refLine
	Width, Height int
}

// logSpread is the hi/lo ratio of the x range past which the axis is
// logarithmic.
const logSpread = 8

var (
	grey = color.RGBA{215, 215, 215, 255}
	red  = color.RGBA{200, 30, 30, 255}
	// palette colours the series in order.
	palette = []color.RGBA{
		{31, 90, 200, 255},  // blue
		{20, 150, 60, 255},  // green
		{230, 120, 10, 255}, // orange
		{150, 50, 170, 255}, // purple
		{0, 160, 170, 255},  // teal
		{120, 80, 40, 255},  // brown
	}
)

// xRange is the x axis's range in ms: every sample and reference line,
// with a margin, and whether it is logarithmic.
func xRange(p plot) (lo, hi float64, logScale bool) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, s := range p.Series {
		for _, d := range s.Samples {
			v := ms(d)
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	for _, r := range p.Refs {
		v := ms(r.At)
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	if math.IsInf(lo, 0) {
		return 0, 1, false
	}
	if lo <= 0 {
		lo = math.Min(hi/1000, 0.001)
	}
	if hi <= lo {
		hi = lo * 2
	}
	if hi/lo > logSpread {
		return lo / 1.3, hi * 1.3, true
	}
	span := hi - lo
	return math.Max(0, lo-span*0.1), hi + span*0.1, false
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// ticks returns x axis tick values (ms) in [lo, hi]: on a log axis the
// 1-2-5 values of each decade (only the decades when that is more than
// 12), on a linear one the multiples of the largest 1-2-5 step giving
// at least 5 of them (at most 11; 4 when range/10 rounds up to a step
// that gives only 4).
func ticks(lo, hi float64, logScale bool) []float64 {
	if !(hi > lo) {
		return nil
	}
	var out []float64
	if logScale {
		if lo <= 0 {
			return nil
		}
		e0, e1 := int(math.Floor(math.Log10(lo))), int(math.Ceil(math.Log10(hi)))
		for _, mults := range [][]float64{{1, 2, 5}, {1}} {
			out = out[:0]
			for e := e0; e <= e1; e++ {
				for _, m := range mults {
					v := m * math.Pow(10, float64(e))
					v = roundSig(v)
					if v >= lo*(1-1e-9) && v <= hi*(1+1e-9) {
						out = append(out, v)
					}
				}
			}
			if len(out) <= 12 {
				break
			}
		}
		return out
	}
	// The largest 1-2-5 step at least range/10 that still gives 5 ticks.
	step := niceStep((hi - lo) / 10)
	for {
		next := niceStep(step * 1.01)
		if len(linearTicks(lo, hi, next)) < 5 {
			break
		}
		step = next
	}
	return linearTicks(lo, hi, step)
}

// linearTicks are the multiples of step in [lo, hi].
func linearTicks(lo, hi, step float64) []float64 {
	var out []float64
	for i := math.Ceil(lo/step - 1e-9); i*step <= hi+step*1e-9; i++ {
		out = append(out, roundSig(i*step))
	}
	return out
}

// niceStep rounds x up to 1, 2 or 5 times a power of ten.
func niceStep(x float64) float64 {
	e := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*e >= x*(1-1e-9) {
			return m * e
		}
	}
	return 10 * e
}

// roundSig drops floating-point noise (0.30000000000000004).
func roundSig(v float64) float64 {
	f, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 10, 64), 64)
	return f
}

// tickLabel formats a latency in ms: "500us", "60ms", "1.5s".
func tickLabel(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 1000:
		return strconv.FormatFloat(v/1000, 'g', 4, 64) + "s"
	case v < 1:
		return strconv.FormatFloat(v*1000, 'g', 4, 64) + "us"
	}
	return strconv.FormatFloat(v, 'g', 4, 64) + "ms"
}

// durationTicks marks an x axis in ms at ticks' values, labelled as
// durations.
type durationTicks struct{ log bool }

// Ticks implements gplot.Ticker.
func (t durationTicks) Ticks(lo, hi float64) []gplot.Tick {
	var out []gplot.Tick
	for _, v := range ticks(lo, hi, t.log) {
		out = append(out, gplot.Tick{Value: v, Label: tickLabel(v)})
	}
	return out
}

// refMarks draws the reference lines (red, dashed) or, with labels,
// their labels near the bottom of the area on a white ground, in
// alternating rows where they would overlap: there a CDF is still flat
// at 0 or has already risen past.
type refMarks struct {
	refs   []refLine
	labels bool
}

// Plot implements gplot.Plotter.
func (r refMarks) Plot(c draw.Canvas, p *gplot.Plot) {
	trX, _ := p.Transforms(&c)
	line := draw.LineStyle{Color: red, Width: vg.Points(1.5), Dashes: []vg.Length{vg.Points(4), vg.Points(4)}}
	sty := text.Style{Color: red, Font: font.From(gplot.DefaultFont, 10), Handler: gplot.DefaultTextHandler}
	lastX, row := vg.Length(math.Inf(-1)), 0
	for _, ref := range r.refs {
		x := trX(ms(ref.At))
		if !r.labels {
			c.StrokeLine2(line, x, c.Min.Y, x, c.Max.Y)
			continue
		}
		w := sty.Width(ref.Label)
		if x-lastX < w+vg.Points(6) {
			row = 1 - row
		} else {
			row = 0
		}
		lastX = x
		at := vg.Point{X: x + vg.Points(2), Y: c.Min.Y + vg.Points(6) + vg.Length(row)*sty.Height(ref.Label)*1.3}
		ground := sty.Rectangle(ref.Label).Add(at)
		ground.Min = ground.Min.Sub(vg.Point{X: 1, Y: 1})
		ground.Max = ground.Max.Add(vg.Point{X: 1, Y: 1})
		c.SetColor(color.White)
		c.Fill(ground.Path())
		c.FillText(sty, at, ref.Label)
	}
}

// cdf is the step curve of samples' empirical CDF across [lo, hi]: up by
// 1/n at each sorted sample (those below lo drawn at lo).
func cdf(samples []time.Duration, lo, hi float64) plotter.XYs {
	v := slices.Clone(samples)
	slices.Sort(v)
	pts := plotter.XYs{{X: lo, Y: 0}}
	for i, d := range v {
		pts = append(pts, plotter.XY{X: max(ms(d), lo), Y: float64(i+1) / float64(len(v))})
	}
	return append(pts, plotter.XY{X: hi, Y: 1})
}

// newPlot builds p with gonum's plot, the series drawn in order.
func newPlot(p plot) (*gplot.Plot, error) {
	lo, hi, logScale := xRange(p)
	g := gplot.New()
	g.Title.Text = p.Title
	g.Title.TextStyle.Font.Size = vg.Points(13)
	g.X.Label.Text = p.XLabel
	if logScale {
		g.X.Label.Text += " (log scale)"
		g.X.Scale = gplot.LogScale{}
	}
	g.X.Min, g.X.Max = lo, hi
	g.X.Tick.Marker = durationTicks{logScale}
	g.Y.Label.Text = "fraction of creates <= x"
	g.Y.Min, g.Y.Max = 0, 1
	var yTicks []gplot.Tick
	for _, f := range []float64{0, 0.25, 0.5, 0.75, 1} {
		yTicks = append(yTicks, gplot.Tick{Value: f, Label: strconv.FormatFloat(f, 'f', 2, 64)})
	}
	g.Y.Tick.Marker = gplot.ConstantTicks(yTicks)
	grid := plotter.NewGrid()
	grid.Vertical = draw.LineStyle{Color: grey, Width: vg.Points(0.75)}
	grid.Horizontal = grid.Vertical
	g.Add(grid, refMarks{refs: p.Refs})
	legend := newLegendBox()
	for _, s := range p.Series {
		l, err := plotter.NewLine(cdf(s.Samples, lo, hi))
		if err != nil {
			return nil, err
		}
		l.StepStyle = plotter.PostStep
		l.LineStyle = draw.LineStyle{Color: s.Color, Width: vg.Points(1.5)}
		if s.Dashed {
			l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		}
		if len(s.Samples) > 0 {
			g.Add(l)
		}
		legend.add(s.Label, l)
	}
	g.Add(refMarks{refs: p.Refs, labels: true}, legend)
	return g, nil
}

// legendBox is the legend, in a white framed box near the top left of
// the area, which a CDF leaves empty.
type legendBox struct {
	gplot.Legend
	labels []string
}

// newLegendBox is an empty legend, its entries' text after their lines.
func newLegendBox() *legendBox {
	l := &legendBox{Legend: gplot.NewLegend()}
	l.Top, l.Left = true, true
	l.ThumbnailWidth = vg.Points(24)
	return l
}

// add appends an entry.
func (l *legendBox) add(label string, thumb gplot.Thumbnailer) {
	l.Add(label, thumb)
	l.labels = append(l.labels, label)
}

// Plot implements gplot.Plotter.
func (l *legendBox) Plot(c draw.Canvas, _ *gplot.Plot) {
	if len(l.labels) == 0 {
		return
	}
	var w, h vg.Length // the widest label, the tallest
	for _, s := range l.labels {
		w, h = max(w, l.TextStyle.Width(" "+s)), max(h, l.TextStyle.Rectangle(s).Max.Y)
	}
	pad, n := vg.Points(4), vg.Length(len(l.labels))
	box := vg.Rectangle{Min: vg.Point{X: c.Min.X + vg.Points(8)}, Max: vg.Point{Y: c.Max.Y - vg.Points(24)}}
	box.Max.X = box.Min.X + l.ThumbnailWidth + w + 3*pad
	box.Min.Y = box.Max.Y - n*h - (n-1)*l.Padding - l.TextStyle.FontExtents().Descent - 2*pad
	c.SetColor(color.White)
	c.Fill(box.Path())
	c.SetLineStyle(draw.LineStyle{Color: color.Black, Width: vg.Points(0.5)})
	c.Stroke(box.Path())
	l.Draw(draw.Crop(draw.Canvas{Canvas: c.Canvas, Rectangle: box}, pad, -pad, pad, -pad))
}

// canvas renders p on a Width×Height canvas (960×600 by default).
func (p plot) canvas() (*vgimg.Canvas, error) {
	g, err := newPlot(p)
	if err != nil {
		return nil, err
	}
	w, h := p.Width, p.Height
	if w == 0 {
		w = 960
	}
	if h == 0 {
		h = 600
	}
	c := benchplot.Canvas(w, h)
	g.Draw(draw.Crop(draw.New(c), vg.Points(4), -vg.Points(12), vg.Points(4), -vg.Points(6)))
	return c, nil
}

// render draws p as an image.
func render(p plot) (image.Image, error) {
	c, err := p.canvas()
	if err != nil {
		return nil, err
	}
	return c.Image(), nil
}

// writePNG renders p to path.
func writePNG(path string, p plot) error {
	c, err := p.canvas()
	if err != nil {
		return err
	}
	return benchplot.SavePNG(path, c)
}
