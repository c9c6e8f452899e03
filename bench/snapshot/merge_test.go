package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/warrenvm/warren/bench/stats"
)

// TestMergeRestores writes two invocations' JSON and checks the merged
// series hold every sample and failure of both.
func TestMergeRestores(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, eager, qemu []time.Duration, fail []string) string {
		c := config{restoreRuns: len(eager), memMiB: 512}
		res := map[string]*restoreSeries{
			"warm warren eager": {FirstRun: eager, Health: eager, Failures: fail},
			"warm qemu":         {Health: qemu},
		}
		p := filepath.Join(dir, name)
		if err := stats.WriteJSON(p, map[string]any{"restore": restoreJSON(c, res)}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	a := write("a.json", stats.Millis(10, 20), stats.Millis(100, 200), nil)
	b := write("b.json", stats.Millis(30), stats.Millis(300), []string{"timed out"})
	out := filepath.Join(dir, "merged.json")
	old := os.Stdout
	os.Stdout, _ = os.Open(os.DevNull)
	err := mergeRestores([]string{a, b}, out)
	os.Stdout = old
	if err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(out)
	defer f.Close()
	raw, _ := io.ReadAll(f)
	var doc struct {
		Restore map[string]json.RawMessage `json:"restore"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	var e struct {
		Agent    stats.Summary `json:"agent_answer"`
		Failures []string      `json:"failures"`
	}
	json.Unmarshal(doc.Restore["warm warren eager"], &e)
	if len(e.Agent.Samples) != 3 || len(e.Failures) != 1 || e.Agent.P50 != 20*time.Millisecond {
		t.Errorf("merged eager: %d samples, %d failures, p50 %v", len(e.Agent.Samples), len(e.Failures), e.Agent.P50)
	}
	var runs int
	json.Unmarshal(doc.Restore["runs"], &runs)
	if runs != 3 { // the fewest of any variant: qemu's 3 (eager has 3 timed + 1 failed)
		t.Errorf("runs %d, want 3", runs)
	}
}
