package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
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
	white = color.RGBA{255, 255, 255, 255}
	black = color.RGBA{0, 0, 0, 255}
	grey  = color.RGBA{215, 215, 215, 255}
	red   = color.RGBA{200, 30, 30, 255}
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

// canvas draws on an RGBA image.
type canvas struct {
	img  *image.RGBA
	face font.Face
}

func (c *canvas) set(x, y int, col color.RGBA) {
	if image.Pt(x, y).In(c.img.Rect) {
		c.img.SetRGBA(x, y, col)
	}
}

// line draws a line width px wide; with dash > 0, dash px on, dash px off.
func (c *canvas) line(x0, y0, x1, y1 int, col color.RGBA, width, dash int) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	err := dx + dy
	for n := 0; ; n++ {
		if dash == 0 || (n/dash)%2 == 0 {
			for i := 0; i < width; i++ {
				for j := 0; j < width; j++ {
					c.set(x0+i-width/2, y0+j-width/2, col)
				}
			}
		}
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * err
		if e2 >= dy {
			err += dy
			x0 += sx
		}
		if e2 <= dx {
			err += dx
			y0 += sy
		}
	}
}

func (c *canvas) rect(r image.Rectangle, col color.RGBA) {
	draw.Draw(c.img, r, image.NewUniform(col), image.Point{}, draw.Src)
}

// text draws s with its left end at x and its baseline at y.
func (c *canvas) text(x, y int, s string, col color.RGBA) {
	d := font.Drawer{Dst: c.img, Src: image.NewUniform(col), Face: c.face, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

func (c *canvas) textWidth(s string) int {
	return font.MeasureString(c.face, s).Ceil()
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func sign(v int) int {
	switch {
	case v < 0:
		return -1
	case v > 0:
		return 1
	}
	return 0
}

// render draws p.
func render(p plot) *image.RGBA {
	if p.Width == 0 {
		p.Width = 960
	}
	if p.Height == 0 {
		p.Height = 600
	}
	c := &canvas{img: image.NewRGBA(image.Rect(0, 0, p.Width, p.Height)), face: basicfont.Face7x13}
	c.rect(c.img.Rect, white)
	// The plot area.
	left, right, top, bottom := 70, p.Width-30, 50, p.Height-60
	lo, hi, logScale := xRange(p)
	xOf := func(v float64) int {
		var f float64
		if logScale {
			f = (math.Log(v) - math.Log(lo)) / (math.Log(hi) - math.Log(lo))
		} else {
			f = (v - lo) / (hi - lo)
		}
		return left + int(math.Round(f*float64(right-left)))
	}
	yOf := func(f float64) int { return bottom - int(math.Round(f*float64(bottom-top))) }

	// Grid and ticks.
	for _, v := range ticks(lo, hi, logScale) {
		x := xOf(v)
		c.line(x, top, x, bottom, grey, 1, 0)
		c.line(x, bottom, x, bottom+5, black, 1, 0)
		l := tickLabel(v)
		c.text(x-c.textWidth(l)/2, bottom+18, l, black)
	}
	for _, f := range []float64{0, 0.25, 0.5, 0.75, 1} {
		y := yOf(f)
		c.line(left, y, right, y, grey, 1, 0)
		c.line(left-5, y, left, y, black, 1, 0)
		l := strconv.FormatFloat(f, 'f', 2, 64)
		c.text(left-9-c.textWidth(l), y+4, l, black)
	}
	// Reference lines, labelled near the bottom on a white ground
	// (alternating rows when close), where a CDF is flat at 0 or has
	// already risen past.
	type refLabel struct {
		x, y int
		s    string
	}
	var labels []refLabel
	lastX, row := -1000, 0
	for _, r := range p.Refs {
		x := xOf(ms(r.At))
		c.line(x, top, x, bottom, red, 1, 4)
		if x-lastX < c.textWidth(r.Label)+8 {
			row = 1 - row
		} else {
			row = 0
		}
		lastX = x
		labels = append(labels, refLabel{x + 3, bottom - 8 - row*16, r.Label})
	}
	// The CDFs: steps up by 1/n at each sorted sample.
	for _, s := range p.Series {
		v := append([]time.Duration(nil), s.Samples...)
		sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
		dash := 0
		if s.Dashed {
			dash = 6
		}
		px, py := left, yOf(0)
		for i, d := range v {
			x, y := xOf(ms(d)), yOf(float64(i+1)/float64(len(v)))
			c.line(px, py, x, py, s.Color, 2, dash)
			c.line(x, py, x, y, s.Color, 2, dash)
			px, py = x, y
		}
		if len(v) > 0 {
			c.line(px, py, right, py, s.Color, 2, dash)
		}
	}
	for _, l := range labels {
		c.rect(image.Rect(l.x-1, l.y-11, l.x+c.textWidth(l.s)+1, l.y+3), white)
		c.text(l.x, l.y, l.s, red)
	}
	// Frame, title, axis labels.
	c.line(left, top, right, top, black, 1, 0)
	c.line(left, bottom, right, bottom, black, 1, 0)
	c.line(left, top, left, bottom, black, 1, 0)
	c.line(right, top, right, bottom, black, 1, 0)
	c.text((p.Width-c.textWidth(p.Title))/2, 20, p.Title, black)
	ylab := "fraction of creates <= x"
	c.text(left-60, top-8, ylab, black)
	xl := p.XLabel
	if logScale {
		xl += " (log scale)"
	}
	c.text(left+(right-left-c.textWidth(xl))/2, p.Height-18, xl, black)
	// Legend, top left inside the area (a CDF leaves it empty).
	if len(p.Series) > 0 {
		w := 0
		for _, s := range p.Series {
			w = max(w, c.textWidth(s.Label))
		}
		lx, ly := left+10, top+40
		box := image.Rect(lx, ly, lx+w+50, ly+len(p.Series)*16+8)
		c.rect(box, white)
		c.line(box.Min.X, box.Min.Y, box.Max.X, box.Min.Y, black, 1, 0)
		c.line(box.Min.X, box.Max.Y, box.Max.X, box.Max.Y, black, 1, 0)
		c.line(box.Min.X, box.Min.Y, box.Min.X, box.Max.Y, black, 1, 0)
		c.line(box.Max.X, box.Min.Y, box.Max.X, box.Max.Y, black, 1, 0)
		for i, s := range p.Series {
			y := ly + 12 + i*16
			dash := 0
			if s.Dashed {
				dash = 6
			}
			c.line(lx+6, y-4, lx+36, y-4, s.Color, 2, dash)
			c.text(lx+42, y, s.Label, black)
		}
	}
	return c.img
}

// writePNG renders p to path.
func writePNG(path string, p plot) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, render(p)); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}
