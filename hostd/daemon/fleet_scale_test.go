package daemon

import (
	"context"
	"fmt"
	"image/color"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/warrenvm/warren/bench/benchplot"
	"github.com/warrenvm/warren/bench/stats"
	v1 "github.com/warrenvm/warren/fleet/api/v1alpha1"
	"github.com/warrenvm/warren/fleet/controller"
	"github.com/warrenvm/warren/hostd/kube"
)

// TestFleetScale is the fleet's scale benchmark (issue 21), run only when
// WARREN_FLEET_SCALE names an output directory:
//
//	WARREN_FLEET_SCALE=bench/results/DIR go test ./hostd/daemon -run TestFleetScale -timeout 30m -v
//
// A real kube-apiserver and etcd, the controller, and WARREN_FLEET_HOSTS
// (default 50) hosts in this process, each a real daemon and a real
// hostd/kube agent, whose VMMs are the fake launcher's (sleep processes
// with a real guest agent on this host): the figures are the control
// plane's, not a VM's. WARREN_FLEET_SANDBOXES (default 1000) Sandboxes
// are created at once; a watch records, per sandbox, when it was placed
// (its host label appeared) and when it was Ready (its host's agent made
// the VM and said so), from the create's return. It prints p50/p90/p99
// of both and writes fleet-scale.json and fleet-scale.png to the
// directory.
func TestFleetScale(t *testing.T) {
	out := os.Getenv("WARREN_FLEET_SCALE")
	if out == "" {
		t.Skip("skipped: a benchmark; set WARREN_FLEET_SCALE=DIR to run it")
	}
	nHosts, nSandboxes := envInt("WARREN_FLEET_HOSTS", 50), envInt("WARREN_FLEET_SANDBOXES", 1000)
	k, workers := 2, envInt("WARREN_FLEET_WORKERS", 8)
	f := startFleet(t, "", func(format string, a ...any) { t.Logf(format, a...) }, controller.Config{K: k, Workers: workers})
	ctx := f.ctx
	launcher := newFakeLauncher(t)
	start := time.Now()
	for i := range nHosts {
		name := fmt.Sprintf("h%02d", i)
		state := t.TempDir()
		td := startDaemon(t, state, launcher, func(c *Config) { c.MaxRestores = 64 })
		agentCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- kube.Run(agentCtx, kube.Config{Kube: f.kube.ConfigFor("host-h1"), Host: name, Socket: td.sock, StateDir: state,
				Capacity: v1.HostResources{MemoryMiB: 64 << 10, CPUs: 64}, CPUGroup: "g1", LeaseDuration: 40 * time.Second,
				Log: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		}()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("host %s: %v", name, err)
			}
		})
	}
	f.eventually(2*time.Minute, "hosts registered", func() (bool, string) {
		var l v1.WarrenHostList
		f.c.List(ctx, &l)
		return len(l.Items) == nHosts, fmt.Sprint(len(l.Items))
	})
	t.Logf("%d hosts joined in %v", nHosts, time.Since(start).Round(time.Millisecond))
	f.create(&v1.SandboxTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "fake"},
		Spec: v1.SandboxTemplateSpec{Kernel: fakeKernel(t), MemoryMiB: 256, CPUs: 1}})

	// Watch first, then create all at once.
	wc, err := ctrlclient.NewWithWatch(f.kube.Config, ctrlclient.Options{Scheme: f.c.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(ctx, &v1.SandboxList{}, ctrlclient.InNamespace("team-a"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var mu sync.Mutex
	created, placed, ready := map[string]time.Time{}, map[string]time.Time{}, map[string]time.Time{}
	go func() {
		for ev := range w.ResultChan() {
			sb, ok := ev.Object.(*v1.Sandbox)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			now := time.Now()
			mu.Lock()
			if _, ok := placed[sb.Name]; !ok && sb.Labels[v1.LabelHost] != "" {
				placed[sb.Name] = now
			}
			if _, ok := ready[sb.Name]; !ok && meta.IsStatusConditionTrue(sb.Status.Conditions, v1.ConditionReady) {
				ready[sb.Name] = now
			}
			mu.Unlock()
		}
	}()
	begin := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i := range nSandboxes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			name := fmt.Sprintf("s-%04d", i)
			sb := &v1.Sandbox{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name},
				Spec: v1.SandboxSpec{SandboxTemplateRef: v1.TemplateRef{Name: "fake"}}}
			if err := f.c.Create(ctx, sb); err != nil {
				t.Errorf("create %s: %v", name, err)
				return
			}
			mu.Lock()
			created[name] = time.Now()
			mu.Unlock()
		}()
	}
	wg.Wait()
	createdAll := time.Since(begin)
	f.eventually(time.Duration(envInt("WARREN_FLEET_WAIT_S", 1200))*time.Second, "every sandbox ready", func() (bool, string) {
		mu.Lock()
		n, p := len(ready), len(placed)
		mu.Unlock()
		if n == nSandboxes {
			return true, ""
		}
		msg := fmt.Sprintf("%d placed, %d ready of %d", p, n, nSandboxes)
		var l v1.SandboxList
		f.c.List(ctx, &l, ctrlclient.InNamespace("team-a"))
		for _, sb := range l.Items {
			if c := meta.FindStatusCondition(sb.Status.Conditions, v1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
				msg += fmt.Sprintf("; %s on %q: %s %v", sb.Name, sb.Labels[v1.LabelHost], sb.Status.Phase, c)
				break
			}
		}
		return false, msg
	})
	all := time.Since(begin)
	var placeLat, readyLat []time.Duration
	per := map[string]int{}
	mu.Lock()
	for name, c := range created {
		placeLat = append(placeLat, max(placed[name].Sub(c), 0))
		readyLat = append(readyLat, max(ready[name].Sub(c), 0))
	}
	mu.Unlock()
	var l v1.SandboxList
	f.c.List(ctx, &l, ctrlclient.InNamespace("team-a"))
	for _, sb := range l.Items {
		per[sb.Status.HostName]++
	}
	counts := make([]int, 0, len(per))
	for _, n := range per {
		counts = append(counts, n)
	}
	slices.Sort(counts)
	sp, sr := stats.Summarise("placement (create -> host label)", placeLat), stats.Summarise("reconcile (create -> Ready)", readyLat)
	fmt.Printf("\nFleet scale: %d Sandboxes over %d hosts (fake VMMs; real kube-apiserver, etcd, controller and host agents), K=%d, %d workers\n",
		nSandboxes, nHosts, k, workers)
	fmt.Printf("creates issued in %v (32 at a time); all Ready after %v (%.0f sandboxes/s)\n", createdAll.Round(time.Millisecond),
		all.Round(time.Millisecond), float64(nSandboxes)/all.Seconds())
	fmt.Printf("sandboxes per host: min %d, median %d, max %d\n", counts[0], counts[len(counts)/2], counts[len(counts)-1])
	fmt.Printf("%-34s %10s %10s %10s\n", "latency", "p50", "p90", "p99")
	for _, s := range []stats.Summary{sp, sr} {
		fmt.Printf("%-34s %10v %10v %10v\n", s.Name, s.P50, s.P90, s.P99)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	res := map[string]any{"hosts": nHosts, "sandboxes": nSandboxes, "k": k, "workers": workers, "vmm": "fake launcher",
		"creates_issued_ms": createdAll.Milliseconds(), "all_ready_ms": all.Milliseconds(),
		"per_host_min": counts[0], "per_host_max": counts[len(counts)-1],
		"placement": sp, "reconcile": sr}
	if err := stats.WriteJSON(filepath.Join(out, "fleet-scale.json"), res); err != nil {
		t.Fatal(err)
	}
	if err := plotCDFs(filepath.Join(out, "fleet-scale.png"),
		fmt.Sprintf("%d Sandboxes over %d hosts (fake VMMs)", nSandboxes, nHosts), map[string][]time.Duration{
			"placed (host label)": placeLat, "Ready (agent made the VM)": readyLat}); err != nil {
		t.Fatal(err)
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// plotCDFs draws the empirical CDFs of each series, in milliseconds.
func plotCDFs(path, title string, series map[string][]time.Duration) error {
	p := gplot.New()
	p.Title.Text = title
	p.X.Label.Text = "ms from the create"
	p.Y.Label.Text = "fraction of sandboxes <= x"
	colors := []color.Color{color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}}
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range series {
			if !yield(k) {
				return
			}
		}
	})
	for i, name := range names {
		v := slices.Clone(series[name])
		slices.Sort(v)
		pts := make(plotter.XYs, len(v))
		for j, d := range v {
			pts[j] = plotter.XY{X: float64(d) / float64(time.Millisecond), Y: float64(j+1) / float64(len(v))}
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.StepStyle = plotter.PostStep
		l.LineStyle = draw.LineStyle{Color: colors[i%len(colors)], Width: vg.Points(1.5)}
		p.Add(l)
		p.Legend.Add(name, l)
	}
	p.Legend.Top, p.Legend.Left = true, false
	p.Add(plotter.NewGrid())
	c := benchplot.Canvas(900, 500)
	p.Draw(draw.New(c))
	return benchplot.SavePNG(path, c)
}
