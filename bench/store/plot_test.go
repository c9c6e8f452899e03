package main

import (
	"encoding/json"
	"image"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenvm/warren/bench/benchplot"
	"github.com/warrenvm/warren/hostd/wire"
)

const storeResultsDir = "../results/2026-12-05-store"

// sampleResults are a synthetic run's results: a plain and a keyed tenant.
func sampleResults() []result {
	return []result{
		{Tenant: "plain (no key)", Before: usage{Files: 161, Bytes: 1700 << 20}, After: usage{Files: 900, Bytes: 600 << 20},
			ObjectStore: &objectStore{Bundles: 161, Logical: 9000 << 20, V1: pieces{Stored: 8900 << 20}, V2: pieces{Stored: 900 << 20}}},
		{Tenant: "keyed (at-rest encryption)", Before: usage{Files: 161, Bytes: 7400 << 20}, After: usage{Files: 800, Bytes: 750 << 20}},
	}
}

var sampleConfig = config{MemMiB: 256, Sandboxes: 16, Snapshots: 10, Keep: 8, ChunkPages: 64, RunPages: 16}

// sampleDaemon is a --hostd run of the plain tenant alone.
func sampleDaemon() []daemonResult {
	return []daemonResult{{Tenant: "plain (no key)", BeforeBytes: 273 << 20, Store: wire.StoreStats{StoredBytes: 62 << 20}}}
}

// readStorePlot reads the PNG at path and checks its size: panels
// panels of a plot of runs configurations.
func readStorePlot(t *testing.T, path string, panels, runs int) image.Image {
	t.Helper()
	img, err := benchplot.ReadPNG(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, h := img.Bounds().Size(), panels*storePanelH(runs); got.X != storePanelW || got.Y != h {
		t.Fatalf("size %v, want %dx%d", got, storePanelW, h)
	}
	return img
}

func TestWriteStorePlot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "store.png")
	if out := os.Getenv("BENCH_STORE_PLOT"); out != "" { // to look at it
		path = out
	}
	runs := []storeRun{storeRunOf("", sampleConfig, sampleResults()), daemonRunOf("", sampleDaemon())}
	if err := writeStorePlot(path, runs); err != nil {
		t.Fatal(err)
	}
	img := readStorePlot(t, path, 3, 2) // plain, keyed and object store panels
	for _, c := range []color.RGBA{beforeColour, afterColour} {
		if n := benchplot.CountNear(img, c, 12); n < 5000 {
			t.Errorf("colour %v drawn on %d pixels", c, n)
		}
	}
	// The plain tenant alone: one panel.
	if err := writeStorePlot(path, []storeRun{daemonRunOf("", sampleDaemon())}); err != nil {
		t.Fatal(err)
	}
	readStorePlot(t, path, 1, 1)
}

func TestStoreRunLabels(t *testing.T) {
	r := storeRunOf("", sampleConfig, sampleResults())
	if r.label != "synthetic memory\nwrites in runs of 16 pages, 64-page chunks" || r.plain.before != 1700<<20 || r.keyed.after != 750<<20 ||
		r.objstore == nil || *r.objstore != (diskBytes{8900 << 20, 900 << 20}) {
		t.Errorf("run %q %+v %+v %+v", r.label, r.plain, r.keyed, r.objstore)
	}
	scattered := sampleConfig
	scattered.RunPages, scattered.ChunkPages = 1, 256
	if r := storeRunOf("", scattered, nil); !strings.Contains(r.label, "scattered single pages, 256-page chunks") || r.plain != nil || r.keyed != nil {
		t.Errorf("run %+v", r)
	}
	if r := daemonRunOf("nested", sampleDaemon()); r.label != "nested" || r.plain.after != 62<<20 || r.keyed != nil {
		t.Errorf("daemon run %+v", r)
	}
}

