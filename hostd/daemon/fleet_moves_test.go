package daemon

import (
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/warrenvm/warren/bench/benchplot"
	"github.com/warrenvm/warren/bench/stats"
	v1 "github.com/warrenvm/warren/fleet/api/v1alpha1"
	"github.com/warrenvm/warren/fleet/controller"
	"github.com/warrenvm/warren/fleet/fleettest"
	hc "github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/store"
	"github.com/warrenvm/warren/hostd/wire"
)

// Kinds of move TestFleetMoves measures.
const (
	moveCross = "across hosts" // suspended to the object store, resumed on the other host
	moveSame  = "same host"    // one daemon's own pause to disk and resume
)

// moveSample is one measured suspend and resume of TestFleetMoves.
type moveSample struct {
	Round int    `json:"round"` // from 1
	Kind  string `json:"kind"`  // moveCross or moveSame
	// From and To are the hosts it was suspended on and resumed on
	// (equal for moveSame).
	From    string        `json:"from"`
	To      string        `json:"to"`
	Suspend time.Duration `json:"suspend_ns"`
	Resume  time.Duration `json:"resume_ns"`
}

// movePoll is how often the timed waits read the Sandbox: the
// resolution of the cross-host figures.
const movePoll = 50 * time.Millisecond

// TestFleetMoves is the cross-host against same-host resume benchmark of
// issue 21, run only when WARREN_FLEET_MOVES names an output directory (a
// relative one is taken from the repository root), with real VMs (KVM,
// as TestE2EFleet; in the nested KVM host here):
//
//	cd hostd/daemon && WARREN_FLEET_MOVES=bench/results/DIR ../../build/tests/moves.test -test.run TestFleetMoves -test.v
//
// (bench/results/2026-12-05-fleet/README.md has the command that runs it
// in the nested KVM host.)
// The fleet is TestE2EFleet's (a real kube-apiserver and etcd, the
// controller, SeaweedFS as the object store) with two warren-hostd hosts.
// One Sandbox of a 256 MiB kernel+initramfs template ("mover", team-a)
// and one sandbox of a template of the same spec made through h2's API
// ("local", team-b: no Sandbox object) run. Then, for
// WARREN_FLEET_MOVES_N rounds (default 10), each kind once, the order
// alternating by round:
//
//   - across hosts: mover's host is cordoned; spec.operatingMode
//     Suspended is patched, timed until the Sandbox is Suspended with a
//     snapshot in the object store and released by its host (pause to
//     disk, export, upload, status); then Running, timed until it is
//     Ready on the other host (placement, download, import, restore, the
//     agent's status); the host is uncordoned.
//   - same host: h2's daemon pauses local to disk and resumes it (the
//     API calls, timed).
//
// Before each move a new value goes into a file of the guest's RAM-backed
// root, and after it the file must hold it and a process started at the
// beginning, which alone holds a secret in its memory, must still run and
// write the secret when asked: a move that loses either fails the test.
// Timings never do. It prints p50/p90/p99 of suspend and resume for both
// kinds with the across/same ratios (stats.Table) and writes them to
// fleet-moves.txt, every sample to fleet-moves.json and a plot of them by
// round to fleet-moves.png in the directory. In the nested KVM host the
// guests run on an emulated CPU: compare the ratios, not the times.
func TestFleetMoves(t *testing.T) {
	out := os.Getenv("WARREN_FLEET_MOVES")
	if out == "" {
		t.Skip("skipped: a benchmark; set WARREN_FLEET_MOVES=DIR to run it (needs KVM)")
	}
	warren, kernel, initrd := e2ePaths(t)
	if !filepath.IsAbs(out) {
		out = filepath.Join(repoRoot(t), out)
	}
	rounds := envInt("WARREN_FLEET_MOVES_N", 10)
	_, step := e2eState(t, "fleet-moves-")
	f := startFleet(t, warren, step, controller.Config{K: -1})
	for _, h := range []string{"h1", "h2"} {
		f.join(h, 5)
	}
	f.eventually(time.Minute, "two hosts registered", func() (bool, string) {
		var l v1.WarrenHostList
		f.c.List(f.ctx, &l)
		return len(l.Items) == 2, fmt.Sprint(len(l.Items))
	})
	const memMiB, cpus = 256, 1
	f.create(&v1.SandboxTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "tiny"},
		Spec: v1.SandboxTemplateSpec{Kernel: kernel, Initramfs: initrd, MemoryMiB: memMiB, CPUs: cpus}})
	f.create(&v1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "mover"},
		Spec: v1.SandboxSpec{SandboxTemplateRef: v1.TemplateRef{Name: "tiny"}}})
	f.waitReady("team-a", 5*time.Minute, "mover")
	// The builder uploads the template after the first sandbox is
	// Ready: let it finish before anything is timed.
	f.eventually(2*time.Minute, "the template's snapshot recorded", func() (bool, string) {
		tpl := f.template("team-a", "tiny")
		return len(tpl.Status.Snapshots) > 0, fmt.Sprintf("%+v", tpl.Status)
	})
	sb := f.sandbox("team-a", "mover")
	moverW := f.startWitness("team-a", sb.Status.HostName, sb.Status.SandboxID, func(script string) string {
		return f.exec("team-a", f.sandbox("team-a", "mover"), script)
	})
	step("mover ready on %s", sb.Status.HostName)

	// The same-host baseline: a sandbox of h2's own, of the same spec.
	cl, err := hc.New(f.hosts["h2"].proc.sock, "team-b", "")
	if err != nil {
		t.Fatal(err)
	}
	tp, err := cl.CreateTemplate(f.ctx, wire.TemplateRequest{Kernel: kernel, Initramfs: initrd, MemMiB: memMiB, CPUs: cpus}, nil)
	if err != nil {
		t.Fatal(err)
	}
	lsb, err := cl.Create(f.ctx, wire.SandboxRequest{Template: tp.ID}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// f.exec needs only the host and the daemon's id.
	local := &v1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: "local"}, Status: v1.SandboxStatus{HostName: "h2", SandboxID: lsb.ID}}
	localW := f.startWitness("team-b", "h2", lsb.ID, func(script string) string { return f.exec("team-b", local, script) })
	step("local sandbox %s ready on h2", lsb.ID)

	var samples []moveSample
	for r := 1; r <= rounds; r++ {
		crossHost := func() {
			s := moveSample{Round: r, Kind: moveCross}
			moverW.before(r)
			s.From, s.To, s.Suspend, s.Resume = f.moveOnce("team-a", "mover")
			moverW.after()
			samples = append(samples, s)
			step("round %d: mover suspended on %s to the object store in %.2f s, resumed on %s in %.2f s: file and process intact",
				r, s.From, s.Suspend.Seconds(), s.To, s.Resume.Seconds())
		}
		sameHost := func() {
			s := moveSample{Round: r, Kind: moveSame, From: "h2", To: "h2"}
			localW.before(r)
			s.Suspend, s.Resume = timedSuspendResume(t, f, cl, lsb.ID)
			localW.after()
			samples = append(samples, s)
			step("round %d: local suspended on h2 to disk in %.2f s, resumed in %.2f s: file and process intact",
				r, s.Suspend.Seconds(), s.Resume.Seconds())
		}
		if r%2 == 1 {
			crossHost()
			sameHost()
		} else {
			sameHost()
			crossHost()
		}
	}
	if err := cl.Delete(f.ctx, lsb.ID); err != nil {
		t.Errorf("delete local sandbox: %v", err)
	}

	env := "real KVM"
	if os.Getenv("WARREN_KVMHOST") != "" {
		env = "the nested KVM host (guests on an emulated CPU under QEMU TCG): compare the ratios, not the times"
	}
	sum := summariseMoves(samples)
	var table strings.Builder
	writeMovesTable(&table, env, rounds, memMiB, sum)
	fmt.Print("\n" + table.String())
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "fleet-moves.txt"), []byte(table.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	res := map[string]any{"rounds": rounds, "hosts": 2, "vm": env, "guest_mem_mib": memMiB, "guest_cpus": cpus,
		"template": "kernel+initramfs", "object_store": "SeaweedFS S3 on loopback", "poll_ms": movePoll.Milliseconds(),
		"samples": samples, "summaries": sum}
	if err := stats.WriteJSON(filepath.Join(out, "fleet-moves.json"), res); err != nil {
		t.Fatal(err)
	}
	if err := plotMoves(filepath.Join(out, "fleet-moves.png"), samples); err != nil {
		t.Fatal(err)
	}
}

