// Command egress measures what a sandbox's egress controls add to its
// traffic: the latency and host CPU per packet of the eBPF egress filter
// (ebpf/filter) and per request of the credential proxy (vmmproc/credproxy),
// each against the same traffic without it, side by side. It starts no VM
// and needs no /dev/kvm.
//
//  1. Filter, per packet (needs root; skipped with a note otherwise). In a
//     network namespace of its own it creates a tap (host 10.210.0.1/24),
//     a local address 198.51.100.7 on lo with a UDP echo server on port 7,
//     a static neighbour for the fake guest 10.210.0.2 and rp_filter off.
//     The fake guest writes Ethernet+IPv4+UDP frames into the tap's fd and
//     reads the echoes back from it, one probe at a time, matched by a
//     sequence number; each probe's round trip is recorded. The fake guest
//     and the echo server (plain blocking system calls, each on a locked
//     thread) share one CPU (--pin-cpu, the last by default; -1 lets them
//     float), which keeps cross-CPU wake-ups out of the tails. Three
//     variants take turns in --rounds rounds (--packets/--rounds probes each per
//     round, the order rotated, after a warm-up and a few unrecorded
//     probes after each switch): no filter, the filter attached with tcx,
//     and attached with clsact (cls_bpf, direct action). Both filters hold
//     the same policy of 200 CIDR rules of various prefix lengths,
//     protocols and ports, compiled with policy.Compile; rule 1 allows the
//     echo server. Reported: round trip p50/p90/p99; the whole process's
//     CPU time (getrusage user+sys) per packet, which holds the tap write
//     and read, the kernel's forwarding both ways, the filter and the echo
//     server; and the program's own run time per run, from the kernel's
//     BPF run-time statistics, turned on (BPF_ENABLE_STATS, or else the
//     sysctl, restored after) only for a separate pass after the rounds,
//     so that their clock reads do not weigh on the rounds. The filters'
//     counters are checked against the frames written while each was
//     attached.
//
//  2. Proxy, per request. On 127.0.0.1: an HTTPS upstream for "api.test"
//     (its own CA and leaf, HTTP/1.1) answering ~1 KiB of JSON that echoes
//     the request's Authorization header, and the credential proxy with a
//     policy holding one credential for api.test. Clients: direct (to the
//     upstream, with the real secret) and through the proxy's TLS listener
//     (trusting the sandbox CA, with the placeholder), GET
//     /v1/x?k=N. Each with keep-alive (--requests each) and with a new TLS
//     connection, full handshake, per request (--fresh-conns each; the
//     proxy keeps its own upstream connections). The four variants take
//     turns in --rounds rounds. Reported: latency p50/p90/p99 and process
//     CPU per request, with the ratio proxy/direct. Every response is
//     checked: the upstream saw the secret, and the proxied client got the
//     placeholder back, never the secret.
//
// By hand:
//
//	go run ./bench/egress [--packets 20000] [--requests 5000] [--fresh-conns 500] [--rounds 10]
//	    [--pin-cpu N] [--skip-filter] [--skip-proxy] [--json out.json]
//
// With the defaults it takes a few seconds on a 2-CPU machine.
//
// `go build -o bin/bench-egress ./bench/egress` builds it.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenvm/warren/bench/stats"
)

// config is the command line.
type config struct {
	packets, requests, freshConns, rounds int
	jsonOut                               string
	skipFilter, skipProxy                 bool
	pinCPU                                int // -1: no pinning
}

