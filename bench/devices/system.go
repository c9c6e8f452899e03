package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/warrenvm/warren/bench/console"
	"github.com/warrenvm/warren/bench/rig"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmm/boot"
	"github.com/warrenvm/warren/vmm/hostprofile"
)

// system is one VMM under test, booted once, driven through its console.
type system struct {
	name    string
	argv    []string
	tap     string
	guestIP string
	host    *netHost
	p       *console.Proc
	c       config
}

// guestArgs are the kernel arguments both systems' guests get (besides the
// base line and the host profile's).
func guestArgs(ip string) string {
	return "warren.shell=1 warren.data=none random.trust_cpu=1 warren.ip=" + ip + "/24 warren.gw=" + gatewayIP
}

func newWarren(c config, disk string, h *netHost) *system {
	const tap, ip = "wbench0", "10.201.0.2"
	return &system{name: "warren", tap: tap, guestIP: ip, host: h, c: c,
		argv: h.exec(c.Warren, "run", "--kernel", c.Kernel, "--initramfs", c.Initramfs, "--mem", "256",
			"--disk", disk, "--tap", tap, "--cmdline", guestArgs(ip))}
}

func newQEMU(c config, disk string, h *netHost) *system {
	const tap, ip = "qbench0", "10.201.0.3"
	var cmd boot.Cmdline // what warren boots with, less its virtio_mmio entries (QEMU adds its own)
	cmd.Add(vmm.BaseCmdline)
	cmd.Add(hostprofile.Detect("/sys/module").KernelArgs()...)
	cmd.Add(guestArgs(ip))
	return &system{name: "qemu", tap: tap, guestIP: ip, host: h, c: c,
		argv: h.exec(c.QEMU, "-M", "microvm,acpi=off", "-accel", "kvm", "-cpu", "host,-arch-capabilities", "-m", "256", "-smp", "1",
			"-nodefaults", "-no-user-config", "-nographic", "-serial", "stdio", "-monitor", "none",
			"-kernel", c.Kernel, "-initrd", c.Initramfs, "-append", cmd.String(),
			"-drive", "id=d0,file="+disk+",format=raw,if=none,file.locking=off",
			"-device", "virtio-blk-device,drive=d0",
			"-netdev", "tap,id=n0,ifname="+tap+",script=no,downscript=no",
			"-device", "virtio-net-device,netdev=n0",
			"-device", "virtio-rng-device")}
}

func (s *system) boot() error {
	p, err := console.Start(s.argv)
	if err != nil {
		return err
	}
	s.p = p
	if err := s.host.tapUp(s.tap, 5*time.Second); err != nil {
		return err
	}
	if _, err := p.Wait(rig.Ready, 10*time.Minute); err != nil {
		return err
	}
	time.Sleep(time.Second) // let the shell start
	fmt.Printf("%s: guest ready after %s\n", s.name, time.Since(p.Started()).Round(time.Millisecond))
	return nil
}

func (s *system) stop() {
	if s.p != nil {
		s.p.Kill()
	}
}

// counters reads a guest counter file and returns its whitespace-separated
// numbers.
func (s *system) counters(path string) ([]uint64, error) {
	out, _, err := s.p.Sh("cat "+path, time.Minute)
	if err != nil {
		return nil, err
	}
	var v []uint64
	for _, f := range strings.Fields(out) {
		if n, err := strconv.ParseUint(f, 10, 64); err == nil {
			v = append(v, n)
		} else if f != "$" { // a shell prompt may precede the output
			return nil, fmt.Errorf("%s: %q", path, out)
		}
	}
	return v, nil
}

// requests returns completed requests of a kind: block reads (stat field 1),
// block writes (field 5), received packets.
func (s *system) requests(kind string) (uint64, error) {
	switch kind {
	case "net-rx":
		v, err := s.counters("/sys/class/net/eth0/statistics/rx_packets")
		if err != nil || len(v) < 1 {
			return 0, err
		}
		return v[0], nil
	}
	v, err := s.counters("/sys/block/vda/stat")
	if err != nil || len(v) < 5 {
		return 0, fmt.Errorf("block stat: %v %v", v, err)
	}
	if kind == "blk-read" {
		return v[0], nil
	}
	return v[4], nil
}

// transfer moves c.xferMiB (disk) or c.blobMiB (network) once and records
// throughput and VMM CPU time per request.
func (s *system) transfer(kind string, run int, m *measurement) error {
	var cmd string
	mib := s.c.xferMiB
	off := run * s.c.xferMiB % max(s.c.diskMiB-s.c.xferMiB, 1) // fresh blocks each run: no guest page cache hits
	switch kind {
	case "blk-read":
		cmd = fmt.Sprintf("dd if=/dev/vda of=/dev/null bs=1M count=%d skip=%d status=none", mib, off)
	case "blk-write":
		cmd = fmt.Sprintf("dd if=/dev/zero of=/dev/vda bs=1M count=%d seek=%d status=none oflag=dsync", mib, off)
	case "net-rx":
		mib = s.c.blobMiB
		cmd = fmt.Sprintf("wget -O /dev/null http://%s:%d/blob", gatewayIP, httpPort)
	}
	req0, err := s.requests(kind)
	if err != nil {
		return err
	}
	cpu0, err := s.p.CPUTime()
	if err != nil {
		return err
	}
	_, wall, err := s.p.Sh(cmd, 10*time.Minute)
	if err != nil {
		return err
	}
	cpu1, err := s.p.CPUTime()
	if err != nil {
		return err
	}
	req1, err := s.requests(kind)
	if err != nil {
		return err
	}
	reqs := req1 - req0
	cpu := cpu1 - cpu0
	m.WallTimes = append(m.WallTimes, wall)
	m.MiBps = append(m.MiBps, float64(mib)/wall.Seconds())
	m.Requests = append(m.Requests, reqs)
	m.CPUPerMiB = append(m.CPUPerMiB, cpu/time.Duration(mib))
	if reqs > 0 {
		m.CPUPerReq = append(m.CPUPerReq, cpu/time.Duration(reqs))
	}
	fmt.Printf("run %d %-6s %-9s %7.1f MiB/s  %6d requests  vmm cpu %s\n", run+1, s.name, kind, float64(mib)/wall.Seconds(), reqs, cpu)
	return nil
}
