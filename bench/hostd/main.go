// Command hostd measures sandbox creation through warren-hostd, the host
// daemon, end to end: the latency of POST /v1/sandboxes {"template": ID}
// from sending the request to its 201 answer (the daemon answers once the
// new sandbox's guest agent answers: `warren restore --lazy` of the
// template's snapshot in a new VMM process), for 1 and 16 concurrent
// clients. This is the headline figure against SPACE's published 60 ms
// median and 89 ms p90 (fixed reference numbers: "SPACE (published)").
//
// It starts warren-hostd itself (--hostd, with --warren) on a temporary
// state directory and unix socket, builds a template through the API
// (POST /v1/templates, --kernel, --initramfs: files of one directory, the
// daemon's --guest-dir, named by name; --mem MiB, progress streamed
// as NDJSON and printed), then for each level of --concurrency runs one
// unrecorded create and --runs recorded ones, with that many clients,
// each looping: create (timed), then DELETE /v1/sandboxes/{id} (not
// timed). Every request carries X-Warren-Tenant: bench. With --encrypted
// the daemon runs with --keys and the tenant gets a key first, so the
// figures are those of a tenant whose snapshots and disks are sealed at
// rest. The daemon is
// stopped (SIGTERM, with --stop-on-exit) at the end.
//
// The measured peer, with --qemu (on by default when qemu-system-x86_64
// and /dev/vhost-vsock are there): QEMU -M microvm restored with
// -incoming "exec:cat FILE" from one migration file of the same
// kernel+initramfs guest (same memory, same kernel arguments), as
// bench/fork clones QEMU, at the same concurrency and run count, timed
// from process start to the guest agent's first answer over AF_VSOCK;
// each QEMU is stopped after (not timed).
//
// Then time to interactive (tti.go; --tti, on by default): create plus the
// answer of the first exec, warren-hostd and the QEMU peer, --tti-runs
// times in each of three arrival modes: sequential, staggered (a create
// every --stagger, 200 ms) and burst (all at once), with their own table
// and plot (--tti-png) and a "tti" member in --json. --concurrency none
// measures TTI alone.
//
//	go run ./bench/hostd [--runs 50] [--concurrency 1,16] [--tti sequential,staggered,burst] [--json out.json] [--png build/bench-hostd.png]
//	go run ./bench/hostd --merge a.json,b.json[,...] [--json merged.json] [--png build/bench-hostd.png]
//
// It prints one table with p50/p90/p99 per level, SPACE's figures and the
// QEMU peer's side by side with the ratios warren/SPACE and warren/qemu,
// writes the samples with --json, and draws the latency distribution
// (one CDF per level and system, SPACE's p50 and p90 as reference lines)
// to --png (after each level too, with the table so far). The --json file
// is also a checkpoint: rewritten (temporary file and rename) after every
// recorded run, with the level in progress so far ("complete": false), so
// a host that freezes mid-level (the nested KVM host has, after 10-30
// creates) leaves every run recorded before. --merge combines such files
// (complete or not, same --mem) of separate invocations: samples and
// failures per system and level concatenated, levels by clients
// ascending, walls summed; it prints the table, writes --png and --json
// (with "merged_from") and needs no /dev/kvm. Running needs /dev/kvm
// (and root for the daemon's cgroups; without them it runs the VMMs
// unlimited). In the nested KVM host, L1 stalled twice (after 7 and
// after 21 creates, once with the daemon's state on L1's tmpfs /tmp, once
// on the shared directory) while each DELETE had the daemon stop the VMM
// with SIGTERM and, past its 3 s grace, SIGKILL (SIGKILLed VMMs have
// stalled L1 before: bench/snapshot); there --term-before-delete (its
// default) SIGTERMs the VMM and waits for it to exit before the DELETE,
// and the runs go through. `make bench` also gives it --dir on the shared
// directory there, as bench/snapshot keeps its cold files.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/warrenvm/warren/bench/stats"
)

