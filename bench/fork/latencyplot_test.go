package main

import (
	"image"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/bench/benchplot"
	"github.com/warrenvm/warren/bench/stats"
)

const forkPauseDir = "../results/2026-12-04-fork-pause"

// spread is n samples from base up by a tenth each.
func spread(base time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = base + time.Duration(i)*base/10
	}
	return out
}

// sampleRuns are two runs: "with qemu" (128 and 1024 MiB, a QEMU peer at
// both) and "warren only" (three sizes, no peer).
func sampleRuns() []latencyRun {
	withQEMU := latencyRun{Label: "with qemu"}
	for _, size := range []int{128, 1024} {
		withQEMU.Sizes = append(withQEMU.Sizes, &sizeResult{MemMiB: size,
			Warren: warrenSeries{Pause: spread(4*time.Millisecond, 10), Ready: spread(100*time.Millisecond, 10), Agent: spread(400*time.Millisecond, 10)},
			QEMU:   &qemuSeries{Downtime: time.Duration(size) * 50 * time.Microsecond, Agent: spread(2*time.Second, 10)}})
	}
	alone := latencyRun{Label: "warren only"}
	for _, size := range []int{128, 1024, 4096} {
		alone.Sizes = append(alone.Sizes, &sizeResult{MemMiB: size,
			Warren: warrenSeries{Pause: spread(time.Duration(size)*10*time.Microsecond, 10), Ready: spread(120*time.Millisecond, 10), Agent: spread(450*time.Millisecond, 10)}})
	}
	return []latencyRun{withQEMU, alone}
}

// readPlot reads the PNG at path and checks its size: three panels side
// by side.
func readPlot(t *testing.T, path string) image.Image {
	t.Helper()
	img, err := benchplot.ReadPNG(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := img.Bounds().Size(); got.X != 3*latencyPanelW || got.Y != latencyPanelH {
		t.Fatalf("size %v, want %dx%d", got, 3*latencyPanelW, latencyPanelH)
	}
	return img
}

func TestWriteLatencyPlot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "latency.png")
	if out := os.Getenv("BENCH_FORK_PLOT"); out != "" { // to look at it
		path = out
	}
	if err := writeLatencyPlot(path, sampleRuns()); err != nil {
		t.Fatal(err)
	}
	img := readPlot(t, path)
	// The first run's Warren and QEMU and the second run's Warren each
	// have a colour, drawn as lines in each panel; no fourth series.
	for i, c := range latencyPalette[:3] {
		if n := benchplot.CountNear(img, c, 24); n < 600 {
			t.Errorf("series %d's colour %v drawn on %d pixels", i, c, n)
		}
	}
	if n := benchplot.CountNear(img, latencyPalette[3], 24); n != 0 {
		t.Errorf("colour %v of no series drawn on %d pixels", latencyPalette[3], n)
	}
}

func TestLatencySeries(t *testing.T) {
	runs := sampleRuns()
	var names []string
	for _, m := range latencyMetrics {
		var ns []string
		for _, s := range latencySeriesOf(m, runs) {
			ns = append(ns, s.name)
			if len(s.pts[0]) != len(s.pts[2]) || len(s.pts[0]) == 0 {
				t.Errorf("%s %s: %d p50 points, %d p99", m.title, s.name, len(s.pts[0]), len(s.pts[2]))
			}
		}
		names = append(names, strings.Join(ns, "|"))
	}
	want := []string{
		"with qemu, warren|with qemu, qemu migration downtime|warren only",
		"with qemu, warren|warren only", // QEMU has no first KVM_RUN figure
		"with qemu, warren|with qemu, qemu -incoming restore to agent|warren only",
	}
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("series\n%q\nwant\n%q", names, want)
	}
	// Points at each size with samples, in ms, by percentile.
	pause := latencySeriesOf(latencyMetrics[0], runs)[2]
	if got := pause.pts[0]; len(got) != 3 || got[2].X != 4096 || got[2].Y != 57.344 { // 40.96 ms x 1.4, the 5th of 10
		t.Errorf("warren only pause p50 %v", got)
	}
	if got := pause.pts[2][0].Y; got != msOf(stats.Percentile(spread(1280*time.Microsecond, 10), 99)) {
		t.Errorf("warren only pause p99 at 128 MiB %v", got)
	}
}

