package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/bench/agentdial"
	"github.com/warrenvm/warren/bench/proc"
	"github.com/warrenvm/warren/bench/qemu"
	"github.com/warrenvm/warren/bench/rig"
	"github.com/warrenvm/warren/bench/stats"
	"github.com/warrenvm/warren/devices/virtio/vsock"
	"github.com/warrenvm/warren/memsnap/uffd"
	"github.com/warrenvm/warren/vmmctl"
)

// restoreSources are the snapshots restored: Warren's DIR/NAME and QEMU's
// migration file, each in the warm and the cold directory, and what
// saveRestoreSources learnt of them.
type restoreSources struct {
	warrenWarm, warrenCold, qemuWarm, qemuCold string
	// warrenPages is the pages in Warren's snapshot (all of them decoded
	// by an eager restore); qemuBytes the migration file's size (all of
	// it read by -incoming).
	warrenPages uint64
	qemuBytes   int64
	// workingSetWarm and workingSetCold are the uffd working set recorded
	// for the uffd-prefetch variant (recordWorkingSet), in each directory.
	workingSetWarm, workingSetCold string
}

// saveRestoreSources snapshots both idle VMs once (Warren's alone when q
// is nil) and copies the files to the cold directory.
func saveRestoreSources(w, q *vm, src *restoreSources) (map[string]any, error) {
	for _, d := range []string{filepath.Dir(src.warrenWarm), filepath.Dir(src.warrenCold)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	r, err := w.warrenSnapshot(src.warrenWarm, "full", 5*time.Minute)
	if err != nil {
		return nil, err
	}
	var m qemu.Migration
	if q != nil {
		if m, err = q.qemuMigrate(src.qemuWarm, 5*time.Minute); err != nil {
			return nil, err
		}
	}
	ents, err := os.ReadDir(filepath.Dir(src.warrenWarm))
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if err := copyFile(filepath.Join(filepath.Dir(src.warrenWarm), e.Name()), filepath.Join(filepath.Dir(src.warrenCold), e.Name())); err != nil {
			return nil, err
		}
	}
	if q != nil {
		if err := copyFile(src.qemuWarm, src.qemuCold); err != nil {
			return nil, err
		}
	}
	src.warrenPages, src.qemuBytes = r.Pages, m.Bytes
	fmt.Printf("restore sources (idle guests): warren full snapshot %d pages, layer %.1f MiB, state %d bytes", r.Pages, mib(r.LayerBytes), r.StateBytes)
	if q != nil {
		fmt.Printf("; qemu migration file %.1f MiB", mib(m.Bytes))
	}
	fmt.Println()
	info := map[string]any{"warren_pages": r.Pages, "warren_layer_bytes": r.LayerBytes, "warren_state_bytes": r.StateBytes}
	if q != nil {
		info["qemu_file_bytes"] = m.Bytes
	}
	return info, nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// variant is one way of restoring.
type variant struct {
	name   string // a key of restoreVariants: "warren eager", ..., "qemu"
	cold   bool
	system string // "warren" or "qemu"
	// mode is Warren's memory mode (vmsnap.MemoryMode: "eager", "mmap",
	// "uffd"); prefetch adds --prefetch with the recorded working set.
	mode     string
	prefetch bool
}

// restoreVariants are the restore variants, in table order: the name
// --variants selects them by (the part after "warren "; "mmap" also
// selects "warren lazy", the name earlier JSON files have) and how each
// restores.
var restoreVariants = []variant{
	{name: "warren eager", system: "warren", mode: "eager"},
	{name: "warren lazy", system: "warren", mode: "mmap"},
	{name: "warren uffd", system: "warren", mode: "uffd"},
	{name: "warren uffd-prefetch", system: "warren", mode: "uffd", prefetch: true},
	{name: "qemu", system: "qemu"},
}

// parseVariants reads --variants: comma-separated eager, lazy (or mmap),
// uffd, uffd-prefetch and qemu. It returns the selected variants' names.
func parseVariants(list string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, v := range strings.Split(list, ",") {
		v = strings.TrimSpace(v)
		if v == "mmap" {
			v = "lazy"
		}
		ok := false
		for _, rv := range restoreVariants {
			if strings.TrimPrefix(rv.name, "warren ") == v {
				ok = true
			}
		}
		if !ok {
			return nil, fmt.Errorf("--variants: unknown variant %q (want eager, lazy or mmap, uffd, uffd-prefetch, qemu)", v)
		}
		out[v] = true
	}
	return out, nil
}

// display is the variant's name in the table.
func (v variant) display() string {
	if v.name == "warren lazy" {
		return "lazy (mmap)"
	}
	return strings.TrimPrefix(v.name, "warren ")
}

func (v variant) key() string {
	c := "warm"
	if v.cold {
		c = "cold"
	}
	return c + " " + v.name
}

// restoreSeries are one variant's samples.
type restoreSeries struct {
	FirstRun []time.Duration // process start to the first KVM_RUN (Warren)
	Health   []time.Duration // process start to the agent's first answer
	// The memory each run had brought in when the agent answered (see
	// restoreSample; empty in JSON files of earlier versions).
	Faults   []uint64
	RAMPages []uint64
	Bytes    []uint64
	// UffdFaults (uffd variants) is the fault server's demands: faults
	// served plus pages Ensure installed for the VMM's devices; Uffd its
	// whole counters.
	UffdFaults []uint64
	Uffd       []uffd.Stats
	// Failures are the runs whose agent did not answer within
	// --restore-timeout (or that failed otherwise): counted, not timed.
	Failures []string
}

// restoreSample is one restore's figures.
type restoreSample struct {
	first, health time.Duration
	// faults is the VMM process's page faults at the answer (procFaults).
	faults uint64
	// ramPages (Warren) is the guest RAM pages resident in the VMM
	// (guestRAMResident).
	ramPages uint64
	// bytes is what the restore read of the snapshot by the answer:
	// eager, every page decoded (the snapshot's pages x 4 KiB, before
	// the first KVM_RUN); mmap, the flattened image's pages mapped
	// (ramPages x 4 KiB: each read from the file or its page cache);
	// uffd, the bytes the fault server decompressed (whole chunks,
	// prefetched ones included); qemu, the migration file, all read by
	// -incoming.
	bytes uint64
	// uffd (uffd variants) is the fault server's counters at the answer.
	uffd *uffd.Stats
}

// add appends sample r.
func (s *restoreSeries) add(v variant, r restoreSample) {
	if v.system == "warren" {
		s.FirstRun = append(s.FirstRun, r.first)
		s.RAMPages = append(s.RAMPages, r.ramPages)
	}
	s.Health = append(s.Health, r.health)
	s.Faults = append(s.Faults, r.faults)
	s.Bytes = append(s.Bytes, r.bytes)
	if r.uffd != nil {
		s.UffdFaults = append(s.UffdFaults, r.uffd.Faults+r.uffd.EnsuredPages)
		s.Uffd = append(s.Uffd, *r.uffd)
	}
}

// restores runs measurement 2: the warm variants, then the cold ones, as
// restoreBlock does.
func restores(c config, src restoreSources, work string) (map[string]*restoreSeries, error) {
	var vs []variant
	for _, cold := range []bool{false, true} {
		if !c.caches[map[bool]string{false: "warm", true: "cold"}[cold]] {
			continue
		}
		for _, v := range restoreVariants {
			if c.variants[strings.TrimPrefix(v.name, "warren ")] {
				v.cold = cold
				vs = append(vs, v)
			}
		}
	}
	res := map[string]*restoreSeries{}
	for _, v := range vs {
		res[v.key()] = &restoreSeries{}
	}
	runDir := filepath.Join(work, "run")
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return nil, err
	}
	if c.variants["uffd-prefetch"] {
		if err := recordWorkingSet(c, &src, runDir); err != nil {
			return nil, fmt.Errorf("recording the working set for uffd-prefetch: %w", err)
		}
	}
	// All warm runs first, then all cold ones: a cold run's drop_caches
	// also evicts the VMMs' binaries, which a warm run should find cached.
	var blocks [][]variant
	for _, cold := range []bool{false, true} {
		var b []variant
		for _, v := range vs {
			if v.cold == cold {
				b = append(b, v)
			}
		}
		if len(b) > 0 {
			blocks = append(blocks, b)
		}
	}
	t0 := time.Now()
	for _, vs := range blocks {
		if err := restoreBlock(c, vs, src, runDir, res, t0); err != nil {
			return nil, err
		}
		fmt.Println()
		printRestores(os.Stdout, c, res, nil) // so far: a later block that hangs the host leaves this one's table
		fmt.Println()
	}
	return res, nil
}

