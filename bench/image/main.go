// Command image measures templates made from container images (issue 15),
// each figure beside the one it is compared with, in the same run:
//
//  1. base: making the ext4 base of an image with package image, cold (an
//     empty store) and cached (the same store again);
//
//  2. template: a template build through warren-hostd from the image, cold
//     (a new state directory: upload, base, boot, snapshot) and cached
//     (a second template on the same state: the base is there), beside a
//     template from the initramfs alone;
//
//  3. create: create-from-template latency of the image template vs the
//     initramfs template (creates interleaved, each sandbox deleted
//     after), and time to interactive (create plus a first exec answering);
//
//  4. snapshot: the pause and the bytes of a full snapshot of a sandbox
//     with a writable root disk (the image template's: the pause freezes
//     the disk as a new copy-on-write layer) vs one without (the
//     initramfs template's), through the daemon's snapshot API;
//
//  5. python: python3 start-up (`python3 -c pass`) inside the guest,
//     Warren vs QEMU -M microvm booting the same kernel, initramfs and
//     ext4 base (QEMU: virtio-blk, snapshot=on), timed by the guest's own
//     clock on its serial console; the first run (cold page cache) apart.
//
//     go run ./bench/image --image oci-layout:build/rootfs/debian:bookworm [--json F] [--png F]
//
// Needs root, /dev/kvm, bin/warren, bin/warren-hostd, the guest kernel and
// initramfs, e2fsprogs and qemu-system-x86. Guest times on a PVM or nested
// host are emulated: compare ratios, not absolute figures.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/warrenvm/warren/bench/console"
	"github.com/warrenvm/warren/bench/qemu"
	"github.com/warrenvm/warren/bench/rig"
	"github.com/warrenvm/warren/bench/stats"
	"github.com/warrenvm/warren/cow/disk"
	"github.com/warrenvm/warren/hostd/client"
	"github.com/warrenvm/warren/hostd/wire"
	"github.com/warrenvm/warren/image"
)

// config is the command line.
type config struct {
	rig.Files
	image, hostd                                string
	work, jsonOut, pngOut, parts                string
	builds, creates, snapshots, pythonRuns, mem int
	timeout                                     time.Duration
}

// results is the --json output.
type results struct {
	Started time.Time      `json:"started"`
	Image   string         `json:"image"`
	Host    string         `json:"host"`
	Base    *pair          `json:"base,omitempty"`
	Build   *buildResults  `json:"template_build,omitempty"`
	Create  *pair          `json:"create,omitempty"`
	TTI     *pair          `json:"time_to_interactive,omitempty"`
	Snap    *snapResults   `json:"snapshot,omitempty"`
	Python  *pythonResults `json:"python,omitempty"`
	Notes   []string       `json:"notes,omitempty"`
	Extra   map[string]any `json:"extra,omitempty"`
	Errors  []string       `json:"errors,omitempty"`
	Params  map[string]any `json:"params"`
	Version string         `json:"version"`
}

// pair is one figure for two systems (ours first) with the ratio of medians.
type pair struct {
	Ours  stats.Summary `json:"ours"`
	Peer  stats.Summary `json:"peer"`
	Ratio float64       `json:"ratio_p50"`
}

type buildResults struct {
	Cold, Cached, Initramfs stats.Summary
	// ColdPhases: upload+pull, base, the rest (boot, start, snapshot).
	ColdPull, ColdBase, ColdRest stats.Summary
}

type snapResults struct {
	Pause      pair    `json:"pause"`
	DiskBytes  []int64 `json:"layer_bytes_with_disk"`
	PlainBytes []int64 `json:"layer_bytes_without_disk"`
}

type pythonResults struct {
	Warm         pair          `json:"warm"`
	ColdWarren   time.Duration `json:"cold_warren_ns"`
	ColdQEMU     time.Duration `json:"cold_qemu_ns"`
	WarrenBootMS float64       `json:"warren_boot_ms"`
	QEMUBootMS   float64       `json:"qemu_boot_ms"`
}

