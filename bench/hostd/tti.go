package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/bench/stats"
)

// Time to interactive (TTI): from asking for a sandbox to the answer of
// the first command run in it, the figure of the public ComputeSDK sandbox
// leaderboard. For warren-hostd, from sending POST /v1/sandboxes to the
// end of the answer of POST /v1/sandboxes/{id}/exec {"argv": ["true"]}
// (exit 0); for the QEMU peer, from its process start (-incoming from the
// migration file) to the end of the guest agent's answer to the same exec
// over AF_VSOCK. Each sandbox (or QEMU) is deleted (stopped) right after
// its own timing, not timed.
//
// Three ways the --tti-runs requests arrive (--tti): sequential (one at a
// time, each after the previous one's delete), staggered (one every
// --stagger, without waiting) and burst (all at once). warren-hostd
// queues what exceeds its restore slots (--max-restores), so a burst
// measures its admission control; QEMU processes are simply all started.

// ttiModes are --tti's known modes, in the order they run.
var ttiModes = []string{"sequential", "staggered", "burst"}

// ttiResult is one mode's samples for one system.
type ttiResult struct {
	Mode     string
	Samples  []time.Duration
	Failures []string
	Wall     time.Duration
}

// parseTTIModes parses --tti ("" or "none": no TTI runs).
func parseTTIModes(s string) ([]string, error) {
	if s == "" || s == "none" {
		return nil, nil
	}
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		known := false
		for _, m := range ttiModes {
			known = known || f == m
		}
		if !known {
			return nil, fmt.Errorf("bad --tti mode %q (sequential, staggered, burst)", f)
		}
		out = append(out, f)
	}
	return out, nil
}

// driveArrivals runs once runs times with mode's arrivals and returns the
// samples; stagger is the gap between staggered starts.
func driveArrivals(ctx context.Context, name, mode string, runs int, stagger time.Duration, once func(context.Context) (time.Duration, error)) ttiResult {
	r := ttiResult{Mode: mode}
	var mu sync.Mutex
	record := func(i int, lat time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			r.Failures = append(r.Failures, fmt.Sprintf("run %d: %s", i, oneLine(err)))
			fmt.Printf("tti %-10s run %3d/%d %-6s FAILED: %s\n", mode, i, runs, name, oneLine(err))
			return
		}
		r.Samples = append(r.Samples, lat)
		fmt.Printf("tti %-10s run %3d/%d %-6s %10s\n", mode, i, runs, name, stats.Significant(lat))
	}
	start := time.Now()
	if mode == "sequential" {
		for i := 1; i <= runs && ctx.Err() == nil; i++ {
			lat, err := once(ctx)
			record(i, lat, err)
		}
		r.Wall = time.Since(start)
		return r
	}
	var wg sync.WaitGroup
	for i := 1; i <= runs && ctx.Err() == nil; i++ {
		if mode == "staggered" && i > 1 {
			select {
			case <-time.After(time.Until(start.Add(time.Duration(i-1) * stagger))):
			case <-ctx.Done():
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat, err := once(ctx)
			record(i, lat, err)
		}()
	}
	wg.Wait()
	r.Wall = time.Since(start)
	return r
}

// warrenTTI is one warren-hostd TTI run: create, first exec, delete.
func warrenTTI(a *api, tpl string, c config) func(context.Context) (time.Duration, error) {
	return func(ctx context.Context) (time.Duration, error) {
		cctx, cancel := context.WithTimeout(ctx, c.createTimeout)
		defer cancel()
		start := time.Now()
		sb, _, err := a.create(cctx, tpl)
		if err == nil {
			err = a.execTrue(cctx, sb.ID)
		}
		lat := time.Since(start)
		if sb.ID != "" {
			discard(a, c, sb)
		}
		return lat, err
	}
}

// discard deletes sb after a timing (SIGTERMing its VMM first with
// --term-before-delete), outside the timing; a failure is a warning.
func discard(a *api, c config, sb sandbox) {
	if c.termFirst && sb.PID > 0 {
		termAndWait(sb.PID, 20*time.Second)
	}
	dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.deleteSandbox(dctx, sb.ID); err != nil {
		fmt.Printf("warning: delete %s: %v\n", sb.ID, err)
	}
}

