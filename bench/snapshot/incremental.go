package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/warrenvm/warren/bench/stats"
)

// incrSeries is one system's samples for one dirty size. Bytes are kept as
// durations only to reuse stats' percentiles (1 ns = 1 byte).
type incrSeries struct {
	Pause, Total []time.Duration
	Bytes        []time.Duration
	Pages        []uint64         // Warren: pages in the layer
	Extra        []map[string]any // QEMU: query-migrate's ram statistics
}

// incrResult maps dirty MiB to system name to samples.
type incrResult map[int]map[string]*incrSeries

// incremental runs measurement 1: memtouch in both guests, then per dirty
// size and repetition a Warren base snapshot, dirty, incremental snapshot,
// and a QEMU dirty then full migration to a file.
func incremental(c config, w, q *vm, work string) (incrResult, error) {
	t0 := time.Now()
	for _, v := range []*vm{w, q} {
		if err := v.startMemtouch(c.touchMiB, c.timeout); err != nil {
			return nil, err
		}
	}
	fmt.Printf("memtouch holding %d MiB in both guests (%s)\n", c.touchMiB, time.Since(t0).Round(time.Millisecond))
	dir := filepath.Join(work, "incr")
	res := incrResult{}
	for _, k := range c.dirty {
		res[k] = map[string]*incrSeries{"warren": {}, "qemu": {}}
		for r := 0; r < c.reps; r++ {
			if err := os.RemoveAll(dir); err != nil {
				return nil, err
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, err
			}
			// Warren: base, dirty, incremental.
			base, err := w.warrenSnapshot(filepath.Join(dir, "base"), "full", c.timeout)
			if err != nil {
				return nil, err
			}
			if err := w.dirty(k, c.timeout); err != nil {
				return nil, err
			}
			inc, err := w.warrenSnapshot(filepath.Join(dir, "inc"), "incremental", c.timeout)
			if err != nil {
				return nil, err
			}
			s := res[k]["warren"]
			s.Pause = append(s.Pause, ms(inc.PauseMS))
			s.Total = append(s.Total, ms(inc.TotalMS))
			s.Bytes = append(s.Bytes, time.Duration(inc.LayerBytes))
			s.Pages = append(s.Pages, inc.Pages)
			// QEMU: dirty, full migration to a file.
			if err := q.dirty(k, c.timeout); err != nil {
				return nil, err
			}
			m, err := q.qemuMigrate(filepath.Join(dir, "qemu.mig"), c.timeout)
			if err != nil {
				return nil, err
			}
			s = res[k]["qemu"]
			s.Pause = append(s.Pause, m.Downtime)
			s.Total = append(s.Total, m.Total)
			s.Bytes = append(s.Bytes, time.Duration(m.Bytes))
			s.Extra = append(s.Extra, m.RAM)
			fmt.Printf("dirty %3d MiB rep %d: warren base pause %.1f ms %.1f MiB, incremental pause %.1f ms total %.1f ms %d pages %.2f MiB; qemu downtime %s total %s %.1f MiB\n",
				k, r+1, base.PauseMS, mib(base.LayerBytes), inc.PauseMS, inc.TotalMS, inc.Pages, mib(inc.LayerBytes),
				m.Downtime, m.Total, mib(m.Bytes))
		}
	}
	os.RemoveAll(dir)
	return res, nil
}

// ms converts milliseconds to a duration.
func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// mib converts bytes to MiB.
func mib(b int64) float64 { return float64(b) / (1 << 20) }

// printIncremental prints measurement 1's table.
func printIncremental(c config, res incrResult) {
	fmt.Printf("\nincremental snapshot vs dirty memory: guest %d MiB, memtouch %d MiB (random bytes), %d reps per size\n", c.memMiB, c.touchMiB, c.reps)
	fmt.Println("warren: pause and layer of an incremental snapshot taken after a full one and `dirty K`;")
	fmt.Println("qemu: no incremental file snapshot: a full live migration to a file each time (downtime, file size)")
	fmt.Printf("%-7s %-13s %-4s %12s %12s %8s\n", "dirty", "metric", "", "warren", "qemu", "ratio")
	for _, k := range c.dirty {
		w, q := res[k]["warren"], res[k]["qemu"]
		first := true
		for _, m := range []struct {
			name  string
			a, b  []time.Duration
			bytes bool
		}{{"pause", w.Pause, q.Pause, false}, {"total", w.Total, q.Total, false}, {"bytes (MiB)", w.Bytes, q.Bytes, true}} {
			for i, p := range []float64{50, 90, 99} {
				a, b := stats.Percentile(m.a, p), stats.Percentile(m.b, p)
				label, name := "", ""
				if first {
					label = fmt.Sprintf("%d MiB", k)
					first = false
				}
				if i == 0 {
					name = m.name
				}
				if m.bytes {
					fmt.Printf("%-7s %-13s p%-3.0f %12.2f %12.2f %8.3f\n", label, name, p, mib(int64(a)), mib(int64(b)), stats.Ratio(a, b))
				} else {
					fmt.Printf("%-7s %-13s p%-3.0f %12s %12s %8.3f\n", label, name, p, stats.Significant(a), stats.Significant(b), stats.Ratio(a, b))
				}
			}
		}
		var pages []time.Duration
		for _, n := range w.Pages {
			pages = append(pages, time.Duration(n))
		}
		fmt.Printf("%-7s %-13s p50  %12d\n", "", "warren pages", int64(stats.Percentile(pages, 50)))
	}
	fmt.Println("pause: warren Report.Pause, qemu query-migrate downtime (ms resolution); total: the whole snapshot or")
	fmt.Println("migration, writing included; bytes: warren's layer file (zstd), qemu's migration file. Ratios are warren/qemu.")
}

// incrementalJSON is measurement 1 for --json.
func incrementalJSON(res incrResult) map[string]any {
	out := map[string]any{}
	for k, sys := range res {
		o := map[string]any{}
		for name, s := range sys {
			e := map[string]any{
				"pause": stats.Summarise(name, s.Pause),
				"total": stats.Summarise(name, s.Total),
				"bytes": s.Bytes, // plain byte counts
			}
			if s.Pages != nil {
				e["pages"] = s.Pages
			}
			if s.Extra != nil {
				e["qemu_ram"] = s.Extra
			}
			o[name] = e
		}
		out[fmt.Sprintf("dirty_%d_mib", k)] = o
	}
	out["note"] = "warren: incremental snapshot after a full base; qemu: full live migration to a file (no incremental equivalent); bytes are byte counts"
	return out
}