// TestStoreJSONRoundTrip reads back what both kinds of run write (--json).
func TestStoreJSONRoundTrip(t *testing.T) {
	dir := t.TempDir()
	synthetic := filepath.Join(dir, "synthetic.json")
	b, _ := json.MarshalIndent(map[string]any{"config": sampleConfig, "results": sampleResults()}, "", "  ") // as main writes it
	if err := os.WriteFile(synthetic, b, 0o644); err != nil {
		t.Fatal(err)
	}
	daemon := filepath.Join(dir, "daemon.json")
	daemonJSON(daemon, sampleConfig, sampleDaemon())
	for _, tc := range []struct {
		file string
		want storeRun
	}{
		{synthetic, storeRunOf("", sampleConfig, sampleResults())},
		{daemon, daemonRunOf("", sampleDaemon())},
	} {
		got, err := readStoreRun("", tc.file)
		if err != nil {
			t.Fatal(err)
		}
		if got.label != tc.want.label || !equalBytes(got.plain, tc.want.plain) || !equalBytes(got.keyed, tc.want.keyed) || !equalBytes(got.objstore, tc.want.objstore) {
			t.Errorf("%s: read %q %+v %+v, want %q %+v %+v", tc.file, got.label, got.plain, got.keyed, tc.want.label, tc.want.plain, tc.want.keyed)
		}
	}
}

func equalBytes(a, b *diskBytes) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

// TestReplotStoreRecorded draws bench/results/2026-12-05-store's JSON
// files, as its README's picture is made, and checks the figures read
// are its table's.
func TestReplotStoreRecorded(t *testing.T) {
	files := []string{"runs16-chunk64.json", "runs16-chunk256.json", "scattered-chunk64.json", "daemon-nested.json"}
	var args []string
	for _, f := range files {
		args = append(args, filepath.Join(storeResultsDir, f))
	}
	path := filepath.Join(t.TempDir(), "store.png")
	if err := replotStore(path, args); err != nil {
		t.Fatal(err)
	}
	readStorePlot(t, path, 2, len(files))
	for _, tc := range []struct {
		file                         string
		plainBefore, plainAfter, key float64 // MiB, as the README's tables give them; key: keyed after
	}{
		{"runs16-chunk64.json", 1698.4, 586.0, 748.0},
		{"scattered-chunk64.json", 1715.2, 1485.6, 4765.2},
		{"daemon-nested.json", 273.2, 62.3, 132.2},
	} {
		r, err := readStoreRun("", filepath.Join(storeResultsDir, tc.file))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []struct{ got, want float64 }{{mibf(r.plain.before), tc.plainBefore}, {mibf(r.plain.after), tc.plainAfter}, {mibf(r.keyed.after), tc.key}} {
			if math.Abs(f.got-f.want) > 0.05 {
				t.Errorf("%s: %.2f MiB, the README says %.1f", tc.file, f.got, f.want)
			}
		}
	}
}

func TestStorePlotRefuses(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "p.png")
	if err := writeStorePlot(out, nil); err == nil || !strings.Contains(err.Error(), "no tenant's results") {
		t.Errorf("no runs: %v", err)
	}
	if err := writeStorePlot(out, []storeRun{{label: "empty"}}); err == nil {
		t.Error("a run without tenants: no error")
	}
	if err := writeStorePlot(out, []storeRun{{label: "zero", plain: &diskBytes{}}}); err == nil || !strings.Contains(err.Error(), "no bytes") {
		t.Errorf("zero bytes: %v", err)
	}
	empty := filepath.Join(dir, "empty.json")
	os.WriteFile(empty, []byte(`{"config": {"mem_mib": 256}, "results": []}`), 0o644)
	for _, tc := range []struct{ file, want string }{
		{"../results/2026-12-04-fork-pause/dirty-log.json", `not a bench/store --json file (benchmark "fork")`},
		{"../results/2026-12-04-uffd-restore/restore.json", `not a bench/store --json file (benchmark "snapshot")`},
		{"../results/2026-12-01-hostd/merged.json", `not a bench/store --json file (benchmark "hostd")`},
		{"../results/2026-12-02-image/bench-image.json", "no bench/store results"}, // no "benchmark" key
		{empty, "no bench/store results"},
		{filepath.Join(dir, "absent.json"), "no such file"},
	} {
		if err := replotStore(out, []string{"x=" + tc.file}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.file, err, tc.want)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a refused plot left a PNG")
	}
}