// restoreBlock runs variants vs: each once unrecorded, then c.restoreRuns
// rounds of one run each, the order rotated every round.
func restoreBlock(c config, vs []variant, src restoreSources, runDir string, res map[string]*restoreSeries, t0 time.Time) error {
	for rd := -1; rd < c.restoreRuns; rd++ { // round -1: warm-up
		for i := range vs {
			v := vs[(i+max(rd, 0))%len(vs)]
			r, err := restoreOnce(c, v, src, runDir)
			s := res[v.key()]
			if err != nil {
				msg := fmt.Sprintf("round %d: %v", rd+1, err)
				fmt.Printf("%s restore FAILED, %s\n", v.key(), msg)
				if rd >= 0 {
					s.Failures = append(s.Failures, msg)
				}
				continue
			}
			label := fmt.Sprintf("round %d", rd+1)
			if rd < 0 {
				label = "warm-up"
			}
			fmt.Printf("%-8s %-25s first KVM_RUN %8s agent %8s %s\n", label, v.key(), stats.Significant(r.first), stats.Significant(r.health), r.memory())
			if rd < 0 {
				continue
			}
			s.add(v, r)
		}
		fmt.Printf("restore round %d of %d done (%s)\n", rd+1, c.restoreRuns, time.Since(t0).Round(time.Second))
		if rd >= 0 && c.jsonOut != "" {
			// A checkpoint: when the host hangs later (the nested KVM
			// host has), the rounds done so far are kept; the complete
			// result replaces it at the end.
			partial := map[string]any{"benchmark": "snapshot", "partial": true, "mem_mib": c.memMiB, "touch_mib": c.touchMiB,
				"restore": restoreJSON(c, res)}
			if err := stats.WriteJSON(c.jsonOut, partial); err != nil {
				return err
			}
		}
	}
	return nil
}