func newPair(ours, peer stats.Summary) *pair {
	return &pair{Ours: ours, Peer: peer, Ratio: stats.Ratio(ours.P50, peer.P50)}
}

func main() {
	var c config
	flag.StringVar(&c.image, "image", "oci-layout:build/rootfs/debian:bookworm", "the image (any reference warren templates create --image takes)")
	c.Flags("guest initramfs")
	flag.StringVar(&c.hostd, "hostd", "bin/warren-hostd", "warren-hostd binary")
	flag.StringVar(&c.work, "dir", "", "working directory (default a new one under /tmp, removed after)")
	flag.StringVar(&c.jsonOut, "json", "", "write the results here (JSON)")
	flag.StringVar(&c.pngOut, "png", "", "plot the results here (PNG)")
	flag.StringVar(&c.parts, "parts", "base,template,create,snapshot,python", "which parts to run")
	flag.IntVar(&c.builds, "builds", 3, "base builds and template builds of each kind")
	flag.IntVar(&c.creates, "creates", 10, "creates from each template")
	flag.IntVar(&c.snapshots, "snapshots", 5, "full snapshots of each sandbox")
	flag.IntVar(&c.pythonRuns, "python-runs", 10, "python3 start-ups in each VM after the first")
	flag.IntVar(&c.mem, "mem", 512, "guest memory in MiB")
	flag.DurationVar(&c.timeout, "timeout", 15*time.Minute, "bound on each boot, build and in-guest command")
	flag.Parse()
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "bench/image:", err)
		os.Exit(1)
	}
}

