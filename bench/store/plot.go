package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"os"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/warrenvm/warren/bench/benchplot"
)

// diskBytes is one tenant's bytes on disk of its memory layers, before
// the page store and after.
type diskBytes struct {
	before, after int64
}

// storeRun is one configuration's result as the plot draws it: its label
// and, per tenant kind, the bytes before and after (nil: not run).
type storeRun struct {
	label        string
	plain, keyed *diskBytes
	// objstore is the fleet's object store's bytes of the bundles'
	// memory: before, cut every 4 MiB (version 1); after, at the chunks
	// (nil: not run).
	objstore *diskBytes
}

// storeRunOf is a synthetic run's (results) figures: before, the layer
// files; after, the store's files and the layers left plain. A label ""
// names it by its configuration.
func storeRunOf(label string, cfg config, results []result) storeRun {
	if label == "" {
		writes := fmt.Sprintf("runs of %d pages", cfg.RunPages)
		if cfg.RunPages == 1 {
			writes = "scattered single pages"
		}
		label = fmt.Sprintf("synthetic memory\nwrites in %s, %d-page chunks", writes, cfg.ChunkPages)
	}
	r := storeRun{label: label}
	for _, res := range results {
		r.set(res.Tenant, diskBytes{res.Before.Bytes, res.After.Bytes})
		if o := res.ObjectStore; o != nil {
			r.objstore = &diskBytes{o.V1.Stored, o.V2.Stored}
		}
	}
	return r
}

// daemonRunOf is a --hostd run's figures: before, the layer files the
// VMM wrote; after, the store's stored bytes (GET /v1/store), as
// printDaemon gives them.
func daemonRunOf(label string, results []daemonResult) storeRun {
	if label == "" {
		label = "real guests through warren-hostd\n(kernel + initramfs guest)"
	}
	r := storeRun{label: label}
	for _, res := range results {
		r.set(res.Tenant, diskBytes{res.BeforeBytes, res.Store.StoredBytes})
	}
	return r
}

// set records a tenant's figures: tenant is a result's Tenant, "plain
// (no key)" or "keyed (at-rest encryption)".
func (r *storeRun) set(tenant string, b diskBytes) {
	if strings.HasPrefix(tenant, "keyed") {
		r.keyed = &b
	} else {
		r.plain = &b
	}
}

