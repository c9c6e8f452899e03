package benchplot

import (
	"image/color"
	"path/filepath"
	"strings"
	"testing"

	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

func TestCanvasSize(t *testing.T) {
	for _, sz := range [][2]int{{960, 600}, {400, 300}, {1152, 864}, {1, 1}, {333, 777}} {
		if got := Canvas(sz[0], sz[1]).Image().Bounds().Size(); got.X != sz[0] || got.Y != sz[1] {
			t.Errorf("Canvas(%d, %d) is %v", sz[0], sz[1], got)
		}
	}
}

func TestSavePNG(t *testing.T) {
	c := Canvas(200, 100)
	dc := draw.New(c)
	dc.SetColor(color.RGBA{R: 255, A: 255})
	dc.Fill(vg.Rectangle{Min: vg.Point{X: 0, Y: 0}, Max: vg.Point{X: 30, Y: 30}}.Path())
	path := filepath.Join(t.TempDir(), "sub", "dir", "p.png") // the directory is created
	if err := SavePNG(path, c); err != nil {
		t.Fatal(err)
	}
	img, err := ReadPNG(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := img.Bounds().Size(); got.X != 200 || got.Y != 100 {
		t.Fatalf("size %v, want 200x100", got)
	}
	// y grows upward on the canvas: the square is at the bottom left.
	if r, g, b, _ := img.At(5, 95).RGBA(); r>>8 != 255 || g != 0 || b != 0 {
		t.Errorf("bottom left is %v, want red", img.At(5, 95))
	}
	if r, g, b, _ := img.At(150, 20).RGBA(); r>>8 != 255 || g>>8 != 255 || b>>8 != 255 {
		t.Errorf("top right is %v, want white", img.At(150, 20))
	}
}

func TestStepTicks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		want   string
	}{
		{0, 66, "0 10 20 30 40 50 60"},
		{0, 860, "0 100 200 300 400 500 600 700 800"},
		{0, 0.7, "0 0.1 0.2 0.3 0.4 0.5 0.6 0.7"},
		{0, 250, "0 50 100 150 200 250"},
		{3, 3, ""},
	} {
		var got []string
		for _, tk := range (StepTicks{}).Ticks(tc.lo, tc.hi) {
			got = append(got, tk.Label)
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("Ticks(%v, %v) = %v, want %s", tc.lo, tc.hi, got, tc.want)
		}
	}
}