// SPACE's published create-from-template latency.
const (
	spaceName = "SPACE (published)"
	spaceP50  = 60 * time.Millisecond
	spaceP90  = 89 * time.Millisecond
)

// config is the command line.
type config struct {
	hostd, warren, kernel, initramfs, qemu string
	cgroupRoot, hostdFlags, dataDir        string
	memMiB, runs, qemuCID                  int
	levels                                 []int
	useQEMU, nested, termFirst, encrypted  bool
	qemuFirst                              bool
	timeout, createTimeout                 time.Duration
	jsonOut, pngOut                        string
	// Time to interactive (tti.go): the modes, runs per mode, the gap
	// between staggered starts and the plot.
	tti     []string
	ttiRuns int
	stagger time.Duration
	ttiPNG  string
}

func main() {
	var c config
	flag.StringVar(&c.hostd, "hostd", "bin/warren-hostd", "warren-hostd binary")
	flag.StringVar(&c.warren, "warren", "bin/warren", "warren binary (the daemon's VMM)")
	flag.StringVar(&c.kernel, "kernel", "build/vmlinux", "guest kernel")
	flag.StringVar(&c.initramfs, "initramfs", "build/initramfs.cpio", "initramfs (with the guest agent)")
	flag.StringVar(&c.qemu, "qemu-bin", "qemu-system-x86_64", "QEMU binary (the peer)")
	flag.StringVar(&c.cgroupRoot, "cgroup-root", "/sys/fs/cgroup", `the daemon's --cgroup-root ("none": no cgroups)`)
	flag.StringVar(&c.hostdFlags, "hostd-flags", "", `more warren-hostd flags, space-separated (e.g. "--jail off")`)
	flag.StringVar(&c.dataDir, "dir", "", "directory for the daemon's state (templates' snapshots) and QEMU's migration file, in a fresh subdirectory removed at the end (default: the temporary directory; sockets always go there). In the nested KVM host the Makefile gives one on the shared directory")
	flag.BoolVar(&c.termFirst, "term-before-delete", os.Getenv("WARREN_KVMHOST") == "1", "SIGTERM each sandbox's VMM and wait (up to 20 s) for it to exit before its DELETE (default on in the nested KVM host, where the daemon's 3 s grace before SIGKILL is too short and SIGKILLed VMMs have stalled L1)")
	flag.BoolVar(&c.qemuFirst, "qemu-first", false, "at each level, run the QEMU peer before warren-hostd (to top up the peer's runs when the host froze in an earlier invocation: --merge joins them)")
	flag.BoolVar(&c.encrypted, "encrypted", false, "the tenant has an encryption key (warren-hostd --keys; POST /v1/keys before the template): its snapshots and disks are sealed at rest, and creates restore the template's decrypted copy")
	flag.IntVar(&c.memMiB, "mem", 256, "guest memory of the template (and of QEMU's guest), MiB")
	flag.IntVar(&c.runs, "runs", 50, "recorded creates per concurrency level (and QEMU restores)")
	flag.IntVar(&c.qemuCID, "qemu-cid", 100, "first vsock CID of the QEMU guests (each restore takes the next)")
	levels := flag.String("concurrency", "1,16", "concurrent clients, comma-separated levels")
	flag.BoolVar(&c.useQEMU, "qemu", haveQEMU("qemu-system-x86_64"), "also measure the QEMU -incoming peer (default: on when qemu-system-x86_64 and /dev/vhost-vsock exist)")
	flag.DurationVar(&c.timeout, "timeout", 5*time.Minute, "limit for the template build (and QEMU's source boot and migration)")
	flag.DurationVar(&c.createTimeout, "create-timeout", 2*time.Minute, "limit for one create (or QEMU restore); past it the run counts as failed")
	stats.JSONFlag(&c.jsonOut)
	flag.StringVar(&c.pngOut, "png", "build/bench-hostd.png", `plot of the latency distribution ("" for none)`)
	tti := flag.String("tti", strings.Join(ttiModes, ","), `time to interactive (create + first exec) in these modes, comma-separated: sequential, staggered, burst ("none": skip)`)
	flag.IntVar(&c.ttiRuns, "tti-runs", 16, "creates (and QEMU restores) per --tti mode")
	flag.DurationVar(&c.stagger, "stagger", 200*time.Millisecond, "--tti staggered: the gap between two creates")
	flag.StringVar(&c.ttiPNG, "tti-png", "build/bench-hostd-tti.png", `plot of the time-to-interactive distribution ("" for none)`)
	merge := flag.String("merge", "", "merge these --json files (comma-separated; complete or checkpoints) of separate invocations into one table, --png and --json, and exit (no /dev/kvm needed)")
	flag.Parse()
	if *merge != "" {
		var files []string
		for _, f := range strings.Split(*merge, ",") {
			if f = strings.TrimSpace(f); f != "" {
				files = append(files, f)
			}
		}
		if err := mergeResults(os.Stdout, files, c); err != nil {
			fmt.Fprintln(os.Stderr, "bench/hostd:", err)
			os.Exit(1)
		}
		return
	}
	var err error
	if c.levels, err = parseLevels(*levels); err != nil {
		fmt.Fprintln(os.Stderr, "bench/hostd:", err)
		os.Exit(2)
	}
	if c.tti, err = parseTTIModes(*tti); err != nil {
		fmt.Fprintln(os.Stderr, "bench/hostd:", err)
		os.Exit(2)
	}
	if len(c.tti) > 0 && c.ttiRuns < 1 {
		fmt.Fprintln(os.Stderr, "bench/hostd: --tti-runs must be at least 1")
		os.Exit(2)
	}
	if c.runs < 1 {
		fmt.Fprintln(os.Stderr, "bench/hostd: --runs must be at least 1")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "bench/hostd:", err)
		os.Exit(1)
	}
}