// warrenRestoreArgv is `warren restore` of snap for variant v, with its
// vsock, control API and timing files in runDir (--api for every Warren
// variant, so that they differ in their memory mode only: it also turns
// on KVM's dirty-page logging, for all alike).
func warrenRestoreArgv(c config, v variant, src restoreSources, snap, runDir string) []string {
	argv := []string{c.Warren, "restore", "--vsock", filepath.Join(runDir, "vsock"), "--api", filepath.Join(runDir, "api"),
		"--console", "/dev/null", "--timing", filepath.Join(runDir, "timing")}
	switch v.mode {
	case "mmap":
		argv = append(argv, "--lazy")
	case "uffd":
		argv = append(argv, "--lazy=uffd")
		if v.prefetch {
			ws := src.workingSetWarm
			if v.cold {
				ws = src.workingSetCold
			}
			argv = append(argv, "--prefetch", ws)
		}
	}
	return append(argv, snap)
}

// clearRunDir removes the files a previous restore left in runDir.
func clearRunDir(runDir string) {
	for _, f := range []string{"timing", "vsock", "api"} {
		os.Remove(filepath.Join(runDir, f))
	}
}

// waitHealth asks the agent for GET /health until it answers, the process
// exits or deadline passes, and returns when it answered.
func waitHealth(client *agentclient.Client, pg *rig.Group, argv0 string, deadline time.Time, limit time.Duration) (time.Time, error) {
	for {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		_, herr := client.Health(ctx)
		cancel()
		if herr == nil {
			return time.Now(), nil
		}
		select {
		case <-pg.Exited:
			return time.Time{}, fmt.Errorf("%s pg.Exited: %s", argv0, tail(pg.Out.String()))
		default:
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("agent did not answer in %s: %w; output: %s", limit, herr, tail(pg.Out.String()))
		}
		time.Sleep(time.Millisecond)
	}
}

// warrenAgent is a client of the restored guest's agent over the vsock
// socket in runDir.
func warrenAgent(runDir string) *agentclient.Client {
	sock := filepath.Join(runDir, "vsock")
	return agentclient.NewDial(agentdial.Racing(func(ctx context.Context) (net.Conn, error) { return vsock.Dial(ctx, sock, agentwire.Port) }))
}

