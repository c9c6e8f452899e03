package objstore

import (
	"fmt"
	"image/color"
	"path/filepath"
	"testing"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/warrenvm/warren/bench/benchplot"
	"github.com/warrenvm/warren/bench/stats"
	"github.com/warrenvm/warren/fleet/fleettest"
)

func s3Creds(s3 *fleettest.S3) *credentials.Credentials {
	return credentials.NewStaticV4(s3.AccessKey, s3.SecretKey, "")
}

// The versions' colours.
var colours = []color.RGBA{{120, 120, 130, 255}, {31, 90, 200, 255}, {90, 170, 110, 255}}

// writePlot draws the results as a PNG: a panel per operation, the
// versions' p50, p90 and p99 side by side (seconds), and a panel of the
// bytes each leaves in the bucket.
func writePlot(path string, results []result) error {
	var row []*plot.Plot
	for _, op := range []struct {
		title string
		get   func(result) stats.Summary
	}{
		{"upload the template's bundle", func(r result) stats.Summary { return r.Template }},
		{"upload a snapshot's bundle", func(r result) stats.Summary { return r.Snapshot }},
		{"fetch the snapshot's bundle", func(r result) stats.Summary { return r.Get }},
		{"fetch it, the template's cached", func(r result) stats.Summary { return r.GetCached }},
	} {
		p := plot.New()
		p.Title.Text = op.title
		p.Y.Label.Text = "seconds"
		p.NominalX("p50", "p90", "p99")
		p.Add(plotter.NewGrid())
		for i, r := range results {
			s := op.get(r)
			bc, err := plotter.NewBarChart(plotter.Values{s.P50.Seconds(), s.P90.Seconds(), s.P99.Seconds()}, vg.Points(18))
			if err != nil {
				return err
			}
			bc.Color = colours[i%len(colours)]
			bc.LineStyle.Width = 0
			bc.Offset = vg.Points(18 * (float64(i) - float64(len(results)-1)/2))
			p.Add(bc)
			p.Legend.Add(r.Version, bc)
		}
		p.Legend.Top = true
		p.Y.Min = 0
		top := 0.0
		for _, r := range results {
			top = max(top, op.get(r).P99.Seconds())
		}
		p.Y.Max = top * 1.5 // room for the legend above the bars
		row = append(row, p)
	}
	p := plot.New()
	p.Title.Text = "in the bucket after both uploads"
	p.Y.Label.Text = "MiB"
	var names []string
	for i, r := range results {
		names = append(names, fmt.Sprintf("%s\n%d blobs", r.Version, r.Blobs))
		vals := make(plotter.Values, len(results))
		vals[i] = mibf(r.Stored)
		bc, err := plotter.NewBarChart(vals, vg.Points(36))
		if err != nil {
			return err
		}
		bc.Color = colours[i%len(colours)]
		bc.LineStyle.Width = 0
		p.Add(bc)
	}
	p.NominalX(names...)
	p.Y.Min = 0
	row = append(row, p)
	return benchplot.SaveGrid(path, [][]*plot.Plot{row}, 360, 360)
}

// TestWritePlot draws sample results: every version's colour is drawn.
func TestWritePlot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "transfer.png")
	var rs []result
	for i, v := range versions {
		s := stats.Summarise(v.Name, stats.Millis(100*(i+1), 120*(i+1), 300))
		rs = append(rs, result{Version: v.Name, Template: s, Snapshot: s, Get: s, GetCached: s, Blobs: 10 * (i + 1), Stored: int64(i+1) << 24})
	}
	if err := writePlot(path, rs); err != nil {
		t.Fatal(err)
	}
	img, err := benchplot.ReadPNG(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range colours[:len(rs)] {
		if n := benchplot.CountNear(img, c, 12); n < 2000 {
			t.Errorf("colour %v drawn on %d pixels", c, n)
		}
	}
}
