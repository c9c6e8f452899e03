package main

import (
	"image"
	"image/color"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/bench/benchplot"
	"github.com/warrenvm/warren/bench/stats"
)

const uffdRestoreDir = "../results/2026-12-04-uffd-restore"

// ramp is n values from base up by a tenth each.
func ramp(base uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = base + uint64(i)*base/10
	}
	return out
}

// sampleRestores are 5 runs of each variant, warm; withUffd false leaves
// out the uffd variants.
func sampleRestores(withUffd bool) map[string]*restoreSeries {
	series := func(health time.Duration, faults, pages, bytes, uffdFaults uint64) *restoreSeries {
		s := &restoreSeries{Health: stats.Millis(int(health/time.Millisecond), int(health/time.Millisecond)+100, int(health/time.Millisecond)+300),
			Faults: ramp(faults, 3), Bytes: ramp(bytes, 3)}
		if pages > 0 {
			s.FirstRun = stats.Millis(40, 50, 60)
			s.RAMPages = ramp(pages, 3)
		}
		if uffdFaults > 0 {
			s.UffdFaults = ramp(uffdFaults, 3)
		}
		return s
	}
	res := map[string]*restoreSeries{
		"warm warren eager": series(2600*time.Millisecond, 10500, 9600, 37<<20, 0),
		"warm warren lazy":  series(1900*time.Millisecond, 1400, 3100, 12<<20, 0),
		"warm qemu":         series(5000*time.Millisecond, 7100, 0, 42<<20, 0),
	}
	if withUffd {
		res["warm warren uffd"] = series(3000*time.Millisecond, 900, 6000, 23<<20, 29)
		res["warm warren uffd-prefetch"] = series(3300*time.Millisecond, 940, 6000, 35<<20, 25)
	}
	return res
}

// readRestorePlot reads the PNG at path and checks its size for groups
// bar groups.
func readRestorePlot(t *testing.T, path string, groups int) image.Image {
	t.Helper()
	img, err := benchplot.ReadPNG(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, w := img.Bounds().Size(), 3*restorePanelW(groups); got.X != w || got.Y != restorePanelH {
		t.Fatalf("size %v, want %dx%d", got, w, restorePanelH)
	}
	return img
}

func TestWriteRestorePlot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "restore.png")
	if out := os.Getenv("BENCH_SNAPSHOT_PLOT"); out != "" { // to look at it
		path = out
	}
	if err := writeRestorePlot(path, "guest 256 MiB, 3 runs per variant", sampleRestores(true)); err != nil {
		t.Fatal(err)
	}
	img := readRestorePlot(t, path, 5)
	// p50 bars (and the faults) blue, p90 (and resident pages) orange,
	// the uffd variants' demand faults green: small bars, and their
	// legend entry.
	for c, least := range map[color.RGBA]int{blue: 20000, orange: 20000, green: 100} {
		if n := benchplot.CountNear(img, c, 24); n < least {
			t.Errorf("colour %v drawn on %d pixels, want at least %d", c, n, least)
		}
	}
	// Without a uffd variant no green at all: no bar, no legend entry.
	if err := writeRestorePlot(path, "", sampleRestores(false)); err != nil {
		t.Fatal(err)
	}
	img = readRestorePlot(t, path, 3)
	if n := benchplot.CountNear(img, green, 24); n != 0 {
		t.Errorf("no uffd variant, but green on %d pixels", n)
	}
}

func TestRestoreCategories(t *testing.T) {
	res := sampleRestores(true)
	var labels []string
	for _, c := range restoreCategories(res) {
		labels = append(labels, c.label)
	}
	want := "eager\n0.53× qemu|lazy (mmap)\n0.39× qemu|uffd\n0.61× qemu|uffd-prefetch\n0.67× qemu|qemu" // p50s: 2.7, 2, 3.1, 3.4 over 5.1 s
	if got := strings.Join(labels, "|"); got != want {
		t.Errorf("labels %q, want %q", got, want)
	}
	// Both cache states: each variant says which; a cold one without a
	// QEMU peer has no ratio; a variant whose every run failed is left out.
	res["cold warren eager"] = &restoreSeries{Health: stats.Millis(4000)}
	res["cold warren lazy"] = &restoreSeries{Failures: []string{"round 1: timeout"}}
	labels = nil
	for _, c := range restoreCategories(res) {
		labels = append(labels, c.label)
	}
	if got := labels[len(labels)-1]; len(labels) != 6 || got != "eager, cold" || labels[0] != "eager, warm\n0.53× qemu" {
		t.Errorf("labels %q", labels)
	}
}

