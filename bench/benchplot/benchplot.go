// Package benchplot holds what the benchmarks' plots, drawn with
// gonum.org/v1/plot, share: canvases sized in pixels and their PNG files.
package benchplot

import (
	"fmt"
	"image"
	"image/png"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
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
