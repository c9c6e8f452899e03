// Package benchplot holds what the benchmarks' plots, drawn with
// gonum.org/v1/plot, share: canvases sized in pixels and their PNG files.
package benchplot

import (
	"fmt"
	"image"
	"image/png"
	"os"
	"path/filepath"

	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/vgimg"
)

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