// readStoreRun reads an earlier run's --json file, of either kind
// (synthetic or --hostd), its bars named label ("": by the run's
// configuration). A file of another benchmark, or without results, is
// an error.
func readStoreRun(label, path string) (storeRun, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return storeRun{}, err
	}
	var doc struct {
		Benchmark string         `json:"benchmark"` // other benchmarks' files have it; ours not
		Config    *config        `json:"config"`
		Results   []result       `json:"results"`
		Daemon    []daemonResult `json:"daemon_results"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return storeRun{}, fmt.Errorf("%s: %w", path, err)
	}
	switch {
	case doc.Benchmark != "":
		return storeRun{}, fmt.Errorf("%s: not a bench/store --json file (benchmark %q)", path, doc.Benchmark)
	case doc.Config == nil || len(doc.Results)+len(doc.Daemon) == 0:
		return storeRun{}, fmt.Errorf("%s: no bench/store results (not a bench/store --json file?)", path)
	case len(doc.Daemon) > 0:
		return daemonRunOf(label, doc.Daemon), nil
	}
	return storeRunOf(label, *doc.Config, doc.Results), nil
}

// replotStore draws the JSON files earlier runs wrote (--json) into
// path, one bar group per file; a file given as LABEL=PATH is named
// LABEL.
func replotStore(path string, files []string) error {
	var runs []storeRun
	for _, f := range files {
		label, file := "", f
		if l, p, ok := strings.Cut(f, "="); ok {
			label, file = l, p
		}
		r, err := readStoreRun(label, file)
		if err != nil {
			return err
		}
		runs = append(runs, r)
	}
	return writeStorePlot(path, runs)
}

// storePanelW is the picture's width in pixels; storePanelH a panel's
// height for n configurations.
const storePanelW = 960

func storePanelH(n int) int { return max(280, 120+80*n) }

// The bars' colours.
var (
	beforeColour = color.RGBA{120, 120, 130, 255} // grey
	afterColour  = color.RGBA{31, 90, 200, 255}   // blue
)

// writeStorePlot draws runs as a PNG: per tenant kind run (plain, keyed)
// a panel of horizontal bars, before and after per configuration, the
// after bar labelled with the ratio before/after.
func writeStorePlot(path string, runs []storeRun) error {
	var col [][]*plot.Plot
	for _, t := range []struct {
		title string
		get   func(storeRun) *diskBytes
		bars  storeBars
	}{
		{"plain tenant (no key): a full snapshot every 8, incremental ones between", func(r storeRun) *diskBytes { return r.plain }, pageStoreBars},
		{"keyed tenant (at-rest encryption): every snapshot full, sealed", func(r storeRun) *diskBytes { return r.keyed }, pageStoreBars},
		{"fleet object store: a bundle of every snapshot and of the template, one tenant", func(r storeRun) *diskBytes { return r.objstore }, objectStoreBars},
	} {
		has := false
		for _, r := range runs {
			has = has || t.get(r) != nil
		}
		if !has {
			continue
		}
		p, err := storePanel(t.title, t.bars, runs, t.get)
		if err != nil {
			return err
		}
		col = append(col, []*plot.Plot{p})
	}
	if len(col) == 0 {
		return fmt.Errorf("store plot: no tenant's results to draw")
	}
	return benchplot.SaveGrid(path, col, storePanelW, storePanelH(len(runs)))
}

// storeBars names a panel's two bars and its axis.
type storeBars struct {
	before, after, axis string
}

// The panels' bars: the page store's, and the object store's.
var (
	pageStoreBars = storeBars{"before: a memsnap file per layer (keyed: each sealed whole)",
		"after: the page store (chunks, reference files) + the layers left out of it", "memory layers on disk, MiB (file bytes)"}
	objectStoreBars = storeBars{"before: bundles' memory cut every 4 MiB (bundle version 1)",
		"after: cut at its memsnap chunks (version 2): the page store's chunks", "bundles' memory in the bucket, MiB (distinct blobs)"}
)

// storePanel draws one tenant kind of runs: the first run at the top, a
// run without this tenant's figures left empty.
func storePanel(title string, bars storeBars, runs []storeRun, get func(storeRun) *diskBytes) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(12)
	p.X.Label.Text = bars.axis
	p.X.Tick.Marker = benchplot.StepTicks{}
	n := len(runs)
	names := make([]string, n)
	for i, r := range runs {
		names[n-1-i] = r.label // gonum's y grows upward: the first run on top
	}
	p.NominalY(names...)
	p.Y.Tick.Label.Font.Size = vg.Points(9)
	grid := plotter.NewGrid()
	grid.Horizontal.Width = 0
	grid.Vertical.Color = color.RGBA{220, 220, 220, 255}
	p.Add(grid)
	const barPt = 16
	top := 0.0
	for k, bar := range []struct {
		name   string
		colour color.RGBA
		value  func(diskBytes) float64
		label  func(diskBytes) string
	}{
		{bars.before, beforeColour,
			func(d diskBytes) float64 { return mibf(d.before) },
			func(d diskBytes) string { return fmt.Sprintf("%.1f MiB", mibf(d.before)) }},
		{bars.after, afterColour,
			func(d diskBytes) float64 { return mibf(d.after) },
			func(d diskBytes) string {
				return fmt.Sprintf("%.1f MiB (%.2f× smaller)", mibf(d.after), float64(d.before)/float64(max(d.after, 1)))
			}},
	} {
		vals := make(plotter.Values, n)
		var lbl plotter.XYLabels
		for i, r := range runs {
			d := get(r)
			if d == nil {
				continue
			}
			v := bar.value(*d)
			vals[n-1-i] = v
			top = math.Max(top, v)
			lbl.XYs = append(lbl.XYs, plotter.XY{X: v, Y: float64(n - 1 - i)})
			lbl.Labels = append(lbl.Labels, bar.label(*d))
		}
		bc, err := plotter.NewBarChart(vals, vg.Points(barPt))
		if err != nil {
			return nil, err
		}
		bc.Horizontal = true
		bc.Color = bar.colour
		bc.LineStyle.Width = 0
		bc.Offset = vg.Points(barPt * (0.5 - float64(k))) // before above after
		p.Add(bc)
		p.Legend.Add(bar.name, bc)
		labels, err := benchplot.ValueLabels(lbl, draw.XLeft, draw.YCenter, 9)
		if err != nil {
			return nil, err
		}
		labels.Offset = vg.Point{X: vg.Points(4), Y: bc.Offset}
		p.Add(labels)
	}
	if top == 0 {
		return nil, fmt.Errorf("store plot: %s: no bytes on disk recorded", title)
	}
	p.X.Min, p.X.Max = 0, top*1.35 // room for the labels after the longest bar
	// Room above the top group for the legend.
	p.Y.Min, p.Y.Max = -0.6, float64(n)-0.4+0.45
	p.Legend.Top, p.Legend.Left = true, false
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	return p, nil
}

// mibf is b in MiB.
func mibf(b int64) float64 { return float64(b) / (1 << 20) }
