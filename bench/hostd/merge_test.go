package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenvm/warren/bench/stats"
)

// fakeRuns is drive's once: the warm-up, then lats in order (0: a failed
// run); after the last it cancels cancel (nil: none), as a host that
// freezes there leaves the file.
func fakeRuns(lats []time.Duration, cancel context.CancelFunc) func(context.Context) (time.Duration, error) {
	var mu sync.Mutex
	calls := -1
	return func(context.Context) (time.Duration, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 0 {
			return time.Millisecond, nil // warm-up
		}
		l := lats[calls-1]
		if calls == len(lats) && cancel != nil {
			cancel()
		}
		if l == 0 {
			return 0, errors.New("timed out")
		}
		return l, nil
	}
}

func readResults(t *testing.T, path string) resultsFile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc resultsFile
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// TestCheckpointMidLevel checks a checkpoint written during a level holds
// the levels done and the samples so far of the one in progress, marked
// incomplete.
func TestCheckpointMidLevel(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.json")
	rs := &results{c: config{memMiB: 256, runs: 5, jsonOut: path}, withQEMU: true}
	rs.warren = append(rs.warren, drive(context.Background(), "warren", 1, 2, fakeRuns(stats.Millis(10, 20), nil), rs.checkpoint("warren")))
	if doc := readResults(t, path); len(doc.Warren) != 1 || *doc.Warren[0].Complete || len(doc.Warren[0].Summary.Samples) != 2 {
		t.Fatalf("checkpoint after the level's last run: %+v", doc.Warren)
	}
	seen := 0
	cp := rs.checkpoint("qemu")
	onSample := func(p levelResult) {
		cp(p)
		seen++
		if seen != 2 {
			return
		}
		doc := readResults(t, path)
		if doc.Complete || doc.MemMiB != 256 {
			t.Errorf("mid-level: complete %v, mem_mib %d", doc.Complete, doc.MemMiB)
		}
		if len(doc.Warren) != 1 || len(doc.Warren[0].Summary.Samples) != 2 || !*doc.Warren[0].Complete {
			t.Errorf("mid-level: warren %+v, want its one level done", doc.Warren)
		}
		if len(doc.QEMU) != 1 {
			t.Fatalf("mid-level: qemu %+v", doc.QEMU)
		}
		q := doc.QEMU[0]
		if q.Clients != 1 || *q.Complete || len(q.Summary.Samples) != 1 || len(q.Failures) != 1 || q.WallS <= 0 {
			t.Errorf("mid-level qemu level: %+v", q)
		}
		if q.Summary.Samples[0] != 30*time.Millisecond || !strings.Contains(q.Failures[0], "run 2: timed out") {
			t.Errorf("mid-level qemu samples %v, failures %v", q.Summary.Samples, q.Failures)
		}
	}
	rs.qemu = append(rs.qemu, drive(context.Background(), "qemu", 1, 3, fakeRuns(stats.Millis(30, 0, 40), nil), onSample))
	if seen != 3 {
		t.Fatalf("%d checkpoints for 3 runs", seen)
	}
	if err := rs.writeJSON(true); err != nil {
		t.Fatal(err)
	}
	if doc := readResults(t, path); !doc.Complete || len(doc.QEMU) != 1 || !*doc.QEMU[0].Complete || len(doc.QEMU[0].Summary.Samples) != 2 {
		t.Fatalf("final: %+v", doc)
	}
}