// haveQEMU tells whether the QEMU peer can run here.
func haveQEMU(bin string) bool {
	if _, err := exec.LookPath(bin); err != nil {
		return false
	}
	_, err := os.Stat("/dev/vhost-vsock")
	return err == nil
}

// parseLevels parses --concurrency ("none": no create levels).
func parseLevels(s string) ([]int, error) {
	var out []int
	if s == "none" {
		return nil, nil
	}
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad --concurrency entry %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// levelResult is one concurrency level's samples for one system.
type levelResult struct {
	Clients  int
	Samples  []time.Duration
	Failures []string
	Wall     time.Duration // the recorded runs, first start to last end (deletes/stops included)
	Partial  bool          // a level in progress (a checkpoint), or merged with one
}

func run(ctx context.Context, c config) error {
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return errors.New("/dev/kvm is absent: run it inside the nested KVM host (.ci/kvmhost/run.sh --host-root)")
	}
	for _, f := range []*string{&c.hostd, &c.warren, &c.kernel, &c.initramfs} {
		abs, err := filepath.Abs(*f)
		if err != nil {
			return err
		}
		if _, err := os.Stat(abs); err != nil {
			return err
		}
		*f = abs
	}
	if filepath.Dir(c.kernel) != filepath.Dir(c.initramfs) {
		return fmt.Errorf("--kernel and --initramfs must be in one directory (the daemon's --guest-dir): %s, %s", c.kernel, c.initramfs)
	}
	if c.useQEMU && !haveQEMU(c.qemu) {
		return fmt.Errorf("--qemu: %s or /dev/vhost-vsock not found", c.qemu)
	}
	nested := os.Getenv("WARREN_KVMHOST") == "1"
	c.nested = nested
	work, err := os.MkdirTemp("", "warren-bench-hostd")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	data := work
	if c.dataDir != "" {
		if err := os.MkdirAll(c.dataDir, 0o755); err != nil {
			return err
		}
		if data, err = os.MkdirTemp(c.dataDir, "run"); err != nil {
			return err
		}
		defer os.RemoveAll(data)
	}

	d, err := startHostd(ctx, c, work, data)
	if err != nil {
		return err
	}
	defer d.stop()
	a := newAPI(d.sock, "bench")
	defer a.close()
	if c.encrypted {
		if err := a.call(ctx, "POST", "/v1/keys", nil, 201, nil); err != nil {
			return d.withLog(fmt.Errorf("create the tenant's key: %w", err))
		}
		fmt.Println("tenant bench has an encryption key: its snapshots are sealed at rest")
	}

	fmt.Printf("warren-hostd serving on %s; building a template (%s, %s, %d MiB)\n", d.sock, c.kernel, c.initramfs, c.memMiB)
	t0 := time.Now()
	tctx, cancel := context.WithTimeout(ctx, c.timeout)
	tpl, err := a.buildTemplate(tctx, templateRequest{Kernel: filepath.Base(c.kernel), Initramfs: filepath.Base(c.initramfs), MemMiB: c.memMiB, CPUs: 1, Cmdline: guestArgs}, os.Stdout)
	cancel()
	if err != nil {
		return d.withLog(err)
	}
	fmt.Printf("template %s ready (build_ms %.0f, %s with the request)\n", tpl.ID, tpl.BuildMS, time.Since(t0).Round(time.Millisecond))
	defer func() {
		cleanup(a)
		dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := a.deleteTemplate(dctx, tpl.ID); err != nil {
			fmt.Printf("warning: deleting template %s: %v\n", tpl.ID, err)
		}
	}()

	var peer *qemuPeer
	var qemuNote string
	if c.useQEMU {
		if peer, err = newQEMUPeer(c, work, data); err != nil {
			qemuNote = "qemu peer left out: " + oneLine(err)
			fmt.Println(qemuNote)
		} else {
			defer peer.close()
		}
	} else {
		qemuNote = "qemu peer not run (--qemu=false, or no qemu-system-x86_64 / /dev/vhost-vsock)"
	}

	rs := &results{c: c, withQEMU: peer != nil, qemuNote: qemuNote,
		extra: map[string]any{"template": map[string]any{"id": tpl.ID, "build_ms": tpl.BuildMS}}}
	if peer != nil {
		rs.extra["qemu_migration_file_bytes"] = peer.fileBytes
	}
	// report prints the table and writes the plot and the JSON: after each
	// level (so far: the nested KVM host has been seen to stall under
	// restore-heavy load, which would lose everything) and at the end.
	// Within a level, drive's checkpoints (rs.checkpoint) keep the JSON
	// up to date after every recorded run.
	report := func(final bool) error {
		fmt.Println()
		if !final {
			fmt.Print("so far: ")
		}
		printTable(os.Stdout, c, rs.warren, rs.qemu)
		if qemuNote != "" {
			fmt.Println(qemuNote)
		}
		if nested {
			fmt.Println("(in the nested KVM host: every figure is emulated; compare the ratio to qemu, not the absolute times)")
		}
		if c.pngOut != "" {
			if err := writePNG(c.pngOut, latencyPlot(c, rs.warren, rs.qemu)); err != nil {
				return err
			}
			fmt.Printf("plot: %s\n", c.pngOut)
		}
		if c.jsonOut == "" {
			return nil
		}
		return rs.writeJSON(final)
	}
	for li, n := range c.levels {
		runQEMU := func() error {
			if peer == nil {
				return nil
			}
			fmt.Printf("\n== %d concurrent client(s): qemu -incoming restores\n", n)
			q := drive(ctx, "qemu", n, c.runs, peer.restore, rs.checkpoint("qemu"))
			rs.qemu = append(rs.qemu, q)
			return ctx.Err()
		}
		if c.qemuFirst {
			if err := runQEMU(); err != nil {
				return err
			}
		}
		fmt.Printf("\n== %d concurrent client(s): warren-hostd creates\n", n)
		r := drive(ctx, "warren", n, c.runs, func(ctx context.Context) (time.Duration, error) {
			cctx, cancel := context.WithTimeout(ctx, c.createTimeout)
			sb, lat, err := a.create(cctx, tpl.ID)
			cancel()
			if sb.ID != "" { // outside the timing
				discard(a, c, sb)
			}
			return lat, err
		}, rs.checkpoint("warren"))
		rs.warren = append(rs.warren, r)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !c.qemuFirst {
			if err := runQEMU(); err != nil {
				return err
			}
		}
		if li < len(c.levels)-1 || len(c.tti) > 0 {
			if err := report(false); err != nil {
				return err
			}
		}
	}
	if len(c.tti) > 0 {
		ws, qs := runTTI(ctx, c, a, tpl.ID, peer)
		if err := ctx.Err(); err != nil {
			return err
		}
		rs.extra["tti"] = ttiJSON(c, ws, qs)
		if err := reportTTI(c, ws, qs); err != nil {
			return err
		}
	}
	if len(c.levels) == 0 {
		return rs.writeJSONIfAsked()
	}
	return report(true)
}

