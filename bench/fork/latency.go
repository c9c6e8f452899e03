package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/warrenvm/warren/bench/agentdial"
	"github.com/warrenvm/warren/bench/console"
	"github.com/warrenvm/warren/bench/qemu"
	"github.com/warrenvm/warren/bench/rig"
	"github.com/warrenvm/warren/bench/stats"
)

// sizeResult is measurement 1 for one guest size.
type sizeResult struct {
	MemMiB int
	Warren warrenSeries
	QEMU   *qemuSeries // nil with --skip-qemu
}

// warrenSeries are the samples of the forks of one parent.
type warrenSeries struct {
	Call  []time.Duration // POST /v1/fork's round trip
	Pause []time.Duration // the parent's pause (pause_ms)
	Ready []time.Duration // pause end to the child's first KVM_RUN (ready_ms)
	Agent []time.Duration // request sent to the child's agent answering
	// Layers is the parent's memory layers after each fork.
	Layers []int
	// Failures are runs that failed (not in the figures).
	Failures []string
}

// qemuSeries are the samples of the restores of one migration file.
type qemuSeries struct {
	Downtime, MigrationTotal time.Duration // query-migrate's, of the one migration
	FileBytes                int64
	Agent                    []time.Duration // process start to the agent answering
	Failures                 []string
}

// latency runs measurement 1 for one size: the Warren parent boots and the
// QEMU guest boots, migrates to a file and stops; then one unrecorded run
// each and c.runs rounds, a Warren fork and a QEMU restore per round, in
// turns.
func latency(c config, reg *registry, work string, size int) (*sizeResult, error) {
	dir := filepath.Join(work, fmt.Sprintf("lat%d", size))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	res := &sizeResult{MemMiB: size}
	fmt.Printf("fork latency, guest %d MiB\n", size)
	w, err := bootWarren(c, reg, dir, "parent", size)
	if err != nil {
		return nil, err
	}
	defer w.stop(reg)
	mig := filepath.Join(dir, "qemu.mig")
	if !c.skipQEMU {
		res.QEMU = &qemuSeries{}
		if err := qemuSource(c, reg, dir, size, mig, res.QEMU); err != nil {
			// A host too small for a second guest of this size (the
			// nested host has 4 GiB): measure Warren alone here.
			fmt.Printf("%d MiB: the QEMU peer could not be started (%v); Warren only for this size\n", size, err)
			res.QEMU = nil
		}
	}
	t0 := time.Now()
	for rd := -1; rd < c.runs; rd++ { // round -1: warm-up
		label := fmt.Sprintf("run %d", rd+1)
		if rd < 0 {
			label = "warm-up"
		}
		steps := []func(){
			func() { warrenRun(c, reg, w, dir, rd, label, &res.Warren) },
		}
		if res.QEMU != nil {
			cid := c.qemuCID + 2 + rd // a fresh CID for each restore
			steps = append(steps, func() { qemuRun(c, reg, dir, size, mig, cid, rd, label, res.QEMU) })
			if rd%2 == 1 {
				steps[0], steps[1] = steps[1], steps[0]
			}
		}
		for _, s := range steps {
			s()
		}
		if !alive(w.p.Pid()) {
			return nil, fmt.Errorf("the Warren parent exited: %s", tail(w.p.Output()))
		}
		if rd >= 0 && (rd+1)%10 == 0 {
			fmt.Printf("%d MiB: %d of %d runs done (%s)\n", size, rd+1, c.runs, time.Since(t0).Round(time.Second))
		}
	}
	return res, nil
}

// warrenRun forks the parent once, waits for the child's agent, records
// the run (unless rd < 0) and stops the child.
func warrenRun(c config, reg *registry, w *parent, dir string, rd int, label string, s *warrenSeries) {
	r, call, agentT, err := forkToAgent(c, reg, w, filepath.Join(dir, "f"))
	defer stopChildren(reg, r.Children)
	if err != nil {
		recordFailure("warren fork", label, err, rd, &s.Failures)
		return
	}
	fmt.Printf("%-8s warren fork: call %8s pause %8s child running %8s agent %8s (%d layers)\n",
		label, stats.Significant(call), stats.Significant(ms(r.PauseMS)), stats.Significant(ms(r.Children[0].ReadyMS)), stats.Significant(agentT), r.Layers)
	if rd < 0 {
		return
	}
	s.Call = append(s.Call, call)
	s.Pause = append(s.Pause, ms(r.PauseMS))
	s.Ready = append(s.Ready, ms(r.Children[0].ReadyMS))
	s.Agent = append(s.Agent, agentT)
	s.Layers = append(s.Layers, r.Layers)
}