// recordWorkingSet makes the working set the uffd-prefetch variant
// prefetches: one unrecorded uffd restore of the warm snapshot with
// --record-working-set, which the control API saves once the agent has
// answered (POST /v1/working-set/save); the file is copied beside the
// cold snapshot.
func recordWorkingSet(c config, src *restoreSources, runDir string) error {
	ws := filepath.Join(filepath.Dir(src.warrenWarm), "working-set")
	os.Remove(ws)
	clearRunDir(runDir)
	v := variant{name: "warren uffd", system: "warren", mode: "uffd"}
	argv := warrenRestoreArgv(c, v, *src, src.warrenWarm, runDir)
	snap := argv[len(argv)-1]
	argv = append(argv[:len(argv)-1], "--record-working-set", ws, snap)
	client := warrenAgent(runDir)
	defer client.Close()
	pg, err := rig.StartGroup(argv)
	if err != nil {
		return err
	}
	defer proc.StopGroup(pg.Cmd.Process.Pid, pg.Exited, argv[0])
	if _, err := waitHealth(client, pg, argv[0], pg.Started.Add(c.restoreTimeout), c.restoreTimeout); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := vmmctl.Client{Socket: filepath.Join(runDir, "api")}.SaveWorkingSet(ctx)
	if err != nil {
		return err
	}
	src.workingSetWarm = ws
	src.workingSetCold = filepath.Join(filepath.Dir(src.warrenCold), "working-set")
	if err := copyFile(ws, src.workingSetCold); err != nil {
		return err
	}
	fmt.Printf("uffd working set recorded to the agent's answer (%s): %d pages in %d runs\n",
		time.Since(pg.Started).Round(time.Millisecond), rep.Pages, rep.Runs)
	return nil
}

// qemuRestores counts QEMU restores, for their guest CIDs.
var qemuRestores int

// restoreOnce restores one snapshot and returns process start to the first
// KVM_RUN (0 for QEMU) and to the agent's first answer, and the memory the
// VMM had brought in by then; the VMM is killed after.
func restoreOnce(c config, v variant, src restoreSources, runDir string) (r restoreSample, err error) {
	clearRunDir(runDir)
	var argv []string
	var client *agentclient.Client
	switch v.system {
	case "warren":
		snap := src.warrenWarm
		if v.cold {
			snap = src.warrenCold
		}
		argv = warrenRestoreArgv(c, v, src, snap, runDir)
		client = warrenAgent(runDir)
	case "qemu":
		file := src.qemuWarm
		if v.cold {
			file = src.qemuCold
		}
		// A fresh guest CID for each restore (the guest re-reads it on
		// the transport reset after migration): reusing one while the
		// previous QEMU's vhost-vsock may still be tearing down was the
		// one thing these runs did that bench/fork's did not, and the
		// nested host stalled within a few rounds of them.
		qemuRestores++
		g := qemuGuest(c)
		g.CID = c.qemuCID + qemuRestores
		argv = append(qemu.Argv(g, ""), "-incoming", "exec:cat "+file)
		client = qemu.AgentClient(uint32(g.CID), agentdial.Racing)
	}
	defer client.Close()
	if v.cold {
		if err := dropCaches(); err != nil {
			return r, fmt.Errorf("drop caches: %w", err)
		}
	}
	pg, err := rig.StartGroup(argv)
	if err != nil {
		return r, err
	}
	start := pg.Started
	// Stopped as a user would (proc.StopGroup).
	defer proc.StopGroup(pg.Cmd.Process.Pid, pg.Exited, argv[0])
	answered, err := waitHealth(client, pg, argv[0], start.Add(c.restoreTimeout), c.restoreTimeout)
	if err != nil {
		return r, err
	}
	r.health = answered.Sub(start)
	if err := r.probe(v, src, pg.Cmd.Process.Pid, runDir); err != nil {
		return r, err
	}
	if v.system == "warren" {
		timing := filepath.Join(runDir, "timing")
		for {
			b, err := os.ReadFile(timing)
			if err == nil && strings.HasSuffix(string(b), "\n") {
				ns, perr := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				if perr != nil {
					return r, fmt.Errorf("--timing file: %w", perr)
				}
				r.first = time.Unix(0, ns).Sub(start)
				break
			}
			if time.Since(start) > r.health+10*time.Second {
				return r, errors.New("no --timing file 10s after the agent answered")
			}
			time.Sleep(time.Millisecond)
		}
	}
	return r, nil
}

