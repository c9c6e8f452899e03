package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warrenvm/warren/bench/stats"
	"github.com/warrenvm/warren/memsnap/uffd"
)

func TestParseVariants(t *testing.T) {
	got, err := parseVariants("eager, mmap,uffd,uffd-prefetch,qemu")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"eager", "lazy", "uffd", "uffd-prefetch", "qemu"} {
		if !got[v] {
			t.Errorf("%s not selected: %v", v, got)
		}
	}
	if got, _ := parseVariants("eager,lazy,qemu"); len(got) != 3 || !got["lazy"] || got["uffd"] {
		t.Errorf("the old default selects %v", got)
	}
	for _, bad := range []string{"eager,lzy", "", "warren eager"} {
		if _, err := parseVariants(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestWarrenRestoreArgv(t *testing.T) {
	c := config{}
	c.Warren = "bin/warren"
	src := restoreSources{workingSetWarm: "/w/ws", workingSetCold: "/c/ws"}
	for _, tc := range []struct {
		v    variant
		want string // the flags between --timing FILE and the snapshot
	}{
		{restoreVariants[0], ""},
		{restoreVariants[1], "--lazy"},
		{restoreVariants[2], "--lazy=uffd"},
		{restoreVariants[3], "--lazy=uffd --prefetch /w/ws"},
		{variant{name: "warren uffd-prefetch", system: "warren", mode: "uffd", prefetch: true, cold: true}, "--lazy=uffd --prefetch /c/ws"},
	} {
		argv := warrenRestoreArgv(c, tc.v, src, "SNAP", "/run")
		want := strings.Fields("bin/warren restore --vsock /run/vsock --api /run/api --console /dev/null --timing /run/timing " + tc.want + " SNAP")
		if !slices.Equal(argv, want) {
			t.Errorf("%s: %q, want %q", tc.v.key(), argv, want)
		}
	}
}

func TestParseStatFaults(t *testing.T) {
	// A command name with a space and a parenthesis; minflt 1234 (field
	// 10), majflt 56 (field 12).
	stat := "4242 (we ir)d) S 1 4242 4242 0 -1 4194560 1234 0 56 0 10 20 0 0 20 0 9 0 100 1000 50\n"
	n, err := parseStatFaults([]byte(stat))
	if err != nil || n != 1290 {
		t.Errorf("faults %d, %v; want 1290", n, err)
	}
	if _, err := parseStatFaults([]byte("4242 (x) S 1 2")); err == nil {
		t.Error("a short stat line was accepted")
	}
}

func TestParseSmapsRAM(t *testing.T) {
	smaps := `00400000-00800000 r-xp 00000000 fd:01 123 /usr/bin/warren
Rss:                4000 kB
7f0000000000-7f0010000000 rw-s 00000000 00:01 77 /memfd:warren-guest-ram (deleted)
Size:             262144 kB
Rss:               16384 kB
Pss:               16384 kB
VmFlags: rd wr sh mr mw me ms sd um
7f1000000000-7f1010000000 rw-p 00000000 fd:01 99 /tmp/snaps/base.0123abcd.wraw
Rss:                  64 kB
7f2000000000-7f2000001000 rw-p 00000000 00:00 0
Rss:                   4 kB
`
	n, err := parseSmapsRAM(strings.NewReader(smaps))
	if err != nil || n != (16384+64)/4 {
		t.Errorf("RAM pages %d, %v; want %d", n, err, (16384+64)/4)
	}
}

// TestPrintRestores renders a table with every variant and checks its
// rows: each Warren variant's figures, the uffd counters only for uffd
// variants, QEMU's column and ratios, and the failures.
func TestPrintRestores(t *testing.T) {
	c := config{restoreRuns: 2, memMiB: 256, caches: map[string]bool{"warm": true}}
	sample := func(pages uint64, st *uffd.Stats) *restoreSeries {
		s := &restoreSeries{}
		for i := range 2 {
			v := variant{system: "warren"}
			s.add(v, restoreSample{first: 10 * time.Millisecond, health: time.Duration(100+i) * time.Millisecond,
				faults: 1000 + pages, ramPages: pages, bytes: pages * pageSize, uffd: st})
		}
		return s
	}
	res := map[string]*restoreSeries{
		"warm warren eager":         sample(60000, nil),
		"warm warren lazy":          sample(5000, nil),
		"warm warren uffd":          sample(4000, &uffd.Stats{Faults: 300, EnsuredPages: 20, BytesDecompressed: 8 << 20}),
		"warm warren uffd-prefetch": sample(4100, &uffd.Stats{Faults: 7, EnsuredPages: 1}),
		"warm qemu":                 {Health: stats.Millis(200, 200), Faults: []uint64{50000, 50000}, Bytes: []uint64{64 << 20, 64 << 20}},
	}
	res["warm warren uffd"].Failures = []string{"round 1: timed out"}
	var b bytes.Buffer
	printRestores(&b, c, res, nil)
	out := b.String()
	for _, want := range []string{
		"warm  eager         first KVM_RUN  p50          10ms            -        -",
		"      lazy (mmap)   first KVM_RUN",
		"                    agent answer   p50         100ms        200ms     0.50",
		"                    VMM faults     p50         61000        50000     1.22",
		"                    RAM pages      p50          5000            -        -",
		"                    read (MiB)     p50          15.6         64.0     0.24",
		"      uffd          first KVM_RUN",
		"                    uffd faults    p50           320            -        -",
		"      uffd-prefetch first KVM_RUN",
		"                    uffd faults    p50             8            -        -",
		"FAILED warm warren uffd: 1 of 2 runs",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no line %q in:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "uffd faults"); n != 2+1 { // two variants' rows, and the footer
		t.Errorf("%d uffd fault rows and mentions, want 3:\n%s", n, out)
	}
}

// TestRestoreJSONCounts writes the memory figures to JSON and merges them
// back.
func TestRestoreJSONCounts(t *testing.T) {
	c := config{restoreRuns: 1, memMiB: 256}
	s := &restoreSeries{}
	s.add(variant{system: "warren"}, restoreSample{first: time.Millisecond, health: 2 * time.Millisecond, faults: 7, ramPages: 8, bytes: 9,
		uffd: &uffd.Stats{Faults: 3, EnsuredPages: 2}})
	p := filepath.Join(t.TempDir(), "a.json")
	if err := stats.WriteJSON(p, map[string]any{"restore": restoreJSON(c, map[string]*restoreSeries{"warm warren uffd": s})}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "merged.json")
	old := os.Stdout
	os.Stdout, _ = os.Open(os.DevNull)
	err := mergeRestores([]string{p, p}, out)
	os.Stdout = old
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Restore map[string]json.RawMessage `json:"restore"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	var e struct {
		Faults     countSummary `json:"vmm_faults"`
		RAMPages   countSummary `json:"ram_pages"`
		Bytes      countSummary `json:"bytes_read"`
		UffdFaults countSummary `json:"uffd_faults"`
		Uffd       []uffd.Stats `json:"uffd_stats"`
	}
	if err := json.Unmarshal(doc.Restore["warm warren uffd"], &e); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(e.Faults.Samples, []uint64{7, 7}) || !slices.Equal(e.RAMPages.Samples, []uint64{8, 8}) ||
		!slices.Equal(e.Bytes.Samples, []uint64{9, 9}) || !slices.Equal(e.UffdFaults.Samples, []uint64{5, 5}) ||
		e.UffdFaults.P50 != 5 || len(e.Uffd) != 2 {
		t.Errorf("merged %+v", e)
	}
}

func TestNeedsQEMU(t *testing.T) {
	only := map[string]bool{"eager": true, "uffd": true}
	withQ := map[string]bool{"eager": true, "qemu": true}
	for _, tc := range []struct {
		c    config
		want bool
	}{
		{config{skipIncremental: true, variants: only}, false},
		{config{skipIncremental: true, variants: withQ}, true},
		{config{skipIncremental: true, skipRestore: true, variants: withQ}, false},
		{config{variants: only}, true}, // measurement 1 compares with QEMU
	} {
		if got := tc.c.needsQEMU(); got != tc.want {
			t.Errorf("%+v: needsQEMU %v, want %v", tc.c, got, tc.want)
		}
	}
}
