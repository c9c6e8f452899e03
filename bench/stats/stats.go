// Package stats summarises benchmark samples: percentiles by nearest rank
// and a side-by-side table of two systems.
package stats

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"sort"
	"time"

	"github.com/warrenvm/warren/internal/atomicfile"
)

// Percentile returns the p-th percentile (0 < p <= 100) of samples by the
// nearest-rank method; 0 for no samples.
func Percentile(samples []time.Duration, p float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), samples...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	rank = min(max(rank, 1), len(s))
	return s[rank-1]
}

// Millis returns one duration a value of ms, in milliseconds: samples
// written by hand.
func Millis(ms ...int) []time.Duration {
	out := make([]time.Duration, len(ms))
	for i, m := range ms {
		out[i] = time.Duration(m) * time.Millisecond
	}
	return out
}

// Median is the 50th percentile, averaging the middle pair for even counts.
func Median(samples []time.Duration) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), samples...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Summary is one system's figures.
type Summary struct {
	Name    string          `json:"name"`
	Samples []time.Duration `json:"samples_ns"`
	Median  time.Duration   `json:"median_ns"`
	P50     time.Duration   `json:"p50_ns"`
	P90     time.Duration   `json:"p90_ns"`
	P99     time.Duration   `json:"p99_ns"`
}

// Summarise computes a Summary.
func Summarise(name string, samples []time.Duration) Summary {
	return Summary{Name: name, Samples: samples, Median: Median(samples),
		P50: Percentile(samples, 50), P90: Percentile(samples, 90), P99: Percentile(samples, 99)}
}

// Row is one row of a percentile table (PercentileRows).
type Row struct {
	// Name is the first row's name (what the table measures), "" in the
	// others; Label is the percentile ("p50"); Values are that percentile
	// of each summary, in order.
	Name, Label string
	Values      []time.Duration
}

// PercentileRows are the p50, p90 and p99 rows of a table of sums, the
// first named name.
func PercentileRows(name string, sums ...Summary) []Row {
	rows := []Row{{Name: name, Label: "p50"}, {Label: "p90"}, {Label: "p99"}}
	for _, s := range sums {
		rows[0].Values = append(rows[0].Values, s.P50)
		rows[1].Values = append(rows[1].Values, s.P90)
		rows[2].Values = append(rows[2].Values, s.P99)
	}
	return rows
}

// Ratio is a/b of two durations (0 when b is 0).
func Ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// Table prints the two summaries side by side with ours/peer ratios.
func Table(w io.Writer, title string, ours, peer Summary) {
	fmt.Fprintf(w, "%s (%d runs each)\n", title, len(ours.Samples))
	fmt.Fprintf(w, "%-8s %12s %12s %8s\n", "", ours.Name, peer.Name, "ratio")
	row := func(label string, a, b time.Duration) {
		fmt.Fprintf(w, "%-8s %12s %12s %8.2f\n", label, round(a), round(b), Ratio(a, b))
	}
	row("median", ours.Median, peer.Median)
	row("p50", ours.P50, peer.P50)
	row("p90", ours.P90, peer.P90)
	row("p99", ours.P99, peer.P99)
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d
}

// Significant rounds d to three or four significant digits, for printing.
func Significant(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(10 * time.Microsecond)
	case d >= 100*time.Microsecond:
		return d.Round(time.Microsecond)
	}
	return d.Round(10 * time.Nanosecond)
}

// JSONFlag registers a benchmark's --json option on the command line
// (flag.CommandLine): the file to write its results to (WriteJSON), ""
// for none.
func JSONFlag(path *string) {
	flag.StringVar(path, "json", "", "also write the results as JSON here")
}

// WriteJSON writes v, indented, to path (a benchmark's --json file).
func WriteJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	// Replaced atomically: a benchmark that rewrites its results as it
	// goes (bench/snapshot's checkpoints) never leaves a torn file when the
	// host dies mid-write.
	return atomicfile.Write(path, b, 0o644)
}