// probe reads, right after the agent answered, the memory the VMM (pid)
// had brought in (restoreSample): the fault server's counters first (uffd
// variants; a VMM that fell back to mmap is a failed run), then /proc.
func (r *restoreSample) probe(v variant, src restoreSources, pid int, runDir string) error {
	if v.mode == "uffd" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ws, err := vmmctl.Client{Socket: filepath.Join(runDir, "api")}.WorkingSet(ctx)
		cancel()
		if err != nil {
			return fmt.Errorf("GET /v1/working-set: %w", err)
		}
		if ws.Mode != "uffd" || ws.Stats == nil {
			return fmt.Errorf("the VMM restored in memory mode %q, not uffd (no userfaultfd on this host?)", ws.Mode)
		}
		r.uffd = ws.Stats
		r.bytes = ws.Stats.BytesDecompressed
	}
	var err error
	if r.faults, err = procFaults(pid); err != nil {
		return err
	}
	switch v.system {
	case "qemu":
		r.bytes = uint64(src.qemuBytes)
		return nil
	}
	if r.ramPages, err = guestRAMResident(pid); err != nil {
		return err
	}
	switch v.mode {
	case "eager":
		r.bytes = src.warrenPages * pageSize
	case "mmap":
		r.bytes = r.ramPages * pageSize
	}
	return nil
}

// memory is the sample's memory figures, for the progress lines.
func (r restoreSample) memory() string {
	s := fmt.Sprintf("faults %d read %.1f MiB", r.faults, mib(int64(r.bytes)))
	if r.ramPages != 0 {
		s += fmt.Sprintf(" RAM pages %d", r.ramPages)
	}
	if r.uffd != nil {
		s += fmt.Sprintf(" uffd faults %d ensured %d", r.uffd.Faults, r.uffd.EnsuredPages)
	}
	return s
}

func tail(s string) string {
	if len(s) > 800 {
		s = s[len(s)-800:]
	}
	return strings.TrimSpace(s)
}

