package main

import (
	"fmt"
	"os"
	"time"

	"github.com/warrenvm/warren/bench/stats"
)

// results is what one invocation (or a --merge) has recorded, and its
// --json file: written as a checkpoint after every recorded run, after
// each level and at the end, always through doc, so that --merge reads
// back whatever the last write left.
type results struct {
	c        config
	warren   []levelResult // levels done
	qemu     []levelResult
	withQEMU bool           // the peer ran ("qemu" is written; else qemuNote)
	qemuNote string         // why it did not
	extra    map[string]any // more top-level fields: the template, QEMU's file size, merged_from
	warned   bool           // a checkpoint failed to write (said once)
}

// levelJSON is one level of one system in the --json file.
type levelJSON struct {
	Clients  int           `json:"clients"`
	Summary  stats.Summary `json:"summary"` // with the samples (samples_ns)
	Failures []string      `json:"failures"`
	WallS    float64       `json:"wall_s"`          // merged: the sum over the invocations
	PerS     float64       `json:"per_s,omitempty"` // runs (ok and failed) per second of wall_s
	// Complete is false for a level in progress (a checkpoint) and, in a
	// merge, for one that any of the merged files had in progress. Files
	// from before checkpoints lack it: they only held complete levels.
	Complete *bool `json:"complete,omitempty"`
}

// levelsJSON is one system's levels for --json.
func levelsJSON(name string, rs []levelResult) []levelJSON {
	out := []levelJSON{}
	for _, r := range rs {
		complete := !r.Partial
		out = append(out, levelJSON{
			Clients: r.Clients, Summary: stats.Summarise(fmt.Sprintf("%s, %d clients", name, r.Clients), r.Samples),
			Failures: append([]string{}, r.Failures...), WallS: r.Wall.Seconds(), PerS: perSecond(r), Complete: &complete,
		})
	}
	return out
}

// levelFromJSON reads one level back.
func levelFromJSON(l levelJSON) levelResult {
	return levelResult{Clients: l.Clients, Samples: l.Summary.Samples, Failures: l.Failures,
		Wall: time.Duration(l.WallS * float64(time.Second)), Partial: l.Complete != nil && !*l.Complete}
}

// doc is the --json document of levels ws and qs (those done, and maybe
// one in progress); complete says the whole invocation is done.
func (rs *results) doc(ws, qs []levelResult, complete bool) map[string]any {
	c := rs.c
	out := map[string]any{
		"benchmark": "hostd", "what": "POST /v1/sandboxes {template} to its 201 answer (guest agent answering)",
		"mem_mib": c.memMiB, "complete": complete,
		"space":           map[string]any{"name": spaceName, "p50_ms": ms(spaceP50), "p90_ms": ms(spaceP90)},
		"warren":          levelsJSON("warren-hostd create", ws),
		"nested_kvm_host": c.nested,
		"encrypted":       c.encrypted,
	}
	if c.kernel != "" {
		out["kernel"], out["initramfs"] = c.kernel, c.initramfs
	}
	if c.runs > 0 {
		out["runs"] = c.runs
	}
	if c.nested {
		out["host_note"] = "inside the nested KVM host everything is emulated: compare the ratios to qemu, " +
			"not absolute figures (nor the ratios to SPACE's published figures)"
	}
	if rs.withQEMU {
		out["qemu"] = levelsJSON("qemu -incoming restore", qs)
	} else if rs.qemuNote != "" {
		out["qemu_note"] = rs.qemuNote
	}
	for k, v := range rs.extra {
		out[k] = v
	}
	return out
}

// writeJSON writes the levels done to --json (stats.WriteJSON: a
// temporary file renamed over it, never a torn one).
func (rs *results) writeJSON(complete bool) error {
	return stats.WriteJSON(rs.c.jsonOut, rs.doc(rs.warren, rs.qemu, complete))
}

// writeJSONIfAsked writes the final --json, if one was asked for.
func (rs *results) writeJSONIfAsked() error {
	if rs.c.jsonOut == "" {
		return nil
	}
	return rs.writeJSON(true)
}

// checkpoint is drive's onSample for system ("warren" or "qemu") with
// --json: it writes the levels done plus partial, the level in progress
// (marked incomplete), after each of its recorded runs. Only the JSON:
// the plot waits for the level's end. nil without --json.
func (rs *results) checkpoint(system string) func(partial levelResult) {
	if rs.c.jsonOut == "" {
		return nil
	}
	return func(partial levelResult) {
		partial.Partial = true
		ws, qs := rs.warren[:len(rs.warren):len(rs.warren)], rs.qemu[:len(rs.qemu):len(rs.qemu)]
		if system == "qemu" {
			qs = append(qs, partial)
		} else {
			ws = append(ws, partial)
		}
		if err := stats.WriteJSON(rs.c.jsonOut, rs.doc(ws, qs, false)); err != nil && !rs.warned {
			rs.warned = true
			fmt.Fprintf(os.Stdout, "warning: checkpoint: %v\n", err)
		}
	}
}
