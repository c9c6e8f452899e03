// Command devices measures virtio-blk and virtio-net throughput between a
// guest and the host, for Warren and for QEMU's microvm machine (QEMU's own
// virtio-mmio devices) on the same kernel, initramfs, disk image and tap
// setup, alternating runs in one process. For each transfer it also reports
// the VMM's own host CPU time (less the time its vCPUs ran the guest) per
// request, with request counts read from the guest's /sys counters.
//
//	go run ./bench/devices --kernel build/vmlinux --initramfs build/initramfs.cpio [--runs 5]
//
// Needs root (network namespace, taps), /dev/kvm, and qemu-system-x86.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/warrenvm/warren/bench/rig"
	"github.com/warrenvm/warren/bench/stats"
)

type config struct {
	rig.Files
	runs, diskMiB, xferMiB, blobMiB int
	jsonOut                         string
}

func main() {
	var c config
	c.Flags("initramfs")
	flag.IntVar(&c.runs, "runs", 5, "transfers per measurement and system")
	flag.IntVar(&c.diskMiB, "disk-mib", 256, "size of the raw disk image")
	flag.IntVar(&c.xferMiB, "xfer-mib", 16, "MiB moved per disk transfer")
	flag.IntVar(&c.blobMiB, "blob-mib", 16, "MiB fetched per network transfer")
	stats.JSONFlag(&c.jsonOut)
	flag.Parse()
	if err := run(c); err != nil {
		fmt.Fprintln(os.Stderr, "bench/devices:", err)
		os.Exit(1)
	}
}

// measurement is one kind of transfer, as samples of throughput and of VMM
// CPU time per request.
type measurement struct {
	Name       string          `json:"name"`
	MiBps      []float64       `json:"mib_per_s"`
	CPUPerReq  []time.Duration `json:"vmm_cpu_per_request_ns"`
	WallTimes  []time.Duration `json:"wall_ns"`
	Requests   []uint64        `json:"requests"`
	CPUPerMiB  []time.Duration `json:"vmm_cpu_per_mib_ns"`
	systemName string
}

func run(c config) error {
	if err := c.Check(rig.Needs{Root: "network namespace and taps", QEMU: true}); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "warren-bench-devices")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// One sparse image per system, so neither reads blocks the other
	// brought into the host's page cache.
	var disks []string
	for _, name := range []string{"warren", "qemu"} {
		disk := filepath.Join(dir, name+".img")
		if err := os.WriteFile(disk, nil, 0o644); err != nil {
			return err
		}
		if err := os.Truncate(disk, int64(c.diskMiB)<<20); err != nil {
			return err
		}
		disks = append(disks, disk)
	}
	host, err := newNetHost(fmt.Sprintf("warren-bench-%d", os.Getpid()), c.blobMiB)
	if err != nil {
		return err
	}
	defer host.Close()

	systems := []*system{newWarren(c, disks[0], host), newQEMU(c, disks[1], host)}
	for _, s := range systems {
		if err := s.boot(); err != nil {
			for _, t := range systems {
				t.stop()
			}
			return fmt.Errorf("%s: boot: %w", s.name, err)
		}
		defer s.stop()
	}
	kinds := []string{"blk-read", "blk-write", "net-rx"}
	results := map[string]map[string]*measurement{}
	for _, s := range systems {
		results[s.name] = map[string]*measurement{}
		for _, k := range kinds {
			results[s.name][k] = &measurement{Name: k, systemName: s.name}
		}
	}
	for r := 0; r < c.runs; r++ {
		for _, k := range kinds {
			for _, s := range systems { // alternate systems within each kind
				if err := s.transfer(k, r, results[s.name][k]); err != nil {
					return fmt.Errorf("%s %s run %d: %w", s.name, k, r+1, err)
				}
			}
		}
	}
	fmt.Printf("\nvirtio throughput guest<->host, %d runs each (Warren vs QEMU microvm, same guest)\n", c.runs)
	fmt.Printf("%-10s %14s %14s %7s   %16s %16s %7s\n", "", "warren MiB/s", "qemu MiB/s", "ratio", "warren cpu/req", "qemu cpu/req", "ratio")
	for _, k := range kinds {
		w, q := results["warren"][k], results["qemu"][k]
		wm, qm := medianF(w.MiBps), medianF(q.MiBps)
		wc, qc := stats.Median(w.CPUPerReq), stats.Median(q.CPUPerReq)
		fmt.Printf("%-10s %14.1f %14.1f %7.2f   %16s %16s %7.2f\n", k, wm, qm, ratioF(wm, qm), wc, qc, stats.Ratio(wc, qc))
	}
	fmt.Println("(medians; MiB/s as seen from the host around the guest command; cpu/req is the VMM process's host CPU time less its vCPUs' guest time, per request the guest completed)")
	if c.jsonOut != "" {
		b, _ := json.MarshalIndent(results, "", "  ")
		return os.WriteFile(c.jsonOut, b, 0o644)
	}
	return nil
}

func medianF(v []float64) float64 {
	d := make([]time.Duration, len(v))
	for i, x := range v {
		d[i] = time.Duration(x * 1000)
	}
	return float64(stats.Median(d)) / 1000
}

func ratioF(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