func main() {
	var c config
	flag.IntVar(&c.packets, "packets", 20000, "recorded probes per filter variant")
	flag.IntVar(&c.requests, "requests", 5000, "recorded keep-alive requests, direct and through the proxy each")
	flag.IntVar(&c.freshConns, "fresh-conns", 500, "recorded requests on a new TLS connection each, direct and through the proxy each")
	flag.IntVar(&c.rounds, "rounds", 10, "alternating rounds the variants' samples are split into")
	flag.StringVar(&c.jsonOut, "json", "", "also write every sample and summary as JSON here")
	flag.BoolVar(&c.skipFilter, "skip-filter", false, "skip part 1, the filter")
	flag.BoolVar(&c.skipProxy, "skip-proxy", false, "skip part 2, the proxy")
	flag.IntVar(&c.pinCPU, "pin-cpu", lastCPU(), "pin part 1's fake guest and echo server to this CPU (-1: let them float)")
	flag.Parse()
	if c.packets < 1 || c.requests < 1 || c.freshConns < 1 || c.rounds < 1 {
		fmt.Fprintln(os.Stderr, "bench/egress: --packets, --requests, --fresh-conns and --rounds must be at least 1")
		os.Exit(2)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sig
		// The namespace, tap, programs and BPF_ENABLE_STATS go with the
		// process; only the sysctl fallback needs undoing.
		if restoreSysctl != nil {
			restoreSysctl()
		}
		fmt.Fprintln(os.Stderr, "bench/egress:", s)
		os.Exit(1)
	}()
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "bench/egress:", err)
		os.Exit(1)
	}
}

func run(c config) error {
	start := time.Now()
	host := describeHost()
	fmt.Println("bench-egress: what the egress filter adds per packet and the credential proxy per request,")
	fmt.Println("against the same traffic without them")
	fmt.Println(host)
	fmt.Println("Not a KVM benchmark: no VM runs. The guest is faked by writing Ethernet frames into a tap in a network")
	fmt.Println("namespace of this program's own; the proxy, its clients and the upstream are this process, on 127.0.0.1.")
	fmt.Println()

	out := map[string]any{
		"benchmark": "egress",
		"host":      host,
		"flags": map[string]any{"packets": c.packets, "requests": c.requests, "fresh_conns": c.freshConns,
			"rounds": c.rounds},
	}
	if !c.skipFilter {
		if os.Geteuid() != 0 {
			fmt.Println("Part 1, the filter, skipped: it needs root (a network namespace, a tap and BPF programs).")
			fmt.Println()
			out["filter"] = "skipped: not root"
		} else if err := runPart(c, out, "filter", runFilterBench, printFilter, filterJSON); err != nil {
			return err
		}
	}
	if !c.skipProxy {
		if err := runPart(c, out, "proxy", proxyBench, printProxy, proxyJSON); err != nil {
			return err
		}
	}
	fmt.Printf("total time %s\n", time.Since(start).Round(100*time.Millisecond))
	if c.jsonOut != "" {
		if err := stats.WriteJSON(c.jsonOut, out); err != nil {
			return err
		}
	}
	return nil
}

// runPart runs one part of the benchmark, prints its report and puts its
// JSON in out under name.
func runPart[R, V any](c config, out map[string]any, name string, bench func(config) (R, V, error), print func(io.Writer, R), toJSON func(R) map[string]any) error {
	rep, _, err := bench(c)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	print(os.Stdout, rep)
	fmt.Println()
	out[name] = toJSON(rep)
	return nil
}

// describeHost is one line on the machine, kernel and Go.
func describeHost() string {
	var u unix.Utsname
	_ = unix.Uname(&u)
	hostname, _ := os.Hostname()
	cpu := "unknown CPU"
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		s := bufio.NewScanner(f)
		for s.Scan() {
			if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	return fmt.Sprintf("host %s: Linux %s %s, %s, %d CPUs (GOMAXPROCS %d), %s",
		hostname, unix.ByteSliceToString(u.Release[:]), unix.ByteSliceToString(u.Machine[:]), cpu,
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())
}

// cell formats a duration for the tables.
func cell(d time.Duration) string { return stats.Significant(d).String() }

func ratio(a, b time.Duration) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", stats.Ratio(a, b))
}

func nsCell(ns float64) string {
	if ns == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0fns", ns)
}