// execTrue runs `true` in sandbox id and waits for its exit frame.
func (a *api) execTrue(ctx context.Context, id string) error {
	res, err := a.do(ctx, http.MethodPost, "/v1/sandboxes/"+id+"/exec", agentwire.ExecRequest{Argv: []string{"true"}}, "")
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
		return fmt.Errorf("exec: %s: %s", res.Status, bytes.TrimSpace(b))
	}
	sc := bufio.NewScanner(io.LimitReader(res.Body, 1<<20))
	for sc.Scan() {
		var f struct {
			Exit  *int   `json:"exit"`
			Error string `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
			return fmt.Errorf("exec frame %q: %w", sc.Bytes(), err)
		}
		switch {
		case f.Error != "":
			return fmt.Errorf("exec: %s", f.Error)
		case f.Exit != nil && *f.Exit != 0:
			return fmt.Errorf("exec true: exit %d", *f.Exit)
		case f.Exit != nil:
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return fmt.Errorf("exec: the stream ended without an exit")
}

// runTTI measures every --tti mode, warren-hostd then the peer (if any),
// and returns the results.
func runTTI(ctx context.Context, c config, a *api, tpl string, peer *qemuPeer) (ws, qs []ttiResult) {
	for _, m := range c.tti {
		fmt.Printf("\n== time to interactive, %s: %d warren-hostd creates + first exec\n", m, c.ttiRuns)
		ws = append(ws, driveArrivals(ctx, "warren", m, c.ttiRuns, c.stagger, warrenTTI(a, tpl, c)))
		if peer != nil && ctx.Err() == nil {
			fmt.Printf("\n== time to interactive, %s: %d qemu -incoming restores + first exec\n", m, c.ttiRuns)
			qs = append(qs, driveArrivals(ctx, "qemu", m, c.ttiRuns, c.stagger, peer.tti))
		}
	}
	return ws, qs
}

// printTTITable prints p50/p90/p99 of each mode, warren-hostd and the
// peer, with the ratio.
func printTTITable(w io.Writer, c config, ws, qs []ttiResult) {
	fmt.Fprintf(w, "time to interactive (create + the first exec's answer), %d runs per mode, staggered every %s, guest %d MiB\n", c.ttiRuns, c.stagger, c.memMiB)
	fmt.Fprintf(w, "%-10s %-4s %12s %12s %12s\n", "mode", "", "warren-hostd", "qemu", "warren/qemu")
	for _, wr := range ws {
		var qr *ttiResult
		for i := range qs {
			if qs[i].Mode == wr.Mode {
				qr = &qs[i]
			}
		}
		for pi, p := range percentiles {
			lvl := ""
			if pi == 0 {
				lvl = wr.Mode
			}
			av, qv, ratio := "-", "-", "-"
			var a time.Duration
			if len(wr.Samples) > 0 {
				a = stats.Percentile(wr.Samples, p)
				av = stats.Significant(a).String()
			}
			if qr != nil && len(qr.Samples) > 0 {
				b := stats.Percentile(qr.Samples, p)
				qv = stats.Significant(b).String()
				if a != 0 {
					ratio = fmt.Sprintf("%.2f", stats.Ratio(a, b))
				}
			}
			fmt.Fprintf(w, "%-10s p%-3.0f %12s %12s %12s\n", lvl, p, av, qv, ratio)
		}
	}
	for _, set := range []struct {
		name string
		rs   []ttiResult
	}{{"warren", ws}, {"qemu", qs}} {
		for _, r := range set.rs {
			fmt.Fprintf(w, "tti %s %s: %d ok, %d failed, wall %s\n", set.name, r.Mode, len(r.Samples), len(r.Failures), r.Wall.Round(time.Millisecond))
			if len(r.Failures) > 0 {
				fmt.Fprintf(w, "FAILED tti %s %s: first: %s\n", set.name, r.Mode, r.Failures[0])
			}
		}
	}
}

// ttiJSON is the "tti" member of --json.
func ttiJSON(c config, ws, qs []ttiResult) map[string]any {
	conv := func(name string, rs []ttiResult) []map[string]any {
		out := []map[string]any{}
		for _, r := range rs {
			out = append(out, map[string]any{"mode": r.Mode,
				"summary":  stats.Summarise(fmt.Sprintf("%s tti, %s", name, r.Mode), r.Samples),
				"failures": append([]string{}, r.Failures...), "wall_s": r.Wall.Seconds()})
		}
		return out
	}
	out := map[string]any{
		"what":      "create + the first exec's answer (true, exit 0); qemu: process start (-incoming) to the agent's answer to the same exec",
		"runs":      c.ttiRuns,
		"stagger_s": c.stagger.Seconds(),
		"warren":    conv("warren-hostd", ws),
	}
	if len(qs) > 0 {
		out["qemu"] = conv("qemu -incoming", qs)
	}
	return out
}

// ttiPlot is the TTI PNG: one CDF per mode and system (warren solid,
// qemu dashed, one colour per mode).
func ttiPlot(c config, ws, qs []ttiResult) plot {
	p := plot{
		Title:  fmt.Sprintf("time to interactive (create + first exec), %d runs per mode, guest %d MiB", c.ttiRuns, c.memMiB),
		XLabel: "time to interactive (request to the first exec's answer; qemu: process start to it)",
	}
	if c.nested {
		p.Title += " (nested KVM host: emulated)"
	}
	for i, r := range ws {
		p.Series = append(p.Series, series{Label: "warren-hostd, " + r.Mode, Samples: r.Samples, Color: palette[i%len(palette)]})
		for _, q := range qs {
			if q.Mode == r.Mode {
				p.Series = append(p.Series, series{Label: "qemu -incoming, " + q.Mode, Samples: q.Samples, Color: palette[i%len(palette)], Dashed: true})
			}
		}
	}
	return p
}

// reportTTI prints the TTI table and writes its plot.
func reportTTI(c config, ws, qs []ttiResult) error {
	fmt.Println()
	printTTITable(os.Stdout, c, ws, qs)
	if c.ttiPNG == "" {
		return nil
	}
	if err := writePNG(c.ttiPNG, ttiPlot(c, ws, qs)); err != nil {
		return err
	}
	fmt.Printf("plot: %s\n", c.ttiPNG)
	return nil
}
