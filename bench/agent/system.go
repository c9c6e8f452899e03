package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/warrenvm/warren/agentclient"
	"github.com/warrenvm/warren/agentwire"
	"github.com/warrenvm/warren/bench/rig"
	"github.com/warrenvm/warren/bench/vsockpeer"
	"github.com/warrenvm/warren/vmm"
	"github.com/warrenvm/warren/vmm/boot"
	"github.com/warrenvm/warren/vmm/hostprofile"
)

// guestArgs are the kernel arguments both guests get besides the base line
// and the host profile's (QEMU's microvm adds the virtio_mmio.device=
// entries for its own devices; Warren adds its own).
const guestArgs = "random.trust_cpu=1"

// system is one VMM under test with its guest's agent: booted once, then
// called many times over one client (one kept-alive connection).
type system struct {
	rig.Guest
	// outside are kernel threads doing the VMM's work outside its process
	// (QEMU's vhost-vsock worker), counted as VMM CPU; found after boot.
	outside []int
	// findOutside, when non-nil, finds outside for the VMM's pid.
	findOutside func(pid int) ([]int, error)
}

// newWarren runs Warren with its userspace virtio-vsock device; the host
// reaches the agent through the device's unix socket (CONNECT 1024).
func newWarren(c config, dir string) *system {
	sock := dir + "/warren.vsock"
	return &system{Guest: rig.Guest{Name: "warren", Argv: c.WarrenArgv(256, sock, "", guestArgs), Client: agentclient.New(sock)}}
}

// newQEMU runs QEMU's microvm machine with the kernel's vhost-vsock
// device; the host reaches the agent over AF_VSOCK at the guest's CID. It
// gets virtio-rng too, as Warren gives its guests one by default.
// debug-threads names its vCPU threads "CPU n/KVM".
func newQEMU(c config) *system {
	var cmd boot.Cmdline // what warren boots with, less its virtio_mmio entries
	cmd.Add(vmm.BaseCmdline)
	cmd.Add(hostprofile.Detect("/sys/module").KernelArgs()...)
	cmd.Add(guestArgs)
	cid := uint32(c.qemuCID)
	return &system{Guest: rig.Guest{Name: "qemu",
		Argv: []string{c.QEMU, "-name", "qemu,debug-threads=on", "-M", "microvm,acpi=off", "-accel", "kvm", "-cpu", "host,-arch-capabilities", "-m", "256", "-smp", "1",
			"-nodefaults", "-no-user-config", "-nographic", "-serial", "stdio", "-monitor", "none",
			"-kernel", c.Kernel, "-initrd", c.Initramfs, "-append", cmd.String(),
			"-device", "virtio-rng-device",
			"-device", "vhost-vsock-device,guest-cid=" + strconv.FormatUint(uint64(cid), 10)},
		Client: agentclient.NewDial(func(ctx context.Context) (net.Conn, error) {
			return vsockpeer.Dial(ctx, cid, agentwire.Port)
		})},
		findOutside: procfs("/proc").vhostWorkers,
	}
}

// waitAgent waits for the guest's ready line and then for the agent to
// answer, and finds the VMM's outside threads.
func (s *system) waitAgent(timeout time.Duration) error {
	if err := s.Guest.WaitAgent(timeout); err != nil {
		return err
	}
	if s.findOutside != nil {
		var err error
		if s.outside, err = s.findOutside(s.P.Pid()); err != nil {
			return fmt.Errorf("%s: %w", s.Name, err)
		}
	}
	return nil
}

func (s *system) stop() {
	s.Client.Close()
	if s.P != nil {
		s.P.Kill()
	}
}

// threads samples the VMM's threads.
func (s *system) threads() (map[int]thread, error) {
	return procfs("/proc").threads(s.P.Pid(), s.outside)
}

// describe lists the VMM's threads as classified: vCPU, VMM, outside.
func (s *system) describe() (string, error) {
	m, err := s.threads()
	if err != nil {
		return "", err
	}
	var vcpu, own, out []string
	tids := make([]int, 0, len(m))
	for tid := range m {
		tids = append(tids, tid)
	}
	slices.Sort(tids)
	for _, tid := range tids {
		t := m[tid]
		label := fmt.Sprintf("%d(%s)", tid, t.Comm)
		switch {
		case t.VCPU:
			vcpu = append(vcpu, label)
		case t.Outside:
			out = append(out, label)
		default:
			own = append(own, label)
		}
	}
	return fmt.Sprintf("%s: vCPU threads %v; VMM threads %d; outside kernel threads %v", s.Name, vcpu, len(own), out), nil
}

// sample is one call's measurement. window is the span vmmCPU covers:
// the call and the thread samples around it.
type sample struct {
	total, agent, vmmCPU, window time.Duration
}

// call runs one operation ("health", or "exec" of argv), timing it and the VMM's non-vCPU CPU time
// around it; the thread samples are taken outside the timed window.
func (s *system) call(op string, argv []string, timeout time.Duration) (sample, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	w0 := time.Now()
	before, err := s.threads()
	if err != nil {
		return sample{}, err
	}
	var sm sample
	t0 := time.Now()
	switch op {
	case "health":
		_, sm.agent, err = s.Client.HealthTimed(ctx)
	case "exec":
		var st agentwire.ExitStatus
		st, err = s.Client.ExecStatus(ctx, agentwire.ExecRequest{Argv: argv}, nil, nil)
		if err == nil && st.Code != 0 {
			err = fmt.Errorf("exit code %d", st.Code)
		}
		sm.agent = time.Duration(st.AgentNs)
	default:
		err = errors.New("unknown operation " + op)
	}
	sm.total = time.Since(t0)
	if err != nil {
		return sample{}, fmt.Errorf("%s %s: %w", s.Name, op, err)
	}
	after, err := s.threads()
	if err != nil {
		return sample{}, err
	}
	sm.vmmCPU = time.Duration(vmmCPU(before, after))
	sm.window = time.Since(w0)
	return sm, nil
}

// idleCPU is the VMM's non-vCPU CPU time per second of wall time while no
// call is made: its background work (timers, the Go runtime, QEMU's main
// loop), part of every call's vmm cpu in proportion to its window.
func (s *system) idleCPU(d time.Duration) (time.Duration, error) {
	before, err := s.threads()
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	time.Sleep(d)
	after, err := s.threads()
	if err != nil {
		return 0, err
	}
	return time.Duration(float64(vmmCPU(before, after)) / time.Since(t0).Seconds()), nil
}