// TestLatencyJSONRoundTrip reads back what a run's --json writes.
func TestLatencyJSONRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fork.json")
	run := sampleRuns()[0]
	lat := map[string]any{}
	for _, s := range run.Sizes {
		lat[strconv.Itoa(s.MemMiB)] = s.json()
	}
	if err := stats.WriteJSON(path, map[string]any{"benchmark": "fork", "latency": lat}); err != nil {
		t.Fatal(err)
	}
	got, err := readLatencyRun("again", path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Label != "again" || len(got.Sizes) != 2 || got.Sizes[0].MemMiB != 128 || got.Sizes[1].MemMiB != 1024 {
		t.Fatalf("read %+v", got)
	}
	for i, s := range got.Sizes {
		w := run.Sizes[i]
		if !reflect.DeepEqual(s.Warren.Pause, w.Warren.Pause) || !reflect.DeepEqual(s.Warren.Ready, w.Warren.Ready) ||
			!reflect.DeepEqual(s.Warren.Agent, w.Warren.Agent) || s.QEMU == nil ||
			s.QEMU.Downtime != w.QEMU.Downtime || !reflect.DeepEqual(s.QEMU.Agent, w.QEMU.Agent) {
			t.Errorf("size %d: read %+v %+v, wrote %+v %+v", s.MemMiB, s.Warren, s.QEMU, w.Warren, w.QEMU)
		}
	}
}

// TestReplotLatencyRecorded draws the recorded Warren-only runs of
// bench/results/2026-12-04-fork-pause, as its README's picture is made.
func TestReplotLatencyRecorded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fork-pause.png")
	err := replot(config{latencyPNG: path}, []string{
		"pagemap scan (old)=" + filepath.Join(forkPauseDir, "pagemap-scan.json"),
		"dirty log (new)=" + filepath.Join(forkPauseDir, "dirty-log.json"),
	})
	if err != nil {
		t.Fatal(err)
	}
	img := readPlot(t, path)
	for _, c := range latencyPalette[:2] {
		if n := benchplot.CountNear(img, c, 24); n < 600 {
			t.Errorf("colour %v drawn on %d pixels", c, n)
		}
	}
	if n := benchplot.CountNear(img, latencyPalette[2], 24); n != 0 { // no QEMU in these runs
		t.Errorf("colour %v of no series drawn on %d pixels", latencyPalette[2], n)
	}
	r, err := readLatencyRun("", filepath.Join(forkPauseDir, "pagemap-scan.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Sizes) != 3 || r.Sizes[2].MemMiB != 4096 || len(r.Sizes[2].Warren.Pause) != 20 || r.Sizes[2].QEMU != nil {
		t.Errorf("pagemap-scan.json read as %d sizes, last %+v", len(r.Sizes), r.Sizes[len(r.Sizes)-1])
	}
}

func TestLatencyPlotRefuses(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "p.png")
	if err := writeLatencyPlot(out, nil); err == nil || !strings.Contains(err.Error(), "no fork latency samples") {
		t.Errorf("no runs: %v", err)
	}
	failed := []latencyRun{{Sizes: []*sizeResult{{MemMiB: 128, Warren: warrenSeries{Failures: []string{"run 1: timeout"}}}}}}
	if err := writeLatencyPlot(out, failed); err == nil {
		t.Error("only failed forks: no error")
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a refused plot left a PNG")
	}
	garbage := filepath.Join(dir, "garbage.json")
	os.WriteFile(garbage, []byte("{not json"), 0o644)
	for _, tc := range []struct{ file, want string }{
		{"../results/2026-12-04-uffd-restore/restore.json", `not a bench/fork --json file (benchmark "snapshot")`},
		{"../results/2026-12-05-store/runs16-chunk64.json", `not a bench/fork --json file (benchmark "")`},
		{"../results/2026-12-05-density/density-balloon.json", "no fork latency measurement"}, // density only
		{garbage, "invalid character"},
		{filepath.Join(dir, "absent.json"), "no such file"},
	} {
		err := replot(config{latencyPNG: out}, []string{"x=" + tc.file})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.file, err, tc.want)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a refused replot left a PNG")
	}
}

// TestReplotDensity checks --replot --density-png still draws alone, and
// beside --latency-png from a file with both measurements.
func TestReplotDensity(t *testing.T) {
	dir := t.TempDir()
	density, latency := filepath.Join(dir, "d.png"), filepath.Join(dir, "l.png")
	if err := replot(config{densityPNG: density}, []string{"trimmed=../results/2026-12-05-density/density-no-balloon.json"}); err != nil {
		t.Fatal(err)
	}
	img, err := benchplot.ReadPNG(density)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 3*480 || b.Dy() != 336 {
		t.Fatalf("density PNG %v: want three panels, 1440x336", b)
	}
	os.Remove(density)
	if err := replot(config{densityPNG: density, latencyPNG: latency}, []string{"../results/2026-12-05-density/density-compacted.json"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{density, latency} {
		if _, err := benchplot.ReadPNG(p); err != nil {
			t.Error(err)
		}
	}
}

func TestReplotArg(t *testing.T) {
	for arg, want := range map[string][2]string{
		"a.json":                       {"", "a.json"},
		"dirty log (new)=dir/new.json": {"dirty log (new)", "dir/new.json"},
	} {
		if l, p := replotArg(arg); l != want[0] || p != want[1] {
			t.Errorf("replotArg(%q) = %q, %q", arg, l, p)
		}
	}
}
