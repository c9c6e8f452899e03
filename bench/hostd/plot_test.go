package main

import (
	"image/color"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/bench/benchplot"
)

// synthetic is n latencies spread around median.
func synthetic(seed int64, n int, median time.Duration) []time.Duration {
	r := rand.New(rand.NewSource(seed))
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = time.Duration(float64(median) * (0.7 + 0.6*r.Float64() + 0.5*r.ExpFloat64()*r.Float64()))
	}
	return out
}

func syntheticPlot(w, h int) plot {
	return plot{
		Title: "synthetic", XLabel: "latency", Width: w, Height: h,
		Series: []series{
			{Label: "warren-hostd, 1 client", Samples: synthetic(1, 50, 40*time.Millisecond), Color: palette[0]},
			{Label: "warren-hostd, 16 clients", Samples: synthetic(2, 50, 300*time.Millisecond), Color: palette[1]},
			{Label: "qemu -incoming, 1 client", Samples: synthetic(3, 50, 120*time.Millisecond), Color: palette[0], Dashed: true},
		},
		Refs: []refLine{{spaceP50, "SPACE p50"}, {spaceP90, "SPACE p90"}},
	}
}

func TestRenderWritesPNG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "p.png")   // creating its directory
	if out := os.Getenv("BENCH_HOSTD_PLOT"); out != "" { // to look at it
		path = out
	}
	if err := writePNG(path, syntheticPlot(960, 600)); err != nil {
		t.Fatal(err)
	}
	img, err := benchplot.ReadPNG(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := img.Bounds().Size(); got.X != 960 || got.Y != 600 {
		t.Fatalf("size %v, want 960x600", got)
	}
	// Each series' colour (the third shares the first's) and the
	// reference lines' red are drawn: curves over a few hundred pixels,
	// thin lines and their labels over fewer.
	for _, c := range palette[:2] {
		if n := benchplot.CountNear(img, c, 24); n < 300 {
			t.Errorf("colour %v drawn on %d pixels", c, n)
		}
	}
	if n := benchplot.CountNear(img, red, 24); n < 200 {
		t.Errorf("red drawn on %d pixels", n)
	}
	if n := benchplot.CountNear(img, palette[2], 24); n != 0 {
		t.Errorf("colour %v of no series drawn on %d pixels", palette[2], n)
	}
	// Mostly white, with dark text.
	if n := benchplot.CountNear(img, color.RGBA{255, 255, 255, 255}, 0); n < 960*600/2 || n > 960*600*99/100 {
		t.Errorf("%d white pixels", n)
	}
	if n := benchplot.CountNear(img, color.RGBA{0, 0, 0, 255}, 150); n < 500 {
		t.Errorf("%d dark pixels", n)
	}
}

func TestRenderSeries(t *testing.T) {
	// One more series, one more colour; its samples on the curve only.
	p := syntheticPlot(480, 300)
	p.Refs = nil
	p.Series[2].Color = palette[2]
	img, err := render(p)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range palette[:3] {
		if n := benchplot.CountNear(img, c, 24); n < 150 {
			t.Errorf("series %d's colour %v drawn on %d pixels", i, c, n)
		}
	}
	if n := benchplot.CountNear(img, red, 24); n != 0 {
		t.Errorf("no reference lines, but red on %d pixels", n)
	}
	// Without samples a series is in the legend only: far fewer pixels.
	withSamples := benchplot.CountNear(img, palette[2], 24)
	p.Series[2].Samples = nil
	if img, err = render(p); err != nil {
		t.Fatal(err)
	}
	if n := benchplot.CountNear(img, palette[2], 24); n == 0 || n*3 > withSamples {
		t.Errorf("empty series drawn on %d pixels, %d with samples", n, withSamples)
	}
}

