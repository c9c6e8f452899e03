package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/bench/benchplot"
	"github.com/warrenvm/warren/bench/stats"
)

func ramp(base time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = base + time.Duration(i)*base/10
	}
	return out
}

// writeRun writes a --json file as run does, with VMM CPU samples around
// warren and qemu for both operations.
func writeRun(t *testing.T, path string, warren, qemu time.Duration) {
	t.Helper()
	out := map[string]any{"benchmark": "agent-round-trip"}
	for _, op := range operations {
		o := map[string]any{}
		for name, base := range map[string]time.Duration{"warren": warren, "qemu": qemu} {
			o[name] = map[string]stats.Summary{"vmm cpu": stats.Summarise(name, ramp(base, 20))}
		}
		out[op.name] = o
	}
	if err := stats.WriteJSON(path, out); err != nil {
		t.Fatal(err)
	}
}

// TestReplot: --replot reads back what --json wrote, one box per run and
// system, the p50 ratios in the titles, and draws them.
func TestReplot(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "before.json"), filepath.Join(dir, "after.json")
	writeRun(t, a, 8*time.Millisecond, 2*time.Millisecond)
	writeRun(t, b, 4*time.Millisecond, 2*time.Millisecond)
	panels, err := replotPanels([]string{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if len(panels) != len(operations) {
		t.Fatalf("%d panels, want one per operation", len(panels))
	}
	for _, p := range panels {
		if len(p.boxes) != 4 || p.boxes[0].label != "before w" || p.boxes[3].label != "after q" {
			t.Fatalf("boxes of %q: %v", p.title, p.boxes)
		}
		if !strings.HasSuffix(p.title, " 4, 2") {
			t.Errorf("title %q, want the ratios 4 and 2", p.title)
		}
	}
	png := filepath.Join(dir, "p.png")
	if out := os.Getenv("BENCH_AGENT_PLOT"); out != "" { // to look at it
		png = out
	}
	if err := writePlot(png, panels); err != nil {
		t.Fatal(err)
	}
	img, err := benchplot.ReadPNG(png)
	if err != nil {
		t.Fatal(err)
	}
	if got := img.Bounds().Size(); got.X != 2*480 || got.Y != 320 { // two panels of four boxes: one row
		t.Fatalf("size %v, want 960x320", got)
	}
}

func TestReplotRefusesOtherFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.json")
	if err := os.WriteFile(path, []byte(`{"benchmark":"other"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := replotPanels([]string{path}); err == nil {
		t.Fatal("a file without agent results was plotted")
	}
}
