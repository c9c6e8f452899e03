package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestParseTTIModes(t *testing.T) {
	for in, want := range map[string]string{"": "", "none": "", "burst": "burst", "sequential, burst": "sequential,burst"} {
		got, err := parseTTIModes(in)
		if err != nil || strings.Join(got, ",") != want {
			t.Errorf("parseTTIModes(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := parseTTIModes("sequential,flood"); err == nil {
		t.Error("an unknown mode was taken")
	}
}

// TestDriveArrivals: sequential runs one at a time; burst starts every run
// before any ends; staggered starts run i no sooner than (i-1) gaps after
// the first; failures are kept apart from samples.
func TestDriveArrivals(t *testing.T) {
	const runs = 6
	ctx := context.Background()

	var active, peak atomic.Int32
	r := driveArrivals(ctx, "test", "sequential", runs, 0, func(context.Context) (time.Duration, error) {
		if n := active.Add(1); n > peak.Load() {
			peak.Store(n)
		}
		time.Sleep(time.Millisecond)
		active.Add(-1)
		return time.Millisecond, nil
	})
	if peak.Load() != 1 || len(r.Samples) != runs {
		t.Errorf("sequential: %d at once, %d samples", peak.Load(), len(r.Samples))
	}

	var started sync.WaitGroup
	started.Add(runs)
	all := make(chan struct{})
	go func() { started.Wait(); close(all) }()
	var n atomic.Int32
	r = driveArrivals(ctx, "test", "burst", runs, time.Hour, func(context.Context) (time.Duration, error) {
		started.Done()
		select {
		case <-all:
		case <-time.After(time.Minute):
			return 0, errors.New("not every run started before this one ended")
		}
		if n.Add(1)%2 == 0 {
			return 0, errors.New("boom")
		}
		return time.Millisecond, nil
	})
	if len(r.Samples) != runs/2 || len(r.Failures) != runs/2 {
		t.Errorf("burst: %d samples, %d failures %q", len(r.Samples), len(r.Failures), r.Failures)
	}

	const gap = 20 * time.Millisecond
	var mu sync.Mutex
	var starts []time.Time
	t0 := time.Now()
	driveArrivals(ctx, "test", "staggered", runs, gap, func(context.Context) (time.Duration, error) {
		mu.Lock()
		starts = append(starts, time.Now())
		mu.Unlock()
		return time.Millisecond, nil
	})
	if len(starts) != runs {
		t.Fatalf("staggered: %d runs", len(starts))
	}
	if last := starts[len(starts)-1]; last.Sub(t0) < (runs-1)*gap {
		t.Errorf("staggered: the last of %d runs started %v after the first, want at least %v", runs, last.Sub(t0), (runs-1)*gap)
	}
}

func TestTTITable(t *testing.T) {
	c := config{ttiRuns: 2, stagger: 200 * time.Millisecond, memMiB: 256}
	ws := []ttiResult{{Mode: "burst", Samples: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}}}
	qs := []ttiResult{{Mode: "burst", Samples: []time.Duration{50 * time.Millisecond}, Failures: []string{"run 2: x"}}}
	var b bytes.Buffer
	printTTITable(&b, c, ws, qs)
	for _, want := range []string{"burst      p50", "tti qemu burst: 1 ok, 1 failed", "FAILED tti qemu burst: first: run 2: x"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q in\n%s", want, b.String())
		}
	}
	if p := ttiPlot(c, ws, qs); len(p.Series) != 2 || !p.Series[1].Dashed {
		t.Errorf("plot series %+v", p.Series)
	}
}
