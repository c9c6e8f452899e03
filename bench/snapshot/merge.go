package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/warrenvm/warren/bench/stats"
	"github.com/warrenvm/warren/memsnap/uffd"
)

// mergeRestores reads the restore part of several --json files written by
// separate invocations (each in a fresh host) and prints one table of all
// their runs together, as if one invocation had made them. It exists for
// hosts that cannot keep a long restore loop alive (the nested KVM host
// freezes in long ones: .ci/kvmhost/README.md): a series is then made of
// short invocations whose rounds alternate the variants just the same.
func mergeRestores(files []string, jsonOut string) error {
	res, c, srcInfo, err := readRestores(files)
	if err != nil {
		return err
	}
	var counts []string
	for _, k := range mergeKeys() {
		if s := res[k]; s != nil {
			counts = append(counts, fmt.Sprintf("%s %d", k, len(s.Health)+len(s.Failures)))
		}
	}
	fmt.Printf("merged from %d invocations: %s\n", len(files), strings.Join(files, " "))
	fmt.Printf("runs: %s\n", strings.Join(counts, ", "))
	printRestores(os.Stdout, c, res, srcInfo)
	if jsonOut != "" {
		return stats.WriteJSON(jsonOut, map[string]any{"merged_from": files, "restore": restoreJSON(c, res), "restore_sources": srcInfo})
	}
	return nil
}

// readRestores reads the restore part (measurement 2) of --json files
// and joins their series: the results, a config holding what the tables
// and plot need of the runs (caches, guest size, and as runs per
// variant the fewest of any series), and the first file's restore
// sources. A file of another benchmark, or without restore results, is
// an error.
func readRestores(files []string) (map[string]*restoreSeries, config, map[string]any, error) {
	res := map[string]*restoreSeries{}
	c := config{caches: map[string]bool{}}
	var srcInfo map[string]any
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, c, nil, err
		}
		var doc struct {
			Benchmark string                     `json:"benchmark"` // absent from --merge's output
			Restore   map[string]json.RawMessage `json:"restore"`
			Sources   map[string]any             `json:"restore_sources"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			return nil, c, nil, fmt.Errorf("%s: %w", f, err)
		}
		if doc.Benchmark != "" && doc.Benchmark != "snapshot" {
			return nil, c, nil, fmt.Errorf("%s: not a bench/snapshot --json file (benchmark %q)", f, doc.Benchmark)
		}
		if doc.Restore == nil {
			return nil, c, nil, fmt.Errorf("%s: no restore results (not a bench/snapshot --json file, or a run with --skip-restore)", f)
		}
		if srcInfo == nil {
			srcInfo = doc.Sources
			for k, v := range srcInfo { // JSON numbers come back as float64
				if f, ok := v.(float64); ok && f == float64(int64(f)) {
					srcInfo[k] = int64(f)
				}
			}
		}
		if m, ok := doc.Restore["mem_mib"]; ok && c.memMiB == 0 {
			json.Unmarshal(m, &c.memMiB)
		}
		for k, raw := range doc.Restore {
			cache, _, ok := strings.Cut(k, " ")
			if !ok || (cache != "warm" && cache != "cold") {
				continue
			}
			var e struct {
				Agent    stats.Summary  `json:"agent_answer"`
				First    *stats.Summary `json:"first_kvm_run"`
				Failures []string       `json:"failures"`
				// Absent from files of earlier versions.
				Faults     *countSummary `json:"vmm_faults"`
				RAMPages   *countSummary `json:"ram_pages"`
				Bytes      *countSummary `json:"bytes_read"`
				UffdFaults *countSummary `json:"uffd_faults"`
				Uffd       []uffd.Stats  `json:"uffd_stats"`
			}
			if err := json.Unmarshal(raw, &e); err != nil {
				return nil, c, nil, fmt.Errorf("%s: %s: %w", f, k, err)
			}
			s := res[k]
			if s == nil {
				s = &restoreSeries{}
				res[k] = s
			}
			s.Health = append(s.Health, e.Agent.Samples...)
			if e.First != nil {
				s.FirstRun = append(s.FirstRun, e.First.Samples...)
			}
			s.Failures = append(s.Failures, e.Failures...)
			for _, m := range []struct {
				from *countSummary
				to   *[]uint64
			}{{e.Faults, &s.Faults}, {e.RAMPages, &s.RAMPages}, {e.Bytes, &s.Bytes}, {e.UffdFaults, &s.UffdFaults}} {
				if m.from != nil {
					*m.to = append(*m.to, m.from.Samples...)
				}
			}
			s.Uffd = append(s.Uffd, e.Uffd...)
			c.caches[cache] = true
		}
	}
	for _, k := range mergeKeys() {
		if s := res[k]; s != nil {
			if n := len(s.Health) + len(s.Failures); c.restoreRuns == 0 || n < c.restoreRuns {
				c.restoreRuns = n // the header's "runs per variant": the fewest
			}
		}
	}
	return res, c, srcInfo, nil
}

// mergeKeys are the series keys in table order: every variant, warm then
// cold.
func mergeKeys() []string {
	var out []string
	for _, cache := range []string{"warm", "cold"} {
		for _, v := range restoreVariants {
			out = append(out, cache+" "+v.name)
		}
	}
	return out
}
