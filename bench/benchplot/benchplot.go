// Package benchplot holds what the benchmarks' plots, drawn with
// gonum.org/v1/plot, share: canvases sized in pixels and their PNG files.
package benchplot

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// SaveGrid draws plots, a grid of rows of equal length (nil cells left
// empty), as panels of panelW×panelH pixels with aligned axes, and writes
// the PNG to path.
func SaveGrid(path string, plots [][]*plot.Plot, panelW, panelH int) error {
	rows := len(plots)
	if rows == 0 || len(plots[0]) == 0 {
		return fmt.Errorf("plot %s: nothing to draw", path)
	}
	cols := len(plots[0])
	img := Canvas(cols*panelW, rows*panelH)
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Millimeter * 4, PadY: vg.Millimeter * 4,
		PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align(plots, tiles, draw.New(img))
	for r := range plots {
		for c := range plots[r] {
			if plots[r][c] != nil {
				plots[r][c].Draw(canvases[r][c])
			}
		}
	}
	return SavePNG(path, img)
}

// Canvas returns a white image canvas of w×h pixels (at vgimg's default
// resolution, where a point is 4/3 pixel).
func Canvas(w, h int) *vgimg.Canvas {
	px := vg.Inch / vgimg.DefaultDPI
	return vgimg.New(vg.Length(w)*px, vg.Length(h)*px)
}

// SavePNG writes c to path as a PNG, creating path's directory.
func SavePNG(path string, c *vgimg.Canvas) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: c}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

// ReadPNG reads back the PNG file at path, as SavePNG wrote it.
func ReadPNG(path string) (image.Image, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		return nil, fmt.Errorf("%s: not a valid PNG: %w", path, err)
	}
	return img, nil
}

// StepTicks marks a linear axis at the multiples of a 1-2-5 step giving
// 5 to 10 ticks (gonum's default gives about 3), labelled without
// trailing zeros.
type StepTicks struct{}

// Ticks implements plot.Ticker.
func (StepTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(hi > lo) {
		return nil
	}
	e := math.Pow(10, math.Floor(math.Log10((hi-lo)/10)))
	step := e
	for _, m := range []float64{1, 2, 5, 10, 20} {
		if step = m * e; (hi-lo)/step <= 10 {
			break
		}
	}
	var out []plot.Tick
	for i := math.Ceil(lo / step); i*step <= hi*(1+1e-9); i++ {
		v, _ := strconv.ParseFloat(strconv.FormatFloat(i*step, 'g', 10, 64), 64) // no 0.30000000000000004
		out = append(out, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
	}
	return out
}

// CountNear counts img's pixels within tol (the sum of the channels'
// differences) of c: drawn lines are anti-aliased, so only some take c
// exactly. The benchmarks' plot tests use it to see that a series was
// drawn.
func CountNear(img image.Image, c color.RGBA, tol float64) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if math.Abs(float64(r>>8)-float64(c.R))+math.Abs(float64(g>>8)-float64(c.G))+math.Abs(float64(bl>>8)-float64(c.B)) <= tol {
				n++
			}
		}
	}
	return n
}

// ValueLabels returns labels (plotter.NewLabels) in black, of size points,
// aligned to their points by xAlign and yAlign: a bar chart's values
// written beside its bars.
func ValueLabels(l plotter.XYLabels, xAlign draw.XAlignment, yAlign draw.YAlignment, size float64) (*plotter.Labels, error) {
	labels, err := plotter.NewLabels(l)
	if err != nil {
		return nil, err
	}
	for i := range labels.TextStyle {
		labels.TextStyle[i] = text.Style{Color: color.Black, Font: labels.TextStyle[i].Font, XAlign: xAlign, YAlign: yAlign,
			Handler: labels.TextStyle[i].Handler}
		labels.TextStyle[i].Font.Size = vg.Points(size)
	}
	return labels, nil
}