// moveWitness is what must survive a move of one sandbox: a file in the
// guest's RAM-backed root, rewritten before each move, and a process
// started once whose memory alone holds secret, which it writes to
// /tmp/beat (and removes /tmp/go) whenever /tmp/go appears.
type moveWitness struct {
	t      *testing.T
	exec   func(script string) string // sh -c script in the sandbox; fails the test on an error
	secret string
	mark   string // what /root/marker holds since before()
}

// startWitness starts the witness process in sandbox id of tenant ns on
// host; exec runs a script in that sandbox wherever it is now.
func (f *fleet) startWitness(ns, host, id string, exec func(string) string) *moveWitness {
	f.t.Helper()
	w := &moveWitness{t: f.t, exec: exec, secret: fmt.Sprintf("s%d", time.Now().UnixNano())}
	cl, err := hc.New(f.hosts[host].proc.sock, ns, "")
	if err != nil {
		f.t.Fatal(err)
	}
	// (The guest's userland is u-root's: gosh, no touch, seq or cut.)
	if _, err := cl.StartProcess(f.ctx, id, wire.ProcessRequest{Argv: []string{"sh", "-c",
		"v=" + w.secret + "; while :; do [ -f /tmp/go ] && rm -f /tmp/go && echo \"$v\" > /tmp/beat; sleep 1; done"}}); err != nil {
		f.t.Fatalf("start the witness process in %s: %v", id, err)
	}
	return w
}