func TestRestorePanelsUnit(t *testing.T) {
	slow := restoreCategories(sampleRestores(false))
	if got := restorePanels(slow)[0].yLabel; !strings.HasPrefix(got, "s ") {
		t.Errorf("seconds-long restores: y label %q", got)
	}
	if v, ok := restorePanels(slow)[0].bars[0].value(slow[0].s); !ok || v != 2.7 { // eager p50: 2.6 s + 100 ms
		t.Errorf("eager p50 %v %v", v, ok)
	}
	fast := restoreCategories(map[string]*restoreSeries{"warm warren lazy": {Health: stats.Millis(40, 50, 900)}})
	pn := restorePanels(fast)
	if got := pn[0].yLabel; !strings.HasPrefix(got, "ms ") {
		t.Errorf("sub-second restores: y label %q", got)
	}
	if _, ok := pn[1].bars[0].value(fast[0].s); ok {
		t.Error("bytes read of a series without them (an earlier version's JSON): want no bar")
	}
	for v, want := range map[float64]string{29: "29", 940: "940", 9631: "9.6k", 10515: "10.5k", 120400: "120k"} {
		if got := compactCount(v); got != want {
			t.Errorf("compactCount(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestReplotRestoresRecorded draws the recorded runs of
// bench/results/2026-12-04-uffd-restore, as its README's pictures are made,
// and one that a run's --json wrote.
func TestReplotRestoresRecorded(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		file   string
		groups int
	}{
		{filepath.Join(uffdRestoreDir, "restore-nested.json"), 5}, // with qemu
		{filepath.Join(uffdRestoreDir, "restore.json"), 4},        // PVM host: no qemu
	} {
		path := filepath.Join(dir, filepath.Base(tc.file)+".png")
		if err := replotRestores(path, []string{tc.file}); err != nil {
			t.Fatal(err)
		}
		img := readRestorePlot(t, path, tc.groups)
		for _, c := range restoreColours {
			if n := benchplot.CountNear(img, c, 24); n < 100 {
				t.Errorf("%s: colour %v drawn on %d pixels", tc.file, c, n)
			}
		}
	}
	c := config{restoreRuns: 3, memMiB: 512}
	written := filepath.Join(dir, "run.json")
	if err := stats.WriteJSON(written, map[string]any{"benchmark": "snapshot", "restore": restoreJSON(c, sampleRestores(false))}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "run.png")
	if err := replotRestores(path, []string{written}); err != nil {
		t.Fatal(err)
	}
	readRestorePlot(t, path, 3)
	res, rc, _, err := readRestores([]string{written})
	if err != nil {
		t.Fatal(err)
	}
	if restorePlotTitle(rc) != "guest 512 MiB, 3 runs per variant" || len(res["warm warren eager"].RAMPages) != 3 {
		t.Errorf("read back: %q, %+v", restorePlotTitle(rc), res["warm warren eager"])
	}
}

func TestRestorePlotRefuses(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "p.png")
	if err := writeRestorePlot(out, "", nil); err == nil || !strings.Contains(err.Error(), "no timed restore") {
		t.Errorf("no results: %v", err)
	}
	failed := map[string]*restoreSeries{"warm warren eager": {Failures: []string{"round 1: timeout"}}}
	if err := writeRestorePlot(out, "", failed); err == nil {
		t.Error("only failed restores: no error")
	}
	noRestore := filepath.Join(dir, "incremental-only.json")
	os.WriteFile(noRestore, []byte(`{"benchmark": "snapshot", "incremental": {}}`), 0o644)
	for _, tc := range []struct{ file, want string }{
		{"../results/2026-12-04-fork-pause/dirty-log.json", `not a bench/snapshot --json file (benchmark "fork")`},
		{"../results/2026-12-05-store/runs16-chunk64.json", "no restore results"},
		{noRestore, "no restore results"},
		{filepath.Join(dir, "absent.json"), "no such file"},
	} {
		if err := replotRestores(out, []string{tc.file}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.file, err, tc.want)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a refused plot left a PNG")
	}
}