// termAndWait sends pid SIGTERM and waits for it to be gone or a zombie
// (the daemon, its parent, reaps it).
func termAndWait(pid int, limit time.Duration) {
	if syscall.Kill(pid, syscall.SIGTERM) != nil {
		return
	}
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return
		}
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X') {
			return
		}
	}
	fmt.Printf("warning: VMM %d still running %s after SIGTERM; deleting anyway\n", pid, limit)
}

// drive runs once: one unrecorded warm-up run, then runs recorded runs
// shared by clients concurrent workers, each taking the next run until
// all are taken. After each recorded run (ok or failed) it calls
// onSample, if not nil, with the level so far (Wall: up to now), under
// its lock: one call at a time, and the slices must not be kept.
func drive(ctx context.Context, name string, clients, runs int, once func(context.Context) (time.Duration, error), onSample func(partial levelResult)) levelResult {
	r := levelResult{Clients: clients}
	if lat, err := once(ctx); err != nil {
		fmt.Printf("c=%-3d warm-up  %-6s FAILED: %s\n", clients, name, oneLine(err))
	} else {
		fmt.Printf("c=%-3d warm-up  %-6s %10s\n", clients, name, stats.Significant(lat))
	}
	var next atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < clients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1))
				if i > runs {
					return
				}
				lat, err := once(ctx)
				mu.Lock()
				if err != nil {
					msg := fmt.Sprintf("run %d: %s", i, oneLine(err))
					r.Failures = append(r.Failures, msg)
					fmt.Printf("c=%-3d run %3d/%d %-6s FAILED: %s\n", clients, i, runs, name, oneLine(err))
				} else {
					r.Samples = append(r.Samples, lat)
					fmt.Printf("c=%-3d run %3d/%d %-6s %10s\n", clients, i, runs, name, stats.Significant(lat))
				}
				if onSample != nil {
					p := r
					p.Wall = time.Since(start)
					onSample(p)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	r.Wall = time.Since(start)
	return r
}