func TestRenderSizesAndEmpty(t *testing.T) {
	for _, tc := range []struct {
		p    plot
		w, h int
	}{
		{syntheticPlot(400, 300), 400, 300},
		{plot{Title: "no samples"}, 960, 600}, // default size, no series
		{plot{Series: []series{{Label: "one", Samples: []time.Duration{5 * time.Millisecond}, Color: palette[0]}}}, 960, 600},
		{plot{Series: []series{{Label: "zero", Samples: []time.Duration{0, 0, time.Second}, Color: palette[0]}}}, 960, 600}, // log axis, samples at 0
	} {
		img, err := render(tc.p)
		if err != nil {
			t.Fatal(err)
		}
		if got := img.Bounds().Size(); got.X != tc.w || got.Y != tc.h {
			t.Fatalf("%+v: size %v", tc.p, got)
		}
	}
}

func TestXRange(t *testing.T) {
	p := syntheticPlot(0, 0)
	lo, hi, logScale := xRange(p)
	if !logScale || lo >= 40*0.7 || hi <= 300 {
		t.Fatalf("xRange = %v, %v, %v", lo, hi, logScale)
	}
	// Close together (and with the references): linear, covering them.
	p = plot{Series: []series{{Samples: []time.Duration{50 * time.Millisecond, 100 * time.Millisecond}}}, Refs: p.Refs}
	lo, hi, logScale = xRange(p)
	if logScale || lo > 50 || hi < 100 {
		t.Fatalf("xRange = %v, %v, %v", lo, hi, logScale)
	}
}

func TestTicks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		log    bool
		want   []float64
	}{
		{0, 100, false, []float64{0, 20, 40, 60, 80, 100}},
		{43, 118, false, []float64{50, 60, 70, 80, 90, 100, 110}},
		{0.3, 1.1, false, []float64{0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1, 1.1}},
		{15, 3000, true, []float64{20, 50, 100, 200, 500, 1000, 2000}},
		{8, 110, true, []float64{10, 20, 50, 100}},
		{0.01, 100000, true, []float64{0.01, 0.1, 1, 10, 100, 1000, 10000, 100000}},
		{5, 5, false, nil},
	} {
		if got := ticks(tc.lo, tc.hi, tc.log); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ticks(%v, %v, %v) = %v, want %v", tc.lo, tc.hi, tc.log, got, tc.want)
		}
	}
}

func TestTickLabel(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 0.5: "500us", 60: "60ms", 89: "89ms", 1000: "1s", 2500: "2.5s", 20000: "20s"} {
		if got := tickLabel(v); got != want {
			t.Errorf("tickLabel(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestNiceStep(t *testing.T) {
	for x, want := range map[float64]float64{0.13: 0.2, 1: 1, 3: 5, 7: 10, 120: 200, 1500: 2000} {
		if got := niceStep(x); got != want {
			t.Errorf("niceStep(%v) = %v, want %v", x, got, want)
		}
	}
}

func TestLatencyPlotLegend(t *testing.T) {
	p := latencyPlot(config{runs: 3, memMiB: 256},
		[]levelResult{{Clients: 1, Samples: synthetic(1, 3, time.Second)}, {Clients: 16, Samples: synthetic(2, 3, 2*time.Second)}},
		[]levelResult{{Clients: 1, Samples: synthetic(3, 3, time.Second)}})
	var labels []string
	for _, s := range p.Series {
		labels = append(labels, s.Label)
	}
	if got := strings.Join(labels, "|"); got != "warren-hostd, 1 client|warren-hostd, 16 clients|qemu -incoming, 1 client" {
		t.Fatalf("labels %s", got)
	}
	if !p.Series[2].Dashed || p.Series[2].Color != p.Series[0].Color {
		t.Fatal("qemu's series should be dashed, in its level's colour")
	}
	if len(p.Refs) != 2 || p.Refs[0].Label != "SPACE p50" || p.Refs[1].At != 89*time.Millisecond {
		t.Fatalf("refs %+v", p.Refs)
	}
}