// before writes round's marker and clears the process's last answer, so
// that after() sees only what was written after the move.
func (w *moveWitness) before(round int) {
	w.t.Helper()
	w.mark = fmt.Sprintf("round-%d-%d", round, time.Now().UnixNano())
	w.exec("echo " + w.mark + " > /root/marker; rm -f /tmp/go /tmp/beat")
}

// after fails the test unless the marker is the one before() wrote and
// the process answers with its secret within a minute.
func (w *moveWitness) after() {
	w.t.Helper()
	got := w.exec("cat /root/marker; echo > /tmp/go; i=0; while [ $i -lt 60 ] && [ ! -s /tmp/beat ]; do sleep 1; i=$((i+1)); done; " +
		"cat /tmp/beat 2>/dev/null || echo no-answer")
	if want := w.mark + "\n" + w.secret + "\n"; got != want {
		w.t.Fatalf("after the move: %q, want the marker and the process's secret %q", got, want)
	}
}

// setOperatingMode patches a Sandbox's spec.operatingMode.
func (f *fleet) setOperatingMode(ns, name string, mode v1.OperatingMode) {
	f.t.Helper()
	sb := f.sandbox(ns, name)
	orig := sb.DeepCopy()
	sb.Spec.OperatingMode = mode
	if err := f.c.Patch(f.ctx, sb, ctrlclient.MergeFrom(orig)); err != nil {
		f.t.Fatalf("set %s/%s %s: %v", ns, name, mode, err)
	}
}

// setUnschedulable sets a WarrenHost's spec.unschedulable.
func (f *fleet) setUnschedulable(host string, on bool) {
	f.t.Helper()
	var h v1.WarrenHost
	if err := f.c.Get(f.ctx, types.NamespacedName{Name: host}, &h); err != nil {
		f.t.Fatal(err)
	}
	orig := h.DeepCopy()
	h.Spec.Unschedulable = on
	// A merge patch: the host's agent may write the object meanwhile.
	if err := f.c.Patch(f.ctx, &h, ctrlclient.MergeFrom(orig)); err != nil {
		f.t.Fatalf("cordon %s %v: %v", host, on, err)
	}
}

// waitSandbox polls Sandbox ns/name every movePoll until cond holds and
// returns when it did (up to movePoll late).
func (f *fleet) waitSandbox(ns, name string, d time.Duration, what string, cond func(*v1.Sandbox) bool) {
	f.t.Helper()
	fleettest.Eventually(f.t, d, movePoll, what, func() (bool, string) {
		var sb v1.Sandbox
		if err := f.c.Get(f.ctx, types.NamespacedName{Namespace: ns, Name: name}, &sb); err != nil {
			return false, err.Error()
		}
		return cond(&sb), fmt.Sprintf("%v %+v", sb.Labels, sb.Status)
	})
}