func printFilter(w io.Writer, r *filterReport) {
	fmt.Fprintf(w, "Part 1, filter, per packet: UDP echo round trip through the tap, %d probes per variant in %d alternating rounds\n", r.Packets, r.Rounds)
	pin := "not pinned"
	if r.PinCPU >= 0 {
		pin = fmt.Sprintf("fake guest and echo server pinned to CPU %d", r.PinCPU)
	}
	fmt.Fprintf(w, "(%d-byte payload; policy of %d rules, %d table entries; %s; after warm-up)\n", probeSize, r.PolicyRules, r.TableEntries, pin)
	vs := r.Variants
	none := vs[0]
	fmt.Fprintf(w, "%-9s %-5s %12s %12s %12s %9s %12s\n", "", "", vs[0].Name, vs[1].Name, vs[2].Name, vs[1].Name+"/none", vs[2].Name+"/none")
	sums := make([]stats.Summary, len(vs))
	for i, v := range vs {
		sums[i] = stats.Summarise(v.Name, v.RTT)
	}
	for _, r := range stats.PercentileRows("rtt", sums[:3]...) {
		a, b, c := r.Values[0], r.Values[1], r.Values[2]
		fmt.Fprintf(w, "%-9s %-5s %12s %12s %12s %9s %12s\n", r.Name, r.Label, cell(a), cell(b), cell(c), ratio(b, a), ratio(c, a))
	}
	fmt.Fprintf(w, "%-9s %-5s %12s %12s %12s %9s %12s\n", "cpu/pkt", "mean", cell(none.CPUPerPacket), cell(vs[1].CPUPerPacket), cell(vs[2].CPUPerPacket),
		ratio(vs[1].CPUPerPacket, none.CPUPerPacket), ratio(vs[2].CPUPerPacket, none.CPUPerPacket))
	fmt.Fprintf(w, "%-9s %-5s %12s %12s %12s %9s %12s\n", "bpf/run", "mean", "-", nsCell(vs[1].BPFNsPerRun), nsCell(vs[2].BPFNsPerRun), "", "")
	fmt.Fprintf(w, "%-9s %-5s %12d %12d %12d\n", "lost", "", none.Lost, vs[1].Lost, vs[2].Lost)
	fmt.Fprintf(w, "rtt: write of the probe into the tap to its echo read back (the host's forwarding both ways, the echo server, the filter).\n")
	fmt.Fprintf(w, "cpu/pkt: the whole process's user+sys CPU (getrusage) over the recorded probes, per probe.\n")
	fmt.Fprintf(w, "bpf/run: the program's own run time per run from the kernel's BPF run-time stats (%s), in a\n", r.BPFStats)
	fmt.Fprintf(w, "separate pass of %d probes per filter after the rounds (stats off during them); runs per probe: tcx %.2f, clsact %.2f.\n",
		r.BPFStatsPackets, vs[1].BPFRunsPerPkt, vs[2].BPFRunsPerPkt)
	fmt.Fprintf(w, "added per packet: rtt p50 tcx %s, clsact %s; cpu tcx %s, clsact %s.\n",
		stats.Significant(sums[1].P50-sums[0].P50), stats.Significant(sums[2].P50-sums[0].P50),
		stats.Significant(vs[1].CPUPerPacket-none.CPUPerPacket), stats.Significant(vs[2].CPUPerPacket-none.CPUPerPacket))
	for _, v := range vs[1:] {
		cv := r.Counters[v.Name]
		verdict := "ok, every frame counted, none denied"
		if !cv.OK {
			verdict = "MISMATCH"
		}
		fmt.Fprintf(w, "counters %-6s: %d frames written while attached; allowed %d, denied %d: %s\n", v.Name, cv.Written, cv.Got.AllowedPackets, cv.Got.DeniedPackets, verdict)
	}
}

