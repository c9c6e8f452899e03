package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/warrenvm/warren/bench/stats"
	"github.com/warrenvm/warren/vmmctl"
)

// densityResult is measurement 2.
type densityResult struct {
	MemMiB   int    `json:"mem_mib"`
	Children int    `json:"children"`
	Stop     string `json:"stop"` // "floor", "cap" or "error: ..."
	// MemTotal, AvailBefore (parent running, no child) and Avail (after
	// each child's agent answered) are /proc/meminfo's, in bytes.
	MemTotal    uint64   `json:"mem_total_bytes"`
	AvailBefore uint64   `json:"mem_available_before_bytes"`
	Avail       []uint64 `json:"mem_available_bytes"`
	FloorBytes  uint64   `json:"floor_bytes"`
	// ForkToAgent is each child's fork request to its agent's answer.
	ForkToAgent stats.Summary `json:"fork_to_agent"`
	// Child and Parent are the processes' smaps_rollup once all children
	// ran, in bytes.
	Child  []procMem `json:"child_smaps_rollup"`
	Parent procMem   `json:"parent_smaps_rollup"`
}

// dropPerChild is MemAvailable's drop per child, in bytes.
func (d *densityResult) dropPerChild() float64 {
	if d.Children == 0 || len(d.Avail) == 0 {
		return 0
	}
	return (float64(d.AvailBefore) - float64(d.Avail[len(d.Avail)-1])) / float64(d.Children)
}

// childMean is the children's mean PSS and Private, in bytes.
func (d *densityResult) childMean() (pss, private float64) {
	if len(d.Child) == 0 {
		return 0, 0
	}
	for _, m := range d.Child {
		pss += float64(m.Pss)
		private += float64(m.Private)
	}
	n := float64(len(d.Child))
	return pss / n, private / n
}

// density runs measurement 2: one parent, forked one child at a time until
// MemAvailable is below the floor or there are c.densityMax children.
func density(c config, reg *registry, work string) (*densityResult, error) {
	dir := filepath.Join(work, "density")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	fmt.Printf("density: parent guest %d MiB, at most %d children, floor %.0f%% of MemTotal\n", c.densityMem, c.densityMax, c.densityFloor)
	w, err := bootWarren(c, reg, dir, "parent", c.densityMem)
	if err != nil {
		return nil, err
	}
	defer w.stop(reg)
	var children []vmmctl.ForkChild
	defer func() { stopChildren(reg, children) }()

	mi, err := readMeminfo()
	if err != nil {
		return nil, err
	}
	d := &densityResult{MemMiB: c.densityMem, MemTotal: mi.Total, AvailBefore: mi.Available,
		FloorBytes: uint64(float64(mi.Total) * c.densityFloor / 100)}
	var agentT []time.Duration
	for avail := mi.Available; ; {
		if avail < d.FloorBytes {
			d.Stop = "floor"
			break
		}
		if d.Children == c.densityMax {
			d.Stop = "cap"
			break
		}
		k := d.Children
		r, _, t, err := forkToAgent(c, reg, w, filepath.Join(dir, fmt.Sprintf("c%d", k)))
		children = append(children, r.Children...)
		if err != nil {
			// Running out of host memory may well end it this way.
			d.Stop = "error: " + err.Error()
			fmt.Printf("density: fork %d FAILED: %v\n", k+1, err)
			break
		}
		agentT = append(agentT, t)
		d.Children++
		if mi, err = readMeminfo(); err != nil {
			return nil, err
		}
		avail = mi.Available
		d.Avail = append(d.Avail, avail)
		fmt.Printf("density: %3d children, MemAvailable %8.1f MiB (%.1f%%), agent %s\n",
			d.Children, mib(avail), 100*float64(avail)/float64(mi.Total), stats.Significant(t))
	}
	d.ForkToAgent = stats.Summarise("warren fork to agent", agentT)
	for _, ch := range children {
		if !alive(ch.PID) {
			continue
		}
		m, err := readSmapsRollup(ch.PID)
		if err != nil {
			return nil, err
		}
		d.Child = append(d.Child, m)
	}
	if d.Parent, err = readSmapsRollup(w.p.Pid()); err != nil {
		return nil, err
	}
	return d, nil
}

// mib converts bytes to MiB.
func mib[T uint64 | int64 | float64](b T) float64 { return float64(b) / (1 << 20) }
