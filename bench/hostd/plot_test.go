package main

import (
	"bytes"
	"image/png"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
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
	path := filepath.Join(t.TempDir(), "p.png")
	if out := os.Getenv("BENCH_HOSTD_PLOT"); out != "" { // to look at it
		path = out
	}
	if err := writePNG(path, syntheticPlot(960, 600)); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not a valid PNG: %v", err)
	}
	if got := img.Bounds().Size(); got.X != 960 || got.Y != 600 {
		t.Fatalf("size %v, want 960x600", got)
	}
	// Each series' colour and the reference lines' red are drawn.
	seen := map[[3]uint32]bool{}
	for y := 0; y < 600; y++ {
		for x := 0; x < 960; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			seen[[3]uint32{r >> 8, g >> 8, b >> 8}] = true
		}
	}
	for _, c := range append(palette[:2], red) {
		if !seen[[3]uint32{uint32(c.R), uint32(c.G), uint32(c.B)}] {
			t.Errorf("colour %v not drawn", c)
		}
	}
}

func TestRenderSizesAndEmpty(t *testing.T) {
	p := syntheticPlot(400, 300)
	if got := render(p).Bounds().Size(); got.X != 400 || got.Y != 300 {
		t.Fatalf("size %v", got)
	}
	p = plot{Title: "no samples"} // default size, no series: must not panic
	if got := render(p).Bounds().Size(); got.X != 960 || got.Y != 600 {
		t.Fatalf("default size %v", got)
	}
	p = plot{Series: []series{{Label: "one", Samples: []time.Duration{5 * time.Millisecond}, Color: palette[0]}}}
	render(p)
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
