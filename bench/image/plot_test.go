package main

import (
	"image"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warrenvm/warren/bench/benchplot"
	"github.com/warrenvm/warren/bench/stats"
)

func samples(base time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = base + time.Duration(i)*base/10
	}
	return out
}

func testPair(ours, peer time.Duration) *pair {
	return &pair{Ours: stats.Summarise("warren", samples(ours, 12)), Peer: stats.Summarise("qemu", samples(peer, 12))}
}

// dark counts the pixels of r in img darker than light grey.
func dark(img image.Image, r image.Rectangle) int {
	n := 0
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			if cr, cg, cb, _ := img.At(x, y).RGBA(); cr>>8+cg>>8+cb>>8 < 3*160 {
				n++
			}
		}
	}
	return n
}

func TestWritePlot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.png")
	if out := os.Getenv("BENCH_IMAGE_PLOT"); out != "" { // to look at it
		path = out
	}
	// Four panels: a grid of 3 columns, 2 rows, the last two tiles empty.
	res := &results{Base: testPair(20*time.Second, 60*time.Second), Create: testPair(40*time.Millisecond, 300*time.Millisecond),
		TTI: testPair(80*time.Millisecond, 900*time.Millisecond), Python: &pythonResults{Warm: *testPair(3*time.Millisecond, 5*time.Millisecond)},
		Snap: &snapResults{}} // no samples: no panel
	if err := writePlot(path, res); err != nil {
		t.Fatal(err)
	}
	img, err := benchplot.ReadPNG(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := img.Bounds().Size(); got.X != 3*384 || got.Y != 2*288 {
		t.Fatalf("size %v, want 1152x576", got)
	}
	for i := 0; i < 6; i++ {
		tile := image.Rect(i%3*384, i/3*288, i%3*384+384, i/3*288+288).Inset(10)
		n := dark(img, tile)
		if i < 4 && n < 1000 {
			t.Errorf("panel %d: %d dark pixels, want a box plot", i, n)
		}
		if i >= 4 && n != 0 {
			t.Errorf("tile %d: %d dark pixels, want none", i, n)
		}
	}
}

func TestWritePlotNothing(t *testing.T) {
	if err := writePlot(filepath.Join(t.TempDir(), "p.png"), &results{Create: &pair{}}); err == nil {
		t.Fatal("no samples: want an error")
	}
}
