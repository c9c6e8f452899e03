package main

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/bench/stats"
)

func TestPercentilesFromStats(t *testing.T) {
	s := stats.Millis(10, 20, 30, 40, 50, 60, 70, 80, 90, 100)
	for p, want := range map[float64]time.Duration{50: 50 * time.Millisecond, 90: 90 * time.Millisecond, 99: 100 * time.Millisecond} {
		if got := stats.Percentile(s, p); got != want {
			t.Errorf("p%v = %v, want %v", p, got, want)
		}
	}
}

func TestSpaceAt(t *testing.T) {
	if spaceAt(50) != 60*time.Millisecond || spaceAt(90) != 89*time.Millisecond || spaceAt(99) != 0 {
		t.Fatal("SPACE's published figures are 60 ms p50 and 89 ms p90, no p99")
	}
}

func TestPrintTable(t *testing.T) {
	ws := []levelResult{
		{Clients: 1, Samples: stats.Millis(120, 120, 120, 120, 120, 120, 120, 120, 178, 200), Wall: time.Second},
		{Clients: 16, Samples: stats.Millis(300, 300, 300), Failures: []string{"run 4: boom"}, Wall: time.Second},
	}
	qs := []levelResult{{Clients: 1, Samples: stats.Millis(60, 60, 60, 60, 60, 60, 60, 60, 89, 100)}}
	var b bytes.Buffer
	printTable(&b, config{runs: 10, memMiB: 256}, ws, qs)
	out := b.String()
	t.Log("\n" + out)
	for _, want := range []string{
		"SPACE (published)", "warren/SPACE", "warren/qemu",
		// p50: 120 ms against SPACE's 60 ms and qemu's 60 ms.
		"1       p50         120ms               60ms          2.00         60ms         2.00",
		// p90: 178 ms against 89 ms and 89 ms.
		"        p90         178ms               89ms          2.00         89ms         2.00",
		// p99: no SPACE figure.
		"        p99         200ms                  -             -        100ms         2.00",
		// no qemu at 16 clients.
		"16      p50         300ms               60ms          5.00            -            -",
		// the counts are the data's, not --runs.
		"runs: warren 1 client 10, 16 clients 4; qemu 1 client 10:",
		"FAILED warren, 16 clients: 1 of 4 runs",
		// qemu's level has no wall: no rate.
		"clients 1: warren 10 ok, 0 failed, 10.00 creates/s (with deletes); qemu 10 ok, 0 failed\n",
		"clients 16: warren 3 ok, 1 failed, 4.00 creates/s",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestParseLevels(t *testing.T) {
	got, err := parseLevels("1, 16,4")
	if err != nil || !reflect.DeepEqual(got, []int{1, 16, 4}) {
		t.Fatalf("parseLevels = %v, %v", got, err)
	}
	for _, bad := range []string{"", "0", "1,x", "-2"} {
		if _, err := parseLevels(bad); err == nil {
			t.Errorf("parseLevels(%q) accepted", bad)
		}
	}
}