// moveOnce moves Running Sandbox ns/name to another host through the
// object store: its host cordoned (before the suspend, so that the
// controller has seen it by the resume), Suspended until its host
// released it, Running until it is Ready elsewhere, the host
// uncordoned. It returns both hosts and both times, each from the patch.
func (f *fleet) moveOnce(ns, name string) (from, to string, suspend, resume time.Duration) {
	f.t.Helper()
	from = f.sandbox(ns, name).Status.HostName
	f.setUnschedulable(from, true)
	t0 := time.Now()
	f.setOperatingMode(ns, name, v1.OperatingModeSuspended)
	f.waitSandbox(ns, name, 3*time.Minute, name+" suspended to the object store", func(sb *v1.Sandbox) bool {
		return sb.Status.Phase == v1.SandboxSuspended && strings.HasPrefix(sb.Status.Snapshot, "s3://fleet/"+ns+"/") &&
			sb.Labels[v1.LabelHost] == "" && sb.Status.HostName == ""
	})
	suspend = time.Since(t0)
	t0 = time.Now()
	f.setOperatingMode(ns, name, v1.OperatingModeRunning)
	f.waitSandbox(ns, name, 4*time.Minute, name+" resumed on another host", func(sb *v1.Sandbox) bool {
		return isReady(sb) && sb.Status.HostName != "" && sb.Status.HostName != from
	})
	resume = time.Since(t0)
	f.setUnschedulable(from, false)
	return from, f.sandbox(ns, name).Status.HostName, suspend, resume
}

// timedSuspendResume pauses the daemon's sandbox id to disk and resumes it,
// and returns the two calls' times.
func timedSuspendResume(t *testing.T, f *fleet, cl *hc.Client, id string) (suspend, resume time.Duration) {
	t.Helper()
	t0 := time.Now()
	s, err := cl.Pause(f.ctx, id, true, nil)
	if err != nil {
		t.Fatalf("pause %s to disk: %v", id, err)
	}
	suspend = time.Since(t0)
	if s.Status != store.Suspended {
		t.Fatalf("%s after a pause to disk: %s, want %s", id, s.Status, store.Suspended)
	}
	t0 = time.Now()
	if s, err = cl.Resume(f.ctx, id, nil); err != nil {
		t.Fatalf("resume %s: %v", id, err)
	}
	resume = time.Since(t0)
	if s.Status != store.Running {
		t.Fatalf("%s after resume: %s, want %s", id, s.Status, store.Running)
	}
	return suspend, resume
}

// moveSummaries are the four series of TestFleetMoves.
type moveSummaries struct {
	CrossSuspend stats.Summary `json:"cross_suspend"`
	SameSuspend  stats.Summary `json:"same_suspend"`
	CrossResume  stats.Summary `json:"cross_resume"`
	SameResume   stats.Summary `json:"same_resume"`
}

func summariseMoves(samples []moveSample) moveSummaries {
	var cs, ss, cr, sr []time.Duration
	for _, s := range samples {
		if s.Kind == moveCross {
			cs, cr = append(cs, s.Suspend), append(cr, s.Resume)
		} else {
			ss, sr = append(ss, s.Suspend), append(sr, s.Resume)
		}
	}
	return moveSummaries{
		CrossSuspend: stats.Summarise(moveCross, cs), SameSuspend: stats.Summarise(moveSame, ss),
		CrossResume: stats.Summarise(moveCross, cr), SameResume: stats.Summarise(moveSame, sr)}
}

// writeMovesTable writes the benchmark's two tables (ratio: across/same).
func writeMovesTable(w io.Writer, env string, rounds, memMiB int, sum moveSummaries) {
	fmt.Fprintf(w, "Fleet moves: %d rounds, a %d MiB kernel+initramfs guest, 2 hosts, object store SeaweedFS on loopback\n", rounds, memMiB)
	fmt.Fprintf(w, "VMs: %s\n\n", env)
	stats.Table(w, "suspend (same: pause to disk; across: + export, upload, release)", sum.CrossSuspend, sum.SameSuspend)
	fmt.Fprintln(w)
	stats.Table(w, "resume (same: restore; across: + placement, download, import)", sum.CrossResume, sum.SameResume)
}