// TestMergeResults writes two invocations' checkpoints, as hosts that froze
// mid-level leave them, merges them and checks the merged levels hold
// every sample and failure of both.
func TestMergeResults(t *testing.T) {
	dir := t.TempDir()
	// a: warren 1 client done (4 runs), then frozen after 2 qemu restores.
	a := filepath.Join(dir, "a.json")
	ra := &results{c: config{memMiB: 256, runs: 4, jsonOut: a}, withQEMU: true}
	ra.warren = append(ra.warren, drive(context.Background(), "warren", 1, 4, fakeRuns(stats.Millis(10, 20, 30, 40), nil), ra.checkpoint("warren")))
	ctx, cancel := context.WithCancel(context.Background())
	drive(ctx, "qemu", 1, 4, fakeRuns(stats.Millis(5, 6), cancel), ra.checkpoint("qemu"))
	cancel()
	// b: warren 1 client done (one ok, one failed), then frozen in the
	// 4-client level after its 3 creates, before the level's report.
	b := filepath.Join(dir, "b.json")
	rb := &results{c: config{memMiB: 256, runs: 2, jsonOut: b}, withQEMU: true}
	rb.warren = append(rb.warren, drive(context.Background(), "warren", 1, 2, fakeRuns(stats.Millis(50, 0), nil), rb.checkpoint("warren")))
	drive(context.Background(), "warren", 4, 3, fakeRuns(stats.Millis(100, 100, 100), nil), rb.checkpoint("warren"))

	for _, f := range []string{a, b} {
		if doc := readResults(t, f); doc.Complete {
			t.Fatalf("%s: a checkpoint claims complete", f)
		}
	}
	png := filepath.Join(dir, "plot", "merged.png")
	out := filepath.Join(dir, "merged.json")
	var tbl strings.Builder
	if err := mergeResults(&tbl, []string{b, a}, config{pngOut: png, jsonOut: out}); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + tbl.String())
	if !strings.Contains(tbl.String(), "runs: warren 1 client 6, 4 clients 3; qemu 1 client 2:") {
		t.Errorf("table's runs line:\n%s", tbl.String())
	}
	if st, err := os.Stat(png); err != nil || st.Size() == 0 {
		t.Fatalf("plot: %v", err)
	}
	doc := readResults(t, out)
	if doc.MemMiB != 256 || doc.Complete {
		t.Errorf("merged: mem_mib %d, complete %v", doc.MemMiB, doc.Complete)
	}
	if len(doc.Warren) != 2 || doc.Warren[0].Clients != 1 || doc.Warren[1].Clients != 4 {
		t.Fatalf("merged warren levels %+v, want 1 then 4 clients", doc.Warren)
	}
	w1 := doc.Warren[0]
	if len(w1.Summary.Samples) != 5 || len(w1.Failures) != 1 {
		t.Errorf("warren 1 client: %d samples, %d failures, want 5 and 1", len(w1.Summary.Samples), len(w1.Failures))
	}
	// 10 20 30 40 50 ms: p50 by nearest rank is the 3rd, p90 the 5th.
	if w1.Summary.P50 != 30*time.Millisecond || w1.Summary.P90 != 50*time.Millisecond {
		t.Errorf("warren 1 client: p50 %v, p90 %v", w1.Summary.P50, w1.Summary.P90)
	}
	if w4 := doc.Warren[1]; len(w4.Summary.Samples) != 3 || *w4.Complete {
		t.Errorf("warren 4 clients: %+v, want 3 samples, incomplete", w4)
	}
	if len(doc.QEMU) != 1 || len(doc.QEMU[0].Summary.Samples) != 2 || doc.QEMU[0].Summary.P50 != 5*time.Millisecond {
		t.Errorf("merged qemu %+v", doc.QEMU)
	}
	var raw map[string]any
	rb2, _ := os.ReadFile(out)
	json.Unmarshal(rb2, &raw)
	if from, _ := raw["merged_from"].([]any); len(from) != 2 {
		t.Errorf("merged_from %v", raw["merged_from"])
	}

	// A merged file merges again, the same.
	again := filepath.Join(dir, "again.json")
	if err := mergeResults(io.Discard, []string{out}, config{jsonOut: again}); err != nil {
		t.Fatal(err)
	}
	if d := readResults(t, again); len(d.Warren) != 2 || len(d.Warren[0].Summary.Samples) != 5 || len(d.QEMU[0].Summary.Samples) != 2 {
		t.Errorf("re-merged: %+v", d)
	}

	// Different guests do not merge.
	c := filepath.Join(dir, "c.json")
	rc := &results{c: config{memMiB: 512, runs: 1, jsonOut: c}}
	rc.warren = append(rc.warren, drive(context.Background(), "warren", 1, 1, fakeRuns(stats.Millis(7), nil), nil))
	if err := rc.writeJSON(true); err != nil {
		t.Fatal(err)
	}
	if err := mergeResults(io.Discard, []string{a, c}, config{}); err == nil || !strings.Contains(err.Error(), "512 MiB") {
		t.Errorf("merging 256 and 512 MiB guests: %v", err)
	}
}
