package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

// resultsFile is what --merge reads of a --json file (complete, or a
// checkpoint left by a host that froze mid-run).
type resultsFile struct {
	Benchmark string      `json:"benchmark"`
	MemMiB    int         `json:"mem_mib"`
	Nested    bool        `json:"nested_kvm_host"`
	Encrypted bool        `json:"encrypted"`
	Complete  bool        `json:"complete"`
	Warren    []levelJSON `json:"warren"`
	QEMU      []levelJSON `json:"qemu"`
	QEMUNote  string      `json:"qemu_note"`
}

// mergeResults reads the --json files of several invocations (each in a
// fresh host: the nested KVM host freezes in long runs) and prints, plots
// (c.pngOut) and writes (c.jsonOut) all their runs together, per system
// and level (clients, ascending), as if one invocation had made them:
// samples and failures concatenated, walls summed. The files must agree
// on the guest's memory and on the host (nested or not).
func mergeResults(w io.Writer, files []string, c config) error {
	if len(files) == 0 {
		return fmt.Errorf("--merge: no files")
	}
	type key struct {
		system  string
		clients int
	}
	merged := map[key]*levelResult{}
	rs := &results{extra: map[string]any{"merged_from": files}}
	complete := true
	var partial []string
	for i, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var doc resultsFile
		if err := json.Unmarshal(b, &doc); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if doc.Benchmark != "hostd" {
			return fmt.Errorf("%s: not a bench/hostd result (benchmark %q)", f, doc.Benchmark)
		}
		if doc.MemMiB <= 0 {
			return fmt.Errorf("%s: no mem_mib", f)
		}
		if i == 0 {
			c.memMiB, c.nested, c.encrypted = doc.MemMiB, doc.Nested, doc.Encrypted
		} else if doc.Encrypted != c.encrypted {
			return fmt.Errorf("%s: encrypted %v, %s's %v: runs of a tenant with and without a key do not merge", f, doc.Encrypted, files[0], c.encrypted)
		} else if doc.MemMiB != c.memMiB {
			return fmt.Errorf("%s: guest of %d MiB, %s's of %d MiB: runs of different guests do not merge", f, doc.MemMiB, files[0], c.memMiB)
		} else if doc.Nested != c.nested {
			return fmt.Errorf("%s: nested_kvm_host %v, %s's %v: emulated and native runs do not merge", f, doc.Nested, files[0], c.nested)
		}
		if !doc.Complete {
			complete = false
			partial = append(partial, f)
		}
		if doc.QEMU != nil {
			rs.withQEMU = true
		} else if rs.qemuNote == "" {
			rs.qemuNote = doc.QEMUNote
		}
		for _, set := range []struct {
			system string
			ls     []levelJSON
		}{{"warren", doc.Warren}, {"qemu", doc.QEMU}} {
			for _, l := range set.ls {
				r := levelFromJSON(l)
				k := key{set.system, r.Clients}
				m := merged[k]
				if m == nil {
					m = &levelResult{Clients: r.Clients}
					merged[k] = m
				}
				m.Samples = append(m.Samples, r.Samples...)
				m.Failures = append(m.Failures, r.Failures...)
				m.Wall += r.Wall
				m.Partial = m.Partial || r.Partial
			}
		}
	}
	var keys []key
	for k := range merged {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].clients < keys[j].clients })
	for _, k := range keys {
		if k.system == "warren" {
			rs.warren = append(rs.warren, *merged[k])
		} else {
			rs.qemu = append(rs.qemu, *merged[k])
		}
	}
	if rs.withQEMU {
		rs.qemuNote = ""
	}
	c.runs, c.kernel, c.initramfs = 0, "", "" // per level, in the data; the files' own
	rs.c = c
	rs.extra["wall_note"] = "merged: wall_s is the sum of the invocations' walls, per_s the runs over it"

	fmt.Fprintf(w, "merged from %d invocations: %s\n", len(files), strings.Join(files, " "))
	if len(partial) > 0 {
		fmt.Fprintf(w, "cut short (checkpoints): %s\n", strings.Join(partial, " "))
	}
	printTable(w, c, rs.warren, rs.qemu)
	if rs.qemuNote != "" {
		fmt.Fprintln(w, rs.qemuNote)
	}
	if c.nested {
		fmt.Fprintln(w, "(in the nested KVM host: every figure is emulated; compare the ratio to qemu, not the absolute times)")
	}
	if c.pngOut != "" {
		if err := writePNG(c.pngOut, latencyPlot(c, rs.warren, rs.qemu)); err != nil {
			return err
		}
		fmt.Fprintf(w, "plot: %s\n", c.pngOut)
	}
	if c.jsonOut != "" {
		if err := rs.writeJSON(complete); err != nil {
			return err
		}
		fmt.Fprintf(w, "json: %s\n", c.jsonOut)
	}
	return nil
}