// plotMoves draws every sample by round: suspend and resume side by side,
// one line per kind, in seconds.
func plotMoves(path string, samples []moveSample) error {
	colors := map[string]color.Color{moveCross: color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, moveSame: color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}}
	panel := func(title string, value func(moveSample) time.Duration) (*gplot.Plot, error) {
		p := gplot.New()
		p.Title.Text = title
		p.X.Label.Text = "round"
		p.Y.Label.Text = "seconds"
		top := 0.0
		for _, kind := range []string{moveCross, moveSame} {
			var pts plotter.XYs
			for _, s := range samples {
				if s.Kind == kind {
					pts = append(pts, plotter.XY{X: float64(s.Round), Y: value(s).Seconds()})
					top = max(top, value(s).Seconds())
				}
			}
			if len(pts) == 0 {
				continue
			}
			l, sc, err := plotter.NewLinePoints(pts)
			if err != nil {
				return nil, err
			}
			l.LineStyle = draw.LineStyle{Color: colors[kind], Width: vg.Points(1.5)}
			sc.GlyphStyle.Color = colors[kind]
			p.Add(l, sc)
			p.Legend.Add(kind, l, sc)
		}
		// Room above the samples for the legend.
		p.Y.Min, p.Y.Max = 0, top*1.25
		p.Legend.Top = true
		p.Add(plotter.NewGrid())
		return p, nil
	}
	sp, err := panel("suspend", func(s moveSample) time.Duration { return s.Suspend })
	if err != nil {
		return err
	}
	rp, err := panel("resume", func(s moveSample) time.Duration { return s.Resume })
	if err != nil {
		return err
	}
	return benchplot.SaveGrid(path, [][]*gplot.Plot{{sp, rp}}, 600, 450)
}

// TestFleetMovesReport: TestFleetMoves's report puts each kind's samples
// in its own series, prints the across/same ratio of each percentile and
// draws a PNG of both panels.
func TestFleetMovesReport(t *testing.T) {
	var samples []moveSample
	for r := 1; r <= 4; r++ {
		sec := time.Duration(r) * time.Second
		samples = append(samples, moveSample{Round: r, Kind: moveCross, From: "h1", To: "h2", Suspend: 4 * sec, Resume: 3 * sec},
			moveSample{Round: r, Kind: moveSame, From: "h2", To: "h2", Suspend: sec, Resume: sec})
	}
	sum := summariseMoves(samples)
	if len(sum.CrossSuspend.Samples) != 4 || sum.CrossSuspend.P90 != 16*time.Second || sum.SameResume.P50 != 2*time.Second ||
		sum.CrossResume.P99 != 12*time.Second || sum.SameSuspend.Name != moveSame {
		t.Fatalf("summaries %+v", sum)
	}
	var b strings.Builder
	writeMovesTable(&b, "real KVM", 4, 256, sum)
	for _, want := range []string{"suspend (", "resume (", "across hosts", "same host", "VMs: real KVM"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	// Suspend's p50 row, then resume's p99 row: across, same, across/same.
	var rows []string
	for _, l := range strings.Split(b.String(), "\n") {
		if f := strings.Fields(l); len(f) == 4 && (f[0] == "p50" || f[0] == "p99") {
			rows = append(rows, strings.Join(f, " "))
		}
	}
	if want := []string{"p50 8s 2s 4.00", "p99 16s 4s 4.00", "p50 6s 2s 3.00", "p99 12s 4s 3.00"}; !slices.Equal(rows, want) {
		t.Errorf("rows %q, want %q:\n%s", rows, want, b.String())
	}
	path := filepath.Join(t.TempDir(), "moves.png")
	if err := plotMoves(path, samples); err != nil {
		t.Fatal(err)
	}
	img, err := benchplot.ReadPNG(path)
	if err != nil {
		t.Fatal(err)
	}
	if r := img.Bounds(); r.Dx() != 1200 || r.Dy() != 450 {
		t.Errorf("plot %v, want 1200x450 (two panels)", r)
	}
}