// recordFailure prints a failed run of kind (label: which) and, unless
// rd < 0 (a warm-up run), adds it to failures.
func recordFailure(kind, label string, err error, rd int, failures *[]string) {
	msg := fmt.Sprintf("%s: %v", label, err)
	fmt.Printf("%s FAILED, %s\n", kind, msg)
	if rd >= 0 {
		*failures = append(*failures, msg)
	}
}

// qemuSource boots the QEMU guest, migrates it to file once and stops it.
func qemuSource(c config, reg *registry, dir string, size int, file string, s *qemuSeries) error {
	g := qemu.Guest{Binary: c.QEMU, Kernel: c.Kernel, Initramfs: c.Initramfs, MemMiB: size, CID: c.qemuCID, GuestArgs: guestArgs}
	qmpPath := filepath.Join(dir, "qemu.qmp")
	p, err := console.Start(qemu.Argv(g, qmpPath))
	if err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	reg.addProc(p)
	defer func() { p.Kill(); reg.dropProc(p) }()
	client := qemu.AgentClient(uint32(c.qemuCID), nil)
	defer client.Close()
	if err := rig.WaitAgent("qemu", p, client, c.timeout); err != nil {
		return err
	}
	q, err := qemu.DialQMP(qmpPath, 30*time.Second)
	if err != nil {
		return err
	}
	defer q.Close()
	if err := q.UnlimitedBandwidth(); err != nil {
		return err
	}
	m, err := q.Migrate(file, c.timeout)
	if err != nil {
		return err
	}
	s.Downtime, s.MigrationTotal, s.FileBytes = m.Downtime, m.Total, m.Bytes
	fmt.Printf("qemu: migrated to a file once: downtime %s, total %s, %.1f MiB\n", m.Downtime, m.Total, float64(m.Bytes)/(1<<20))
	return nil
}

// qemuRun starts a QEMU from the migration file with guest CID cid, as
// bench/snapshot restores it, times it to its agent's answer, records the
// run (unless rd < 0) and stops it.
func qemuRun(c config, reg *registry, dir string, size int, file string, cid, rd int, label string, s *qemuSeries) {
	g := qemu.Guest{Binary: c.QEMU, Kernel: c.Kernel, Initramfs: c.Initramfs, MemMiB: size, CID: cid, GuestArgs: guestArgs}
	argv := append(qemu.Argv(g, ""), "-incoming", "exec:cat "+file)
	client := qemu.AgentClient(uint32(cid), agentdial.Racing)
	defer client.Close()
	pg, err := rig.StartGroup(argv)
	var agentT time.Duration
	if err == nil {
		reg.addGroup(pg.Cmd.Process.Pid)
		gone := func() bool {
			select {
			case <-pg.Exited:
				return true
			default:
				return false
			}
		}
		agentT, err = waitAnswer(client, pg.Started, pg.Started.Add(c.runTimeout), gone)
		stopGroups(reg, pg.Cmd.Process.Pid)
		select { // stopGroups saw it gone: Wait returns soon (then out is whole)
		case <-pg.Exited:
		case <-time.After(5 * time.Second):
		}
		if err != nil {
			err = fmt.Errorf("%w; output: %s", err, tail(pg.Out.String()))
		}
	}
	if err != nil {
		recordFailure("qemu restore", label, err, rd, &s.Failures)
		return
	}
	fmt.Printf("%-8s qemu restore: agent %8s\n", label, stats.Significant(agentT))
	if rd >= 0 {
		s.Agent = append(s.Agent, agentT)
	}
}

// json is one size's samples for --json.
func (r *sizeResult) json() map[string]any {
	w := r.Warren
	out := map[string]any{
		"warren": map[string]any{
			"fork_call":      stats.Summarise("warren fork call", w.Call),
			"pause":          stats.Summarise("warren pause", w.Pause),
			"child_running":  stats.Summarise("warren child first KVM_RUN", w.Ready),
			"fork_to_agent":  stats.Summarise("warren fork to agent", w.Agent),
			"memory_layers":  w.Layers,
			"failures":       w.Failures,
			"pause_note":     "pause_ms and ready_ms as POST /v1/fork reports them",
			"fork_call_note": "round trip of POST /v1/fork n=1, which returns once the child runs",
		},
	}
	if q := r.QEMU; q != nil {
		out["qemu"] = map[string]any{
			"migration_downtime_ns": q.Downtime,
			"migration_total_ns":    q.MigrationTotal,
			"migration_file_bytes":  q.FileBytes,
			"restore_to_agent":      stats.Summarise("qemu restore to agent", q.Agent),
			"failures":              q.Failures,
		}
	}
	return out
}

// ms converts milliseconds to a duration.
func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