// cleanup deletes the tenant's sandboxes left behind (a create that
// timed out on our side goes on in the daemon).
func cleanup(a *api) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := a.sandboxes(ctx)
	if err != nil {
		fmt.Printf("warning: listing sandboxes: %v\n", err)
		return
	}
	for _, s := range l {
		if err := a.deleteSandbox(ctx, s.ID); err != nil {
			fmt.Printf("warning: delete %s: %v\n", s.ID, err)
		}
	}
}

var percentiles = []float64{50, 90, 99}

// spaceAt is SPACE's published figure at percentile p (0: not published).
func spaceAt(p float64) time.Duration {
	switch p {
	case 50:
		return spaceP50
	case 90:
		return spaceP90
	}
	return 0
}

// printTable prints the one table: per level, p50/p90/p99 of warren-hostd,
// SPACE's published figures and the QEMU peer's, with the ratios. The run
// counts are the data's (samples and failures), not --runs: a level cut
// short (a checkpoint) or a merge of several invocations has others.
func printTable(w io.Writer, c config, ws, qs []levelResult) {
	enc := ""
	if c.encrypted {
		enc = ", tenant with an encryption key (snapshots sealed at rest)"
	}
	fmt.Fprintf(w, "create from template, POST /v1/sandboxes to its 201 (guest agent answering), after one unrecorded run per level, guest %d MiB%s\n", c.memMiB, enc)
	fmt.Fprintf(w, "runs: %s:\n", runCounts(ws, qs))
	fmt.Fprintf(w, "%-7s %-4s %12s %18s %13s %12s %12s\n", "clients", "", "warren-hostd", spaceName, "warren/SPACE", "qemu", "warren/qemu")
	for _, n := range levelClients(ws, qs) {
		wr, qr := byClients(ws, n), byClients(qs, n)
		for pi, p := range percentiles {
			lvl := ""
			if pi == 0 {
				lvl = strconv.Itoa(n)
			}
			av, sp, spr, qv, qrt := "-", "-", "-", "-", "-"
			var a time.Duration
			if wr != nil && len(wr.Samples) > 0 {
				a = stats.Percentile(wr.Samples, p)
				av = stats.Significant(a).String()
			}
			if s := spaceAt(p); s != 0 {
				sp = stats.Significant(s).String()
				if a != 0 {
					spr = fmt.Sprintf("%.2f", stats.Ratio(a, s))
				}
			}
			if qr != nil && len(qr.Samples) > 0 {
				b := stats.Percentile(qr.Samples, p)
				qv = stats.Significant(b).String()
				if a != 0 {
					qrt = fmt.Sprintf("%.2f", stats.Ratio(a, b))
				}
			}
			fmt.Fprintf(w, "%-7s p%-3.0f %12s %18s %13s %12s %12s\n", lvl, p, av, sp, spr, qv, qrt)
		}
	}
	incomplete := func(r *levelResult) string {
		if r.Partial {
			return " (level incomplete)"
		}
		return ""
	}
	for _, n := range levelClients(ws, qs) {
		var parts []string
		if wr := byClients(ws, n); wr != nil {
			parts = append(parts, fmt.Sprintf("warren %d ok, %d failed%s%s", len(wr.Samples), len(wr.Failures), rate(*wr, "creates/s (with deletes)"), incomplete(wr)))
		}
		if qr := byClients(qs, n); qr != nil {
			parts = append(parts, fmt.Sprintf("qemu %d ok, %d failed%s%s", len(qr.Samples), len(qr.Failures), rate(*qr, "restores/s (with stops)"), incomplete(qr)))
		}
		fmt.Fprintf(w, "clients %d: %s\n", n, strings.Join(parts, "; "))
	}
	for _, set := range []struct {
		name string
		rs   []levelResult
	}{{"warren", ws}, {"qemu", qs}} {
		for _, r := range set.rs {
			if len(r.Failures) > 0 {
				fmt.Fprintf(w, "FAILED %s, %s: %d of %d runs (not in the figures); first: %s\n", set.name, clientsLabel(r.Clients), len(r.Failures), len(r.Samples)+len(r.Failures), r.Failures[0])
			}
		}
	}
	fmt.Fprintln(w, "warren-hostd: from sending POST /v1/sandboxes {\"template\": ID} (unix socket) to its 201 answer, which the daemon")
	fmt.Fprintln(w, "sends once the new VMM (`warren restore --lazy` of the template's snapshot) has its guest agent answering;")
	fmt.Fprintln(w, "the DELETE after each create is not timed. SPACE: its published 60 ms median and 89 ms p90 (no p99).")
	fmt.Fprintln(w, "qemu: `qemu -M microvm -incoming \"exec:cat FILE\"` from one migration file of the same guest, from process")
	fmt.Fprintln(w, "start to the agent's first answer over AF_VSOCK (its stop not timed). Ratios are warren/peer.")
}

