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
)

// restoreSources are the snapshots restored: Warren's DIR/NAME and QEMU's
// migration file, each in the warm and the cold directory.
type restoreSources struct {
	warrenWarm, warrenCold, qemuWarm, qemuCold string
}

// saveRestoreSources snapshots both idle VMs once and copies the files to
// the cold directory.
func saveRestoreSources(w, q *vm, src restoreSources) (map[string]any, error) {
	for _, d := range []string{filepath.Dir(src.warrenWarm), filepath.Dir(src.warrenCold)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	r, err := w.warrenSnapshot(src.warrenWarm, "full", 5*time.Minute)
	if err != nil {
		return nil, err
	}
	m, err := q.qemuMigrate(src.qemuWarm, 5*time.Minute)
	if err != nil {
		return nil, err
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
	if err := copyFile(src.qemuWarm, src.qemuCold); err != nil {
		return nil, err
	}
	fmt.Printf("restore sources (idle guests): warren full snapshot %d pages, layer %.1f MiB, state %d bytes; qemu migration file %.1f MiB\n",
		r.Pages, mib(r.LayerBytes), r.StateBytes, mib(m.Bytes))
	return map[string]any{"warren_pages": r.Pages, "warren_layer_bytes": r.LayerBytes, "warren_state_bytes": r.StateBytes,
		"qemu_file_bytes": m.Bytes}, nil
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
	name   string // "warren eager", "warren lazy", "qemu"
	cold   bool
	system string
	lazy   bool
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
	// Failures are the runs whose agent did not answer within
	// --restore-timeout (or that failed otherwise): counted, not timed.
	Failures []string
}

// restores runs measurement 2: the warm variants, then the cold ones, as
// restoreBlock does.
func restores(c config, src restoreSources, work string) (map[string]*restoreSeries, error) {
	var vs []variant
	for _, cold := range []bool{false, true} {
		if !c.caches[map[bool]string{false: "warm", true: "cold"}[cold]] {
			continue
		}
		for _, v := range []variant{{"warren eager", cold, "warren", false}, {"warren lazy", cold, "warren", true}, {"qemu", cold, "qemu", false}} {
			if c.variants[strings.TrimPrefix(v.name, "warren ")] {
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
		printRestores(c, res, nil) // so far: a later block that hangs the host leaves this one's table
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
			first, health, err := restoreOnce(c, v, src, runDir)
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
			fmt.Printf("%-8s %-17s first KVM_RUN %8s agent %8s\n", label, v.key(), stats.Significant(first), stats.Significant(health))
			if rd < 0 {
				continue
			}
			if v.system == "warren" {
				s.FirstRun = append(s.FirstRun, first)
			}
			s.Health = append(s.Health, health)
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

// qemuRestores counts QEMU restores, for their guest CIDs.
var qemuRestores int

// restoreOnce restores one snapshot and returns process start to the first
// KVM_RUN (0 for QEMU) and to the agent's first answer; the VMM is killed
// after.
func restoreOnce(c config, v variant, src restoreSources, runDir string) (first, health time.Duration, err error) {
	timing := filepath.Join(runDir, "timing")
	sock := filepath.Join(runDir, "vsock")
	os.Remove(timing)
	os.Remove(sock)
	var argv []string
	var client *agentclient.Client
	switch v.system {
	case "warren":
		snap := src.warrenWarm
		if v.cold {
			snap = src.warrenCold
		}
		argv = []string{c.Warren, "restore", "--vsock", sock, "--console", "/dev/null", "--timing", timing}
		if v.lazy {
			argv = append(argv, "--lazy")
		}
		argv = append(argv, snap)
		client = agentclient.NewDial(agentdial.Racing(func(ctx context.Context) (net.Conn, error) { return vsock.Dial(ctx, sock, agentwire.Port) }))
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
			return 0, 0, fmt.Errorf("drop caches: %w", err)
		}
	}
	pg, err := rig.StartGroup(argv)
	if err != nil {
		return 0, 0, err
	}
	start := pg.Started
	// Stopped as a user would (proc.StopGroup).
	defer proc.StopGroup(pg.Cmd.Process.Pid, pg.Exited, argv[0])
	deadline := start.Add(c.restoreTimeout)
	for {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		_, herr := client.Health(ctx)
		cancel()
		if herr == nil {
			health = time.Since(start)
			break
		}
		select {
		case <-pg.Exited:
			return 0, 0, fmt.Errorf("%s pg.Exited: %s", argv[0], tail(pg.Out.String()))
		default:
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("agent did not answer in %s: %w; output: %s", c.restoreTimeout, herr, tail(pg.Out.String()))
		}
		time.Sleep(time.Millisecond)
	}
	if v.system == "warren" {
		for {
			b, err := os.ReadFile(timing)
			if err == nil && strings.HasSuffix(string(b), "\n") {
				ns, perr := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				if perr != nil {
					return 0, 0, fmt.Errorf("--timing file: %w", perr)
				}
				first = time.Unix(0, ns).Sub(start)
				break
			}
			if time.Since(start) > health+10*time.Second {
				return 0, 0, errors.New("no --timing file 10s after the agent answered")
			}
			time.Sleep(time.Millisecond)
		}
	}
	return first, health, nil
}

func tail(s string) string {
	if len(s) > 800 {
		s = s[len(s)-800:]
	}
	return strings.TrimSpace(s)
}

// printRestores prints measurement 2's table.
func printRestores(c config, res map[string]*restoreSeries, srcInfo map[string]any) {
	fmt.Printf("restore latency, %d runs per variant (after one unrecorded each), guest %d MiB idle:\n", c.restoreRuns, c.memMiB)
	if srcInfo != nil {
		fmt.Printf("  warren full snapshot %v pages, layer %v bytes; qemu migration file %v bytes\n",
			srcInfo["warren_pages"], srcInfo["warren_layer_bytes"], srcInfo["qemu_file_bytes"])
	}
	fmt.Printf("%-5s %-13s %-14s %-4s %12s %12s %8s\n", "cache", "warren", "from start to", "", "warren", "qemu", "ratio")
	for _, cache := range []string{"warm", "cold"} {
		if !c.caches[cache] {
			continue
		}
		q := res[cache+" qemu"]
		if q == nil {
			q = &restoreSeries{}
		}
		for vi, name := range []string{"warren eager", "warren lazy"} {
			w := res[cache+" "+name]
			if w == nil {
				continue
			}
			for mi, m := range []struct {
				name string
				a, b []time.Duration
			}{{"first KVM_RUN", w.FirstRun, nil}, {"agent answer", w.Health, q.Health}} {
				for pi, p := range []float64{50, 90, 99} {
					c0, c1, c2 := "", "", ""
					if vi == 0 && mi == 0 && pi == 0 {
						c0 = cache
					}
					if mi == 0 && pi == 0 {
						c1 = strings.TrimPrefix(name, "warren ")
					}
					if pi == 0 {
						c2 = m.name
					}
					a := stats.Percentile(m.a, p)
					if m.b == nil {
						fmt.Printf("%-5s %-13s %-14s p%-3.0f %12s %12s %8s\n", c0, c1, c2, p, stats.Significant(a), "-", "-")
						continue
					}
					b := stats.Percentile(m.b, p)
					fmt.Printf("%-5s %-13s %-14s p%-3.0f %12s %12s %8.2f\n", c0, c1, c2, p, stats.Significant(a), stats.Significant(b), stats.Ratio(a, b))
				}
			}
		}
	}
	for _, cache := range []string{"warm", "cold"} {
		for _, name := range []string{"warren eager", "warren lazy", "qemu"} {
			if s := res[cache+" "+name]; s != nil && len(s.Failures) > 0 {
				f := s.Failures
				fmt.Printf("FAILED %s %s: %d of %d runs (not in the figures); first: %s\n", cache, name, len(f), c.restoreRuns, f[0])
			}
		}
	}
	fmt.Println("start: the benchmark's fork/exec of the VMM; first KVM_RUN: `warren restore --timing`; agent answer: first")
	fmt.Println("GET /health answered (qemu: over AF_VSOCK after -incoming \"exec:cat FILE\"). warm: files in --warm-dir;")
	fmt.Println("cold: files in --cold-dir, `sync; echo 3 > /proc/sys/vm/drop_caches` before each run. Ratios are warren/qemu.")
}

// restoreJSON is measurement 2 for --json.
func restoreJSON(c config, res map[string]*restoreSeries) map[string]any {
	out := map[string]any{"runs": c.restoreRuns, "warm_dir": c.warmDir, "cold_dir": c.coldDir, "mem_mib": c.memMiB}
	for k, s := range res {
		e := map[string]any{"agent_answer": stats.Summarise(k, s.Health), "failures": s.Failures}
		if s.FirstRun != nil {
			e["first_kvm_run"] = stats.Summarise(k, s.FirstRun)
		}
		out[k] = e
	}
	return out
}