// printRestores prints measurement 2's table to w.
func printRestores(w io.Writer, c config, res map[string]*restoreSeries, srcInfo map[string]any) {
	fmt.Fprintf(w, "restore latency, %d runs per variant (after one unrecorded each), guest %d MiB idle:\n", c.restoreRuns, c.memMiB)
	if srcInfo != nil {
		fmt.Fprintf(w, "  warren full snapshot %v pages, layer %v bytes", srcInfo["warren_pages"], srcInfo["warren_layer_bytes"])
		if qb, ok := srcInfo["qemu_file_bytes"]; ok {
			fmt.Fprintf(w, "; qemu migration file %v bytes", qb)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "%-5s %-13s %-14s %-4s %12s %12s %8s\n", "cache", "warren", "from start to", "", "warren", "qemu", "ratio")
	for _, cache := range []string{"warm", "cold"} {
		if !c.caches[cache] {
			continue
		}
		q := res[cache+" qemu"]
		if q == nil {
			q = &restoreSeries{}
		}
		firstRow := true
		for _, v := range restoreVariants {
			ws := res[cache+" "+v.name]
			if v.system != "warren" || ws == nil {
				continue
			}
			firstMetric := true
			for _, m := range []struct {
				name string
				a, b []time.Duration
				unit string // "" (durations), "count", "MiB"
			}{
				{"first KVM_RUN", ws.FirstRun, nil, ""},
				{"agent answer", ws.Health, q.Health, ""},
				{"VMM faults", counts(ws.Faults), counts(q.Faults), "count"},
				{"RAM pages", counts(ws.RAMPages), nil, "count"},
				{"read (MiB)", counts(ws.Bytes), counts(q.Bytes), "MiB"},
				{"uffd faults", counts(ws.UffdFaults), nil, "count"},
			} {
				if m.unit != "" && len(m.a) == 0 {
					continue // not measured (uffd only; JSON of earlier versions)
				}
				for pi, p := range []float64{50, 90, 99} {
					c0, c1, c2 := "", "", ""
					if firstRow {
						c0, firstRow = cache, false
					}
					if firstMetric {
						c1, firstMetric = v.display(), false
					}
					if pi == 0 {
						c2 = m.name
					}
					a := stats.Percentile(m.a, p)
					if len(m.b) == 0 && (m.b == nil || m.unit != "") {
						fmt.Fprintf(w, "%-5s %-13s %-14s p%-3.0f %12s %12s %8s\n", c0, c1, c2, p, figure(a, m.unit), "-", "-")
						continue
					}
					b := stats.Percentile(m.b, p)
					fmt.Fprintf(w, "%-5s %-13s %-14s p%-3.0f %12s %12s %8.2f\n", c0, c1, c2, p, figure(a, m.unit), figure(b, m.unit), stats.Ratio(a, b))
				}
			}
		}
	}
	for _, cache := range []string{"warm", "cold"} {
		for _, v := range restoreVariants {
			if s := res[cache+" "+v.name]; s != nil && len(s.Failures) > 0 {
				f := s.Failures
				fmt.Fprintf(w, "FAILED %s %s: %d of %d runs (not in the figures); first: %s\n", cache, v.name, len(f), c.restoreRuns, f[0])
			}
		}
	}
	fmt.Fprintln(w, "start: the benchmark's fork/exec of the VMM; first KVM_RUN: `warren restore --timing`; agent answer: first")
	fmt.Fprintln(w, "GET /health answered (qemu: over AF_VSOCK after -incoming \"exec:cat FILE\"). warm: files in --warm-dir;")
	fmt.Fprintln(w, "cold: files in --cold-dir, `sync; echo 3 > /proc/sys/vm/drop_caches` before each run. Ratios are warren/qemu.")
	fmt.Fprintln(w, "Every warren restore has --api (dirty-page logging on). At the answer: VMM faults: the VMM process's minor+major")
	fmt.Fprintln(w, "faults (/proc/PID/stat: KVM's on guest RAM and the process's own); RAM pages: guest RAM resident in the VMM")
	fmt.Fprintln(w, "(smaps Rss of the memfd or image mapping); read: eager, every snapshot page decoded; lazy (mmap), the image")
	fmt.Fprintln(w, "pages mapped (RAM pages x 4 KiB); uffd, the bytes the fault server decompressed (whole chunks, prefetch")
	fmt.Fprintln(w, "included); qemu, its migration file. uffd faults: faults served + pages installed for devices (Ensure).")
}

// counts converts counts to durations (1 ns each) for stats' percentiles.
func counts(v []uint64) []time.Duration {
	if v == nil {
		return nil
	}
	out := make([]time.Duration, len(v))
	for i, n := range v {
		out[i] = time.Duration(n)
	}
	return out
}

// figure formats a percentile of unit ("" durations, "count", "MiB" of
// bytes).
func figure(d time.Duration, unit string) string {
	switch unit {
	case "count":
		return strconv.FormatInt(int64(d), 10)
	case "MiB":
		return strconv.FormatFloat(mib(int64(d)), 'f', 1, 64)
	}
	return stats.Significant(d).String()
}

// countSummary is a count series in the JSON: the samples and their
// percentiles by nearest rank.
type countSummary struct {
	Samples []uint64 `json:"samples"`
	P50     uint64   `json:"p50"`
	P90     uint64   `json:"p90"`
	P99     uint64   `json:"p99"`
}

// summariseCounts is v's countSummary.
func summariseCounts(v []uint64) countSummary {
	d := counts(v)
	return countSummary{Samples: v, P50: uint64(stats.Percentile(d, 50)), P90: uint64(stats.Percentile(d, 90)), P99: uint64(stats.Percentile(d, 99))}
}

// restoreJSON is measurement 2 for --json.
func restoreJSON(c config, res map[string]*restoreSeries) map[string]any {
	out := map[string]any{"runs": c.restoreRuns, "warm_dir": c.warmDir, "cold_dir": c.coldDir, "mem_mib": c.memMiB,
		"memory_note": "at the agent's answer: vmm_faults = the VMM process's minflt+majflt (/proc/PID/stat); ram_pages = guest RAM " +
			"resident in the VMM (smaps Rss of the memfd or image mapping); bytes_read = eager: snapshot pages x 4 KiB decoded, " +
			"lazy (mmap): ram_pages x 4 KiB of the image mapped, uffd: bytes the fault server decompressed, qemu: the migration file; " +
			"uffd_faults = faults served + pages Ensure installed for devices; every warren restore has --api"}
	for k, s := range res {
		e := map[string]any{"agent_answer": stats.Summarise(k, s.Health), "failures": s.Failures}
		if s.FirstRun != nil {
			e["first_kvm_run"] = stats.Summarise(k, s.FirstRun)
		}
		for name, v := range map[string][]uint64{"vmm_faults": s.Faults, "ram_pages": s.RAMPages, "bytes_read": s.Bytes, "uffd_faults": s.UffdFaults} {
			if v != nil {
				e[name] = summariseCounts(v)
			}
		}
		if s.Uffd != nil {
			e["uffd_stats"] = s.Uffd
		}
		out[k] = e
	}
	return out
}