// runCounts is the table's "runs:" line: the runs (ok and failed) of each
// level and system, e.g. "warren 1 client 50, 16 clients 50; qemu 1
// client 50, 16 clients 50".
func runCounts(ws, qs []levelResult) string {
	var sys []string
	for _, set := range []struct {
		name string
		rs   []levelResult
	}{{"warren", ws}, {"qemu", qs}} {
		if len(set.rs) == 0 {
			continue
		}
		var lv []string
		for _, r := range set.rs {
			lv = append(lv, fmt.Sprintf("%s %d", clientsLabel(r.Clients), len(r.Samples)+len(r.Failures)))
		}
		sys = append(sys, set.name+" "+strings.Join(lv, ", "))
	}
	if len(sys) == 0 {
		return "none"
	}
	return strings.Join(sys, "; ")
}

// levelClients is the levels of ws and qs, in ws's order, then any that
// only qs has.
func levelClients(ws, qs []levelResult) []int {
	var out []int
	seen := map[int]bool{}
	for _, set := range [][]levelResult{ws, qs} {
		for _, r := range set {
			if !seen[r.Clients] {
				seen[r.Clients] = true
				out = append(out, r.Clients)
			}
		}
	}
	return out
}

// byClients is rs's level of n clients, nil if none.
func byClients(rs []levelResult, n int) *levelResult {
	for i := range rs {
		if rs[i].Clients == n {
			return &rs[i]
		}
	}
	return nil
}

