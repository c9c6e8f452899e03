package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/warrenvm/warren/bench/stats"
	"github.com/warrenvm/warren/vmmctl"
)

// densityResult is measurement 2.
type densityResult struct {
	MemMiB int `json:"mem_mib"`
	// Balloon says the parent (and so every child) had a virtio-balloon
	// with free page reporting (warren run --balloon).
	Balloon bool `json:"balloon"`
	// Label names the run in a replot (--replot LABEL=FILE); not saved.
	Label    string `json:"-"`
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
	// Points are the measurements taken when the count of children
	// reached each of densityPoints.
	Points []densityPoint `json:"points"`
}

// densityPoints are the child counts at which the density measurement
// stops to take a densityPoint (--density-points; issue 20 asks for 16,
// 64 and 256), in increasing order.
var densityPoints = []int{16, 64, 256}

// densityPoint is the state with Children children running idle.
type densityPoint struct {
	Children int `json:"children"`
	// DropPerChild is MemAvailable's drop since before the first child,
	// over Children, in bytes.
	DropPerChild float64 `json:"mem_available_drop_per_child_bytes"`
	// Marginal is MemAvailable's drop per child since the previous point
	// (or since before the first child), in bytes.
	Marginal float64 `json:"marginal_bytes_per_child"`
	// Split is the children's mean memory, guest RAM against the rest of
	// the VMM process (/proc/PID/smaps).
	Split memSplit `json:"child_mean_split"`
	// CPUBusy is the fraction of the host's CPUs busy over cpuSample
	// with the children idle (/proc/stat).
	CPUBusy float64 `json:"cpu_busy"`
	// FirstChildTop are the first child's mappings holding the most
	// private memory: where the VMM process's own cost sits.
	FirstChildTop []mapPrivate `json:"first_child_top_private"`
}

// cpuSample is how long each densityPoint samples the host's CPU use (a
// variable for the tests).
var cpuSample = 3 * time.Second

// point measures the state with the children running.
func (d *densityResult) point(children []vmmctl.ForkChild) (densityPoint, error) {
	n := d.Children
	p := densityPoint{Children: n}
	last := d.Avail[n-1]
	p.DropPerChild = (float64(d.AvailBefore) - float64(last)) / float64(n)
	prevN, prevAvail := 0, d.AvailBefore
	if k := len(d.Points); k > 0 {
		prevN, prevAvail = d.Points[k-1].Children, d.Avail[d.Points[k-1].Children-1]
	}
	p.Marginal = (float64(prevAvail) - float64(last)) / float64(n-prevN)
	var sum memSplit
	k := uint64(0)
	for _, ch := range children {
		if !alive(ch.PID) {
			continue
		}
		m, err := readSmapsSplit(ch.PID)
		if err != nil {
			return p, err
		}
		if k == 0 {
			if p.FirstChildTop, err = readTopPrivate(ch.PID, 8); err != nil {
				return p, err
			}
		}
		sum.GuestPss += m.GuestPss
		sum.GuestPrivate += m.GuestPrivate
		sum.VMMPss += m.VMMPss
		sum.VMMPrivate += m.VMMPrivate
		k++
	}
	if k > 0 {
		p.Split = memSplit{sum.GuestPss / k, sum.GuestPrivate / k, sum.VMMPss / k, sum.VMMPrivate / k}
	}
	t0, err := readCPUTimes()
	if err != nil {
		return p, err
	}
	time.Sleep(cpuSample)
	t1, err := readCPUTimes()
	if err != nil {
		return p, err
	}
	if t1.total > t0.total {
		p.CPUBusy = float64(t1.busy-t0.busy) / float64(t1.total-t0.total)
	}
	return p, nil
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
func density(c config, reg *registry, work string, balloon bool) (*densityResult, error) {
	dir := filepath.Join(work, "density")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	fmt.Printf("density: parent guest %d MiB (balloon %v), at most %d children, floor %.0f%% of MemTotal\n", c.densityMem, balloon, c.densityMax, c.densityFloor)
	var extra []string
	if balloon {
		extra = []string{"--balloon"}
	}
	w, err := bootWarren(c, reg, dir, "parent", c.densityMem, extra...)
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
	d := &densityResult{MemMiB: c.densityMem, Balloon: balloon, MemTotal: mi.Total, AvailBefore: mi.Available,
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
		if slices.Contains(densityPoints, d.Children) {
			p, err := d.point(children)
			if err != nil {
				return nil, err
			}
			d.Points = append(d.Points, p)
			fmt.Printf("density: at %d children: %.2f MiB/child (marginal %.2f), child guest RAM private %.2f MiB, VMM private %.2f MiB, CPUs %.0f%% busy\n",
				p.Children, mib(p.DropPerChild), mib(p.Marginal), mib(p.Split.GuestPrivate), mib(p.Split.VMMPrivate), 100*p.CPUBusy)
			for _, m := range p.FirstChildTop {
				fmt.Printf("density:   first child's mapping %-60s private %7.2f MiB\n", m.Name, mib(m.Private))
			}
		}
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