func printProxy(w io.Writer, r *proxyReport) {
	fmt.Fprintf(w, "Part 2, credential proxy, per request: GET https://api.test/v1/x?k=N, HTTP/1.1 over TLS 1.3 on 127.0.0.1,\n")
	fmt.Fprintf(w, "a JSON answer of %d B (%d B through the proxy), %d alternating rounds, after warm-up\n", r.BodyBytes[0], r.BodyBytes[1], r.Rounds)
	byName := map[string]proxyVariantReport{}
	for _, v := range r.Variants {
		byName[v.Name] = v
	}
	pair := func(title, direct, proxied string) {
		d, p := byName[direct], byName[proxied]
		sd, sp := stats.Summarise(direct, d.Latency), stats.Summarise(proxied, p.Latency)
		fmt.Fprintf(w, "%s (%d requests each)\n", title, len(d.Latency))
		fmt.Fprintf(w, "%-9s %-5s %12s %12s %8s\n", "", "", "direct", "proxy", "ratio")
		for _, r := range stats.PercentileRows("latency", sd, sp) {
			a, b := r.Values[0], r.Values[1]
			fmt.Fprintf(w, "%-9s %-5s %12s %12s %8s\n", r.Name, r.Label, cell(a), cell(b), ratio(b, a))
		}
		fmt.Fprintf(w, "%-9s %-5s %12s %12s %8s\n", "cpu/req", "mean", cell(d.CPUPerRequest), cell(p.CPUPerRequest), ratio(p.CPUPerRequest, d.CPUPerRequest))
		fmt.Fprintf(w, "added per request: latency p50 %s, cpu %s\n", stats.Significant(sp.P50-sd.P50), stats.Significant(p.CPUPerRequest-d.CPUPerRequest))
	}
	pair("keep-alive connections", "direct", "proxy")
	fmt.Fprintln(w)
	pair("a new TLS connection per request (full handshake; the proxy reuses its upstream connections)", "direct fresh", "proxy fresh")
	fmt.Fprintln(w, "latency: client.Do to the body read; cpu/req: the whole process's user+sys CPU (client, proxy and upstream all")
	fmt.Fprintln(w, "in it) over the recorded requests, per request. Ratios are proxy/direct.")
	fmt.Fprintf(w, "checked: the upstream got the secret in all %d recorded requests; every proxied response had the placeholder, never the secret\n", r.UpstreamSecret)
	fmt.Fprintf(w, "proxy counters: %d requests, %d substituted, %d denied (warm-up included)\n", r.ProxyStats.Requests, r.ProxyStats.Substituted, r.ProxyStats.Denied)
}

// variantsJSON is the JSON of each of vs, by its name (fn: the name and
// the JSON of one).
func variantsJSON[V any](vs []V, fn func(V) (string, map[string]any)) map[string]any {
	out := map[string]any{}
	for _, v := range vs {
		name, j := fn(v)
		out[name] = j
	}
	return out
}

func filterJSON(r *filterReport) map[string]any {
	vs := variantsJSON(r.Variants, func(v filterVariantReport) (string, map[string]any) {
		return v.Name, map[string]any{
			"rtt":                 stats.Summarise(v.Name, v.RTT),
			"lost":                v.Lost,
			"cpu_ns_per_packet":   v.CPUPerPacket,
			"bpf_ns_per_run":      v.BPFNsPerRun,
			"bpf_runs":            v.BPFRuns,
			"bpf_runs_per_packet": v.BPFRunsPerPkt,
			"recorded_frames":     v.RecordedFrames,
		}
	})
	return map[string]any{
		"packets_per_variant": r.Packets,
		"rounds":              r.Rounds,
		"policy_rules":        r.PolicyRules,
		"table_entries":       r.TableEntries,
		"pin_cpu":             r.PinCPU,
		"probe_payload_bytes": probeSize,
		"bpf_stats":           r.BPFStats,
		"bpf_stats_packets":   r.BPFStatsPackets,
		"order":               "variants take turns each round, the order rotated; unrecorded probes after each switch",
		"variants":            vs,
		"counters":            r.Counters,
	}
}

func proxyJSON(r *proxyReport) map[string]any {
	vs := variantsJSON(r.Variants, func(v proxyVariantReport) (string, map[string]any) {
		return v.Name, map[string]any{
			"latency":            stats.Summarise(v.Name, v.Latency),
			"cpu_ns_per_request": v.CPUPerRequest,
		}
	})
	return map[string]any{
		"requests_per_variant":            r.Requests,
		"fresh_conn_requests_per_variant": r.FreshConns,
		"rounds":                          r.Rounds,
		"response_body_bytes":             r.BodyBytes,
		"variants":                        vs,
		"upstream_requests_with_secret":   r.UpstreamSecret,
		"proxy_stats":                     r.ProxyStats,
	}
}

// lastCPU is the highest CPU the process may run on (0 when unknown).
func lastCPU() int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return 0
	}
	last := 0
	for i := range 1024 {
		if set.IsSet(i) {
			last = i
		}
	}
	return last
}