// rate is ", N unit" of r's runs per second of its wall ("" without one).
func rate(r levelResult, unit string) string {
	if r.Wall <= 0 {
		return ""
	}
	return fmt.Sprintf(", %.2f %s", perSecond(r), unit)
}

func perSecond(r levelResult) float64 {
	if r.Wall <= 0 {
		return 0
	}
	return float64(len(r.Samples)+len(r.Failures)) / r.Wall.Seconds()
}

// latencyPlot is the PNG: one CDF per level and system (warren solid, qemu
// dashed, one colour per level), SPACE's p50 and p90 as reference lines.
func latencyPlot(c config, ws, qs []levelResult) plot {
	lo, hi := -1, 0 // the fewest and most runs of any level and system
	for _, r := range append(append([]levelResult(nil), ws...), qs...) {
		n := len(r.Samples) + len(r.Failures)
		if lo < 0 || n < lo {
			lo = n
		}
		hi = max(hi, n)
	}
	runs := fmt.Sprintf("%d runs per level", max(lo, 0))
	if lo != hi {
		runs = fmt.Sprintf("%d-%d runs per level", lo, hi)
	}
	p := plot{
		Title:  fmt.Sprintf("warren-hostd create from template: latency CDF, %s, guest %d MiB", runs, c.memMiB),
		XLabel: "latency (request to 201; qemu: process start to agent answer)",
		Refs:   []refLine{{spaceP50, "SPACE p50"}, {spaceP90, "SPACE p90"}},
	}
	if c.nested {
		p.Title += " (nested KVM host: emulated)"
	}
	colour := func(i int) color.RGBA { return palette[i%len(palette)] }
	for i, r := range ws {
		p.Series = append(p.Series, series{Label: fmt.Sprintf("warren-hostd, %s", clientsLabel(r.Clients)), Samples: r.Samples, Color: colour(i)})
	}
	extra := len(ws)
	for _, r := range qs { // in its level's colour
		i := -1
		for wi, wr := range ws {
			if wr.Clients == r.Clients {
				i = wi
			}
		}
		if i < 0 { // a level only qemu has (a merge): the next colour
			i, extra = extra, extra+1
		}
		p.Series = append(p.Series, series{Label: fmt.Sprintf("qemu -incoming, %s", clientsLabel(r.Clients)), Samples: r.Samples, Color: colour(i), Dashed: true})
	}
	return p
}

func clientsLabel(n int) string {
	if n == 1 {
		return "1 client"
	}
	return fmt.Sprintf("%d clients", n)
}