func run(c config) error {
	for _, p := range []*string{&c.Kernel, &c.Initramfs, &c.Warren, &c.hostd} {
		a, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		*p = a
	}
	if strings.HasPrefix(c.image, image.LayoutPrefix) || strings.HasPrefix(c.image, image.ArchivePrefix) {
		kind, rest, _ := strings.Cut(c.image, ":")
		p, tag, _ := strings.Cut(rest, ":")
		a, err := filepath.Abs(p)
		if err != nil {
			return err
		}
		c.image = kind + ":" + a
		if tag != "" {
			c.image += ":" + tag
		}
	}
	if c.work == "" {
		w, err := os.MkdirTemp("", "bench-image-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(w)
		c.work = w
	}
	ctx, stop := signalContext()
	defer stop()
	host, _ := os.Hostname()
	res := &results{Started: time.Now().UTC(), Image: c.image, Host: host, Version: "1",
		Params: map[string]any{"builds": c.builds, "creates": c.creates, "snapshots": c.snapshots, "python_runs": c.pythonRuns, "mem_mib": c.mem}}
	if kvmIsPVM() {
		res.Notes = append(res.Notes, "host /dev/kvm is kvm_pvm: guest kernel mode is emulated (~1 us/instruction); guest-side times are not a hardware host's")
	}
	want := map[string]bool{}
	for _, p := range strings.Split(c.parts, ",") {
		want[strings.TrimSpace(p)] = true
	}
	part := func(name string, fn func() error) {
		if !want[name] || ctx.Err() != nil {
			return
		}
		fmt.Printf("\n== %s\n", name)
		if err := fn(); err != nil {
			fmt.Printf("%s: FAILED: %v\n", name, err)
			res.Errors = append(res.Errors, name+": "+err.Error())
		}
	}
	var base *image.Base
	part("base", func() (err error) { base, err = benchBase(ctx, c, res); return err })
	part("template", func() error { return benchTemplates(ctx, c, res) })
	part("create", func() error { return benchCreateAndSnapshot(ctx, c, res, want["snapshot"]) })
	if !want["create"] {
		part("snapshot", func() error { return benchCreateAndSnapshot(ctx, c, res, true) })
	}
	part("python", func() error { return benchPython(ctx, c, res, base) })
	if c.jsonOut != "" {
		if err := stats.WriteJSON(c.jsonOut, res); err != nil {
			return err
		}
		fmt.Println("\nwrote", c.jsonOut)
	}
	if c.pngOut != "" {
		if err := writePlot(c.pngOut, res); err != nil {
			return err
		}
		fmt.Println("wrote", c.pngOut)
	}
	if len(res.Errors) > 0 {
		return errors.New(strings.Join(res.Errors, "; "))
	}
	return nil
}

// signalContext is cancelled by SIGINT or SIGTERM.
func signalContext() (context.Context, func()) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// kvmIsPVM reports whether /dev/kvm is kvm_pvm's.
func kvmIsPVM() bool {
	_, err := os.Stat("/sys/module/kvm_pvm")
	return err == nil
}

// benchBase builds the image's base cold, in a new store each time, and
// then cached, in the last store; it returns the last base (for python).
func benchBase(ctx context.Context, c config, res *results) (*image.Base, error) {
	var cold, cached []time.Duration
	var last *image.Base
	for i := 0; i < c.builds; i++ {
		st := &image.Store{Dir: filepath.Join(c.work, fmt.Sprintf("store-%d", i))}
		img, err := image.Open(ctx, c.image, image.OpenOptions{})
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		b, err := st.Build(ctx, img, image.BuildOptions{Ref: c.image})
		if err != nil {
			return nil, err
		}
		cold = append(cold, time.Since(t0))
		t0 = time.Now()
		b2, err := st.Build(ctx, img, image.BuildOptions{Ref: c.image})
		if err != nil {
			return nil, err
		}
		if !b2.Cached {
			return nil, errors.New("the second build of the same image was not cached")
		}
		cached = append(cached, time.Since(t0))
		fmt.Printf("build %d: cold %s (%d layers, %.1f MiB of files, %d inodes, %d free), cached %s\n", i+1,
			stats.Significant(cold[i]), b.Layers, float64(b.ContentBytes)/(1<<20), b.Inodes, b.FreeInodes, stats.Significant(cached[i]))
		if last != nil {
			os.RemoveAll(filepath.Dir(filepath.Dir(filepath.Dir(last.Path))))
		}
		last = b
	}
	res.Base = newPair(stats.Summarise("cached", cached), stats.Summarise("cold", cold))
	stats.Table(os.Stdout, "image base build: cached vs cold", res.Base.Ours, res.Base.Peer)
	return last, nil
}

// daemon is a warren-hostd started for a part.
type daemon struct {
	cmd  *exec.Cmd
	sock string
	log  string
	c    *client.Client
	done chan struct{}
}

func startDaemon(ctx context.Context, c config, state string) (*daemon, error) {
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, err
	}
	d := &daemon{sock: filepath.Join(state, "hostd.sock"), log: filepath.Join(state, "hostd.log"), done: make(chan struct{})}
	logf, err := os.Create(d.log)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	d.cmd = exec.Command(c.hostd, "--state", filepath.Join(state, "state"), "--socket", d.sock, "--warren", c.Warren,
		"--stop-on-exit", "--guest-kernel", c.Kernel, "--guest-initramfs", c.Initramfs)
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { d.cmd.Wait(); close(d.done) }()
	if d.c, err = client.New(d.sock, "bench", ""); err != nil {
		d.stop()
		return nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := d.c.Health(ctx); err == nil {
			return d, nil
		}
		if time.Now().After(deadline) {
			d.stop()
			return nil, d.withLog(errors.New("warren-hostd did not answer in 30 s"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (d *daemon) stop() {
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(60 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
	}
}

func (d *daemon) withLog(err error) error {
	b, _ := os.ReadFile(d.log)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return fmt.Errorf("%w\nwarren-hostd log (end):\n%s", err, b)
}

// imageTemplate builds a template from c.image through d (a local
// image is uploaded first, as the CLI does).
func imageTemplate(ctx context.Context, c config, d *daemon) (*client.Template, time.Duration, error) {
	t0 := time.Now()
	req := wire.TemplateRequest{Image: c.image, MemMiB: c.mem}
	if strings.HasPrefix(c.image, image.LayoutPrefix) || strings.HasPrefix(c.image, image.ArchivePrefix) {
		img, err := image.Open(ctx, c.image, image.OpenOptions{})
		if err != nil {
			return nil, 0, err
		}
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(image.WriteArchive(pw, img, "bench/image:latest")) }()
		u, err := d.c.UploadImage(ctx, pr, c.image)
		pr.Close()
		if err != nil {
			return nil, 0, err
		}
		req.Image = u.Ref
	}
	tctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	t, err := d.c.CreateTemplate(tctx, req, nil)
	if err != nil {
		return nil, 0, d.withLog(err)
	}
	return t, time.Since(t0), nil
}

func initramfsTemplate(ctx context.Context, c config, d *daemon) (*client.Template, time.Duration, error) {
	t0 := time.Now()
	tctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	t, err := d.c.CreateTemplate(tctx, wire.TemplateRequest{Kernel: c.Kernel, Initramfs: c.Initramfs, MemMiB: c.mem}, nil)
	if err != nil {
		return nil, 0, d.withLog(err)
	}
	return t, time.Since(t0), nil
}

// benchTemplates builds image templates cold and cached, and initramfs
// templates, each on a daemon of its own state.
func benchTemplates(ctx context.Context, c config, res *results) error {
	var cold, cached, plain, pull, base, rest []time.Duration
	for i := 0; i < c.builds; i++ {
		d, err := startDaemon(ctx, c, filepath.Join(c.work, fmt.Sprintf("tpl-%d", i)))
		if err != nil {
			return err
		}
		err = func() error {
			defer d.stop()
			t, dur, err := imageTemplate(ctx, c, d)
			if err != nil {
				return err
			}
			cold = append(cold, dur)
			p, b := msDur(t.Image.PullMS), msDur(t.Image.BaseMS)
			pull, base, rest = append(pull, p), append(base, b), append(rest, dur-p-b)
			t2, dur2, err := imageTemplate(ctx, c, d)
			if err != nil {
				return err
			}
			if !t2.Image.Cached {
				return errors.New("the second template's base was not cached")
			}
			cached = append(cached, dur2)
			_, dur3, err := initramfsTemplate(ctx, c, d)
			if err != nil {
				return err
			}
			plain = append(plain, dur3)
			fmt.Printf("round %d: image cold %s (pull %s, base %s), image cached %s, initramfs %s\n", i+1,
				stats.Significant(dur), stats.Significant(p), stats.Significant(b), stats.Significant(dur2), stats.Significant(dur3))
			return nil
		}()
		os.RemoveAll(filepath.Join(c.work, fmt.Sprintf("tpl-%d", i)))
		if err != nil {
			return err
		}
	}
	br := &buildResults{Cold: stats.Summarise("cold", cold), Cached: stats.Summarise("cached", cached), Initramfs: stats.Summarise("initramfs", plain),
		ColdPull: stats.Summarise("upload+pull", pull), ColdBase: stats.Summarise("base", base), ColdRest: stats.Summarise("boot+snapshot", rest)}
	res.Build = br
	stats.Table(os.Stdout, "template build from the image: cold vs cached base", br.Cold, br.Cached)
	stats.Table(os.Stdout, "template build: image (cached base) vs initramfs", br.Cached, br.Initramfs)
	stats.Table(os.Stdout, "cold image template build phases: base vs upload+pull", br.ColdBase, br.ColdPull)
	return nil
}

func msDur(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// benchCreateAndSnapshot builds one template of each kind on one daemon,
// then interleaves creates from them (each sandbox deleted after its
// first exec answers), and with snap takes full snapshots of a sandbox
// of each.
func benchCreateAndSnapshot(ctx context.Context, c config, res *results, snap bool) error {
	d, err := startDaemon(ctx, c, filepath.Join(c.work, "create"))
	if err != nil {
		return err
	}
	defer d.stop()
	it, _, err := imageTemplate(ctx, c, d)
	if err != nil {
		return err
	}
	pt, _, err := initramfsTemplate(ctx, c, d)
	if err != nil {
		return err
	}
	type kind struct {
		name, tpl string
		create    []time.Duration
		tti       []time.Duration
	}
	kinds := []*kind{{name: "image", tpl: it.ID}, {name: "initramfs", tpl: pt.ID}}
	for i := 0; i < c.creates && ctx.Err() == nil; i++ {
		order := kinds
		if i%2 == 1 {
			order = []*kind{kinds[1], kinds[0]}
		}
		for _, k := range order {
			cctx, cancel := context.WithTimeout(ctx, c.timeout)
			t0 := time.Now()
			sb, err := d.c.Create(cctx, wire.SandboxRequest{Template: k.tpl}, nil)
			if err != nil {
				cancel()
				return d.withLog(fmt.Errorf("create from the %s template: %w", k.name, err))
			}
			created := time.Since(t0)
			_, err = d.c.Exec(cctx, sb.ID, wire.ExecRequest{Argv: []string{"true"}}, io.Discard, io.Discard)
			tti := time.Since(t0)
			d.c.Delete(cctx, sb.ID)
			cancel()
			if err != nil {
				return fmt.Errorf("exec in the %s sandbox: %w", k.name, err)
			}
			k.create, k.tti = append(k.create, created), append(k.tti, tti)
		}
		fmt.Printf("create %d: image %s (interactive %s), initramfs %s (interactive %s)\n", i+1,
			stats.Significant(kinds[0].create[i]), stats.Significant(kinds[0].tti[i]),
			stats.Significant(kinds[1].create[i]), stats.Significant(kinds[1].tti[i]))
	}
	res.Create = newPair(stats.Summarise("image", kinds[0].create), stats.Summarise("initramfs", kinds[1].create))
	res.TTI = newPair(stats.Summarise("image", kinds[0].tti), stats.Summarise("initramfs", kinds[1].tti))
	stats.Table(os.Stdout, "create from a template: image vs initramfs", res.Create.Ours, res.Create.Peer)
	stats.Table(os.Stdout, "time to interactive (create + first exec): image vs initramfs", res.TTI.Ours, res.TTI.Peer)
	if !snap {
		return nil
	}
	fmt.Println()
	sr := &snapResults{}
	var pauses [2][]time.Duration
	for ki, k := range kinds {
		cctx, cancel := context.WithTimeout(ctx, c.timeout)
		sb, err := d.c.Create(cctx, wire.SandboxRequest{Template: k.tpl}, nil)
		if err != nil {
			cancel()
			return err
		}
		for i := 0; i < c.snapshots; i++ {
			// Some writes first, so that there is something to freeze.
			if _, err := d.c.Exec(cctx, sb.ID, wire.ExecRequest{Argv: []string{"sh", "-c", fmt.Sprintf("echo %d > /tmp/snap-%d; sync", i, i)}}, io.Discard, io.Discard); err != nil {
				cancel()
				return err
			}
			s, err := d.c.Snapshot(cctx, sb.ID, wire.SnapshotRequest{Name: fmt.Sprintf("b%d", i)})
			if err != nil {
				cancel()
				return err
			}
			pauses[ki] = append(pauses[ki], msDur(s.PauseMS))
			if ki == 0 {
				sr.DiskBytes = append(sr.DiskBytes, s.Bytes)
			} else {
				sr.PlainBytes = append(sr.PlainBytes, s.Bytes)
			}
			fmt.Printf("%s sandbox snapshot %d: pause %.2f ms, memory layer %d bytes\n", k.name, i+1, s.PauseMS, s.Bytes)
		}
		d.c.Delete(cctx, sb.ID)
		cancel()
	}
	sr.Pause = *newPair(stats.Summarise("with disk", pauses[0]), stats.Summarise("no disk", pauses[1]))
	res.Snap = sr
	stats.Table(os.Stdout, "full snapshot pause: with a writable root disk vs without", sr.Pause.Ours, sr.Pause.Peer)
	return nil
}

// pyLine is one timed python3 start-up the guest prints (the first may
// follow the shell's prompt on its line).
var pyLine = regexp.MustCompile(`(?m)(?:^|\s)PY (\d+)\s*$`)

// benchPython boots Warren and QEMU on the same kernel, initramfs and
// base, one after the other, each with the image's shell on its console,
// and times python3 start-ups inside each guest.
func benchPython(ctx context.Context, c config, res *results, base *image.Base) error {
	if base == nil {
		st := &image.Store{Dir: filepath.Join(c.work, "store-python")}
		img, err := image.Open(ctx, c.image, image.OpenOptions{})
		if err != nil {
			return err
		}
		if base, err = st.Build(ctx, img, image.BuildOptions{Ref: c.image}); err != nil {
			return err
		}
	}
	args := "warren.root=/dev/vda warren.shell=1"
	// Warren: its own overlay over the base, as a sandbox has.
	ov := filepath.Join(c.work, "python.overlay")
	raw, err := disk.OpenRaw(base.Path, false)
	if err != nil {
		return err
	}
	o, err := disk.Create(ov, raw, disk.CreateOptions{BasePath: base.Path})
	raw.Close()
	if err != nil {
		return err
	}
	o.Close()
	defer os.Remove(ov)
	warrenArgv := []string{c.Warren, "run", "--kernel", c.Kernel, "--initramfs", c.Initramfs, "--mem", strconv.Itoa(c.mem), "--cpus", "1",
		"--disk", ov, "--cmdline", args}
	g := qemu.Guest{Binary: c.QEMU, Kernel: c.Kernel, Initramfs: c.Initramfs, MemMiB: c.mem, GuestArgs: args, Disks: []string{base.Path}, NoVsock: true}
	pr := &pythonResults{}
	var warm [2][]time.Duration
	for i, vm := range []struct {
		name string
		argv []string
		cold *time.Duration
		boot *float64
	}{{"warren", warrenArgv, &pr.ColdWarren, &pr.WarrenBootMS}, {"qemu", qemu.Argv(g, ""), &pr.ColdQEMU, &pr.QEMUBootMS}} {
		t0 := time.Now()
		p, err := console.Start(vm.argv)
		if err != nil {
			return fmt.Errorf("%s: %w", vm.name, err)
		}
		_, err = p.Wait(regexp.MustCompile(`warren-init: ready`), c.timeout)
		if err == nil {
			*vm.boot = float64(time.Since(t0).Milliseconds())
			// The shell starts after the ready line.
			_, _, err = p.Sh("true", c.timeout)
		}
		var out string
		if err == nil {
			loop := fmt.Sprintf(`for i in $(seq %d); do s=$(date +%%s%%N); python3 -c pass; e=$(date +%%s%%N); echo PY $((e-s)); done`, c.pythonRuns+1)
			out, _, err = p.Sh(loop, c.timeout)
		}
		p.Stop(10 * time.Second)
		if err != nil {
			return fmt.Errorf("%s: %w", vm.name, err)
		}
		ms := pyLine.FindAllStringSubmatch(out, -1)
		if len(ms) != c.pythonRuns+1 {
			return fmt.Errorf("%s: %d timings in the guest's output, want %d: %q", vm.name, len(ms), c.pythonRuns+1, out)
		}
		for j, m := range ms {
			ns, _ := strconv.ParseInt(m[1], 10, 64)
			if j == 0 {
				*vm.cold = time.Duration(ns)
			} else {
				warm[i] = append(warm[i], time.Duration(ns))
			}
		}
		fmt.Printf("%s: ready after %.1f s; python3 -c pass: first %s, then median %s\n", vm.name, *vm.boot/1000,
			stats.Significant(*vm.cold), stats.Significant(stats.Median(warm[i])))
	}
	pr.Warm = *newPair(stats.Summarise("warren", warm[0]), stats.Summarise("qemu", warm[1]))
	res.Python = pr
	stats.Table(os.Stdout, "python3 -c pass inside the guest (warm page cache): Warren vs QEMU", pr.Warm.Ours, pr.Warm.Peer)
	fmt.Printf("first run (cold page cache): warren %s, qemu %s (ratio %.2f)\n", stats.Significant(pr.ColdWarren), stats.Significant(pr.ColdQEMU), stats.Ratio(pr.ColdWarren, pr.ColdQEMU))
	return nil
}
